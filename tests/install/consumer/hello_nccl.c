/* Built against an installed meshccl as NVIDIA's NCCL would be (nccl.h,
 * -lnccl): reports the version and runs a one-rank AllReduce. */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  int version = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  int x[3] = {5, 6, 7};
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return 1;
  if (ncclAllReduce(x, x, 3, ncclInt32, ncclMax, comm, NULL) != ncclSuccess) return 1;
  if (ncclCommDestroy(comm) != ncclSuccess || x[2] != 7) return 1;
  printf("nccl ok %d\n", version);
  return 0;
}
