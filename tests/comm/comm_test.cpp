// Communicators, point-to-point, groups, host streams and error paths.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/harness.h"

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

namespace {

std::vector<int> iota_vec(size_t n, int base) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), base);
  return v;
}

class P2P : public ::testing::TestWithParam<int> {};

TEST_P(P2P, RingShiftAllPairsAndSelf) {
  const int n = GetParam();
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300000}}) {
      // Ring shift, recv posted before send.
      std::vector<int> out = iota_vec(count, rank * 1000), in(count, -1);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclRecv(in.data(), count, ncclInt, (rank + n - 1) % n, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclSend(out.data(), count, ncclInt, (rank + 1) % n, comm, nullptr), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      ASSERT_EQ(in, iota_vec(count, ((rank + n - 1) % n) * 1000));
      // All pairs including self, in one group, several messages per pair kept in order.
      std::vector<std::vector<int>> recv(n, std::vector<int>(2 * count, -1));
      std::vector<std::vector<int>> send(n);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int p = 0; p < n; ++p) {
        send[p] = iota_vec(2 * count, rank * 100 + p);
        ASSERT_EQ(ncclSend(send[p].data(), count, ncclInt, p, comm, nullptr), ncclSuccess);
        ASSERT_EQ(ncclSend(send[p].data() + count, count, ncclInt, p, comm, nullptr), ncclSuccess);
      }
      for (int p = n - 1; p >= 0; --p) {
        ASSERT_EQ(ncclRecv(recv[p].data(), count, ncclInt, p, comm, nullptr), ncclSuccess);
        ASSERT_EQ(ncclRecv(recv[p].data() + count, count, ncclInt, p, comm, nullptr), ncclSuccess);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      for (int p = 0; p < n; ++p) ASSERT_EQ(recv[p], iota_vec(2 * count, p * 100 + rank)) << "from " << p;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, P2P, ::testing::Values(1, 2, 3, 5, 7, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(P2P, MismatchedCountIsReported) {
  run_ranks(2, [](ncclComm_t comm, int rank) {
    std::vector<int> buf(100, 1);
    ncclResult_t r = rank == 0 ? ncclSend(buf.data(), 100, ncclInt, 1, comm, nullptr)
                               : ncclRecv(buf.data(), 50, ncclInt, 0, comm, nullptr);
    if (rank == 1) EXPECT_EQ(r, ncclInvalidUsage);
    (void)r;
  });
}

// MESHCCL_CHECKS=1 (read at init): in a group, the collective whose count
// differs on one rank fails on every rank; the other one completes, and the
// communicator stays usable.
TEST(Groups, CheckedMismatchFailsOnlyItsOperation) {
  ScopedEnv checks({{"MESHCCL_CHECKS", "1"}});
  run_ranks(3, [](ncclComm_t comm, int rank) {
    std::vector<int> a(10, rank), b(11, rank);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a.data(), a.data(), 10, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b.data(), b.data(), rank == 2 ? 11 : 10, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_EQ(a, std::vector<int>(10, 3));
    EXPECT_EQ(b, std::vector<int>(11, rank)) << "data moved despite the mismatch";
    int v = rank;
    EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(v, 3);
  });
}

TEST(Groups, OneThreadDrivesSeveralRanksAndNesting) {
  const int n = 4;
  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(777));
  for (int r = 0; r < n; ++r) std::fill(bufs[r].begin(), bufs[r].end(), float(r + 1));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // nested: only the outer End launches
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(ncclAllReduce(bufs[r].data(), bufs[r].data(), 777, ncclFloat, ncclSum, comms[r], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < n; ++r) ASSERT_EQ(bufs[r][776], 10.f);
  int count = 0, rank = -1, dev = 0;
  ASSERT_EQ(ncclCommCount(comms[2], &count), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(comms[2], &rank), ncclSuccess);
  ASSERT_EQ(ncclCommCuDevice(comms[2], &dev), ncclSuccess);
  EXPECT_EQ(count, n);
  EXPECT_EQ(rank, 2);
  EXPECT_EQ(dev, -1);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (auto c : comms) ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // not in a group
}

TEST(Groups, OpsOnSeveralCommunicatorsInOneGroup) {
  run_ranks(3, [](ncclComm_t world, int rank) {
    ncclComm_t dup = nullptr;
    ASSERT_EQ(ncclCommSplit(world, 0, rank, &dup, nullptr), ncclSuccess);
    std::vector<int> a(10, rank), b(10, 10 * rank);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(a.data(), a.data(), 10, ncclInt, ncclSum, world, nullptr), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b.data(), b.data(), 10, ncclInt, ncclMax, dup, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(a[9], 3);
    EXPECT_EQ(b[9], 20);
    ASSERT_EQ(ncclCommDestroy(dup), ncclSuccess);
  });
}

TEST(Split, ColorsKeysAndNoColor) {
  const int n = 7;
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    // Halves ordered by descending key; rank 6 opts out.
    int color = rank == 6 ? NCCL_SPLIT_NOCOLOR : rank % 2;
    ncclComm_t sub = reinterpret_cast<ncclComm_t>(0x1);
    ASSERT_EQ(ncclCommSplit(comm, color, -rank, &sub, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    if (color == NCCL_SPLIT_NOCOLOR) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    int sn = 0, sr = -1;
    ASSERT_EQ(ncclCommCount(sub, &sn), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(sub, &sr), ncclSuccess);
    std::vector<int> members;
    for (int r = 0; r < n - 1; ++r)
      if (r % 2 == color) members.push_back(r);
    EXPECT_EQ(sn, static_cast<int>(members.size()));
    EXPECT_EQ(sr, static_cast<int>(members.size()) - 1 -
                      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin()));
    int v = rank, sum = 0;
    ASSERT_EQ(ncclAllReduce(&v, &sum, 1, ncclInt, ncclSum, sub, nullptr), ncclSuccess);
    EXPECT_EQ(sum, std::accumulate(members.begin(), members.end(), 0));
    ASSERT_EQ(ncclCommDestroy(sub), ncclSuccess);
  });
}

TEST(Split, InvalidColorFailsEverywhere) {
  run_ranks(3, [](ncclComm_t comm, int rank) {
    ncclComm_t sub = nullptr;
    ncclResult_t r = ncclCommSplit(comm, rank == 1 ? -5 : 0, 0, &sub, nullptr);
    EXPECT_EQ(r, rank == 1 ? ncclInvalidArgument : ncclInvalidUsage);
    EXPECT_EQ(sub, nullptr);
  });
}

TEST(NonBlocking, InitPollsToSuccess) {
  const int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      ncclComm_t comm = nullptr;
      ncclResult_t res = ncclCommInitRankConfig(&comm, n, id, r, &cfg);
      EXPECT_TRUE(res == ncclInProgress || res == ncclSuccess);
      ncclResult_t state = ncclInProgress;
      for (int i = 0; i < 200000 && state == ncclInProgress; ++i) {
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      ASSERT_EQ(state, ncclSuccess);
      int x = 1, y = 0;
      ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
      EXPECT_EQ(y, n);
      res = ncclCommFinalize(comm);
      EXPECT_TRUE(res == ncclInProgress || res == ncclSuccess);
      state = ncclInProgress;
      for (int i = 0; i < 200000 && state == ncclInProgress; ++i) {
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      EXPECT_EQ(state, ncclSuccess);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Config, RejectsBadConfigs) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_CONFIG_INITIALIZER"), std::string::npos);
  cfg = NCCL_CONFIG_INITIALIZER;
  cfg.CTAPolicy = 7;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 3;
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclInvalidArgument);
  // An older header's config (2.13: no blocking field meaning) is accepted.
  cfg = NCCL_CONFIG_INITIALIZER;
  cfg.version = NCCL_VERSION(2, 13, 0);
  cfg.blocking = 0;  // ignored for that version
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST(Errors, ArgumentChecks) {
  run_ranks(2, [](ncclComm_t comm, int rank) {
    int x = 0;
    EXPECT_EQ(ncclAllReduce(nullptr, &x, 1, ncclInt, ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(12), ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, static_cast<ncclRedOp_t>(9), comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(&x, &x, 1, ncclInt, 2, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclBroadcast(&x, &x, 1, ncclInt, -1, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclSend(&x, 1, ncclInt, 5, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclRecv(nullptr, 1, ncclInt, 0, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, comm, reinterpret_cast<cudaStream_t>(0x1234)),
              ncclInvalidArgument);
    // AlltoAll in place is accepted, as by NCCL, and correct.
    int a2a[2] = {rank * 100, rank * 100 + 1};
    EXPECT_EQ(ncclAlltoAll(a2a, a2a, 1, ncclInt, comm, nullptr), ncclSuccess);
    EXPECT_EQ(a2a[0], rank);
    EXPECT_EQ(a2a[1], 100 + rank);
    // Count 0 with NULL buffers is legal.
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    // An invalid argument inside a group fails the call and, as in NCCL, the
    // group: ncclGroupEnd returns the first error and nothing of it runs.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclSend(&x, 1, ncclInt, 9, comm, nullptr), ncclInvalidArgument);
    int y = rank + 1, z = 0;
    EXPECT_EQ(ncclAllReduce(&y, &z, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclInvalidArgument);
    EXPECT_EQ(z, 0);
    // The next group is unaffected.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(&y, &z, 1, ncclInt, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    EXPECT_EQ(z, 3);
    // PreMulSum ops belong to a comm and a type.
    float s = 2;
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &s, ncclFloat, ncclScalarHostImmediate, comm), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, op, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclInvalidArgument);
  });
}

TEST(Errors, LifecycleAndLibrary) {
  int v = 0;
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_STREQ(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error");
  EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(42)), "unknown result code");
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
  ncclUniqueId bogus;
  std::memset(&bogus, 0, sizeof(bogus));
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, 1, bogus, 0), ncclInvalidArgument);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  int y = 0;
  EXPECT_EQ(ncclAllReduce(&y, &y, 1, static_cast<ncclDataType_t>(12), ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("invalid type 12"), std::string::npos) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidArgument);  // already destroyed
  int x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, comm, nullptr), ncclInvalidArgument);  // use after destroy
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 12345), ncclSuccess);
  std::memset(p, 1, 12345);
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  EXPECT_EQ(ncclMemFree(p), ncclInvalidArgument);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.magic = 1;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
}

TEST(Streams, AsyncInStreamOrderWithPriorities) {
  run_ranks(3, [](ncclComm_t comm, int rank) {
    int least = 1, greatest = 1;
    ASSERT_EQ(meshcclStreamGetPriorityRange(&least, &greatest), ncclSuccess);
    EXPECT_LT(greatest, least);
    meshcclStream_t lo, hi;
    ASSERT_EQ(meshcclStreamCreateWithPriority(&lo, least), ncclSuccess);
    ASSERT_EQ(meshcclStreamCreateWithPriority(&hi, greatest), ncclSuccess);
    std::vector<std::vector<float>> grads(6, std::vector<float>(50000, float(rank)));
    for (auto& g : grads)
      ASSERT_EQ(ncclAllReduce(g.data(), g.data(), g.size(), ncclFloat, ncclSum, comm, meshcclStreamAsCuda(lo)),
                ncclSuccess);
    std::vector<int> act(100, rank), got(100, -1);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(act.data(), 100, ncclInt, (rank + 1) % 3, comm, meshcclStreamAsCuda(hi)), ncclSuccess);
    ASSERT_EQ(ncclRecv(got.data(), 100, ncclInt, (rank + 2) % 3, comm, meshcclStreamAsCuda(hi)), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(hi), ncclSuccess);
    EXPECT_EQ(got[99], (rank + 2) % 3);
    ASSERT_EQ(meshcclStreamSynchronize(lo), ncclSuccess);
    EXPECT_EQ(meshcclStreamQuery(lo), ncclSuccess);
    for (auto& g : grads) EXPECT_EQ(g[49999], 3.f);
    EXPECT_EQ(meshcclStreamDestroy(lo), ncclSuccess);
    EXPECT_EQ(meshcclStreamDestroy(hi), ncclSuccess);
    EXPECT_EQ(meshcclStreamSynchronize(lo), ncclInvalidArgument);
  });
}

// nccl.h: a PreMulSum scalar of residence ncclScalarDevice is read when the
// collective runs, not when it is enqueued. Rank 0's second operation waits on
// its stream behind one that needs rank 1; the scalar changes meanwhile. Both
// the direct shared-memory algorithm and a plan (MESHCCL_ALGO=ring).
TEST(Streams, DeviceResidentScalarIsReadWhenTheOperationRuns) {
  for (const char* algo : {"", "allreduce:ring"}) {
    SCOPED_TRACE(algo);
    if (*algo) setenv("MESHCCL_ALGO", algo, 1);
    ncclComm_t c[2];
    ASSERT_EQ(ncclCommInitAll(c, 2, nullptr), ncclSuccess);
    meshcclStream_t s[2];
    float scalar[2] = {2.f, 2.f};
    ncclRedOp_t op[2];
    std::vector<float> a[2], b[2];
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(meshcclStreamCreate(&s[r]), ncclSuccess);
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&op[r], &scalar[r], ncclFloat, ncclScalarDevice, c[r]), ncclSuccess);
      a[r].assign(1000, 1.f);
      b[r].assign(1000, float(r + 1));
    }
    auto enqueue = [&](int r) {
      ASSERT_EQ(ncclAllReduce(a[r].data(), a[r].data(), 1000, ncclFloat, ncclSum, c[r], meshcclStreamAsCuda(s[r])),
                ncclSuccess);
      ASSERT_EQ(ncclAllReduce(b[r].data(), b[r].data(), 1000, ncclFloat, op[r], c[r], meshcclStreamAsCuda(s[r])),
                ncclSuccess);
    };
    enqueue(0);  // its first operation cannot finish before rank 1 joins
    scalar[0] = scalar[1] = 3.f;
    enqueue(1);
    for (int r = 0; r < 2; ++r) ASSERT_EQ(meshcclStreamSynchronize(s[r]), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(a[r][999], 2.f);
      EXPECT_EQ(b[r][0], 3.f * 1 + 3.f * 2) << "rank " << r;
      EXPECT_EQ(b[r][999], 9.f) << "rank " << r;
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ncclRedOpDestroy(op[r], c[r]), ncclSuccess);
      EXPECT_EQ(meshcclStreamDestroy(s[r]), ncclSuccess);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (ncclComm_t comm : c) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    unsetenv("MESHCCL_ALGO");
  }
}

// A synchronize leaves an idle stream's worker thread asleep: waking it for
// nothing cost a context switch per call, on the core where a peer rank may
// be polling (the host-stream slow mode that perf/stream_latency measures).
// The process's voluntary context switches stay far below one per call.
TEST(Streams, SynchronizeLeavesTheIdleWorkerAsleep) {
  meshcclStream_t s;
  ASSERT_EQ(meshcclStreamCreate(&s), ncclSuccess);
  ASSERT_EQ(meshcclStreamSynchronize(s), ncclSuccess);
  const int calls = 1000;
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  for (int i = 0; i < calls; ++i) {
    ASSERT_EQ(meshcclStreamSynchronize(s), ncclSuccess);
    // Some work between calls (busy, so this thread never blocks): time for
    // a worker woken by the call to run and go back to waiting.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20);
    while (std::chrono::steady_clock::now() < until) {}
  }
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_nvcsw - before.ru_nvcsw, calls / 4);
  EXPECT_EQ(meshcclStreamDestroy(s), ncclSuccess);
}

TEST(Abort, FromAnotherThreadUnblocksAWaitingCall) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comms[2] = {nullptr, nullptr};
  std::thread t([&] { ASSERT_EQ(ncclCommInitRank(&comms[1], 2, id, 1), ncclSuccess); });
  ASSERT_EQ(ncclCommInitRank(&comms[0], 2, id, 0), ncclSuccess);
  t.join();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  });
  std::vector<float> buf(1000, 1.f);
  auto start = std::chrono::steady_clock::now();
  // Rank 1 never joins: only the abort can end this call.
  ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comms[0], nullptr);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  aborter.join();
  EXPECT_NE(r, ncclSuccess);
  EXPECT_LT(secs, 20.0);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
}

}  // namespace
