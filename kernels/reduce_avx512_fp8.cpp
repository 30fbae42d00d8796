// Fast fp8 Sum/Prod for AVX-512 CPUs that also have AVX512-BF16, VBMI and
// VBMI2 (AMD Zen 4, Intel Sapphire Rapids and later): compiled with those
// flags and installed into the AVX-512 table only after the runtime check.
// The loops are those of fp8_loops.h; blocks they cannot take fall back to
// the AVX-512 codecs, which this file instantiates for itself.
#define MESHCCL_KERNEL_NS avx512fp8
#include "kernels/avx512_codecs.h"

namespace meshccl::kernels::avx512fp8 {
namespace {

// 64 codes per block. Encoding clamps to the largest finite value keeping
// the sign (vrangeps), then a funnel shift (vpshrdd) moves the code down so
// that its last bit is bit 16 and puts a small exponent on top:
// vcvtne2ps2bf16 then rounds to nearest even at exactly the code's last bit
// and narrows two vectors at once. Each bfloat16 is K << 12 | s << 11 | code
// (e4m3; one bit further for e5m2), and vpmaddubsw by (1, 2^(7-kMan)) turns
// it into code | s << 7 in the low byte, which vpermt2b gathers back into
// order.
template <class Tr>
struct Fp8Fast : Fp8Blocks<Zmm, Tr> {
  using F = Fp8Format<Tr>;
  using R = typename Fp8Blocks<Zmm, Tr>::R;
  static constexpr int kShift = 7 - F::kMan;  // the code's last bit -> bit 16
  using Fp8Blocks<Zmm, Tr>::kMul;

  template <bool kJam>
  static __m512 narrowable(__m512 v) {
    // min(|v|, largest) with v's sign: imm [1:0] = 10 absolute min, [3:2] = 00 sign of the first operand.
    const __m512i c = _mm512_castps_si512(_mm512_range_ps(v, _mm512_set1_ps(F::kMaxScaled), 0x02));
    __m512i y = _mm512_shrdi_epi32(c, c32(1), kShift);
    if constexpr (kJam) y = _mm512_ternarylogic_epi32(y, c, c32((1u << kShift) - 1), 0xf8);  // A | (B & C)
    return _mm512_castsi512_ps(y);
  }
  template <bool kJam>
  static R encode(const F32::V* v) {
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
};

}  // namespace
}  // namespace meshccl::kernels::avx512fp8

namespace meshccl::kernels {

void fill_avx512_fp8_arith(KernelTable& t) { avx512fp8::fill_fp8_arith<avx512fp8::Fp8Fast>(t); }

}  // namespace meshccl::kernels
