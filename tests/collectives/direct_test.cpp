// The direct shared-memory algorithms: operations spanning many rounds of a
// small slot, every collective forced onto the direct path, the fallback to a
// plan when an operation does not fit, and mismatched calls found on every
// rank. Ranks are threads of this process; the region is real shared memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/common/harness.h"

using namespace meshccl_test;

namespace {

float in(int r, size_t i) { return static_cast<float>((r * 5 + i * 3) % 7); }

// NodeRegion::kRunAhead (src/transport/node_region.h): how many rounds a
// rank that waits for nobody may run ahead of its slowest peer.
constexpr int kRunAhead = 128;

// 4 KiB slots: a 3001-element double buffer takes six rounds.
TEST(Direct, ManyRoundsEveryCollective) {
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "4096"}, {"MESHCCL_ALGO", "direct_shm"}});
  for (int n : {2, 3, 5}) {
    run_ranks(n, [n](ncclComm_t comm, int rank) {
      for (size_t count : {size_t{1}, size_t{511}, size_t{3001}}) {
        for (bool in_place : {false, true}) {
          std::vector<double> send(count), recv(count, -1);
          for (size_t i = 0; i < count; ++i) send[i] = in(rank, i);
          double* out = in_place ? send.data() : recv.data();
          ASSERT_EQ(ncclAllReduce(send.data(), out, count, ncclFloat64, ncclSum, comm, nullptr), ncclSuccess)
              << ncclGetLastError(comm);
          for (size_t i = 0; i < count; ++i) {
            double want = 0;
            for (int r = 0; r < n; ++r) want += in(r, i);
            ASSERT_EQ(out[i], want) << "AllReduce n=" << n << " count=" << count << " i=" << i;
          }
        }
        // Avg divides once at the end; PreMulSum scales each input.
        std::vector<float> a(count), b(count);
        for (size_t i = 0; i < count; ++i) a[i] = in(rank, i) * static_cast<float>(n);
        ASSERT_EQ(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, ncclAvg, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += in(r, i);
          ASSERT_FLOAT_EQ(b[i], want) << "Avg i=" << i;
        }
        float scalar = static_cast<float>(rank + 1);
        ncclRedOp_t premul;
        ASSERT_EQ(ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat32, ncclScalarHostImmediate, comm), ncclSuccess);
        for (size_t i = 0; i < count; ++i) a[i] = in(rank, i);
        ASSERT_EQ(ncclAllReduce(a.data(), b.data(), count, ncclFloat32, premul, comm, nullptr), ncclSuccess);
        ASSERT_EQ(ncclRedOpDestroy(premul, comm), ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += static_cast<float>(r + 1) * in(r, i);
          ASSERT_FLOAT_EQ(b[i], want) << "PreMulSum i=" << i;
        }
        for (int root : {0, n - 1}) {
          std::vector<int64_t> s(count), d(count, -7);
          for (size_t i = 0; i < count; ++i) s[i] = static_cast<int64_t>(in(rank, i)) - 3;
          ASSERT_EQ(ncclReduce(s.data(), d.data(), count, ncclInt64, ncclMin, root, comm, nullptr), ncclSuccess);
          for (size_t i = 0; i < count; ++i) {
            int64_t want = INT64_MAX;
            for (int r = 0; r < n; ++r) want = std::min<int64_t>(want, static_cast<int64_t>(in(r, i)) - 3);
            ASSERT_EQ(d[i], rank == root ? want : -7) << "Reduce root=" << root << " i=" << i;
          }
          std::vector<uint8_t> bc(count);
          for (size_t i = 0; i < count; ++i) bc[i] = rank == root ? static_cast<uint8_t>(i * 7 + root) : 0;
          ASSERT_EQ(ncclBroadcast(bc.data(), bc.data(), count, ncclUint8, root, comm, nullptr), ncclSuccess);
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(bc[i], static_cast<uint8_t>(i * 7 + root)) << "Broadcast";
        }
        // One-round kinds: direct when they fit a slot, a plan otherwise.
        std::vector<float> piece(count), all(count * n, -1);
        for (size_t i = 0; i < count; ++i) piece[i] = in(rank, i);
        ASSERT_EQ(ncclAllGather(piece.data(), all.data(), count, ncclFloat32, comm, nullptr), ncclSuccess);
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], in(r, i)) << "AllGather";
        std::vector<float> full(count * n), mine(count, -1);
        for (size_t i = 0; i < count * n; ++i) full[i] = in(rank, i);
        ASSERT_EQ(ncclReduceScatter(full.data(), mine.data(), count, ncclFloat32, ncclMax, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want = std::max(want, in(r, rank * count + i));
          ASSERT_EQ(mine[i], want) << "ReduceScatter";
        }
        std::vector<float> a2a(count * n), got(count * n, -1);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i) a2a[p * count + i] = in(rank * n + p, i);
        ASSERT_EQ(ncclAlltoAll(a2a.data(), got.data(), count, ncclFloat32, comm, nullptr), ncclSuccess);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[p * count + i], in(p * n + rank, i)) << "AlltoAll";
        const int root = n / 2;
        std::vector<float> g(count * n, -1);
        ASSERT_EQ(ncclGather(piece.data(), g.data(), count, ncclFloat32, root, comm, nullptr), ncclSuccess);
        if (rank == root)
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(g[r * count + i], in(r, i)) << "Gather";
        std::vector<float> sc(count, -1);
        ASSERT_EQ(ncclScatter(full.data(), sc.data(), count, ncclFloat32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(sc[i], in(root, rank * count + i)) << "Scatter";
      }
    });
  }
}

// Several operations in flight on one communicator (a group, and host
// streams of different priorities) still run their rounds in order.
TEST(Direct, GroupsAndStreams) {
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "4096"}, {"MESHCCL_ALGO", "direct_shm"}});
  const int n = 3;
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    meshcclStream_t hi, lo;
    ASSERT_EQ(meshcclStreamCreateWithPriority(&hi, -3), ncclSuccess);
    ASSERT_EQ(meshcclStreamCreateWithPriority(&lo, 0), ncclSuccess);
    const size_t count = 2000;
    std::vector<std::vector<float>> bufs(6, std::vector<float>(count));
    for (int k = 0; k < 6; ++k)
      for (size_t i = 0; i < count; ++i) bufs[k][i] = static_cast<float>(rank + k + i % 3);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int k = 0; k < 2; ++k)
      ASSERT_EQ(ncclAllReduce(bufs[k].data(), bufs[k].data(), count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (int k = 2; k < 6; ++k)
      ASSERT_EQ(ncclAllReduce(bufs[k].data(), bufs[k].data(), count, ncclFloat32, ncclSum, comm,
                              meshcclStreamAsCuda(k % 2 ? hi : lo)),
                ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(hi), ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(lo), ncclSuccess);
    for (int k = 0; k < 6; ++k)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(bufs[k][i], static_cast<float>(n * (n - 1) / 2 + n * (k + static_cast<int>(i % 3)))) << k;
    ASSERT_EQ(meshcclStreamDestroy(hi), ncclSuccess);
    ASSERT_EQ(meshcclStreamDestroy(lo), ncclSuccess);
  });
}

// In place, AlltoAll must not overwrite blocks it has yet to send: on the
// direct path and on the pairwise plan.
TEST(Direct, AlltoAllInPlace) {
  for (const char* algo : {"alltoall:direct_shm", "alltoall:pairwise"}) {
    ScopedEnv env({{"MESHCCL_ALGO", algo}});
    for (int n : {1, 2, 3, 4}) {
      run_ranks(n, [n, algo](ncclComm_t comm, int rank) {
        for (size_t count : {size_t{1}, size_t{333}}) {
          std::vector<float> buf(count * n);
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < count; ++i) buf[p * count + i] = in(rank * n + p, i);
          ASSERT_EQ(ncclAlltoAll(buf.data(), buf.data(), count, ncclFloat32, comm, nullptr), ncclSuccess)
              << ncclGetLastError(comm);
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(buf[p * count + i], in(p * n + rank, i)) << algo << " n=" << n << " from " << p << " i=" << i;
        }
      });
    }
  }
}

// Inputs in ncclMemAlloc memory are read by the peers in place (no copy into
// the slot); a rank may reuse its buffer as soon as its call returns. Rank 1
// uses plain memory, so both kinds of input meet in every round.
TEST(Direct, RegisteredBuffersReadInPlace) {
  ScopedEnv env({{"MESHCCL_DIRECT_SLOT_BYTES", "65536"}, {"MESHCCL_ALGO", "direct_shm"}});
  for (int n : {2, 3}) {
    run_ranks(n, [n](ncclComm_t comm, int rank) {
      const size_t count = 50000;  // several rounds, the last one short
      const size_t total = count * n;
      float *send = nullptr, *recv = nullptr;
      std::vector<float> plain_send, plain_recv;
      if (rank == 1) {
        plain_send.resize(total);
        plain_recv.resize(total);
        send = plain_send.data();
        recv = plain_recv.data();
      } else {
        ASSERT_EQ(ncclMemAlloc(reinterpret_cast<void**>(&send), total * sizeof(float)), ncclSuccess);
        ASSERT_EQ(ncclMemAlloc(reinterpret_cast<void**>(&recv), total * sizeof(float)), ncclSuccess);
      }
      auto v = [](int r, size_t i, int it) { return static_cast<float>((r * 13 + i * 7 + it * 5) % 17); };
      for (int it = 0; it < 3; ++it) {
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
        // Overwrite at once: a peer still reading it would see garbage.
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += v(r, i, it);
          ASSERT_EQ(recv[i], want) << "AllReduce it=" << it << " i=" << i;
        }
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclAllGather(send, recv, count, ncclFloat32, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[r * count + i], v(r, i, it)) << "AllGather";
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclAlltoAll(send, recv, count, ncclFloat32, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[p * count + i], v(p, rank * count + i, it)) << "AlltoAll";
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclReduceScatter(send, recv, count, ncclFloat32, ncclMax, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want = std::max(want, v(r, rank * count + i, it));
          ASSERT_EQ(recv[i], want) << "ReduceScatter";
        }
        const int root = it % n;
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclBroadcast(send, recv, count, ncclFloat32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[i], v(root, i, it)) << "Broadcast";
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclScatter(send, recv, count, ncclFloat32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[i], v(root, rank * count + i, it)) << "Scatter";
        for (size_t i = 0; i < total; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclGather(send, recv, count, ncclFloat32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < total; ++i) send[i] = -1000;
        if (rank == root)
          for (int r = 0; r < n; ++r)
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[r * count + i], v(r, i, it)) << "Gather";
        // In place.
        for (size_t i = 0; i < count; ++i) send[i] = v(rank, i, it);
        ASSERT_EQ(ncclAllReduce(send, send, count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += v(r, i, it);
          ASSERT_EQ(send[i], want) << "AllReduce in place";
        }
      }
      if (rank != 1) {
        EXPECT_EQ(ncclMemFree(send), ncclSuccess);
        EXPECT_EQ(ncclMemFree(recv), ncclSuccess);
      }
    });
  }
}

// One rank calls something else: every rank gets ncclInvalidUsage naming both
// calls, in bounded time, instead of corrupt data or a hang.
TEST(Direct, MismatchedCallsFailEveryRank) {
  ScopedEnv env({{"MESHCCL_TIMEOUT", "20"}});
  struct Case {
    const char* what;
    const char* expect;  // in the message
  };
  const Case cases[] = {{"count", "65 on rank 1"},
                        {"dtype", "int32 on rank 1"},
                        {"op", "max on rank 1"},
                        {"root", "2 on rank 1"},
                        {"collective", "Broadcast on rank 1"}};
  for (const Case& c : cases) {
    const int n = 3;
    run_ranks(n, [&c](ncclComm_t comm, int rank) {
      std::vector<float> buf(128, 1.f);
      size_t count = 64;
      ncclDataType_t dt = ncclFloat32;
      ncclRedOp_t op = ncclSum;
      int root = 0;
      std::string w = c.what;
      const bool odd = rank == 1;
      if (odd && w == "count") count = 65;
      if (odd && w == "dtype") dt = ncclInt32;
      if (odd && w == "op") op = ncclMax;
      if (odd && w == "root") root = 2;
      ncclResult_t res;
      if (w == "root" || w == "collective") {
        res = odd && w == "collective" ? ncclBroadcast(buf.data(), buf.data(), count, dt, root, comm, nullptr)
                                       : ncclReduce(buf.data(), buf.data(), count, dt, op, root, comm, nullptr);
      } else {
        res = ncclAllReduce(buf.data(), buf.data(), count, dt, op, comm, nullptr);
      }
      EXPECT_EQ(res, ncclInvalidUsage) << c.what << " rank " << rank;
      // Every rank saw every header: each message names rank 1's call.
      std::string msg = ncclGetLastError(comm);
      EXPECT_NE(msg.find("mismatched calls across ranks"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    });
  }
}

// A small Broadcast's root waits for no peer and returns at once; a peer
// compares itself with the root only. Ranks 0 and 1 call it with root 0, rank
// 2 with root 2 (so it too is a root that compares with nobody): rank 1
// matches its root and may succeed; both roots find the difference at their
// next call at the latest, and rank 1 at its next wait on them (its next
// AllReduce may still succeed: the roots called that one alike). Every rank
// ends with ncclInvalidUsage, and rank 1 never takes the wrong root's data.
TEST(Direct, RootsLearnOfAMismatchAtTheirNextCall) {
  ScopedEnv env({{"MESHCCL_TIMEOUT", "20"}});
  const int n = 3;
  for (int rep = 0; rep < 5; ++rep) {
    run_ranks(n, [](ncclComm_t comm, int rank) {
      std::vector<float> buf(16, static_cast<float>(rank + 1));
      const int root = rank == 2 ? 2 : 0;
      ncclResult_t res = ncclBroadcast(buf.data(), buf.data(), buf.size(), ncclFloat32, root, comm, nullptr);
      if (res == ncclSuccess && rank == 1) EXPECT_EQ(buf[0], 1.f) << "rank 1 takes its root's data";
      int calls = 1;
      for (; res == ncclSuccess && calls < 3; ++calls) {
        int v = 1;
        res = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr);
        if (res == ncclSuccess) EXPECT_EQ(v, 3);
      }
      const std::string msg = ncclGetLastError(comm);
      EXPECT_EQ(res, ncclInvalidUsage) << "rank " << rank << " after " << calls << " calls: " << msg;
      if (rank != 1) EXPECT_LE(calls, 2) << "a root learns at its next call";
      EXPECT_NE(msg.find("mismatched calls across ranks"), std::string::npos) << msg;
      if (msg.find("found them") == std::string::npos)
        EXPECT_NE(msg.find("root is"), std::string::npos) << "names the difference: " << msg;
    });
  }
}

// Small Broadcasts and Scatters let their roots run up to kRunAhead rounds
// ahead of the slowest peer: a long stream of them of varying sizes (the root
// changing every 300 calls, more than kRunAhead, so that it does run ahead
// that far), mixed with AllReduces
// (which wait for everyone) and Broadcasts too large for the header, delivers
// every value to every rank. (With a bound past kRing it fails.)
TEST(Direct, RootsRunningAheadDeliverEveryValue) {
  for (int n : {2, 3, 5}) {
    run_ranks(n, [n](ncclComm_t comm, int rank) {
      std::vector<int32_t> buf(4096), piece(64);
      static_assert(kRunAhead < 300);
      for (int it = 0; it < 900; ++it) {
        const int root = (it / 300 + 1) % n;
        const size_t count = it % 50 == 49 ? 1000 : 1 + static_cast<size_t>(it * 13) % 240;
        for (size_t i = 0; i < count; ++i) buf[i] = rank == root ? static_cast<int32_t>(it * 1000 + i) : -1;
        ASSERT_EQ(ncclBroadcast(buf.data(), buf.data(), count, ncclInt32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], static_cast<int32_t>(it * 1000 + i)) << "it " << it;
        if (it % 3 == 0) {
          const size_t per = 1 + static_cast<size_t>(it) % 7;
          for (size_t i = 0; i < per * static_cast<size_t>(n); ++i) buf[i] = static_cast<int32_t>(it + i);
          ASSERT_EQ(ncclScatter(buf.data(), piece.data(), per, ncclInt32, root, comm, nullptr), ncclSuccess);
          for (size_t i = 0; i < per; ++i)
            ASSERT_EQ(piece[i], static_cast<int32_t>(it + static_cast<size_t>(rank) * per + i)) << "Scatter it " << it;
        }
        if (it % 150 == 0) {
          int32_t v = rank + it;
          ASSERT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
          ASSERT_EQ(v, n * (n - 1) / 2 + n * it);
        }
      }
    });
  }
}

// An empty call (count 0) waits for nobody: its rank publishes its signature
// and returns, and compares its peers' later. Long runs of them, of every
// collective, between calls that move data (more than a header ring's worth
// in a row, so that ranks run ahead and the headers are reused) leave every
// result right.
TEST(Direct, EmptyCallsInterleavedWithDataCalls) {
  for (int n : {2, 3}) {
    run_ranks(n, [n](ncclComm_t comm, int rank) {
      std::vector<int32_t> buf(64 * 8), out(64 * 8);
      for (int it = 0; it < 6; ++it) {
        const int empties = it == 3 ? 150 : 1 + it * 7;
        for (int e = 0; e < empties; ++e) {
          const int root = e % n;
          ncclResult_t r = ncclSuccess;
          switch (e % 7) {
            case 0: r = ncclAllReduce(buf.data(), out.data(), 0, ncclInt32, ncclSum, comm, nullptr); break;
            case 1: r = ncclBroadcast(buf.data(), out.data(), 0, ncclInt32, root, comm, nullptr); break;
            case 2: r = ncclAllGather(buf.data(), out.data(), 0, ncclInt32, comm, nullptr); break;
            case 3: r = ncclReduceScatter(buf.data(), out.data(), 0, ncclInt32, ncclMax, comm, nullptr); break;
            case 4: r = ncclAlltoAll(buf.data(), out.data(), 0, ncclInt32, comm, nullptr); break;
            case 5: r = ncclReduce(buf.data(), out.data(), 0, ncclInt32, ncclSum, root, comm, nullptr); break;
            default: r = ncclGather(buf.data(), out.data(), 0, ncclInt32, root, comm, nullptr); break;
          }
          ASSERT_EQ(r, ncclSuccess) << "empty call " << e << ": " << ncclGetLastError(comm);
        }
        int32_t v = rank + it;
        ASSERT_EQ(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess) << ncclGetLastError(comm);
        ASSERT_EQ(v, n * (n - 1) / 2 + n * it);
        const int root = it % n;
        for (size_t i = 0; i < 7; ++i) buf[i] = rank == root ? static_cast<int32_t>(it * 100 + i) : -1;
        ASSERT_EQ(ncclBroadcast(buf.data(), buf.data(), 7, ncclInt32, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < 7; ++i) ASSERT_EQ(buf[i], static_cast<int32_t>(it * 100 + i));
      }
    });
  }
}

// A mismatch that involves an empty call still fails every rank naming the
// difference: against a call with a count (the ranks with a count fail at
// that call, the empty one at its next call), and between empty calls alone
// (each rank compares the others' headers later: at its next call that waits
// for peers, or within the next kRunAhead rounds when it makes only empty
// calls).
TEST(Direct, MismatchedEmptyCallsFailEveryRank) {
  ScopedEnv env({{"MESHCCL_TIMEOUT", "20"}});
  const int n = 3;
  for (int mode = 0; mode < 3; ++mode) {
    run_ranks(n, [mode](ncclComm_t comm, int rank) {
      std::vector<float> buf(16, 1.f);
      const bool odd = rank == 1;
      ncclResult_t res;
      if (mode == 0) {  // an empty call against calls with a count
        res = ncclAllReduce(buf.data(), buf.data(), odd ? 0 : 4, ncclFloat32, ncclSum, comm, nullptr);
      } else {  // empty calls whose datatypes differ
        res = ncclAllReduce(buf.data(), buf.data(), 0, odd ? ncclInt32 : ncclFloat32, ncclSum, comm, nullptr);
      }
      int calls = 1;
      // mode 1: then a call that waits for peers; mode 2: only empty calls.
      const int most = kRunAhead + 1;
      for (; res == ncclSuccess && calls < most + 10; ++calls)
        res = mode == 2 ? ncclAllGather(buf.data(), buf.data(), 0, ncclFloat32, comm, nullptr)
                        : ncclAllReduce(buf.data(), buf.data(), 4, ncclFloat32, ncclSum, comm, nullptr);
      const std::string msg = ncclGetLastError(comm);
      EXPECT_EQ(res, ncclInvalidUsage) << "mode " << mode << " rank " << rank << " after " << calls << ": " << msg;
      EXPECT_NE(msg.find("mismatched calls across ranks"), std::string::npos) << msg;
      if (mode != 2) EXPECT_LE(calls, 2) << "mode " << mode << " rank " << rank << ": " << msg;
      else EXPECT_LE(calls, most) << "rank " << rank << ": " << msg;
      if (msg.find("found them") == std::string::npos)
        EXPECT_NE(msg.find(mode == 0 ? "count is" : "datatype is"), std::string::npos) << msg;
    });
  }
}

}  // namespace
