// Stall probes (sched/notices.h, Probes): a collective stalled 100 ms tells
// every peer its place in the sequence and its signature. A peer that never
// stalls, such as the rank the others wait for, must still take those
// messages in: left unreceived they stay parked on its connections for the
// communicator's life (the matcher scans them at every receive; over ucx
// they sit in UCX's unexpected queue, which warns about each one when the
// worker is destroyed). Runs over the transport MESHCCL_TRANSPORT names
// (meson runs this once per transport); ranks are threads of this process.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "base/tag.h"
#include "comm/comm.h"
#include "tests/common/harness.h"

namespace {

using meshccl_test::run_ranks;

// The late rank's connections hold no probe once it has waited in a
// collective again: ranks 0 and 1 stall twice waiting for rank 2 and send
// it their probes; rank 2 never stalls, waits over a second later (the
// collection interval outside a stall), then finds nothing left.
TEST(Probes, ALateRankTakesInThePeersProbes) {
  constexpr int kRanks = 3, kLate = 2;
  run_ranks(kRanks, [&](ncclComm_t comm, int rank) {
    std::vector<float> buf(64, 1.0f);
    for (int round = 0; round < 3; ++round) {
      if (rank == kLate) std::this_thread::sleep_for(std::chrono::milliseconds(round < 2 ? 300 : 1100));
      ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
    }
    EXPECT_EQ(buf[0], 27.0f);
    for (int p = 0; p < kRanks && rank == kLate; ++p) {
      if (p == rank) continue;
      bool found = true;
      EXPECT_TRUE(comm->mesh->probe(p, meshccl::tag::kProbe, &found).ok());
      EXPECT_FALSE(found) << "a probe of rank " << p << " is still parked on rank " << rank;
    }
    // The others stay connected until rank 2 has looked.
    ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), 1, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  });
}

}  // namespace
