// The checking scheme is only sound if every reduction order a library may use
// gives the bits FillReduced predicts. These tests reduce the generated inputs
// in several orders with arithmetic rounded to the element type at every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "data.h"

namespace perf {
namespace {

uint64_t Get(const std::vector<char>& b, size_t i, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + i * size, size);
  return v;
}

void Put(std::vector<char>& b, size_t i, size_t size, uint64_t v) { std::memcpy(b.data() + i * size, &v, size); }

int64_t Signed(uint64_t v, size_t size) {
  const int shift = 64 - 8 * static_cast<int>(size);
  return shift ? static_cast<int64_t>(v << shift) >> shift : static_cast<int64_t>(v);
}

// One step of the reduction in the element type: a op b.
uint64_t Combine(const TypeInfo& t, Op op, uint64_t a, uint64_t b) {
  const uint64_t mask = t.size == 8 ? ~0ULL : (1ULL << (8 * t.size)) - 1;
  if (!t.is_float) {
    switch (op) {
      case Op::kSum:
      case Op::kMulSum:
      case Op::kAvg: return (a + b) & mask;
      case Op::kProd: return (a * b) & mask;
      case Op::kMax: return t.is_signed ? (Signed(a, t.size) > Signed(b, t.size) ? a : b) : std::max(a, b);
      case Op::kMin: return t.is_signed ? (Signed(a, t.size) < Signed(b, t.size) ? a : b) : std::min(a, b);
      default: return a;
    }
  }
  const double x = DecodeFloat(t, a), y = DecodeFloat(t, b);
  switch (op) {
    case Op::kSum:
    case Op::kMulSum:
    case Op::kAvg: return EncodeFloat(t, x + y);
    case Op::kProd: return EncodeFloat(t, x * y);
    case Op::kMax: return EncodeFloat(t, std::max(x, y));
    case Op::kMin: return EncodeFloat(t, std::min(x, y));
    default: return a;
  }
}

// What a rank contributes before combining: PreMulSum and avg scale first.
uint64_t Prepare(const TypeInfo& t, Op op, int rank, int n, uint64_t v) {
  if (op == Op::kMulSum) {
    const int s = rank & 1 ? 2 : 1;
    return t.is_float ? EncodeFloat(t, DecodeFloat(t, v) * s) : v * s;
  }
  if (op == Op::kAvg && t.is_float) return EncodeFloat(t, DecodeFloat(t, v) * DecodeFloat(t, EncodeFloat(t, 1.0 / n)));
  return v;
}

uint64_t Finish(const TypeInfo& t, Op op, int n, uint64_t v) {
  if (op != Op::kAvg || t.is_float) return v;
  const uint64_t mask = t.size == 8 ? ~0ULL : (1ULL << (8 * t.size)) - 1;
  return t.is_signed ? static_cast<uint64_t>(Signed(v, t.size) / n) & mask : v / n;
}

std::vector<char> ReduceInOrder(const DataSpec& spec, size_t count, const std::vector<int>& order) {
  const TypeInfo& t = *spec.type;
  std::vector<std::vector<char>> in(spec.nranks, std::vector<char>(count * t.size));
  for (int r = 0; r < spec.nranks; r++) FillInput(spec, r, 0, count, in[r].data());
  std::vector<char> out(count * t.size);
  for (size_t i = 0; i < count; i++) {
    uint64_t acc = Prepare(t, spec.op, order[0], spec.nranks, Get(in[order[0]], i, t.size));
    for (size_t k = 1; k < order.size(); k++)
      acc = Combine(t, spec.op, acc, Prepare(t, spec.op, order[k], spec.nranks, Get(in[order[k]], i, t.size)));
    Put(out, i, t.size, Finish(t, spec.op, spec.nranks, acc));
  }
  return out;
}

// Pairwise tree: (0+1)+(2+3)..., the shape of recursive halving.
std::vector<char> ReduceTree(const DataSpec& spec, size_t count) {
  const TypeInfo& t = *spec.type;
  std::vector<char> out(count * t.size);
  std::vector<std::vector<char>> in(spec.nranks, std::vector<char>(count * t.size));
  for (int r = 0; r < spec.nranks; r++) FillInput(spec, r, 0, count, in[r].data());
  for (size_t i = 0; i < count; i++) {
    std::vector<uint64_t> level;
    for (int r = 0; r < spec.nranks; r++) level.push_back(Prepare(t, spec.op, r, spec.nranks, Get(in[r], i, t.size)));
    while (level.size() > 1) {
      std::vector<uint64_t> next;
      for (size_t k = 0; k + 1 < level.size(); k += 2) next.push_back(Combine(t, spec.op, level[k], level[k + 1]));
      if (level.size() % 2) next.push_back(level.back());
      level = next;
    }
    Put(out, i, t.size, Finish(t, spec.op, spec.nranks, level[0]));
  }
  return out;
}

class ReductionOrders : public ::testing::TestWithParam<std::tuple<int, Op, int>> {};

TEST_P(ReductionOrders, EveryOrderMatchesExpected) {
  const auto [type_index, op, nranks] = GetParam();
  const TypeInfo& t = TypeAt(type_index);
  const DataSpec spec{&t, op, nranks, 1234};
  const size_t count = 999;
  std::vector<char> expected(count * t.size);
  FillReduced(spec, 0, count, expected.data());

  std::vector<int> forward(nranks);
  std::iota(forward.begin(), forward.end(), 0);
  std::vector<int> backward(forward.rbegin(), forward.rend());
  std::vector<int> rotated = forward;
  std::rotate(rotated.begin(), rotated.begin() + nranks / 2, rotated.end());
  for (const auto& order : {forward, backward, rotated}) {
    const std::vector<char> got = ReduceInOrder(spec, count, order);
    EXPECT_EQ(CountWrong(spec, got.data(), expected.data(), count), 0)
        << t.name << " " << OpName(op) << " n=" << nranks;
  }
  const std::vector<char> tree = ReduceTree(spec, count);
  EXPECT_EQ(CountWrong(spec, tree.data(), expected.data(), count), 0)
      << t.name << " " << OpName(op) << " n=" << nranks << " (tree)";
}

INSTANTIATE_TEST_SUITE_P(AllTypesOpsRanks, ReductionOrders,
                         ::testing::Combine(::testing::Range(0, 12),
                                            ::testing::Values(Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg,
                                                              Op::kMulSum),
                                            ::testing::Values(1, 2, 3, 4, 7, 8)));

TEST(Data, InputsDependOnSeedRankAndIndexOnly) {
  const DataSpec spec{FindType("float"), Op::kSum, 4, 7};
  std::vector<float> a(64), b(64), c(64), d(32);
  FillInput(spec, 1, 0, 64, a.data());
  FillInput(spec, 1, 0, 64, b.data());
  EXPECT_EQ(a, b);
  FillInput(spec, 2, 0, 64, c.data());
  EXPECT_NE(a, c);
  FillInput(spec, 1, 32, 32, d.data());  // a window of the same sequence
  EXPECT_TRUE(std::equal(d.begin(), d.end(), a.begin() + 32));
  DataSpec other = spec;
  other.seed = 8;
  FillInput(other, 1, 0, 64, c.data());
  EXPECT_NE(a, c);
}

TEST(Data, FloatSumInputsAreNotTrivial) {
  const DataSpec spec{FindType("float"), Op::kSum, 2, 3};
  std::vector<float> a(1000);
  FillInput(spec, 0, 0, a.size(), a.data());
  std::sort(a.begin(), a.end());
  EXPECT_GT(std::unique(a.begin(), a.end()) - a.begin(), 900);
}

TEST(Data, CountWrongSeesOneFlippedBit) {
  for (int i = 0; i < NumTypes(); i++) {
    const TypeInfo& t = TypeAt(i);
    const DataSpec spec{&t, Op::kSum, 3, 5};
    std::vector<char> e(100 * t.size), g;
    FillReduced(spec, 0, 100, e.data());
    g = e;
    EXPECT_EQ(CountWrong(spec, g.data(), e.data(), 100), 0) << t.name;
    g[57 * t.size] ^= 1;
    EXPECT_EQ(CountWrong(spec, g.data(), e.data(), 100), 1) << t.name;
    DataSpec avg = spec;
    avg.op = Op::kAvg;
    g[57 * t.size] ^= 1;
    g[3 * t.size + t.size - 1] ^= 0x40;  // far beyond 2 ulp
    EXPECT_EQ(CountWrong(avg, g.data(), e.data(), 100), 1) << t.name;
  }
}

TEST(Data, IntegerSumWraps) {
  const TypeInfo& t = *FindType("uint8");
  const DataSpec spec{&t, Op::kSum, 5, 11};
  std::vector<uint8_t> in(5 * 50), out(50);
  for (int r = 0; r < 5; r++) FillInput(spec, r, 0, 50, in.data() + r * 50);
  FillReduced(spec, 0, 50, out.data());
  for (int i = 0; i < 50; i++) {
    unsigned s = 0;
    for (int r = 0; r < 5; r++) s += in[r * 50 + i];
    EXPECT_EQ(out[i], static_cast<uint8_t>(s));
  }
}

TEST(Encode, KnownBitPatterns) {
  EXPECT_EQ(EncodeFloat(*FindType("half"), 1.0), 0x3c00u);
  EXPECT_EQ(EncodeFloat(*FindType("half"), -2.0), 0xc000u);
  EXPECT_EQ(EncodeFloat(*FindType("half"), 65504.0), 0x7bffu);
  EXPECT_EQ(EncodeFloat(*FindType("half"), 1.0 / 3), 0x3555u);
  EXPECT_EQ(EncodeFloat(*FindType("half"), 1e6), 0x7c00u);
  EXPECT_EQ(EncodeFloat(*FindType("half"), 5.960464477539063e-08), 0x0001u);
  EXPECT_EQ(EncodeFloat(*FindType("bfloat16"), 1.0), 0x3f80u);
  EXPECT_EQ(EncodeFloat(*FindType("f8e4m3"), 448.0), 0x7eu);
  EXPECT_EQ(EncodeFloat(*FindType("f8e4m3"), 1.0), 0x38u);
  EXPECT_EQ(EncodeFloat(*FindType("f8e5m2"), 1.0), 0x3cu);
  EXPECT_EQ(EncodeFloat(*FindType("f8e5m2"), -0.0), 0x80u);
  for (const char* name : {"half", "bfloat16", "f8e4m3", "f8e5m2", "float", "double"}) {
    const TypeInfo& t = *FindType(name);
    for (double v : {0.5, 1.0, 3.0, -6.0, 12.0}) EXPECT_EQ(DecodeFloat(t, EncodeFloat(t, v)), v) << name;
  }
}

TEST(MulSum, ScalarsByRankParity) {
  float s = 0;
  MulSumScalar(*FindType("float"), 0, &s);
  EXPECT_EQ(s, 1.0f);
  MulSumScalar(*FindType("float"), 3, &s);
  EXPECT_EQ(s, 2.0f);
  int32_t i = 0;
  MulSumScalar(*FindType("int32"), 5, &i);
  EXPECT_EQ(i, 2);
}

}  // namespace
}  // namespace perf
