// Resharding over real communicators: every dtype, every strategy, ranks in
// both meshes, one or neither, plans reused, host streams, point-to-point
// order kept, bad arguments refused on every rank; ranks as threads of one
// process (one host) and as processes on emulated hosts (MESHCCL_HOSTID).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "tests/common/harness.h"

namespace {

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

size_t dtype_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

meshcclShardSpec_t spec(std::initializer_list<std::vector<int>> dims) {
  meshcclShardSpec_t s{};
  s.ndims = static_cast<int>(dims.size());
  int d = 0;
  for (const auto& axes : dims) {
    s.dims[d].naxes = static_cast<int>(axes.size());
    for (size_t a = 0; a < axes.size(); ++a) s.dims[d].axes[a] = axes[a];
    ++d;
  }
  return s;
}

// Byte b of global element e, for a given round: any dtype's bits will do,
// the data is only moved.
unsigned char byte_of(size_t e, size_t b, int round) {
  return static_cast<unsigned char>(e * 131 + b * 7 + round * 29 + 1);
}

// The dense tile of (mesh, spec) on rank, filled with the global pattern.
std::vector<unsigned char> tile(const meshcclMesh_t& m, const meshcclShardSpec_t& s, const std::vector<size_t>& shape,
                                int rank, size_t es, int round, bool* member) {
  size_t off[8], ext[8];
  *member = meshcclShardTile(&m, &s, shape.data(), rank, off, ext) == ncclSuccess;
  if (!*member) return {};
  const int nd = static_cast<int>(shape.size());
  size_t n = 1;
  for (int d = 0; d < nd; ++d) n *= ext[d];
  std::vector<unsigned char> out(n * es);
  std::vector<size_t> c(nd, 0);
  for (size_t i = 0; i < n; ++i) {
    size_t g = 0;
    for (int d = 0; d < nd; ++d) g = g * shape[d] + off[d] + c[d];
    for (size_t b = 0; b < es; ++b) out[i * es + b] = byte_of(g, b, round);
    for (int d = nd - 1; d >= 0; --d) {
      if (++c[d] < ext[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

struct Case {
  std::vector<int> smesh_shape, dmesh_shape;
  std::vector<int> sranks, dranks;
  meshcclShardSpec_t sspec, dspec;
  std::vector<size_t> shape;
};

meshcclMesh_t as_mesh(const std::vector<int>& shape, const std::vector<int>& ranks) {
  meshcclMesh_t m{};
  m.ndims = static_cast<int>(shape.size());
  for (size_t a = 0; a < shape.size(); ++a) m.shape[a] = shape[a];
  m.ranks = ranks.data();
  return m;
}

// Runs one case on this rank: plan, `rounds` reshards (odd rounds on a host
// stream), checks. Returns an empty string or what went wrong.
std::string run_case(ncclComm_t comm, int rank, const Case& c, ncclDataType_t dt, meshcclReshardStrategy_t st,
                     int rounds) {
  const meshcclMesh_t sm = as_mesh(c.smesh_shape, c.sranks), dm = as_mesh(c.dmesh_shape, c.dranks);
  meshcclReshardConfig_t cfg = MESHCCL_RESHARD_CONFIG_INITIALIZER;
  cfg.strategy = st;
  meshcclReshardPlan_t plan = nullptr;
  ncclResult_t r = meshcclReshardPlanCreate(&sm, &c.sspec, &dm, &c.dspec, c.shape.data(), dt, comm, &cfg, &plan);
  if (r != ncclSuccess) return std::string("plan: ") + ncclGetLastError(comm);
  meshcclReshardInfo_t info{};
  if (meshcclReshardPlanGetInfo(plan, &info) != ncclSuccess) return "info";
  if (st != meshcclReshardAuto && info.strategy != st) return "strategy not forced";
  const size_t es = dtype_bytes(dt);
  meshcclStream_t stream = nullptr;
  if (meshcclStreamCreate(&stream) != ncclSuccess) return "stream";
  std::string err;
  for (int round = 0; round < rounds && err.empty(); ++round) {
    bool in_src = false, in_dst = false;
    std::vector<unsigned char> send = tile(sm, c.sspec, c.shape, rank, es, round, &in_src);
    std::vector<unsigned char> want = tile(dm, c.dspec, c.shape, rank, es, round, &in_dst);
    if (in_src && info.sendCount * es != send.size()) return "sendCount";
    if (in_dst && info.recvCount * es != want.size()) return "recvCount";
    std::vector<unsigned char> got(want.size(), 0xEE);
    cudaStream_t s = round % 2 ? meshcclStreamAsCuda(stream) : nullptr;
    r = meshcclReshard(plan, in_src ? send.data() : nullptr, in_dst ? got.data() : nullptr, s);
    if (r == ncclSuccess && s != nullptr) r = meshcclStreamSynchronize(stream);
    if (r != ncclSuccess) err = std::string("reshard: ") + ncclGetLastError(comm);
    else if (got != want) err = "round " + std::to_string(round) + ": wrong tile";
  }
  meshcclStreamDestroy(stream);
  meshcclReshardPlanDestroy(plan);
  return err;
}

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
                                 ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
const meshcclReshardStrategy_t kStrategies[] = {meshcclReshardSendRecv, meshcclReshardSendRecvAllGather,
                                                meshcclReshardBroadcast, meshcclReshardAuto};

// 7 ranks: source (2,2) on 0..3, destination (3) on 3..5 (rank 3 in both),
// rank 6 in neither; uneven dims.
Case mixed_case() {
  return Case{{2, 2}, {3}, {0, 1, 2, 3}, {5, 4, 3}, spec({{0}, {}, {1}}), spec({{}, {0}, {}}), {57, 25, 9}};
}

TEST(ReshardComm, EveryDtypeEveryStrategyThreads) {
  ScopedEnv env({{"MESHCCL_CHUNKSIZE", "4096"}});  // the smallest chunk: several per slice
  const Case c = mixed_case();
  run_ranks(7, [&](ncclComm_t comm, int rank) {
    for (ncclDataType_t dt : kTypes)
      for (meshcclReshardStrategy_t st : kStrategies)
        EXPECT_EQ(run_case(comm, rank, c, dt, st, 2), "") << "rank " << rank << " dtype " << dt << " strategy " << st;
  });
}

TEST(ReshardComm, ReplicatedToShardedAndBackThreads) {
  // One-to-many and many-to-one, an empty tile, a 1-d mesh on 3-d.
  const std::vector<Case> cases{
      {{1}, {2, 2}, {0}, {1, 2, 3, 4}, spec({{}, {}}), spec({{}, {}}), {33, 9}},     // one to many, replicated
      {{2, 2}, {1}, {0, 1, 2, 3}, {4}, spec({{0, 1}, {}}), spec({{}, {}}), {3, 2}},  // an empty source tile
      {{2, 2}, {2, 2}, {0, 1, 2, 3}, {4, 3, 2, 1}, spec({{1}, {0}}), spec({{0}, {1}}), {6, 10}},  // same ranks
      {{5}, {5}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, spec({{0}, {}}), spec({{}, {0}}), {11, 13}},   // all-to-all
  };
  run_ranks(5, [&](ncclComm_t comm, int rank) {
    for (size_t i = 0; i < cases.size(); ++i)
      for (meshcclReshardStrategy_t st : kStrategies)
        EXPECT_EQ(run_case(comm, rank, cases[i], ncclFloat32, st, 3), "") << "case " << i << " rank " << rank;
  });
}

// A reshard takes its place in each pair's point-to-point order: sends
// before and after it still match.
TEST(ReshardComm, KeepsPointToPointOrder) {
  const Case c{{1}, {1}, {0}, {1}, spec({{}}), spec({{}}), {1000}};
  run_ranks(2, [&](ncclComm_t comm, int rank) {
    std::vector<int> a(100, rank == 0 ? 7 : 0), b(100, rank == 0 ? 9 : 0);
    const int peer = 1 - rank;
    if (rank == 0) ASSERT_EQ(ncclSend(a.data(), 100, ncclInt32, peer, comm, nullptr), ncclSuccess);
    else ASSERT_EQ(ncclRecv(a.data(), 100, ncclInt32, peer, comm, nullptr), ncclSuccess);
    EXPECT_EQ(run_case(comm, rank, c, ncclInt32, meshcclReshardSendRecv, 2), "");
    if (rank == 0) ASSERT_EQ(ncclSend(b.data(), 100, ncclInt32, peer, comm, nullptr), ncclSuccess);
    else ASSERT_EQ(ncclRecv(b.data(), 100, ncclInt32, peer, comm, nullptr), ncclSuccess);
    EXPECT_EQ(a[99], 7);
    EXPECT_EQ(b[99], 9);
  });
}

// Bad arguments: every rank fails, with the problem named.
TEST(ReshardComm, BadSpecsFailOnEveryRank) {
  struct Bad {
    meshcclShardSpec_t s;
    std::vector<int> ranks;
    std::vector<int> shape;
    int dst_ndims;
    const char* words;
  };
  const std::vector<Bad> bads{
      {spec({{0}, {0}}), {0, 1, 2, 3}, {2, 2}, 2, "twice"},
      {spec({{0}, {}}), {0, 1, 2, 9}, {2, 2}, 2, "outside the communicator"},
      {spec({{0}, {}}), {0, 1, 2, 3}, {2, 2}, 1, "dimensions"},
      {spec({{2}, {}}), {0, 1, 2, 3}, {2, 2}, 2, "axis 2"},
      {spec({{0}, {}}), {0, 1, 1, 3}, {2, 2}, 2, "twice"},
  };
  run_ranks(4, [&](ncclComm_t comm, int rank) {
    (void)rank;
    const std::vector<size_t> shape{8, 8};
    for (const Bad& b : bads) {
      const meshcclMesh_t sm = as_mesh(b.shape, b.ranks);
      const std::vector<int> dr{0, 1, 2, 3};
      const meshcclMesh_t dm = as_mesh({4}, dr);
      const meshcclShardSpec_t ds = b.dst_ndims == 2 ? spec({{}, {0}}) : spec({{0}});
      meshcclReshardPlan_t plan = nullptr;
      EXPECT_EQ(meshcclReshardPlanCreate(&sm, &b.s, &dm, &ds, shape.data(), ncclFloat32, comm, nullptr, &plan),
                ncclInvalidArgument);
      // Every rank words the same problem alike; the barrier keeps the next
      // case's message (the last error is process-wide) out of this check.
      EXPECT_NE(std::string(ncclGetLastError(comm)).find(b.words), std::string::npos) << ncclGetLastError(comm);
      EXPECT_EQ(plan, nullptr);
      int one = 1;
      ASSERT_EQ(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    }
    // One rank's arguments differ: every rank is told.
    const std::vector<int> r4{0, 1, 2, 3};
    const meshcclMesh_t m = as_mesh({4}, r4);
    const meshcclShardSpec_t s0 = spec({{0}, {}}), s1 = spec({{}, {0}});
    meshcclReshardPlan_t plan = nullptr;
    EXPECT_EQ(
        meshcclReshardPlanCreate(&m, rank == 2 ? &s1 : &s0, &m, &s1, shape.data(), ncclFloat32, comm, nullptr, &plan),
        ncclInvalidUsage);
    EXPECT_EQ(meshcclReshard(nullptr, nullptr, nullptr, nullptr), ncclInvalidArgument);
  });
}

// A shape whose element count does not fit 64 bits (or holds more than 2^57
// bytes) is refused on every rank; it was taken with a wrapped count and
// crashed later. meshcclShardTile names itself in its errors.
TEST(ReshardComm, ShapesBeyondTheAddressSpaceAreRefused) {
  const std::vector<int> r2{0, 1};
  const meshcclMesh_t m = as_mesh({2}, r2);
  const meshcclShardSpec_t s = spec({{0}, {}});
  const size_t big = size_t{1} << 32;
  run_ranks(2, [&](ncclComm_t comm, int rank) {
    for (const std::vector<size_t>& shape : {std::vector<size_t>{big, big}, std::vector<size_t>{big * 8, big / 2},
                                             std::vector<size_t>{size_t{1} << 40, size_t{1} << 18}}) {
      meshcclReshardPlan_t plan = nullptr;
      EXPECT_EQ(meshcclReshardPlanCreate(&m, &s, &m, &s, shape.data(), ncclFloat32, comm, nullptr, &plan),
                ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("more than 2^57"), std::string::npos)
          << ncclGetLastError(comm);
      EXPECT_EQ(plan, nullptr);
      size_t off[2], ext[2];
      EXPECT_EQ(meshcclShardTile(&m, &s, shape.data(), rank, off, ext), ncclInvalidArgument);
      EXPECT_EQ(std::string(ncclGetLastError(nullptr)).rfind("meshcclShardTile : ", 0), 0u)
          << ncclGetLastError(nullptr);
      int one = 1;
      ASSERT_EQ(ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    }
    // 2^55 float64 elements: countable, but more than 2^57 bytes.
    const std::vector<size_t> wide{size_t{1} << 45, size_t{1} << 10};
    meshcclReshardPlan_t plan = nullptr;
    EXPECT_EQ(meshcclReshardPlanCreate(&m, &s, &m, &s, wide.data(), ncclFloat64, comm, nullptr, &plan),
              ncclInvalidArgument);
    EXPECT_EQ(meshcclShardTile(nullptr, &s, wide.data(), rank, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("meshcclShardTile : the mesh is NULL"), std::string::npos)
        << ncclGetLastError(nullptr);
  });
}

// Ranks as processes on two emulated hosts (socket links between them):
// every dtype and strategy on spec section 1.8's shapes, scaled down.
int child(const ncclUniqueId& id, int n, int rank) {
  setenv("MESHCCL_HOSTID", rank < n / 2 ? "reshard-host-a" : "reshard-host-b", 1);
  setenv("MESHCCL_CHUNKSIZE", "4096", 1);  // the smallest chunk: several per slice
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) return 10;
  // (2,2) meshes spanning both hosts, and (1,4) host to host.
  const std::vector<Case> cases{
      {{2, 2}, {2, 2}, {0, 1, 4, 5}, {2, 3, 6, 7}, spec({{0}, {}, {}}), spec({{0}, {}, {}}), {9, 4, 48}},
      {{2, 2}, {2, 2}, {0, 1, 4, 5}, {2, 3, 6, 7}, spec({{}, {0}, {}}), spec({{}, {}, {0}}), {4, 7, 80}},
      {{1, 4}, {2, 2}, {0, 1, 2, 3}, {4, 5, 6, 7}, spec({{1}, {}, {}}), spec({{}, {}, {}}), {10, 3, 32}},
      {{1}, {1, 4}, {0}, {4, 5, 6, 7}, spec({{}, {}, {}}), spec({{}, {}, {}}), {5, 5, 80}},
  };
  {
    // The hosts are real to the plan: case 2 moves its data between them.
    const Case& c = cases[2];
    const meshcclMesh_t sm = as_mesh(c.smesh_shape, c.sranks), dm = as_mesh(c.dmesh_shape, c.dranks);
    meshcclReshardPlan_t plan = nullptr;
    meshcclReshardInfo_t info{};
    if (meshcclReshardPlanCreate(&sm, &c.sspec, &dm, &c.dspec, c.shape.data(), ncclInt32, comm, nullptr, &plan) !=
            ncclSuccess ||
        meshcclReshardPlanGetInfo(plan, &info) != ncclSuccess || info.bytesNetwork == 0 || info.lowerBoundUs <= 0)
      return 15;
    meshcclReshardPlanDestroy(plan);
  }
  for (size_t i = 0; i < cases.size(); ++i)
    for (ncclDataType_t dt : kTypes)
      for (meshcclReshardStrategy_t st : kStrategies) {
        const std::string e = run_case(comm, rank, cases[i], dt, st, 2);
        if (!e.empty()) {
          std::fprintf(stderr, "rank %d case %zu dtype %d strategy %d: %s\n", rank, i, dt, st, e.c_str());
          return 20;
        }
      }
  if (ncclCommDestroy(comm) != ncclSuccess) return 30;
  return 0;
}

TEST(ReshardComm, EmulatedHostsProcesses) {
  const int n = 8;
  ScopedEnv env({{"MESHCCL_TIMEOUT", "30"}});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(child(id, n, r));
    kids.push_back(pid);
  }
  // Bounded wait: 150 s, then the children are killed.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> status(n, -1);
  int left = n;
  while (left > 0) {
    const bool late = std::chrono::steady_clock::now() - t0 > std::chrono::seconds(150);
    for (int r = 0; r < n; ++r) {
      if (status[r] != -1) continue;
      if (late) kill(kids[r], SIGKILL);
      int st = 0;
      if (waitpid(kids[r], &st, late ? 0 : WNOHANG) == kids[r]) status[r] = st, --left;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "rank " << r << " status " << status[r];
}

}  // namespace
