/* Built against NVIDIA's nccl.h and linked with meshccl's libnccl.so.2: the
 * drop-in promise. Checks the struct layouts both headers declare, then uses
 * the library the way a CUDA program compiled for NVIDIA's NCCL would (on host
 * buffers, NULL stream). Exits non-zero on the first failure. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_layout.h"

const char* const abi_config_field_names[ABI_CONFIG_FIELDS] = {
    "size",     "magic",        "version",  "blocking",      "cgaClusterSize", "minCTAs",
    "maxCTAs",  "netName",      "splitShare", "trafficClass", "commName",       "collnetEnable",
    "CTAPolicy", "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer", "nvlinkCentricSched"};

static int failures = 0;

#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) {                               \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);              \
      fputc('\n', stderr);                       \
      ++failures;                                \
    }                                            \
  } while (0)

#define NCCL_OK(call)                                                                     \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      fprintf(stderr, "FAIL %s:%d: %s -> %d %s (%s)\n", __FILE__, __LINE__, #call, (int)r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                            \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)

static int check_layout(void) {
  struct abi_layout theirs, ours;
  ABI_FILL_LAYOUT(&theirs);
  abi_layout_ours(&ours);
  CHECK(theirs.config_size == 80, "NVIDIA sizeof(ncclConfig_t) = %zu, expected 80", theirs.config_size);
  CHECK(ours.config_size == theirs.config_size, "sizeof(ncclConfig_t): ours %zu, NVIDIA %zu", ours.config_size,
        theirs.config_size);
  CHECK(ours.config_align == theirs.config_align, "alignof(ncclConfig_t): ours %zu, NVIDIA %zu", ours.config_align,
        theirs.config_align);
  CHECK(theirs.unique_id_size == 128 && ours.unique_id_size == 128, "sizeof(ncclUniqueId): ours %zu, NVIDIA %zu",
        ours.unique_id_size, theirs.unique_id_size);
  for (int i = 0; i < ABI_CONFIG_FIELDS; ++i)
    CHECK(ours.offsets[i] == theirs.offsets[i], "offsetof(ncclConfig_t, %s): ours %zu, NVIDIA %zu",
          abi_config_field_names[i], ours.offsets[i], theirs.offsets[i]);
  CHECK(ours.version_code == theirs.version_code, "NCCL_VERSION_CODE: ours %d, NVIDIA %d", ours.version_code,
        theirs.version_code);
  CHECK(ours.num_results == theirs.num_results, "ncclNumResults: ours %d, NVIDIA %d", ours.num_results,
        theirs.num_results);
  return failures;
}

static int check_entry_points(void) {
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  CHECK(version == NCCL_VERSION_CODE, "ncclGetVersion = %d, header NCCL_VERSION_CODE %d", version, NCCL_VERSION_CODE);
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL) should be ncclInvalidArgument");

  const char* seen[ncclNumResults];
  for (int r = 0; r < (int)ncclNumResults; ++r) {
    const char* s = ncclGetErrorString((ncclResult_t)r);
    seen[r] = s;
    CHECK(s != NULL && s[0] != '\0', "ncclGetErrorString(%d) is empty", r);
    for (int q = 0; s != NULL && q < r; ++q)
      CHECK(seen[q] == NULL || strcmp(seen[q], s) != 0, "ncclGetErrorString(%d) == ncclGetErrorString(%d): %s", r, q, s);
  }
  const char* unknown = ncclGetErrorString((ncclResult_t)1234);
  CHECK(unknown != NULL, "ncclGetErrorString(1234) returned NULL");
  return failures;
}

static int check_collective(void) {
  enum { kRanks = 2, kCount = 100003 };
  ncclComm_t comms[kRanks] = {NULL, NULL};
  NCCL_OK(ncclCommInitAll(comms, kRanks, NULL));
  for (int r = 0; r < kRanks; ++r) {
    int count = 0, rank = -1;
    NCCL_OK(ncclCommCount(comms[r], &count));
    NCCL_OK(ncclCommUserRank(comms[r], &rank));
    CHECK(count == kRanks && rank == r, "comm %d: count %d rank %d", r, count, rank);
  }
  float* bufs[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    bufs[r] = (float*)malloc(sizeof(float) * kCount);
    if (bufs[r] == NULL) return 1;
    for (int i = 0; i < kCount; ++i) bufs[r][i] = (float)((r + 1) * (i % 977));
  }
  /* One thread drives both ranks: the group lets the calls wait on each other. */
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < kRanks; ++r)
    NCCL_OK(ncclAllReduce(bufs[r], bufs[r], kCount, ncclFloat, ncclSum, comms[r], (cudaStream_t)0));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < kRanks; ++r) {
    int bad = 0;
    for (int i = 0; i < kCount && !bad; ++i)
      if (bufs[r][i] != (float)(3 * (i % 977))) {
        CHECK(0, "rank %d allreduce[%d] = %g, want %g", r, i, bufs[r][i], (double)(3 * (i % 977)));
        bad = 1;
      }
    free(bufs[r]);
  }
  for (int r = 0; r < kRanks; ++r) NCCL_OK(ncclCommDestroy(comms[r]));

  /* A config initialised with NVIDIA's macro is accepted as is. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = "abi-check";
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t one = NULL;
  NCCL_OK(ncclCommInitRankConfig(&one, 1, id, 0, &config));
  double v = 2.5;
  NCCL_OK(ncclAllReduce(&v, &v, 1, ncclDouble, ncclSum, one, (cudaStream_t)0));
  CHECK(v == 2.5, "1-rank allreduce = %g", v);
  NCCL_OK(ncclCommDestroy(one));
  return failures;
}

int main(void) {
  check_layout();
  check_entry_points();
  if (check_collective() != 0 && failures == 0) failures = 1;
  if (failures) {
    fprintf(stderr, "abi_check: %d failure(s)\n", failures);
    return 1;
  }
  printf("abi_check: layout, version %d, error strings and a 2-rank allreduce OK\n", NCCL_VERSION_CODE);
  return 0;
}
