// Fast fp8 Sum/Prod for AVX-512 CPUs that also have AVX512-BF16, VBMI and
// VBMI2 (AMD Zen 4, Intel Sapphire Rapids and later): compiled with those
// flags and installed into the AVX-512 table only after the runtime check.
// The loops are those of fp8_loops.h; blocks they cannot take fall back to
// the AVX-512 codecs, which this file instantiates for itself.
#define MESHCCL_KERNEL_NS avx512fp8
#include "kernels/avx512_codecs.h"

namespace meshccl::kernels::avx512fp8 {
namespace {

// 64 codes per block. Decoding: vpmaddubsw multiplies each code, as a signed
// byte, by 2^(7-kMan), which puts the magnitude where a float's high half
// wants it with the sign spread above; a shift and a mask make four float
// vectors, lane i of v[k] holding code 4i+k. Encoding clamps to the largest
// finite value keeping the sign (vrangeps), then a funnel shift (vpshrdd)
// moves the code down so that its last bit is bit 16 and puts a small
// exponent on top: vcvtne2ps2bf16 then rounds to nearest even at exactly
// the code's last bit and narrows two vectors at once. Each bfloat16 is
// K << 12 | s << 11 | code (e4m3; one bit further for e5m2), and vpmaddubsw
// by (1, 2^(7-kMan)) turns it into code | s << 7 in the low byte, which
// vpermt2b gathers back into order.
template <class Tr_>
struct Fp8Fast {
  using Tr = Tr_;
  using F = Fp8Format<Tr>;
  using M = F32;
  using R = __m512i;
  static constexpr size_t kBlock = 64;
  static constexpr int kVecs = 4;
  static constexpr int kShift = 7 - F::kMan;  // the code's last bit -> bit 16
  static constexpr uint16_t kMul = 1u << (7 - F::kMan);

  static R load(const void* p) { return _mm512_loadu_si512(p); }
  static void store(void* p, R r) { _mm512_storeu_si512(p, r); }
  static R special(R x) { return _mm512_or_si512(x, c8(F::kSpecialOr)); }
  static R merge(R a, R b) { return _mm512_max_epu8(a, b); }
  static bool any_special(R acc) { return _mm512_cmpeq_epi8_mask(acc, c8(0xff)) != 0; }

  static void decode(R x, __m512* v) {
    const __m512i m = c32(kFp8FloatMask<Tr>);
    const __m512i even = _mm512_maddubs_epi16(c16(kMul), x);
    const __m512i odd = _mm512_maddubs_epi16(c16(kMul << 8), x);
    v[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(even, 16), m));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(odd, 16), m));
    v[2] = _mm512_castsi512_ps(_mm512_and_si512(even, m));
    v[3] = _mm512_castsi512_ps(_mm512_and_si512(odd, m));
  }
  static __m512 unscale(__m512 v) { return _mm512_mul_ps(v, _mm512_set1_ps(F::kUnscale)); }

  template <bool kJam>
  static __m512 narrowable(__m512 v) {
    // min(|v|, largest) with v's sign: imm [1:0] = 10 absolute min, [3:2] = 00 sign of the first operand.
    const __m512i c = _mm512_castps_si512(_mm512_range_ps(v, _mm512_set1_ps(F::kMaxScaled), 0x02));
    __m512i y = _mm512_shrdi_epi32(c, c32(1), kShift);
    if constexpr (kJam) y = _mm512_ternarylogic_epi32(y, c, c32((1u << kShift) - 1), 0xf8);  // A | (B & C)
    return _mm512_castsi512_ps(y);
  }
  template <bool kJam>
  static R encode(const __m512* v) {
    // Words 0..15 from the first vector given to vcvtne2ps2bf16's second operand, 16..31 from the other.
    __m512i lo = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(narrowable<kJam>(v[2]), narrowable<kJam>(v[0])));
    __m512i hi = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(narrowable<kJam>(v[3]), narrowable<kJam>(v[1])));
    lo = _mm512_maddubs_epi16(lo, c16(static_cast<uint16_t>(1u | kMul << 8)));
    hi = _mm512_maddubs_epi16(hi, c16(static_cast<uint16_t>(1u | kMul << 8)));
    return _mm512_permutex2var_epi8(lo, _mm512_load_si512(kOrder.idx), hi);
  }
  // Code 4i+k sits in word i (k = 0, 1) or 16+i (k = 2, 3) of lo (k even) or hi (k odd).
  struct Order {
    alignas(64) int8_t idx[64];
  };
  static constexpr Order kOrder = [] {
    Order o{};
    for (int e = 0; e < 64; ++e) {
      const int i = e / 4, k = e % 4;
      o.idx[e] = static_cast<int8_t>((k & 1) * 64 + 2 * (k < 2 ? i : 16 + i));
    }
    return o;
  }();

  template <ReduceOp kOp>
  static void general2(void* dst, const void* a, const void* b, size_t count) {
    reduce2_vec<F32, Fp8Codec<Tr>, Tr, kOp>(dst, a, b, count);
  }
  static void general_n(void* dst, const void* const* srcs, int nsrc, size_t begin, size_t end) {
    reduce_n_vec_range<F32, Fp8Codec<Tr>, Tr, ReduceOp::Sum>(dst, srcs, nsrc, begin, end);
  }
};

}  // namespace
}  // namespace meshccl::kernels::avx512fp8

namespace meshccl::kernels {

void fill_avx512_fp8_arith(KernelTable& t) {
  using namespace avx512fp8;
  fill_fp8_arith<Fp8Fast<E4m3Traits>>(t, ncclFloat8e4m3);
  fill_fp8_arith<Fp8Fast<E5m2Traits>>(t, ncclFloat8e5m2);
}

}  // namespace meshccl::kernels
