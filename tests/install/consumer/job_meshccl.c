/* Built against an installed meshccl and started by its meshrun: every rank
 * contributes rank + 1 to an AllReduce over the job. Prints "meshccl job ok"
 * on each rank whose result is right. */
#include <meshccl/meshccl.h>
#include <stdio.h>

#define CHECK(call)                                                       \
  do {                                                                    \
    ncclResult_t r_ = (call);                                             \
    if (r_ != ncclSuccess) {                                              \
      fprintf(stderr, "%s: %s: %s\n", #call, ncclGetErrorString(r_),      \
              ncclGetLastError(NULL));                                    \
      return 1;                                                           \
    }                                                                     \
  } while (0)

int main(void) {
  ncclComm_t comm;
  int rank, nranks;
  double x[1000];
  CHECK(meshcclCommInitFromEnv(&comm, NULL));
  CHECK(ncclCommUserRank(comm, &rank));
  CHECK(ncclCommCount(comm, &nranks));
  for (int i = 0; i < 1000; ++i) x[i] = rank + 1;
  CHECK(ncclAllReduce(x, x, 1000, ncclDouble, ncclSum, comm, NULL));
  CHECK(ncclCommDestroy(comm));
  for (int i = 0; i < 1000; ++i)
    if (x[i] != nranks * (nranks + 1) / 2.0) return 1;
  printf("meshccl job ok\n");
  return 0;
}
