// Priority scheduling of the direct shared-memory algorithms
// (docs/priority.md): with MESHCCL_PRIORITY=1 every stream priority level has
// its own lane of rounds in the shared region, and a bulk direct operation
// moves in chunk-sized rounds between which the more urgent rounds every rank
// announced go first. Here: every direct collective is exact while it
// overtakes a bulk direct all-reduce, the urgent call provably runs before
// the bulk one ends (and after it with FIFO), an urgent call queued behind
// work that needs the bulk one does not deadlock it, the bulk one never
// starves, a priority that differs across ranks is reported, and FIFO keeps
// one lane.
// Ranks are threads of this process; the region is real shared memory.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/comm.h"
#include "tests/common/harness.h"
#include "tests/common/priority_streams.h"

namespace {

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

using meshccl_test::cu;
using meshccl_test::Streams;

// Small rounds: with priority 128 KiB slots (a 4 MiB bulk all-reduce is 32
// rounds), with FIFO the default 1 MiB ones; the smallest link chunks too.
ScopedEnv direct_env(const std::string& priority) {
  return ScopedEnv({{"MESHCCL_PRIORITY", priority},
                    {"MESHCCL_DIRECT_SLOT_BYTES", priority == "1" ? "131072" : "1048576"},
                    {"MESHCCL_CHUNK_US", "1"},
                    {"MESHCCL_TIMEOUT", "60"}});
}

// The region's shape: with priority one lane per level, with FIFO one lane;
// slots of MESHCCL_DIRECT_SLOT_BYTES either way.
void expect_shape(ncclComm_t comm, bool priority) {
  ASSERT_NE(comm->node, nullptr);
  EXPECT_EQ(comm->node->lanes(), priority ? meshccl::NodeRegion::kPriorityLanes : 1);
  EXPECT_EQ(comm->node->slot_bytes(), priority ? size_t{128} << 10 : size_t{1} << 20);
}

int value(int rank, size_t i) { return static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 101); }

class DirectOvertake : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// Every direct collective on the urgent stream (counts 0, 1, primes and
// non-multiples of a round, one spanning two rounds; several dtypes and ops;
// in and out of place) while a bulk direct all-reduce runs on the bulk stream.
TEST_P(DirectOvertake, EveryCollectiveExact) {
  const auto [n, priority] = GetParam();
  ScopedEnv env = direct_env(priority);
  run_ranks(n, [n = n, prio = priority == "1"](ncclComm_t comm, int rank) {
    expect_shape(comm, prio);
    Streams s;
    std::vector<int> bulk(size_t{1} << 20), bulk_out(bulk.size(), -1);
    for (size_t i = 0; i < bulk.size(); ++i) bulk[i] = value(rank, i);
    ASSERT_EQ(ncclAllReduce(bulk.data(), bulk_out.data(), bulk.size(), ncclInt, ncclSum, comm, cu(s.lo)), ncclSuccess);
    auto hi = cu(s.hi);
    auto sync = [&] { ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess) << ncclGetLastError(comm); };
    const int root = n - 1;
    for (size_t count : {size_t{0}, size_t{1}, size_t{1009}, size_t{12289}, size_t{40003}}) {
      for (bool in_place : {false, true}) {
        const size_t nc = count * static_cast<size_t>(n);
        std::vector<int> in(nc), out(nc, -1), small(count, -1);
        for (size_t i = 0; i < nc; ++i) in[i] = value(rank, i);
        auto want_sum = [&](size_t i) {
          int w = 0;
          for (int r = 0; r < n; ++r) w += value(r, i);
          return w;
        };
        // AllReduce, int32 sum.
        std::vector<int> ar(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(count));
        int* ar_out = in_place ? ar.data() : small.data();
        ASSERT_EQ(ncclAllReduce(ar.data(), ar_out, count, ncclInt, ncclSum, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(ar_out[i], want_sum(i)) << "AllReduce i=" << i;
        // AllReduce, float max and double min.
        std::vector<float> f(count);
        for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(value(rank, i)) - 50.f;
        std::vector<float> f_out(count, -1.f);
        float* fo = in_place ? f.data() : f_out.data();
        ASSERT_EQ(ncclAllReduce(f.data(), fo, count, ncclFloat32, ncclMax, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i) {
          int w = value(0, i);
          for (int r = 1; r < n; ++r) w = std::max(w, value(r, i));
          ASSERT_EQ(fo[i], static_cast<float>(w) - 50.f) << "float max i=" << i;
        }
        std::vector<double> d(count);
        for (size_t i = 0; i < count; ++i) d[i] = value(rank, i) * 0.5;
        ASSERT_EQ(ncclAllReduce(d.data(), d.data(), count, ncclFloat64, ncclMin, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i) {
          int w = value(0, i);
          for (int r = 1; r < n; ++r) w = std::min(w, value(r, i));
          ASSERT_EQ(d[i], w * 0.5) << "double min i=" << i;
        }
        // Broadcast (uint8), Reduce (int64 sum).
        std::vector<uint8_t> bc(count);
        for (size_t i = 0; i < count; ++i) bc[i] = rank == root ? static_cast<uint8_t>(i * 5 + 1) : 0;
        std::vector<uint8_t> bc_out(count, 0);
        uint8_t* bo = in_place ? bc.data() : bc_out.data();
        ASSERT_EQ(ncclBroadcast(bc.data(), bo, count, ncclUint8, root, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(bo[i], static_cast<uint8_t>(i * 5 + 1)) << "Broadcast";
        std::vector<int64_t> r64(count), r64_out(count, -1);
        for (size_t i = 0; i < count; ++i) r64[i] = value(rank, i);
        int64_t* ro = in_place ? r64.data() : r64_out.data();
        ASSERT_EQ(ncclReduce(r64.data(), ro, count, ncclInt64, ncclSum, root, comm, hi), ncclSuccess);
        sync();
        if (rank == root)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(ro[i], want_sum(i)) << "Reduce i=" << i;
        // AllGather and Gather (this rank's piece sits at its place when in place).
        std::vector<int> ag(nc, -1);
        for (size_t i = 0; i < count; ++i) ag[static_cast<size_t>(rank) * count + i] = value(rank, i);
        const int* piece = in_place ? ag.data() + static_cast<size_t>(rank) * count : in.data();
        ASSERT_EQ(ncclAllGather(piece, ag.data(), count, ncclInt, comm, hi), ncclSuccess);
        sync();
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(ag[r * count + i], value(r, i)) << "AllGather";
        std::fill(out.begin(), out.end(), -1);
        ASSERT_EQ(ncclGather(in.data(), out.data(), count, ncclInt, root, comm, hi), ncclSuccess);
        sync();
        if (rank == root)
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[r * count + i], value(r, i)) << "Gather";
        // ReduceScatter (sum), AlltoAll, Scatter.
        std::vector<int> rs(in);
        int* rs_out = in_place ? rs.data() + static_cast<size_t>(rank) * count : small.data();
        ASSERT_EQ(ncclReduceScatter(rs.data(), rs_out, count, ncclInt, ncclSum, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(rs_out[i], want_sum(static_cast<size_t>(rank) * count + i)) << "ReduceScatter";
        std::vector<int> a2a(in);
        int* a2a_out = in_place ? a2a.data() : out.data();
        ASSERT_EQ(ncclAlltoAll(a2a.data(), a2a_out, count, ncclInt, comm, hi), ncclSuccess);
        sync();
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(a2a_out[r * count + i], value(r, static_cast<size_t>(rank) * count + i)) << "AlltoAll";
        std::fill(small.begin(), small.end(), -1);
        ASSERT_EQ(ncclScatter(in.data(), small.data(), count, ncclInt, root, comm, hi), ncclSuccess);
        sync();
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(small[i], value(root, static_cast<size_t>(rank) * count + i)) << "Scatter";
      }
    }
    ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess) << ncclGetLastError(comm);
    for (size_t i = 0; i < bulk.size(); i += 997) {
      int w = 0;
      for (int r = 0; r < n; ++r) w += value(r, i);
      ASSERT_EQ(bulk_out[i], w) << "bulk i=" << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, DirectOvertake,
                         ::testing::Values(std::make_tuple(2, "1"), std::make_tuple(3, "1"), std::make_tuple(4, "1"),
                                           std::make_tuple(3, "0")));

// Ranks that are threads of this process: every rank's lane of `priority`
// has announced its rounds up to `round` (read through this rank's mappings
// of the peers' regions), within 30 s.
bool all_announced(ncclComm_t comm, int priority, uint64_t round) {
  meshccl::NodeRegion& node = *comm->node;
  const int lane = node.lane_for(priority);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (int p = 0; p < node.nranks(); ++p)
    while (node.control(p, lane).announced.value.load() < round)
      if (std::chrono::steady_clock::now() > end) return false;
  return true;
}

class DirectOrder : public ::testing::TestWithParam<std::string> {};

// The urgent all-reduce reads the bulk all-reduce's output, past the bulk's
// first round, as its input. Rank 0 holds its bulk call back (behind a
// receive on its stream) until every rank is running its urgent call, so
// that no bulk round past the first can start before every rank has
// announced the urgent one: with priority, the bulk's later rounds wait for
// all of it, and it reads the -1s the output started with; with FIFO it runs
// after the whole bulk call and reads the bulk's sums. Not a matter of
// timing: the rounds' flags order it.
TEST_P(DirectOrder, UrgentRunsBeforeBulkEnds) {
  const bool prio = GetParam() == "1";
  ScopedEnv env = direct_env(GetParam());
  for (int n : {2, 3}) {
    run_ranks(n, [n, prio](ncclComm_t comm, int rank) {
      expect_shape(comm, prio);
      Streams s;
      // 32 rounds of 128 KiB with priority (4 of 1 MiB with FIFO); the urgent
      // call reads from the second round's range on: 31 rounds of its own.
      const size_t count = size_t{1} << 20, skip = (size_t{128} << 10) / sizeof(int), tail = count - skip;
      std::vector<int> bulk(count, rank + 1), bulk_out(count, -1), urgent(tail, 0);
      int token = 7;
      if (rank == 0) ASSERT_EQ(ncclRecv(&token, 1, ncclInt, 1, comm, cu(s.lo)), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(bulk.data(), bulk_out.data(), count, ncclInt, ncclSum, comm, cu(s.lo)), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(bulk_out.data() + skip, urgent.data(), tail, ncclInt, ncclSum, comm, cu(s.hi)),
                ncclSuccess);
      if (rank == 1) {
        if (prio) ASSERT_TRUE(all_announced(comm, -7, 1));
        ASSERT_EQ(ncclSend(&token, 1, ncclInt, 0, comm, nullptr), ncclSuccess);
      }
      if (prio && rank == 0) {
        // While both run: once this rank has finished a bulk round past the
        // first, it has finished every urgent round (read in that order, so
        // the urgent count is the later one).
        meshccl::NodeRegion& node = *comm->node;
        const uint64_t urgent_rounds = (tail + skip - 1) / skip;
        size_t early = 0;
        while (meshcclStreamQuery(s.lo) != ncclSuccess || meshcclStreamQuery(s.hi) != ncclSuccess) {
          const uint64_t bulk_done = node.finished(node.lane_for(0)).load();
          const uint64_t urgent_done = node.finished(node.lane_for(-7)).load();
          early += bulk_done >= 2 && urgent_done < urgent_rounds;
        }
        EXPECT_EQ(early, 0u) << "bulk rounds ran while announced urgent rounds were left";
      }
      ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess) << ncclGetLastError(comm);
      ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess) << ncclGetLastError(comm);
      const int bulk_sum = n * (n + 1) / 2;
      for (size_t i = 0; i < tail; ++i)
        ASSERT_EQ(urgent[i], prio ? -n : n * bulk_sum)
            << i << ": " << (prio ? "the urgent call waited for the bulk one" : "FIFO let the urgent call overtake");
      ASSERT_EQ(bulk_out[0], bulk_sum);
      ASSERT_EQ(bulk_out[count - 1], bulk_sum);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, DirectOrder, ::testing::Values("1", "0"));

// No deadlock: rank 1's urgent all-reduce is queued behind a receive whose
// send rank 0 queues behind its bulk all-reduce. The urgent call is reserved
// on every rank but not yet running on rank 1, so it is not announced there
// and the bulk call does not wait for it (if it did, neither would ever
// end). Whatever the timing, everything completes, with the right data.
TEST(DirectPriority, BulkDoesNotWaitForUrgentCallQueuedBehindIt) {
  ScopedEnv env = direct_env("1");
  run_ranks(3, [](ncclComm_t comm, int rank) {
    Streams s;
    const size_t count = size_t{1} << 20;
    std::vector<int> bulk(count, rank + 1), small(1000, rank);
    int token = rank == 0 ? 42 : 0;
    if (rank == 1) ASSERT_EQ(ncclRecv(&token, 1, ncclInt, 0, comm, cu(s.hi)), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(bulk.data(), bulk.data(), count, ncclInt, ncclSum, comm, cu(s.lo)), ncclSuccess);
    if (rank == 0) ASSERT_EQ(ncclSend(&token, 1, ncclInt, 1, comm, cu(s.lo)), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(small.data(), small.data(), small.size(), ncclInt, ncclSum, comm, cu(s.hi)), ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(s.hi), ncclSuccess) << ncclGetLastError(comm);
    ASSERT_EQ(meshcclStreamSynchronize(s.lo), ncclSuccess) << ncclGetLastError(comm);
    EXPECT_EQ(token, rank == 2 ? 0 : 42);
    EXPECT_EQ(bulk[count - 1], 6);
    EXPECT_EQ(small[999], 3);
  });
}

// Starvation-freedom: a bulk direct all-reduce completes while every rank
// keeps issuing urgent direct all-reduces for as long as it runs (each bulk
// round waits only for the urgent rounds announced when it came up).
TEST(DirectPriority, BulkCompletesUnderEndlessUrgentCalls) {
  ScopedEnv env = direct_env("1");
  run_ranks(3, meshccl_test::bulk_completes_under_endless_urgent_calls);
}

// Two same-shaped calls that the ranks issue at swapped priorities land in
// swapped lanes: every rank reports it (ncclInvalidUsage, on the thread that
// drives the least urgent call: the NULL stream's) instead of exchanging the
// wrong data. A rank that compared the headers names the cause; one whose
// other lane saw the finder's flag first may say only who found it.
TEST(DirectPriority, PriorityDifferingAcrossRanksIsReported) {
  ScopedEnv env = direct_env("1");
  std::atomic<int> named{0};
  run_ranks(2, [&named](ncclComm_t comm, int rank) {
    Streams s;
    std::vector<float> a(100, 1.f), b(100, 2.f);
    ncclResult_t res;
    if (rank == 0) {
      res = ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, nullptr);
    } else {
      ASSERT_EQ(ncclAllReduce(a.data(), a.data(), a.size(), ncclFloat, ncclSum, comm, cu(s.hi)), ncclSuccess);
      res = ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, nullptr);
    }
    EXPECT_EQ(res, ncclInvalidUsage);
    const std::string msg = ncclGetLastError(comm);
    // (Empty when another thread driving the engine met the error: messages
    // stay on the thread that found them.)
    if (!msg.empty()) EXPECT_NE(msg.find("mismatched calls across ranks"), std::string::npos) << msg;
    if (msg.find("stream priority must be the same on every rank") != std::string::npos) named.fetch_add(1);
    // The communicator has failed: rank 0's second call is refused, rank 1's
    // first one (on the urgent stream) ends with the failure.
    if (rank == 0)
      EXPECT_NE(ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat, ncclSum, comm, cu(s.hi)), ncclSuccess);
    else EXPECT_NE(meshcclStreamSynchronize(s.hi), ncclSuccess);
  });
  EXPECT_GE(named.load(), 1);
}

}  // namespace
