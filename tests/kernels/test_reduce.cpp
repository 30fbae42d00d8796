// Reduction kernels against the plain reference in reference.h: every
// datatype x op x awkward size x misalignment, on every ISA this CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/op.h"
#include "kernels/reduce.h"
#include "kernels/table.h"
#include "tests/kernels/reference.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define KERNEL_TEST_MXCSR 1
#define KERNEL_TEST_X86 1
#endif

namespace mk = meshccl::kernels;
using meshccl::ReduceOp;

namespace kref {
const Encoder& encoder(ncclDataType_t dt) {
  static const Encoder half(ncclFloat16), bf16(ncclBfloat16), e4m3(ncclFloat8e4m3), e5m2(ncclFloat8e5m2);
  switch (dt) {
    case ncclFloat16: return half;
    case ncclBfloat16: return bf16;
    case ncclFloat8e4m3: return e4m3;
    default: return e5m2;
  }
}
}  // namespace kref

namespace {

constexpr ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};
constexpr size_t kSizes[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 1000, 4099};
const char* const kOpNames[] = {"sum", "prod", "max", "min"};

// Random element bits with plenty of special values: raw bit patterns for the
// narrow types (so NaN, inf and subnormals all occur), and for float/double
// mostly ordinary values of varied magnitude with specials sprinkled in.
uint64_t random_elem(ncclDataType_t dt, std::mt19937_64& rng) {
  const uint64_t r = rng();
  switch (dt) {
    case ncclFloat32: {
      static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 3.4e38f, 1.0f};
      if (r % 16 == 0) return kref::ubits(special[(r >> 8) % 9]);
      const float m = static_cast<float>(static_cast<int32_t>(r >> 32)) / 2147483648.0f;
      return kref::ubits(std::ldexp(m, static_cast<int>((r >> 8) % 41) - 20));
    }
    case ncclFloat64: {
      static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-310, 1.0};
      double d = r % 16 == 0 ? special[(r >> 8) % 7]
                             : std::ldexp(static_cast<double>(static_cast<int64_t>(r)) / 9.2e18,
                                          static_cast<int>((r >> 3) % 61) - 30);
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      return bits;
    }
    case ncclFloat16:
    case ncclBfloat16:
      // Half the time a value near 1 so that sums round in interesting ways.
      if (r & 1) return (r >> 1) & 0xffff;
      return kref::encoder(dt).encode(static_cast<float>(static_cast<int32_t>(r >> 32)) / 1e9f);
    default: return r & kref::mask(dt);
  }
}

std::vector<unsigned char> random_buffer(ncclDataType_t dt, size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> b(count * kref::size_of(dt) + 64);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  for (size_t i = 0; i < count; ++i) kref::put(dt, b.data(), i, random_elem(dt, rng));
  return b;
}

std::string hex(uint64_t v) {
  char s[32];
  std::snprintf(s, sizeof s, "0x%llx", static_cast<unsigned long long>(v));
  return s;
}

// Checks count elements of got against want(i), reporting only the first
// mismatch so one bug does not flood the log.
template <class Want>
void expect_elems(ncclDataType_t dt, ReduceOp op, const void* got, size_t count, Want want, const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t w = want(i);
    const uint64_t g = kref::get(dt, got, i);
    if (!kref::same(dt, op, w, g)) {
      ADD_FAILURE() << what << ": element " << i << " of " << count << " want " << hex(w) << " got " << hex(g);
      return;
    }
  }
}

class KernelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!mk::isa_supported(GetParam())) GTEST_SKIP() << GetParam() << " not supported by this CPU";
    ASSERT_TRUE(mk::select_isa(GetParam()));
    ASSERT_STREQ(mk::isa_name(), GetParam());
  }
};

// Byte offsets applied to every pointer: aligned, one element off, three
// elements off (vector tails and heads), and one byte off (not even element-aligned).
std::vector<size_t> offsets_for(ncclDataType_t dt) {
  const size_t s = kref::size_of(dt);
  std::vector<size_t> o = {0, s, 3 * s};
  if (s > 1) o.push_back(1);
  return o;
}

TEST_P(KernelTest, Reduce2EveryTypeOpSizeAlignment) {
  std::mt19937_64 rng(42);
  for (ncclDataType_t dt : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : kSizes) {
        for (size_t off : offsets_for(dt)) {
          const std::string what = std::string(meshccl::dtype_name(dt)) + " " + kOpNames[static_cast<int>(op)] +
                                   " count " + std::to_string(count) + " offset " + std::to_string(off);
          auto a = random_buffer(dt, count + 4, rng);
          auto b = random_buffer(dt, count + 4, rng);
          std::vector<unsigned char> d(a.size(), 0xa5);
          const void* pa = a.data() + off;
          const void* pb = b.data() + 2 * off % 17;
          void* pd = d.data() + off;
          auto want = [&](size_t i) {
            const uint64_t v[2] = {kref::get(dt, pa, i), kref::get(dt, pb, i)};
            return kref::reduce_elem(dt, op, v, 2);
          };
          mk::reduce2(dt, op, pd, pa, pb, count);
          expect_elems(dt, op, pd, count, want, what);
          // Nothing past the end is touched.
          for (size_t i = off + count * kref::size_of(dt); i < d.size(); ++i) {
            if (d[i] != 0xa5) {
              ADD_FAILURE() << what << ": wrote past the end at byte " << i;
              break;
            }
          }
          // In place, both ways round.
          std::vector<unsigned char> a2 = a, b2 = b;
          mk::reduce2(dt, op, a2.data() + off, a2.data() + off, pb, count);
          expect_elems(dt, op, a2.data() + off, count, want, what + " dst==a");
          mk::reduce2(dt, op, b2.data() + 2 * off % 17, pa, b2.data() + 2 * off % 17, count);
          expect_elems(dt, op, b2.data() + 2 * off % 17, count, want, what + " dst==b");
        }
      }
    }
  }
}

TEST_P(KernelTest, ReduceNOneToEightInputs) {
  std::mt19937_64 rng(7);
  const size_t sizes[] = {1, 3, 17, 65, 1000, 4099};
  for (ncclDataType_t dt : kTypes) {
    for (ReduceOp op : kOps) {
      for (int n = 1; n <= 8; ++n) {
        for (size_t count : sizes) {
          const size_t off = (count + n) % 3 == 0 ? 1 : kref::size_of(dt) * (n % 3);
          const std::string what = std::string(meshccl::dtype_name(dt)) + " " + kOpNames[static_cast<int>(op)] + " n " +
                                   std::to_string(n) + " count " + std::to_string(count) + " offset " +
                                   std::to_string(off);
          std::vector<std::vector<unsigned char>> bufs;
          std::vector<const void*> srcs;
          for (int k = 0; k < n; ++k) bufs.push_back(random_buffer(dt, count, rng));
          for (int k = 0; k < n; ++k) srcs.push_back(bufs[k].data() + off);
          auto want = [&](size_t i) {
            uint64_t v[8];
            for (int k = 0; k < n; ++k) v[k] = kref::get(dt, srcs[k], i);
            return kref::reduce_elem(dt, op, v, n);
          };
          std::vector<unsigned char> d(bufs[0].size());
          mk::reduce_n(dt, op, d.data() + off, srcs.data(), n, count);
          expect_elems(dt, op, d.data() + off, count, want, what);
          // dst may be any of the sources.
          const int k = (n - 1) / 2;
          std::vector<unsigned char> keep = bufs[k];
          std::vector<const void*> srcs2 = srcs;
          srcs2[k] = keep.data() + off;
          auto want2 = [&](size_t i) {
            uint64_t v[8];
            for (int j = 0; j < n; ++j) v[j] = kref::get(dt, srcs2[j], i);
            return kref::reduce_elem(dt, op, v, n);
          };
          mk::reduce_n(dt, op, bufs[k].data() + off, srcs.data(), n, count);
          expect_elems(dt, op, bufs[k].data() + off, count, want2, what + " dst==src" + std::to_string(k));
        }
      }
    }
  }
}

TEST_P(KernelTest, ReduceNOfTwoMatchesReduce2) {
  std::mt19937_64 rng(11);
  for (ncclDataType_t dt : kTypes) {
    for (ReduceOp op : kOps) {
      auto a = random_buffer(dt, 257, rng), b = random_buffer(dt, 257, rng);
      std::vector<unsigned char> d1(a.size()), d2(a.size());
      const void* srcs[2] = {a.data(), b.data()};
      mk::reduce2(dt, op, d1.data(), a.data(), b.data(), 257);
      mk::reduce_n(dt, op, d2.data(), srcs, 2, 257);
      EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), 257 * kref::size_of(dt))) << meshccl::dtype_name(dt);
    }
  }
}

TEST_P(KernelTest, DivideIntegersTruncateLikeC) {
  std::mt19937_64 rng(3);
  const int divisors[] = {1, 2, 3, 7, 8, 100, 1000, -1, -3, 300, 0x7fffffff};
  for (ncclDataType_t dt : {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64}) {
    for (int q : divisors) {
      if (!kref::is_signed_int(dt) && q < 0) continue;
      for (size_t count : {size_t{1}, size_t{17}, size_t{1000}}) {
        auto s = random_buffer(dt, count, rng);
        // Make sure the most negative value and small negatives occur.
        kref::put(dt, s.data(), 0, kref::is_signed_int(dt) ? (kref::mask(dt) >> 1) + 1 : kref::mask(dt));
        if (count > 1) kref::put(dt, s.data(), 1, kref::mask(dt) - 6);  // -7 for signed types
        std::vector<unsigned char> d(s.size());
        mk::divide(dt, d.data() + 1, s.data(), count, q);
        auto want = [&](size_t i) -> uint64_t {
          const uint64_t v = kref::get(dt, s.data(), i);
          if (kref::is_signed_int(dt)) {
            const __int128 r = static_cast<__int128>(kref::sext(dt, v)) / q;
            return static_cast<uint64_t>(r) & kref::mask(dt);
          }
          return v / static_cast<uint64_t>(q);
        };
        expect_elems(dt, ReduceOp::Sum, d.data() + 1, count, want,
                     std::string(meshccl::dtype_name(dt)) + " / " + std::to_string(q));
      }
    }
  }
  // Every 8-bit value by every divisor an average could use and then some.
  int8_t all_s[256];
  uint8_t all_u[256];
  for (int i = 0; i < 256; ++i) {
    all_s[i] = static_cast<int8_t>(i);
    all_u[i] = static_cast<uint8_t>(i);
  }
  for (int q = -300; q <= 300; ++q) {
    if (q == 0) continue;
    int8_t ds[256];
    mk::divide(ncclInt8, ds, all_s, 256, q);
    for (int i = 0; i < 256; ++i) {
      ASSERT_EQ(ds[i], static_cast<int8_t>(all_s[i] / q)) << int{all_s[i]} << " / " << q;
    }
    if (q < 0) continue;
    uint8_t du[256];
    mk::divide(ncclUint8, du, all_u, 256, q);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(du[i], all_u[i] / q) << int{all_u[i]} << " / " << q;
  }
  // Spot values that a sign or rounding mistake would get wrong.
  int32_t v[4] = {-7, 7, -1, INT32_MIN};
  mk::divide(ncclInt32, v, v, 4, 2);
  EXPECT_EQ(v[0], -3);
  EXPECT_EQ(v[1], 3);
  EXPECT_EQ(v[2], 0);
  EXPECT_EQ(v[3], INT32_MIN / 2);
  int8_t m = INT8_MIN;
  mk::divide(ncclInt8, &m, &m, 1, -1);
  EXPECT_EQ(m, INT8_MIN);  // wraps like NCCL's integer arithmetic
  int32_t big[6] = {INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1, 1000000007, -999999999};
  for (int q : {2, 3, 7, 1000, 65537, INT32_MAX, -2, -7, INT32_MIN + 1}) {
    int32_t out[6];
    mk::divide(ncclInt32, out, big, 6, q);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], big[i] / q) << big[i] << " / " << q;
  }
  uint32_t ubig[3] = {UINT32_MAX, UINT32_MAX - 1, 0x80000001u};
  for (int q : {1, 2, 3, 7, 65537, INT32_MAX}) {
    uint32_t out[3];
    mk::divide(ncclUint32, out, ubig, 3, q);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], ubig[i] / static_cast<uint32_t>(q)) << ubig[i] << " / " << q;
  }
}

TEST_P(KernelTest, DivideFloatsRoundOnce) {
  std::mt19937_64 rng(5);
  for (ncclDataType_t dt : {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2}) {
    for (int q : {1, 2, 3, 5, 7, 8, 24}) {
      for (size_t count : {size_t{1}, size_t{33}, size_t{4099}}) {
        auto s = random_buffer(dt, count, rng);
        std::vector<unsigned char> d(s.size());
        mk::divide(dt, d.data(), s.data() + 1, count, q);
        auto want = [&](size_t i) -> uint64_t {
          const uint64_t v = kref::get(dt, s.data() + 1, i);
          if (dt == ncclFloat64) {
            double x;
            std::memcpy(&x, &v, 8);
            x /= q;
            uint64_t r;
            std::memcpy(&r, &x, 8);
            return r;
          }
          if (dt == ncclFloat32) return kref::ubits(kref::fbits(static_cast<uint32_t>(v)) / static_cast<float>(q));
          // The exact quotient rounded once; float carries enough bits that
          // rounding float's quotient again gives the same answer.
          const double x = kref::decode_narrow(dt, static_cast<uint32_t>(v)) / q;
          return kref::encoder(dt).encode(static_cast<float>(x));
        };
        expect_elems(dt, ReduceOp::Sum, d.data(), count, want,
                     std::string(meshccl::dtype_name(dt)) + " / " + std::to_string(q));
      }
    }
  }
  float f[3] = {1.0f, -3.0f, 10.0f};
  mk::divide(ncclFloat32, f, f, 3, 3);
  EXPECT_EQ(f[0], 1.0f / 3.0f);
  EXPECT_EQ(f[1], -1.0f);
  EXPECT_EQ(f[2], 10.0f / 3.0f);
}

TEST_P(KernelTest, ScaleMultipliesByOneElementOfTheType) {
  std::mt19937_64 rng(9);
  for (ncclDataType_t dt : kTypes) {
    for (size_t count : {size_t{1}, size_t{31}, size_t{1000}}) {
      for (int trial = 0; trial < 4; ++trial) {
        auto s = random_buffer(dt, count, rng);
        auto k = random_buffer(dt, 1, rng);
        if (trial == 0 && !kref::is_int(dt)) {
          // A scalar of 0.5 exactly, the Avg-style case.
          const uint64_t half_code = dt == ncclFloat32   ? kref::ubits(0.5f)
                                     : dt == ncclFloat64 ? 0x3fe0000000000000ull
                                                         : kref::encoder(dt).encode(0.5f);
          kref::put(dt, k.data(), 0, half_code);
        }
        std::vector<unsigned char> d(s.size());
        mk::scale(dt, d.data() + 3, s.data(), count, k.data());
        auto want = [&](size_t i) {
          const uint64_t v[2] = {kref::get(dt, s.data(), i), kref::get(dt, k.data(), 0)};
          return kref::reduce_elem(dt, ReduceOp::Prod, v, 2);
        };
        expect_elems(dt, ReduceOp::Prod, d.data() + 3, count, want, std::string(meshccl::dtype_name(dt)) + " scale");
        // In place.
        mk::scale(dt, s.data(), s.data(), count, k.data());
        expect_elems(
            dt, ReduceOp::Prod, s.data(), count, [&](size_t i) { return kref::get(dt, d.data() + 3, i); },
            std::string(meshccl::dtype_name(dt)) + " scale in place");
      }
    }
  }
}

// Chosen cases where wrap-around, NaN handling or rounding are easy to get wrong.
TEST_P(KernelTest, ChosenEdgeCases) {
  int8_t a8[2] = {127, -128}, b8[2] = {1, -1};
  mk::reduce2(ncclInt8, ReduceOp::Sum, a8, a8, b8, 2);
  EXPECT_EQ(a8[0], -128);
  EXPECT_EQ(a8[1], 127);
  int32_t a32 = INT32_MIN, b32 = -1;
  mk::reduce2(ncclInt32, ReduceOp::Prod, &a32, &a32, &b32, 1);
  EXPECT_EQ(a32, INT32_MIN);
  uint64_t au = ~0ull, bu = 2;
  mk::reduce2(ncclUint64, ReduceOp::Sum, &au, &au, &bu, 1);
  EXPECT_EQ(au, 1u);
  int64_t mx[2] = {-5, INT64_MIN}, my[2] = {-6, INT64_MAX};
  mk::reduce2(ncclInt64, ReduceOp::Max, mx, mx, my, 2);
  EXPECT_EQ(mx[0], -5);
  EXPECT_EQ(mx[1], INT64_MAX);
  uint8_t ux = 200, uy = 100;
  mk::reduce2(ncclUint8, ReduceOp::Min, &ux, &ux, &uy, 1);
  EXPECT_EQ(ux, 100);

  // fmax/fmin: a NaN operand yields the other operand, in either position.
  float fa[20], fb[20], fd[20];
  for (int i = 0; i < 20; ++i) {
    fa[i] = i % 2 ? NAN : 1.0f + i;
    fb[i] = i % 2 ? -2.0f : NAN;
  }
  mk::reduce2(ncclFloat32, ReduceOp::Max, fd, fa, fb, 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(fd[i], i % 2 ? -2.0f : 1.0f + i) << i;
  mk::reduce2(ncclFloat32, ReduceOp::Min, fd, fb, fa, 20);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(fd[i], i % 2 ? -2.0f : 1.0f + i) << i;
  mk::reduce2(ncclFloat32, ReduceOp::Sum, fd, fa, fb, 20);
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(std::isnan(fd[i])) << i;

  // half: 1 + 2^-11 is a tie between 1 and 1+2^-10 and goes to the even 1.
  uint16_t h1[17], h2[17], hd[17];
  for (int i = 0; i < 17; ++i) {
    h1[i] = 0x3c00;  // 1.0
    h2[i] = 0x1000;  // 2^-11
  }
  h2[16] = 0x1200;  // 1.5 * 2^-11: above the tie, rounds up
  mk::reduce2(ncclFloat16, ReduceOp::Sum, hd, h1, h2, 17);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(hd[i], 0x3c00) << i;
  EXPECT_EQ(hd[16], 0x3c01);
  // 65504 + 16 = 65520 is the tie between the largest half and 65536 -> inf.
  uint16_t big[16], add[16];
  for (int i = 0; i < 16; ++i) {
    big[i] = 0x7bff;
    add[i] = 0x4c00;  // 16
  }
  mk::reduce2(ncclFloat16, ReduceOp::Sum, hd, big, add, 16);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(hd[i], 0x7c00) << i;

  // bf16: 1 + 2^-8 ties to 1; NaN stays NaN.
  uint16_t b1[16], b2[16], bd[16];
  for (int i = 0; i < 16; ++i) {
    b1[i] = 0x3f80;
    b2[i] = i == 5 ? 0x7fc1 : 0x3b80;  // 2^-8, one NaN
  }
  mk::reduce2(ncclBfloat16, ReduceOp::Sum, bd, b1, b2, 16);
  for (int i = 0; i < 16; ++i) {
    if (i == 5) {
      EXPECT_TRUE(std::isnan(mk::bf16_to_float(bd[i])));
    } else {
      EXPECT_EQ(bd[i], 0x3f80) << i;
    }
  }

  // fp8 saturates: 448 + 448 -> 448 in e4m3, 57344 * 2 -> 57344 in e5m2, and
  // e5m2's inf saturates too (__NV_SATFINITE).
  uint8_t e1[40], e2[40], ed[40];
  std::memset(e1, 0x7e, sizeof e1);
  std::memset(e2, 0xfe, sizeof e2);  // -448
  mk::reduce2(ncclFloat8e4m3, ReduceOp::Sum, ed, e1, e1, 40);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(ed[i], 0x7e) << i;
  mk::reduce2(ncclFloat8e4m3, ReduceOp::Sum, ed, e2, e2, 40);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(ed[i], 0xfe) << i;
  std::memset(e1, 0x7b, sizeof e1);
  std::memset(e2, 0x40, sizeof e2);  // 2.0
  e2[39] = 0x7c;                     // inf
  mk::reduce2(ncclFloat8e5m2, ReduceOp::Prod, ed, e1, e2, 40);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(ed[i], 0x7b) << i;
  std::memset(e1, 0x7f, sizeof e1);  // NaN in both fp8 formats
  mk::reduce2(ncclFloat8e4m3, ReduceOp::Sum, ed, e1, e2, 40);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(std::isnan(mk::e4m3_to_float(ed[i]))) << i;
}

// ---- the fast paths against the portable path ------------------------------------
// The vector code for the narrow types (bfloat16 by halves of a float, fp8 in
// a scaled float domain or on codes) must give the portable loops' results
// bit for bit; only the NaN payload of a Sum/Prod result may differ (it is
// unspecified), and even Max/Min's NaN and signed-zero choices must agree.

void expect_same_as_portable(ncclDataType_t dt, ReduceOp op, const void* want, const void* got, size_t count,
                             const std::string& what) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t w = kref::get(dt, want, i), g = kref::get(dt, got, i);
    const bool arith = op == ReduceOp::Sum || op == ReduceOp::Prod;
    if (w == g || (arith && kref::is_nan_code(dt, w) && kref::is_nan_code(dt, g))) continue;
    ADD_FAILURE() << what << ": element " << i << " of " << count << " portable " << hex(w) << " got " << hex(g);
    return;
  }
}

// Runs fn with the portable implementation selected, then selects isa again.
template <class F>
void on_portable(const char* isa, F fn) {
  ASSERT_TRUE(mk::select_isa("portable"));
  fn();
  ASSERT_TRUE(mk::select_isa(isa));
}

// Every (a, b) pair of 8-bit codes, the pairs without a NaN or inf code
// first, so that whole vector blocks of them take the fast path and the
// blocks holding a special code take the general one.
struct CodePairs {
  std::vector<unsigned char> a, b;
};
CodePairs fp8_pairs(ncclDataType_t dt) {
  auto special = [dt](uint32_t c) { return !std::isfinite(kref::decode_narrow(dt, c)); };
  CodePairs p;
  for (bool with_special : {false, true}) {
    for (uint32_t x = 0; x < 256; ++x) {
      for (uint32_t y = 0; y < 256; ++y) {
        if ((special(x) || special(y)) != with_special) continue;
        p.a.push_back(static_cast<unsigned char>(x));
        p.b.push_back(static_cast<unsigned char>(y));
      }
    }
  }
  return p;
}

// reduce2 and reduce_n of every pair of fp8 codes, each op, against the
// portable path and the reference; out of place, in place, and shifted by
// three elements so other pairs share a vector block and the tail differs.
void check_fp8_every_pair(const char* isa, const std::string& mode) {
  for (ncclDataType_t dt : {ncclFloat8e4m3, ncclFloat8e5m2}) {
    const CodePairs p = fp8_pairs(dt);
    const size_t n = p.a.size();
    for (ReduceOp op : kOps) {
      const std::string what = std::string(meshccl::dtype_name(dt)) + " " + kOpNames[static_cast<int>(op)] + mode;
      std::vector<unsigned char> want(n), want_n(n), got(n), got_n(n);
      const void* srcs[2] = {p.a.data(), p.b.data()};
      on_portable(isa, [&] {
        mk::reduce2(dt, op, want.data(), p.a.data(), p.b.data(), n);
        mk::reduce_n(dt, op, want_n.data(), srcs, 2, n);
      });
      mk::reduce2(dt, op, got.data(), p.a.data(), p.b.data(), n);
      expect_same_as_portable(dt, op, want.data(), got.data(), n, what + " reduce2");
      mk::reduce_n(dt, op, got_n.data(), srcs, 2, n);
      expect_same_as_portable(dt, op, want_n.data(), got_n.data(), n, what + " reduce_n");
      expect_elems(
          dt, op, got.data(), n,
          [&](size_t i) {
            const uint64_t v[2] = {p.a[i], p.b[i]};
            return kref::reduce_elem(dt, op, v, 2);
          },
          what + " reduce2 vs reference");
      std::vector<unsigned char> in_place = p.a;
      mk::reduce2(dt, op, in_place.data(), in_place.data(), p.b.data(), n);
      expect_same_as_portable(dt, op, want.data(), in_place.data(), n, what + " reduce2 dst==a");
      mk::reduce2(dt, op, got.data(), p.a.data() + 3, p.b.data() + 3, n - 5);
      expect_same_as_portable(dt, op, want.data() + 3, got.data(), n - 5, what + " reduce2 offset 3");
    }
  }
}

TEST_P(KernelTest, Fp8EveryPairOfCodes) { check_fp8_every_pair(GetParam(), ""); }

// Sums of three or more fp8 values can need the bits the encoder shifts out
// as a sticky bit: 256 + 16 + 2^-9 is just above the tie between 256 and 288
// in e4m3 (so 288), and 16 + 2 + 2^-16 just above the tie between 16 and 20
// in e5m2. Whole blocks of such triples, in every sign combination, then
// random finite codes for 3..8 inputs, against the portable path.
TEST_P(KernelTest, Fp8ManyInputs) {
  struct Case {
    ncclDataType_t dt;
    float v[3];
  };
  const Case cases[] = {{ncclFloat8e4m3, {256.0f, 16.0f, 0x1p-9f}},
                        {ncclFloat8e4m3, {1.0f, 0.0625f, 0x1p-9f}},
                        {ncclFloat8e5m2, {16.0f, 2.0f, 0x1p-16f}},
                        {ncclFloat8e5m2, {1024.0f, 128.0f, 0x1p-16f}}};
  for (const Case& c : cases) {
    const size_t n = 256;
    std::vector<unsigned char> in[3];
    for (int k = 0; k < 3; ++k) {
      in[k].resize(n);
      for (size_t i = 0; i < n; ++i) {
        const float v = (i >> k) & 1 ? -c.v[k] : c.v[k];
        in[k][i] = static_cast<unsigned char>(kref::encoder(c.dt).encode(v));
      }
    }
    const void* srcs[3] = {in[0].data(), in[1].data(), in[2].data()};
    std::vector<unsigned char> want(n), got(n);
    on_portable(GetParam(), [&] { mk::reduce_n(c.dt, ReduceOp::Sum, want.data(), srcs, 3, n); });
    mk::reduce_n(c.dt, ReduceOp::Sum, got.data(), srcs, 3, n);
    expect_same_as_portable(c.dt, ReduceOp::Sum, want.data(), got.data(), n,
                            std::string(meshccl::dtype_name(c.dt)) + " triple");
    expect_elems(
        c.dt, ReduceOp::Sum, got.data(), n,
        [&](size_t i) {
          const uint64_t v[3] = {in[0][i], in[1][i], in[2][i]};
          return kref::reduce_elem(c.dt, ReduceOp::Sum, v, 3);
        },
        std::string(meshccl::dtype_name(c.dt)) + " triple vs reference");
  }
  std::mt19937_64 rng(17);
  for (ncclDataType_t dt : {ncclFloat8e4m3, ncclFloat8e5m2}) {
    for (ReduceOp op : kOps) {
      for (int nsrc = 1; nsrc <= 8; ++nsrc) {
        const size_t n = 4099;
        std::vector<std::vector<unsigned char>> in(nsrc, std::vector<unsigned char>(n));
        std::vector<const void*> srcs;
        for (auto& v : in) {
          for (auto& c : v) {
            do c = static_cast<unsigned char>(rng());
            while (!std::isfinite(kref::decode_narrow(dt, c)));
          }
          srcs.push_back(v.data());
        }
        std::vector<unsigned char> want(n), got(n);
        on_portable(GetParam(), [&] { mk::reduce_n(dt, op, want.data(), srcs.data(), nsrc, n); });
        mk::reduce_n(dt, op, got.data(), srcs.data(), nsrc, n);
        expect_same_as_portable(
            dt, op, want.data(), got.data(), n,
            std::string(meshccl::dtype_name(dt)) + " " + kOpNames[static_cast<int>(op)] + " n " + std::to_string(nsrc));
      }
    }
  }
}

// Every bfloat16 / half code against edge values (signed zeros, the smallest
// and largest subnormals and normals, the largest finite value, a value at a
// rounding tie, infinities, a quiet and a signalling NaN), each op, reduce2
// and reduce_n of three; and reduce_n of one source, which only converts:
// a signalling NaN comes out quiet as the scalar store makes it.
TEST_P(KernelTest, Bf16AndHalfEveryCodeAgainstEdgeValues) {
  const uint16_t bf16_edges[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x3f80,
                                 0x3b80, 0xbb80, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xff81, 0x4b00};
  const uint16_t half_edges[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00,
                                 0x1000, 0x9000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfc01, 0x4c00};
  for (ncclDataType_t dt : {ncclBfloat16, ncclFloat16}) {
    const uint16_t* edges = dt == ncclBfloat16 ? bf16_edges : half_edges;
    const size_t n = 0x10000;
    std::vector<uint16_t> all(n), other(n), third(n);
    for (size_t i = 0; i < n; ++i) {
      all[i] = static_cast<uint16_t>(i);
      third[i] = static_cast<uint16_t>(i * 40503u);
    }
    for (ReduceOp op : kOps) {
      for (int e = 0; e < 16; ++e) {
        for (auto& v : other) v = edges[e];
        const std::string what =
            std::string(meshccl::dtype_name(dt)) + " " + kOpNames[static_cast<int>(op)] + " with " + hex(edges[e]);
        std::vector<uint16_t> want(n), got(n), want3(n), got3(n);
        const void* srcs[3] = {all.data(), other.data(), third.data()};
        on_portable(GetParam(), [&] {
          mk::reduce2(dt, op, want.data(), all.data(), other.data(), n);
          mk::reduce_n(dt, op, want3.data(), srcs, 3, n);
        });
        mk::reduce2(dt, op, got.data(), all.data(), other.data(), n);
        expect_same_as_portable(dt, op, want.data(), got.data(), n, what);
        mk::reduce2(dt, op, got.data(), other.data(), all.data(), n);
        on_portable(GetParam(), [&] { mk::reduce2(dt, op, want.data(), other.data(), all.data(), n); });
        expect_same_as_portable(dt, op, want.data(), got.data(), n, what + " swapped");
        mk::reduce_n(dt, op, got3.data(), srcs, 3, n);
        expect_same_as_portable(dt, op, want3.data(), got3.data(), n, what + " reduce_n 3");
      }
      const void* one[1] = {all.data()};
      std::vector<uint16_t> want(n), got(n);
      on_portable(GetParam(), [&] { mk::reduce_n(dt, op, want.data(), one, 1, n); });
      mk::reduce_n(dt, op, got.data(), one, 1, n);
      // No arithmetic happens, so not even the NaN payload may differ.
      expect_same_as_portable(dt, ReduceOp::Max, want.data(), got.data(), n,
                              std::string(meshccl::dtype_name(dt)) + " reduce_n of one");
    }
  }
}

#if KERNEL_TEST_MXCSR
// The fast fp8 path decodes subnormals to float denormals; with flush-to-zero
// and denormals-are-zero set it must hand over to the general path, and every
// implementation must still match the portable one run under the same mode.
TEST_P(KernelTest, FlushToZeroModeMatchesPortable) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);
  check_fp8_every_pair(GetParam(), " under FTZ/DAZ");
  _mm_setcsr(saved);
}
#endif

INSTANTIATE_TEST_SUITE_P(Isa, KernelTest, ::testing::Values("portable", "avx2", "avx512"),
                         [](const auto& info) { return std::string(info.param); });

// ---- conversions (ISA independent) -------------------------------------------

TEST(KernelConvert, DecodeEveryCode) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const double want = kref::decode_narrow(ncclFloat16, c);
    const float got = mk::half_to_float(static_cast<uint16_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << c;
    }
    const double wb = kref::decode_narrow(ncclBfloat16, c);
    const float gb = mk::bf16_to_float(static_cast<uint16_t>(c));
    if (std::isnan(wb)) {
      EXPECT_TRUE(std::isnan(gb)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(gb), wb) << c;
    }
  }
  for (uint32_t c = 0; c < 0x100; ++c) {
    const double w4 = kref::decode_narrow(ncclFloat8e4m3, c), w5 = kref::decode_narrow(ncclFloat8e5m2, c);
    const float g4 = mk::e4m3_to_float(static_cast<uint8_t>(c)), g5 = mk::e5m2_to_float(static_cast<uint8_t>(c));
    if (std::isnan(w4)) {
      EXPECT_TRUE(std::isnan(g4)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(g4), w4) << c;
    }
    if (std::isnan(w5)) {
      EXPECT_TRUE(std::isnan(g5)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(g5), w5) << c;
    }
  }
  EXPECT_EQ(mk::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(mk::e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(mk::e5m2_to_float(0x7c), INFINITY);
  EXPECT_EQ(mk::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(KernelConvert, EncodeRoundsToNearestEven) {
  // Round trips of every code.
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const float h = mk::half_to_float(static_cast<uint16_t>(c));
    if (!std::isnan(h)) { EXPECT_EQ(mk::float_to_half(h), c) << c; }
    const float b = mk::bf16_to_float(static_cast<uint16_t>(c));
    if (!std::isnan(b)) { EXPECT_EQ(mk::float_to_bf16(b), c) << c; }
  }
  for (uint32_t c = 0; c < 0x100; ++c) {
    const float f4 = mk::e4m3_to_float(static_cast<uint8_t>(c));
    if (!std::isnan(f4)) { EXPECT_EQ(mk::float_to_e4m3(f4), c) << c; }
    const float f5 = mk::e5m2_to_float(static_cast<uint8_t>(c));
    if (std::isfinite(f5)) { EXPECT_EQ(mk::float_to_e5m2(f5), c) << c; }
  }
  // Many floats of every magnitude against the nearest-value search.
  std::mt19937 rng(1);
  for (int i = 0; i < 400000; ++i) {
    uint32_t u = rng();
    if (i % 2) u = (u & 0x81ffffffu) | (0x30000000u + (u % 0x18000000u));  // near the narrow ranges
    const float f = kref::fbits(u);
    auto check = [&](ncclDataType_t dt, uint32_t got) {
      const uint32_t want = kref::encoder(dt).encode(f);
      if (std::isnan(f)) {
        EXPECT_TRUE(kref::is_nan_code(dt, got)) << meshccl::dtype_name(dt) << " " << hex(u);
      } else {
        EXPECT_EQ(got, want) << meshccl::dtype_name(dt) << " " << hex(u);
      }
    };
    check(ncclFloat16, mk::float_to_half(f));
    check(ncclBfloat16, mk::float_to_bf16(f));
    check(ncclFloat8e4m3, mk::float_to_e4m3(f));
    check(ncclFloat8e5m2, mk::float_to_e5m2(f));
  }
  // Ties, overflow, saturation and NaN, by hand.
  EXPECT_EQ(mk::float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(mk::float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(mk::float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(mk::float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(mk::float_to_half(-INFINITY), 0xfc00);
  EXPECT_EQ(mk::float_to_half(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(mk::float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(mk::float_to_half(3 * std::ldexp(1.0f, -25)), 0x0002);
  EXPECT_EQ(mk::float_to_half(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(mk::half_to_float(mk::float_to_half(NAN))));
  EXPECT_EQ(mk::float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(mk::float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(mk::float_to_bf16(3.4028235e38f), 0x7f80);
  EXPECT_TRUE(std::isnan(mk::bf16_to_float(mk::float_to_bf16(kref::fbits(0x7f800001u)))));  // signalling NaN
  EXPECT_EQ(mk::float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(mk::float_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(mk::float_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(mk::float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(mk::float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(mk::float_to_e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(mk::float_to_e4m3(1.0625f), 0x38);  // tie between 1 and 1.125
  EXPECT_EQ(mk::float_to_e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25
  EXPECT_EQ(mk::float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(mk::float_to_e4m3(1.5f * std::ldexp(1.0f, -9)), 0x02);
  EXPECT_EQ(mk::float_to_e4m3(-std::ldexp(1.0f, -9)), 0x81);
  EXPECT_EQ(mk::float_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(mk::float_to_e5m2(61440.0f), 0x7b);
  EXPECT_EQ(mk::float_to_e5m2(INFINITY), 0x7b);
  EXPECT_EQ(mk::float_to_e5m2(-1e30f), 0xfb);
  EXPECT_EQ(mk::float_to_e5m2(1.125f), 0x3c);
  EXPECT_EQ(mk::float_to_e5m2(1.375f), 0x3e);
  EXPECT_EQ(mk::float_to_e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(mk::float_to_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_TRUE(std::isnan(mk::e5m2_to_float(mk::float_to_e5m2(NAN))));
}

// ---- API behaviour ---------------------------------------------------------------

TEST(KernelApi, SizesAndNames) {
  EXPECT_EQ(meshccl::dtype_size(ncclInt8), 1u);
  EXPECT_EQ(meshccl::dtype_size(ncclFloat16), 2u);
  EXPECT_EQ(meshccl::dtype_size(ncclFloat32), 4u);
  EXPECT_EQ(meshccl::dtype_size(ncclUint64), 8u);
  EXPECT_EQ(meshccl::dtype_size(ncclFloat8e5m2), 1u);
  EXPECT_EQ(meshccl::dtype_size(static_cast<ncclDataType_t>(12)), 0u);
  EXPECT_EQ(meshccl::dtype_size(static_cast<ncclDataType_t>(-1)), 0u);
  EXPECT_STREQ(meshccl::dtype_name(ncclFloat32), "float");
  EXPECT_STREQ(meshccl::dtype_name(ncclBfloat16), "bfloat16");
  EXPECT_STREQ(meshccl::dtype_name(ncclFloat8e4m3), "f8e4m3");
  EXPECT_STREQ(meshccl::dtype_name(static_cast<ncclDataType_t>(99)), "invalid");
}

TEST(KernelApi, InvalidArgumentsLeaveDstAlone) {
  float a[4] = {1, 2, 3, 4}, d[4] = {9, 9, 9, 9};
  mk::reduce2(static_cast<ncclDataType_t>(12), ReduceOp::Sum, d, a, a, 4);
  mk::reduce2(ncclFloat32, static_cast<ReduceOp>(4), d, a, a, 4);
  mk::reduce2(ncclFloat32, ReduceOp::Sum, d, nullptr, a, 4);
  const void* srcs[2] = {a, nullptr};
  mk::reduce_n(ncclFloat32, ReduceOp::Sum, d, srcs, 2, 4);
  mk::reduce_n(ncclFloat32, ReduceOp::Sum, d, srcs, 0, 4);
  mk::divide(static_cast<ncclDataType_t>(-3), d, a, 4, 2);
  mk::scale(ncclFloat32, d, a, 4, nullptr);
  for (float v : d) EXPECT_EQ(v, 9.0f);
  int32_t i[2] = {5, 6}, id[2] = {1, 1};
  mk::divide(ncclInt32, id, i, 2, 0);  // would trap in C
  EXPECT_EQ(id[0], 1);
  uint32_t u[1] = {5}, ud[1] = {1};
  mk::divide(ncclUint32, ud, u, 1, -2);
  EXPECT_EQ(ud[0], 1u);
}

TEST(KernelApi, SelectIsa) {
  EXPECT_FALSE(mk::select_isa("sse9"));
  EXPECT_FALSE(mk::select_isa(nullptr));
  EXPECT_TRUE(mk::select_isa("portable"));
  EXPECT_STREQ(mk::isa_name(), "portable");
  for (const char* isa : {"avx2", "avx512"}) { EXPECT_EQ(mk::select_isa(isa), mk::isa_supported(isa)); }
}

#if KERNEL_TEST_X86
// Which fast fp8 Sum/Prod loops the avx512 tests above ran: those of
// reduce_avx512_fp8.cpp where the CPU also has AVX512-BF16, VBMI and VBMI2,
// the AVX2 ones elsewhere, where the AVX-512 loops are built but cannot run.
TEST(KernelApi, Avx512TableHasTheFp8LoopsThisCpuRuns) {
  if (!mk::isa_supported("avx512")) GTEST_SKIP() << "avx512 not supported by this CPU";
  const bool extras = mk::avx512_fp8_extras_supported();
  mk::KernelTable want{};
  if (extras) {
    mk::fill_avx512_fp8_arith(want);
  } else {
    mk::fill_avx2_fp8_arith(want);
  }
  const mk::KernelTable& t = mk::avx512_table();
  for (ncclDataType_t dt : {ncclFloat8e4m3, ncclFloat8e5m2}) {
    EXPECT_EQ(t.reduce2[dt][0], want.reduce2[dt][0]) << meshccl::dtype_name(dt);
    EXPECT_EQ(t.reduce2[dt][1], want.reduce2[dt][1]) << meshccl::dtype_name(dt);
    EXPECT_EQ(t.reduce_n[dt][0], want.reduce_n[dt][0]) << meshccl::dtype_name(dt);
  }
  if (!extras) {
    GTEST_SKIP() << "no AVX512-BF16/VBMI/VBMI2 on this CPU: the AVX-512 fp8 Sum/Prod loops were not run (the avx512 "
                    "table uses the AVX2 ones)";
  }
}
#endif

}  // namespace
