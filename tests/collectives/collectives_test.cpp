// Correctness matrix for every collective and every algorithm of it, forced
// in turn with MESHCCL_ALGO: ranks 1..8 (threads of one process, real
// transports), counts 0/1/primes/non-multiples/large, every datatype and
// reduction, roots other than 0, in-place and out-of-place. Inputs are small
// integers so every datatype holds them exactly; expected values are computed
// independently on each rank. The full datatype x reduction product runs up
// to 5 ranks; at 7 and 8 every reduction on representative types and every
// type with sum, which keeps the suite to tens of seconds on 2 cores.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/common/harness.h"
#include "tests/common/typed_values.h"

using namespace meshccl_test;

namespace {

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
                                 ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
enum Red { kSum, kProd, kMax, kMin, kAvg, kPreMul };
const Red kReds[] = {kSum, kProd, kMax, kMin, kAvg, kPreMul};

bool is_signed(ncclDataType_t dt) { return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64 || dt >= ncclFloat16; }

double input(Red red, ncclDataType_t dt, int r, size_t i) {
  switch (red) {
    case kProd: return (r + i) % 5 == 0 ? 2 : 1;
    case kMax:
    case kMin: return static_cast<double>((r * 7 + i * 3) % 11) - (is_signed(dt) ? 5 : 0);
    default: return static_cast<double>((r + 2 * i) % 3);
  }
}

double scalar_of(int r) { return 1 + (r % 2); }

double expected(Red red, ncclDataType_t dt, int n, size_t i) {
  double acc = red == kProd ? 1 : (red == kMax ? -1e30 : red == kMin ? 1e30 : 0);
  for (int r = 0; r < n; ++r) {
    double v = stored(dt, input(red, dt, r, i));
    switch (red) {
      case kProd: acc = stored(dt, acc * v); break;
      case kMax: acc = v > acc ? v : acc; break;
      case kMin: acc = v < acc ? v : acc; break;
      case kPreMul: acc += stored(dt, scalar_of(r) * v); break;
      default: acc += v;
    }
  }
  if (red == kAvg) acc = is_float(dt) ? acc / n : static_cast<double>(static_cast<int64_t>(acc) / n);
  return red == kProd || red == kMax || red == kMin || !is_float(dt) ? stored(dt, acc) : acc;
}

ncclRedOp_t make_op(Red red, ncclDataType_t dt, int rank, ncclComm_t comm) {
  switch (red) {
    case kSum: return ncclSum;
    case kProd: return ncclProd;
    case kMax: return ncclMax;
    case kMin: return ncclMin;
    case kAvg: return ncclAvg;
    case kPreMul: {
      unsigned char s[8];
      encode(dt, scalar_of(rank), s);
      ncclRedOp_t op;
      EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, s, dt, ncclScalarHostImmediate, comm), ncclSuccess);
      return op;
    }
  }
  return ncclSum;
}

// MESHCCL_ALGO for the ranks of one test: set before they start (it is read
// when their communicators are created), restored after they joined.
struct ScopedAlgo : ScopedEnv {
  explicit ScopedAlgo(const std::string& spec) : ScopedEnv({{"MESHCCL_ALGO", spec}}) {}
};

// The (datatype, reduction) pairs checked at n ranks.
std::vector<std::pair<ncclDataType_t, Red>> type_ops(int n) {
  std::vector<std::pair<ncclDataType_t, Red>> out;
  const bool full = n <= 5;
  for (ncclDataType_t dt : kTypes)
    for (Red red : kReds) {
      const bool family_rep =
          dt == ncclInt8 || dt == ncclUint64 || dt == ncclFloat32 || dt == ncclBfloat16 || dt == ncclFloat8e4m3;
      if (full || family_rep || red == kSum) out.emplace_back(dt, red);
    }
  return out;
}

struct Buf {
  ncclDataType_t dt;
  std::vector<unsigned char> bytes;
  Buf(ncclDataType_t t, size_t n) : dt(t), bytes(n * esize(t) + 1) {}
  void* ptr(size_t elem = 0) { return bytes.data() + elem * esize(dt); }
  double get(size_t i) const { return decode(dt, bytes.data() + i * esize(dt)); }
  void set(size_t i, double v) { encode(dt, v, bytes.data() + i * esize(dt)); }
};

std::vector<size_t> counts_for(int n) {
  std::vector<size_t> c = {0, 1, 7, 1021, static_cast<size_t>(n) * 97 + 3};
  return c;
}

void check_allreduce(ncclComm_t comm, int n, int rank, bool in_place) {
  for (auto [dt, red] : type_ops(n)) {
    for (size_t count : counts_for(n)) {
      Buf send(dt, count), recv(dt, count);
      for (size_t i = 0; i < count; ++i) send.set(i, input(red, dt, rank, i));
      Buf& out = in_place ? send : recv;
      ncclRedOp_t op = make_op(red, dt, rank, comm);
      ASSERT_EQ(ncclAllReduce(send.ptr(), out.ptr(), count, dt, op, comm, nullptr), ncclSuccess)
          << ncclGetLastError(nullptr);
      if (red == kPreMul) ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
      for (size_t i = 0; i < count; ++i)
        ASSERT_TRUE(close(dt, out.get(i), expected(red, dt, n, i), n))
            << "AllReduce n=" << n << " dt=" << dt << " red=" << red << " count=" << count << " i=" << i << " got "
            << out.get(i) << " want " << expected(red, dt, n, i) << (in_place ? " in-place" : "");
    }
  }
}

void check_reduce_scatter(ncclComm_t comm, int n, int rank, bool in_place) {
  for (ncclDataType_t dt : {ncclInt32, ncclFloat32, ncclBfloat16, ncclFloat8e4m3, ncclUint64}) {
    for (Red red : kReds) {
      for (size_t rc : {size_t{0}, size_t{1}, size_t{13}, size_t{1000}}) {
        Buf send(dt, rc * n), recv(dt, rc);
        for (size_t i = 0; i < rc * n; ++i) send.set(i, input(red, dt, rank, i));
        void* out = in_place ? send.ptr(rank * rc) : recv.ptr();
        ncclRedOp_t op = make_op(red, dt, rank, comm);
        ASSERT_EQ(ncclReduceScatter(send.ptr(), out, rc, dt, op, comm, nullptr), ncclSuccess)
            << ncclGetLastError(nullptr);
        if (red == kPreMul) ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
        const Buf& ob = in_place ? send : recv;
        size_t off = in_place ? rank * rc : 0;
        for (size_t i = 0; i < rc; ++i)
          ASSERT_TRUE(close(dt, ob.get(off + i), expected(red, dt, n, rank * rc + i), n))
              << "ReduceScatter n=" << n << " dt=" << dt << " red=" << red << " rc=" << rc << " i=" << i;
      }
    }
  }
}

void check_reduce(ncclComm_t comm, int n, int rank, bool in_place) {
  for (ncclDataType_t dt : {ncclInt8, ncclFloat16, ncclFloat64}) {
    for (Red red : kReds) {
      for (int root : {0, n - 1, n / 2}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{1021}}) {
          Buf send(dt, count), recv(dt, count);
          for (size_t i = 0; i < count; ++i) {
            send.set(i, input(red, dt, rank, i));
            recv.set(i, 99);
          }
          Buf& out = in_place ? send : recv;
          ncclRedOp_t op = make_op(red, dt, rank, comm);
          ASSERT_EQ(ncclReduce(send.ptr(), out.ptr(), count, dt, op, root, comm, nullptr), ncclSuccess);
          if (red == kPreMul) ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
          for (size_t i = 0; i < count; ++i) {
            // Only the root's output changes.
            double want = rank == root ? expected(red, dt, n, i)
                                       : (in_place ? stored(dt, input(red, dt, rank, i)) : stored(dt, 99));
            ASSERT_TRUE(close(dt, out.get(i), want, n))
                << "Reduce n=" << n << " root=" << root << " red=" << red << " count=" << count << " i=" << i;
          }
        }
      }
    }
  }
}

double pattern(int r, size_t i) { return static_cast<double>((r * 31 + i * 7) % 100); }

void check_broadcast(ncclComm_t comm, int n, int rank, bool in_place) {
  for (ncclDataType_t dt : {ncclFloat32, ncclInt8, ncclBfloat16}) {
    for (size_t count : counts_for(n)) {
      for (int root : {0, n - 1, n / 2}) {
        Buf send(dt, count), recv(dt, count);
        for (size_t i = 0; i < count; ++i) send.set(i, rank == root ? pattern(root, i) : -1);
        Buf& out = in_place ? send : recv;
        ASSERT_EQ(ncclBroadcast(send.ptr(), out.ptr(), count, dt, root, comm, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(out.get(i), stored(dt, pattern(root, i))) << "Broadcast n=" << n << " root " << root << " i=" << i;
      }
    }
  }
}

void check_data_movement(ncclComm_t comm, int n, int rank, bool in_place) {
  const ncclDataType_t dt = ncclFloat32;
  for (size_t count : counts_for(n)) {
    {  // AllGather
      Buf send(dt, count), recv(dt, count * n);
      void* src = send.ptr();
      if (in_place) src = recv.ptr(rank * count);
      for (size_t i = 0; i < count; ++i) encode(dt, pattern(rank, i), static_cast<char*>(src) + i * 4);
      ASSERT_EQ(ncclAllGather(src, recv.ptr(), count, dt, comm, nullptr), ncclSuccess);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv.get(r * count + i), pattern(r, i)) << "AllGather";
    }
    {  // AlltoAll
      Buf send(dt, count * n), recv(dt, count * n);
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < count; ++i) send.set(p * count + i, pattern(rank * n + p, i));
      Buf& out = in_place ? send : recv;
      ASSERT_EQ(ncclAlltoAll(send.ptr(), out.ptr(), count, dt, comm, nullptr), ncclSuccess);
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(out.get(p * count + i), pattern(p * n + rank, i)) << "AlltoAll";
    }
    for (int root : {0, n - 1}) {  // Gather
      Buf send(dt, count), recv(dt, count * n);
      void* src = send.ptr();
      if (in_place && rank == root) src = recv.ptr(root * count);
      for (size_t i = 0; i < count; ++i) encode(dt, pattern(rank, i), static_cast<char*>(src) + i * 4);
      ASSERT_EQ(ncclGather(src, recv.ptr(), count, dt, root, comm, nullptr), ncclSuccess);
      if (rank == root)
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv.get(r * count + i), pattern(r, i)) << "Gather";
    }
    for (int root : {0, n - 1}) {  // Scatter
      Buf send(dt, count * n), recv(dt, count);
      if (rank == root)
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) send.set(r * count + i, pattern(r, i));
      void* dst = (in_place && rank == root) ? send.ptr(root * count) : recv.ptr();
      ASSERT_EQ(ncclScatter(send.ptr(), dst, count, dt, root, comm, nullptr), ncclSuccess);
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(decode(dt, static_cast<char*>(dst) + i * 4), pattern(rank, i)) << "Scatter";
    }
  }
}

const int kRankCounts[] = {1, 2, 3, 4, 5, 7, 8};
std::string ranks_name(int n) { return "n" + std::to_string(n); }

// One algorithm forced for the collectives it implements.
using AlgoCase = std::tuple<int, std::string>;
std::string case_name(const ::testing::TestParamInfo<AlgoCase>& info) {
  return ranks_name(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
}

class AllReduceAlgos : public ::testing::TestWithParam<AlgoCase> {};

TEST_P(AllReduceAlgos, Matrix) {
  const auto& [n, algo] = GetParam();
  ScopedAlgo forced("allreduce:" + algo);
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    check_allreduce(comm, n, rank, false);
    check_allreduce(comm, n, rank, true);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceAlgos,
                         ::testing::Combine(::testing::ValuesIn(kRankCounts),
                                            ::testing::Values("ring", "tree", "halving_doubling", "recursive_doubling",
                                                              "direct_shm")),
                         case_name);

// Reduce and Broadcast share their algorithm names.
class RootedAlgos : public ::testing::TestWithParam<AlgoCase> {};

TEST_P(RootedAlgos, ReduceAndBroadcast) {
  const auto& [n, algo] = GetParam();
  ScopedAlgo forced("reduce:" + algo + ";broadcast:" + algo);
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    for (bool ip : {false, true}) {
      check_reduce(comm, n, rank, ip);
      check_broadcast(comm, n, rank, ip);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, RootedAlgos,
                         ::testing::Combine(::testing::ValuesIn(kRankCounts),
                                            ::testing::Values("chain", "tree", "direct_shm")),
                         case_name);

// The other collectives: their plans ("plans") or the direct shared-memory
// algorithm, each forced.
class Collectives : public ::testing::TestWithParam<AlgoCase> {};

std::string other_collectives(const std::string& algo) {
  if (algo == "plans") return "reducescatter:ring;allgather:ring;alltoall:pairwise;gather:direct;scatter:direct";
  return "reducescatter:" + algo + ";allgather:" + algo + ";alltoall:" + algo + ";gather:" + algo + ";scatter:" + algo;
}

TEST_P(Collectives, ReduceScatter) {
  const auto& [n, algo] = GetParam();
  ScopedAlgo forced(other_collectives(algo));
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    for (bool ip : {false, true}) check_reduce_scatter(comm, n, rank, ip);
  });
}

TEST_P(Collectives, DataMovement) {
  const auto& [n, algo] = GetParam();
  ScopedAlgo forced(other_collectives(algo));
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    check_data_movement(comm, n, rank, false);
    check_data_movement(comm, n, rank, true);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives,
                         ::testing::Combine(::testing::ValuesIn(kRankCounts), ::testing::Values("plans", "direct_shm")),
                         case_name);

// The hierarchical algorithms on ranks grouped into hosts by a topology file
// (MESHCCL_TOPO_FILE places each rank on a host; the transports stay shared
// memory, the algorithms see the hosts): even, uneven and interleaved layouts
// (tests/cluster runs them on real emulated hosts too: 2x2, 3+1, 2+1+1, 2x4).
struct HostLayout {
  const char* name;
  std::vector<int> host;  // host of each rank
};

// A topology file placing rank r on host[r]; returns its path.
std::string write_hosts_file(const std::string& name, const std::vector<int>& host) {
  int hosts = 0;
  for (int h : host) hosts = std::max(hosts, h + 1);
  std::string xml = "<meshccl_topology version=\"1\">\n";
  for (int h = 0; h < hosts; ++h)
    xml += "  <host name=\"fake" + std::to_string(h) + "\">\n    <numa id=\"0\" cpus=\"0-1\"/>\n  </host>\n";
  for (size_t r = 0; r < host.size(); ++r)
    xml += "  <rank id=\"" + std::to_string(r) + "\" host=\"" + std::to_string(host[r]) + "\" numa=\"0\"/>\n";
  xml += "</meshccl_topology>\n";
  const char* dir = std::getenv("TMPDIR");
  const std::string path =
      std::string(dir != nullptr ? dir : "/tmp") + "/meshccl_hosts_" + name + "_" + std::to_string(getpid()) + ".xml";
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f != nullptr) {
    std::fputs(xml.c_str(), f);
    std::fclose(f);
  }
  return path;
}

class HierAlgos : public ::testing::TestWithParam<HostLayout> {};

TEST_P(HierAlgos, EveryCollective) {
  const HostLayout& l = GetParam();
  const int n = static_cast<int>(l.host.size());
  const std::string file = write_hosts_file(l.name, l.host);
  ScopedEnv env({{"MESHCCL_TOPO_FILE", file},
                 {"MESHCCL_ALGO", "allreduce:hier;allgather:hier;reducescatter:hier;broadcast:hier;reduce:hier"}});
  run_ranks(n, [n](ncclComm_t comm, int rank) {
    for (bool ip : {false, true}) {
      check_allreduce(comm, n, rank, ip);
      check_reduce_scatter(comm, n, rank, ip);
      check_data_movement(comm, n, rank, ip);
      check_reduce(comm, n, rank, ip);
      check_broadcast(comm, n, rank, ip);
    }
  });
  std::remove(file.c_str());
}

// An in-place float sum of `count` elements, rank r contributing
// (r + i) % mod at i, checked element by element.
void check_large_allreduce(ncclComm_t comm, int n, int rank, size_t count, int mod) {
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((rank + i) % mod);
  ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += static_cast<float>((r + i) % mod);
    ASSERT_EQ(buf[i], want) << i;
  }
}

// A large AllReduce: several segments, chunked sub-plans across hosts.
TEST_P(HierAlgos, LargeAllReduce) {
  const HostLayout& l = GetParam();
  const int n = static_cast<int>(l.host.size());
  const std::string file = write_hosts_file(std::string(l.name) + "_large", l.host);
  ScopedEnv env({{"MESHCCL_TOPO_FILE", file}, {"MESHCCL_ALGO", "allreduce:hier"}, {"MESHCCL_CHUNKSIZE", "65536"}});
  const size_t count = (3u << 20) / 4 + 5;
  run_ranks(n, [&](ncclComm_t comm, int rank) { check_large_allreduce(comm, n, rank, count, 5); });
  std::remove(file.c_str());
}

// The ranks of a host that carry AllReduce, AllGather and ReduceScatter
// across hosts (MESHCCL_HIER_CHANNELS): one per rail by default, or as many
// as asked, at most the widest host's ranks; fewer or more than a host's
// ranks (3+2, 2+1+1), around a ring of 2, 3 or 4 hosts.
TEST_P(HierAlgos, EveryChannelCount) {
  const HostLayout& l = GetParam();
  const int n = static_cast<int>(l.host.size());
  const std::string file = write_hosts_file(std::string(l.name) + "_channels", l.host);
  const size_t count = (1u << 20) / 4 + 3;
  for (const char* channels : {"1", "2", "3", "64"}) {
    SCOPED_TRACE(std::string("MESHCCL_HIER_CHANNELS=") + channels);
    ScopedEnv env({{"MESHCCL_TOPO_FILE", file},
                   {"MESHCCL_ALGO", "allreduce:hier;allgather:hier;reducescatter:hier"},
                   {"MESHCCL_CHUNKSIZE", "65536"},
                   {"MESHCCL_HIER_CHANNELS", channels}});
    run_ranks(n, [&](ncclComm_t comm, int rank) {
      for (bool ip : {false, true}) {
        check_allreduce(comm, n, rank, ip);
        check_reduce_scatter(comm, n, rank, ip);
        check_data_movement(comm, n, rank, ip);
      }
      check_large_allreduce(comm, n, rank, count, 7);
    });
  }
  std::remove(file.c_str());
}

INSTANTIATE_TEST_SUITE_P(Hosts, HierAlgos,
                         ::testing::Values(HostLayout{"h2x2_interleaved", {0, 1, 0, 1}},
                                           HostLayout{"h3p1", {0, 0, 0, 1}}, HostLayout{"h2p1p1", {0, 0, 1, 2}},
                                           HostLayout{"h3p2", {0, 1, 0, 1, 0}},
                                           HostLayout{"h4_uneven", {0, 1, 2, 3, 0, 1, 0}},
                                           HostLayout{"h2x4", {0, 0, 0, 0, 1, 1, 1, 1}}),
                         [](const auto& info) { return std::string(info.param.name); });

// Large messages cross the chunking and the rendezvous paths, with every
// algorithm; 3 ranks also take halving-doubling's fold.
using LargeCase = std::tuple<std::string, std::string>;  // collective, algorithm
class LargeAlgos : public ::testing::TestWithParam<LargeCase> {};

TEST_P(LargeAlgos, Over16MiB) {
  const auto& [collective, algo] = GetParam();
  ScopedAlgo forced(collective + ":" + algo);
  const size_t count = (17u << 20) / 4 + 3;
  run_ranks(3, [&, collective = collective](ncclComm_t comm, int rank) {
    auto sum = [](size_t i) { return static_cast<float>(i % 5 + (1 + i) % 5 + (2 + i) % 5); };
    std::vector<float> buf(count), out(count, -1.f);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>((rank + i) % 5);
    if (collective == "allreduce") {
      ASSERT_EQ(ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], sum(i)) << i;
    } else if (collective == "reduce") {
      ASSERT_EQ(ncclReduce(buf.data(), out.data(), count, ncclFloat, ncclSum, 2, comm, nullptr), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], rank == 2 ? sum(i) : -1.f) << i;
    } else {
      std::vector<float> b(count, rank == 1 ? 3.5f : 0.f);
      ASSERT_EQ(ncclBroadcast(b.data(), b.data(), count, ncclFloat, 1, comm, nullptr), ncclSuccess);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(b[i], 3.5f) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LargeAlgos,
                         ::testing::Values(LargeCase{"allreduce", "ring"}, LargeCase{"allreduce", "tree"},
                                           LargeCase{"allreduce", "halving_doubling"},
                                           LargeCase{"allreduce", "recursive_doubling"}, LargeCase{"reduce", "chain"},
                                           LargeCase{"reduce", "tree"}, LargeCase{"broadcast", "chain"},
                                           LargeCase{"broadcast", "tree"}, LargeCase{"allreduce", "direct_shm"},
                                           LargeCase{"reduce", "direct_shm"}, LargeCase{"broadcast", "direct_shm"}),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
