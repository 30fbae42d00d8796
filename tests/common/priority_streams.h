// What the priority tests share: a least and a most urgent stream, and the
// starvation check run on plans and on the direct algorithms alike.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "meshccl.h"

namespace meshccl_test {

inline cudaStream_t cu(meshcclStream_t s) { return meshcclStreamAsCuda(s); }

struct Streams {
  meshcclStream_t lo = nullptr, hi = nullptr;
  Streams() {
    int least = 0, greatest = 0;
    EXPECT_EQ(meshcclStreamGetPriorityRange(&least, &greatest), ncclSuccess);
    EXPECT_EQ(meshcclStreamCreateWithPriority(&lo, least), ncclSuccess);
    EXPECT_EQ(meshcclStreamCreateWithPriority(&hi, greatest), ncclSuccess);
  }
  ~Streams() {
    meshcclStreamDestroy(lo);
    meshcclStreamDestroy(hi);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
};

// One rank of 3: a bulk all-reduce of 1 Mi ints on the least urgent stream
// must complete while every rank keeps issuing urgent all-reduces (which
// also agree on whether every rank's bulk is done) for as long as it runs.
inline void bulk_completes_under_endless_urgent_calls(ncclComm_t comm, int rank) {
  Streams s;
  std::vector<int> bulk(size_t{1} << 20, rank + 1);
  ASSERT_EQ(ncclAllReduce(bulk.data(), bulk.data(), bulk.size(), ncclInt, ncclSum, comm, cu(s.lo)), ncclSuccess);
  int rounds = 0;
  for (; rounds < 200000; ++rounds) {
    int flag = meshcclStreamQuery(s.lo) == ncclSuccess ? 1 : 0;
    ASSERT_EQ(ncclAllReduce(&flag, &flag, 1, ncclInt, ncclMin, comm, cu(s.hi)), ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess);
    if (flag == 1) break;
  }
  EXPECT_LT(rounds, 200000) << "the bulk all-reduce starved";
  ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess);
  EXPECT_EQ(bulk[0], 6);
  EXPECT_EQ(bulk[bulk.size() - 1], 6);
}

}  // namespace meshccl_test
