// Small helpers of the perf tools that fork or thread their own ranks
// (priority_perf, sparse_perf): a clock, a median, and a check that stops the
// tool with the library's last error.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "nccl.h"

namespace perf_util {

inline double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// The middle value (the upper one of an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace perf_util

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    ncclResult_t r_ = (x);                                                                       \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetLastError(nullptr)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)
