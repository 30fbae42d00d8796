// meshcclSparseAllReduce: both strategies against each other (bitwise, on
// every rank), against ncclAllReduce of the densified tensors, and against a
// rank-order fold computed here; bad arguments fail on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "meshccl.h"
#include "tests/common/harness.h"
#include "tests/common/typed_values.h"

using namespace meshccl_test;

namespace {

struct Input {
  std::vector<int64_t> idx;
  std::vector<double> vals;  // nnz * row_len small integers
};

// Rank r's rows: nnz differing per rank (rank 1 has none), unsorted, with
// duplicates; values small integers in [lo, hi].
Input make_input(int r, size_t rows, size_t row_len, int lo, int hi, unsigned seed) {
  std::mt19937 g(seed * 131 + static_cast<unsigned>(r));
  Input in;
  const size_t nnz = r == 1 ? 0 : (static_cast<size_t>(r) * 3 + 1) % (rows + 2);
  for (size_t k = 0; k < nnz; ++k) in.idx.push_back(static_cast<int64_t>(g() % rows));
  if (nnz >= 2) in.idx.back() = in.idx.front();  // a duplicate
  for (size_t k = 0; k < nnz * row_len; ++k)
    in.vals.push_back(lo + static_cast<int>(g() % static_cast<unsigned>(hi - lo + 1)));
  return in;
}

std::vector<unsigned char> encode_all(ncclDataType_t dt, const std::vector<double>& v) {
  std::vector<unsigned char> out(v.size() * esize(dt));
  for (size_t i = 0; i < v.size(); ++i) encode(dt, v[i], out.data() + i * esize(dt));
  return out;
}

// The densified tensor, duplicates combined with op (sum for avg).
std::vector<double> densify(const Input& in, size_t rows, size_t row_len, ncclRedOp_t op) {
  std::vector<double> d(rows * row_len, 0);
  std::vector<bool> seen(rows, false);
  for (size_t k = 0; k < in.idx.size(); ++k) {
    const size_t r = static_cast<size_t>(in.idx[k]);
    for (size_t e = 0; e < row_len; ++e) {
      double& x = d[r * row_len + e];
      const double v = in.vals[k * row_len + e];
      if (!seen[r]) x = v;
      else if (op == ncclProd) x *= v;
      else if (op == ncclMax) x = std::max(x, v);
      else if (op == ncclMin) x = std::min(x, v);
      else x += v;
    }
    seen[r] = true;
  }
  return d;
}

// Runs the sparse all-reduce (strategy forced by algo) and ncclAllReduce of
// the densified inputs; returns each rank's two results.
void run_case(int n, ncclDataType_t dt, ncclRedOp_t op, size_t rows, size_t row_len, int lo, int hi, const char* algo,
              std::vector<std::vector<unsigned char>>* sparse, std::vector<std::vector<unsigned char>>* dense) {
  ScopedEnv env({{"MESHCCL_SPARSE_ALGO", algo}});
  sparse->assign(static_cast<size_t>(n), {});
  dense->assign(static_cast<size_t>(n), {});
  const size_t bytes = rows * row_len * esize(dt);
  run_ranks(n, [&](ncclComm_t comm, int r) {
    Input in = make_input(r, rows, row_len, lo, hi, static_cast<unsigned>(rows * 7 + row_len));
    auto vals = encode_all(dt, in.vals);
    auto dens = encode_all(dt, densify(in, rows, row_len, op));
    std::vector<unsigned char> out(bytes, 0xa5), ref(bytes, 0x5a);
    ASSERT_EQ(meshcclSparseAllReduce(vals.data(), in.idx.data(), in.idx.size(), out.data(), rows, row_len, dt, op, comm,
                                     nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    ASSERT_EQ(ncclAllReduce(dens.data(), ref.data(), rows * row_len, dt, op, comm, nullptr), ncclSuccess);
    (*sparse)[static_cast<size_t>(r)] = out;
    (*dense)[static_cast<size_t>(r)] = ref;
  });
}

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,   ncclInt64,      ncclUint64,
                                 ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

}  // namespace

// Every datatype and op: both strategies give the same bytes on every rank,
// equal to ncclAllReduce of the densified tensors (values exact in every type).
TEST(SparseAllReduce, EveryTypeAndOpMatchesDense) {
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (ncclDataType_t dt : kTypes) {
    for (ncclRedOp_t op : ops) {
      const int n = 3;
      const bool prod = op == ncclProd;
      std::vector<std::vector<unsigned char>> sd, rd, sg, rg;
      run_case(n, dt, op, 7, 3, prod ? 1 : -3, prod ? 2 : 3, "dense", &sd, &rd);
      run_case(n, dt, op, 7, 3, prod ? 1 : -3, prod ? 2 : 3, "gather", &sg, &rg);
      for (int r = 0; r < n; ++r) {
        const bool unsig = dt == ncclUint8 || dt == ncclUint32 || dt == ncclUint64;
        if (unsig && (op == ncclMax || op == ncclMin))
          continue;  // wrapped negatives: the reference's max is not theirs
        const bool fp8 = dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
        if (fp8 && (op == ncclSum || op == ncclAvg)) continue;  // partial sums round: orders differ
        EXPECT_EQ(sd[static_cast<size_t>(r)], rd[static_cast<size_t>(r)])
            << "dtype " << dt << " op " << op << " rank " << r;
      }
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(sd[static_cast<size_t>(r)], sg[static_cast<size_t>(r)])
            << "dtype " << dt << " op " << op << " rank " << r;
        EXPECT_EQ(sd[static_cast<size_t>(r)], sd[0]) << "rank " << r;
      }
    }
  }
}

// 1..8 ranks, random float32 values: bitwise the rank-order fold c0 + c1 + ...
// computed here, with either strategy.
TEST(SparseAllReduce, FloatIsTheRankOrderFold) {
  const size_t rows = 37, row_len = 5;
  for (int n = 1; n <= 8; ++n) {
    for (const char* algo : {"dense", "gather", "auto"}) {
      ScopedEnv env({{"MESHCCL_SPARSE_ALGO", algo}});
      std::vector<std::vector<float>> vals(static_cast<size_t>(n));
      std::vector<Input> ins(static_cast<size_t>(n));
      std::vector<std::vector<float>> outs(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        ins[static_cast<size_t>(r)] = make_input(r, rows, row_len, 0, 1, 99);
        std::mt19937 g(static_cast<unsigned>(r) + 5);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t k = 0; k < ins[static_cast<size_t>(r)].idx.size() * row_len; ++k)
          vals[static_cast<size_t>(r)].push_back(u(g) * 1e3f);
      }
      run_ranks(n, [&](ncclComm_t comm, int r) {
        auto& out = outs[static_cast<size_t>(r)];
        out.assign(rows * row_len, 7.0f);
        const auto& in = ins[static_cast<size_t>(r)];
        ASSERT_EQ(meshcclSparseAllReduce(vals[static_cast<size_t>(r)].data(), in.idx.data(), in.idx.size(), out.data(),
                                         rows, row_len, ncclFloat32, ncclSum, comm, nullptr),
                  ncclSuccess);
      });
      std::vector<float> want(rows * row_len, 0.0f);
      for (int r = 0; r < n; ++r) {
        std::vector<float> c(rows * row_len, 0.0f);
        std::vector<bool> seen(rows, false);
        const auto& in = ins[static_cast<size_t>(r)];
        for (size_t k = 0; k < in.idx.size(); ++k) {
          const size_t row = static_cast<size_t>(in.idx[k]);
          for (size_t e = 0; e < row_len; ++e)
            c[row * row_len + e] = seen[row] ? c[row * row_len + e] + vals[static_cast<size_t>(r)][k * row_len + e]
                                             : vals[static_cast<size_t>(r)][k * row_len + e];
          seen[row] = true;
        }
        for (size_t i = 0; i < want.size(); ++i) want[i] = r == 0 ? c[i] : want[i] + c[i];
      }
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(std::memcmp(outs[static_cast<size_t>(r)].data(), want.data(), want.size() * sizeof(float)), 0)
            << n << " ranks, " << algo << ", rank " << r;
    }
  }
}

// A row a rank does not hold is +0: -0.0 + (+0.0) is +0.0 under either strategy.
TEST(SparseAllReduce, NegativeZeroLikeDense) {
  for (const char* algo : {"dense", "gather"}) {
    ScopedEnv env({{"MESHCCL_SPARSE_ALGO", algo}});
    run_ranks(3, [&](ncclComm_t comm, int r) {
      float v = -0.0f;
      int64_t idx = 1;
      float out[2] = {5, 5};
      ASSERT_EQ(meshcclSparseAllReduce(&v, &idx, r == 2 ? 1 : 0, out, 2, 1, ncclFloat32, ncclSum, comm, nullptr),
                ncclSuccess);
      EXPECT_FALSE(std::signbit(out[1])) << algo;
      EXPECT_EQ(out[0], 0.0f);
    });
  }
}

// PreMulSum with a different scalar per rank, and both strategies agree.
TEST(SparseAllReduce, PreMulSum) {
  std::vector<std::vector<float>> res[2];
  const char* algos[] = {"dense", "gather"};
  for (int a = 0; a < 2; ++a) {
    ScopedEnv env({{"MESHCCL_SPARSE_ALGO", algos[a]}});
    res[a].assign(4, {});
    run_ranks(4, [&](ncclComm_t comm, int r) {
      float scalar = r == 2 ? -2.0f : 0.5f + static_cast<float>(r);
      ncclRedOp_t op;
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm), ncclSuccess);
      std::vector<int64_t> idx = {3, 0, 3};
      std::vector<float> v = {1, 2, 3, 4, 5, 6};
      std::vector<float> dense = {3, 4, 0, 0, 0, 0, 1 + 5, 2 + 6}, out(8);
      ASSERT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 3, out.data(), 4, 2, ncclFloat32, op, comm, nullptr),
                ncclSuccess);
      std::vector<float> ref(8);
      ASSERT_EQ(ncclAllReduce(dense.data(), ref.data(), 8, ncclFloat32, op, comm, nullptr), ncclSuccess);
      EXPECT_EQ(out, ref);
      res[a][static_cast<size_t>(r)] = out;
      ncclRedOpDestroy(op, comm);
    });
  }
  EXPECT_EQ(res[0], res[1]);
}

// Counts 0 and 1, and every rank without rows.
TEST(SparseAllReduce, SmallCounts) {
  run_ranks(3, [&](ncclComm_t comm, int r) {
    float v = static_cast<float>(r + 1), out = -1;
    int64_t idx = 0;
    ASSERT_EQ(meshcclSparseAllReduce(&v, &idx, 1, &out, 1, 1, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(out, 6.0f);
    ASSERT_EQ(meshcclSparseAllReduce(&v, &idx, 0, &out, 1, 1, ncclFloat32, ncclMax, comm, nullptr), ncclSuccess);
    EXPECT_EQ(out, 0.0f);
    EXPECT_EQ(meshcclSparseAllReduce(nullptr, nullptr, 0, nullptr, 0, 4, ncclFloat32, ncclSum, comm, nullptr),
              ncclSuccess);
    EXPECT_EQ(meshcclSparseAllReduce(nullptr, nullptr, 5, nullptr, 9, 0, ncclFloat32, ncclSum, comm, nullptr),
              ncclSuccess);
  });
}

// Bad input on one rank fails the call on every rank, naming the rank; the
// communicator keeps working.
TEST(SparseAllReduce, BadArgumentsFailEverywhere) {
  for (const char* algo : {"dense", "gather"}) {
    ScopedEnv env({{"MESHCCL_SPARSE_ALGO", algo}});
    run_ranks(3, [&](ncclComm_t comm, int r) {
      std::vector<float> v(4, 1.0f), out(8);
      std::vector<int64_t> idx = {0, 3};
      if (r == 1) idx[1] = 4;  // rows is 4
      EXPECT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out.data(), 4, 2, ncclFloat32, ncclSum, comm, nullptr),
                ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("rank 1: indices[1] = 4"), std::string::npos)
          << ncclGetLastError(comm);
      idx = {r == 2 ? int64_t{-1} : 0, 1};
      EXPECT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out.data(), 4, 2, ncclFloat32, ncclSum, comm, nullptr),
                ncclInvalidArgument);
      idx = {0, 1};
      EXPECT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out.data(), r == 0 ? 3 : 4, 2, ncclFloat32, ncclSum,
                                       comm, nullptr),
                ncclInvalidArgument);
      EXPECT_NE(std::string(ncclGetLastError(comm)).find("disagree"), std::string::npos) << ncclGetLastError(comm);
      EXPECT_EQ(
          meshcclSparseAllReduce(out.data(), idx.data(), 2, out.data(), 4, 2, ncclFloat32, ncclSum, comm, nullptr),
          ncclInvalidArgument);
      ASSERT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out.data(), 4, 2, ncclFloat32, ncclSum, comm, nullptr),
                ncclSuccess);
      EXPECT_EQ(out[0], 3.0f);
      EXPECT_EQ(out[7], 0.0f);
    });
  }
  run_ranks(1, [&](ncclComm_t comm, int) {
    float v = 1, out[2];
    int64_t idx = 0;
    EXPECT_EQ(meshcclSparseAllReduce(&v, &idx, 1, out, 2, 1, static_cast<ncclDataType_t>(99), ncclSum, comm, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(meshcclSparseAllReduce(&v, &idx, 1, out, 2, 1, ncclFloat32, static_cast<ncclRedOp_t>(77), comm, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(meshcclSparseAllReduce(nullptr, &idx, 1, out, 2, 1, ncclFloat32, ncclSum, comm, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(meshcclSparseAllReduce(&v, &idx, 1, out, 0, 1, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
    EXPECT_EQ(meshcclSparseAllReduce(&v, &idx, 1, out, 2, 1, ncclFloat32, ncclSum, nullptr, nullptr),
              ncclInvalidArgument);
  });
}

// Asynchronous on a host stream, inside a group with an ordinary all-reduce.
TEST(SparseAllReduce, HostStreamAndGroup) {
  run_ranks(4, [&](ncclComm_t comm, int r) {
    meshcclStream_t s;
    ASSERT_EQ(meshcclStreamCreate(&s), ncclSuccess);
    std::vector<int32_t> v = {r, 10 * r};
    std::vector<int64_t> idx = {static_cast<int64_t>(r), 5};
    std::vector<int32_t> out1(6), out2(6), d = {1, 2}, dout(2);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out1.data(), 6, 1, ncclInt32, ncclSum, comm,
                                     meshcclStreamAsCuda(s)),
              ncclSuccess);
    ASSERT_EQ(ncclAllReduce(d.data(), dout.data(), 2, ncclInt32, ncclSum, comm, meshcclStreamAsCuda(s)), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    ASSERT_EQ(meshcclSparseAllReduce(v.data(), idx.data(), 2, out2.data(), 6, 1, ncclInt32, ncclMax, comm,
                                     meshcclStreamAsCuda(s)),
              ncclSuccess);
    ASSERT_EQ(meshcclStreamSynchronize(s), ncclSuccess);
    EXPECT_EQ(out1, (std::vector<int32_t>{0, 1, 2, 3, 0, 60}));
    EXPECT_EQ(out2, (std::vector<int32_t>{0, 1, 2, 3, 0, 30}));
    EXPECT_EQ(dout, (std::vector<int32_t>{4, 8}));
    ASSERT_EQ(meshcclStreamDestroy(s), ncclSuccess);
  });
}
