/* Built against an installed meshccl: a one-rank communicator, an AllReduce
 * queued on a host stream. Prints "meshccl ok" when the result is right. */
#include <meshccl/meshccl.h>
#include <stdio.h>

#define CHECK(call)                                                       \
  do {                                                                    \
    ncclResult_t r_ = (call);                                             \
    if (r_ != ncclSuccess) {                                              \
      fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(r_));         \
      return 1;                                                           \
    }                                                                     \
  } while (0)

int main(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  meshcclStream_t stream;
  float x[4] = {1, 2, 3, 4};
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  CHECK(meshcclStreamCreate(&stream));
  CHECK(ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, meshcclStreamAsCuda(stream)));
  CHECK(meshcclStreamSynchronize(stream));
  CHECK(meshcclStreamDestroy(stream));
  CHECK(ncclCommDestroy(comm));
  if (x[0] != 1 || x[3] != 4) return 1;
  printf("meshccl ok %d\n", MESHCCL_VERSION_CODE);
  return 0;
}
