// The AVX2 implementation: compiled with -mavx2 -mf16c and called only after
// the runtime CPU check. Floating-point types use the vector loops of
// simd_loops.h with the 8-lane codecs of x86_codecs.h (bfloat16's below), fp8
// also the loops of fp8_loops.h; integer types use the generic loops, which
// the compiler vectorises for AVX2.
#define MESHCCL_KERNEL_NS avx2
#include <immintrin.h>

#include "kernels/fp8_loops.h"

namespace meshccl::kernels::avx2 {
namespace {

// maxps returns its second operand on NaN; where b is the NaN, take a.
struct F32 : FloatOps<float, 32> {
  static V max(V a, V b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q)); }
};

struct F64 : FloatOps<double, 32> {
  static V max(V a, V b) { return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q)); }
};

// The ISA policy of x86_codecs.h on 256-bit vectors.
struct Ymm : VecWidth<32> {
  using M = F32;
  static I min_i32(I a, I b) { return reinterpret_cast<I>(_mm256_min_epi32(__m256i(a), __m256i(b))); }
  static I round_i32(F v) {
    return reinterpret_cast<I>(_mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }
  static void store_bytes(void* p, I x0, I x1) {
    const __m256i w = _mm256_packus_epi32(__m256i(x0), __m256i(x1));  // x0[0..3] x1[0..3] | x0[4..7] x1[4..7] as u16
    const __m256i b = _mm256_packus_epi16(w, w);                      // the same as bytes, twice per half
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_castsi256_si128(ordered));
  }
  static H widen_bytes(const void* p) {
    return reinterpret_cast<H>(_mm_cvtepu8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
  }
  static F cvtph(H h) { return _mm256_cvtph_ps(__m128i(h)); }
  static R maddubs(R a, R b) { return _mm256_maddubs_epi16(a, b); }
  static bool any_ff(R r) { return _mm256_movemask_epi8(_mm256_cmpeq_epi8(r, _mm256_set1_epi8(-1))) != 0; }
};

inline __m256i c32(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
inline __m256i c16(uint16_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }
inline __m256i c8(uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }

// Round-to-nearest-even at bit 16: the bfloat16 ends up in the high half.
inline __m256i bf16_round(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), c32(1));
  return _mm256_add_epi32(_mm256_add_epi32(u, c32(0x7fff)), lsb);
}

// bfloat16 is the high half of a float, so the even elements of a block are
// its 32-bit lanes shifted up and the odd ones the lanes with the low half
// cleared: no widening shuffle. Rounding needs no NaN case: a NaN reaching
// the store comes from an input (low 16 bits zero) or is the default NaN,
// so adding below bit 16 never carries, and it is quiet already unless it
// was passed through untouched (kPass), where the quiet bit is set here.
struct Bf16Codec {
  static constexpr int kVecs = 2;
  static void load(const void* p, F32::V* v) {
    const __m256i x = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(x, c32(0xffff0000u)));
  }
  template <bool kPass>
  static void store(void* p, const F32::V* v) {
    __m256i w = _mm256_blend_epi16(_mm256_srli_epi32(bf16_round(v[0]), 16), bf16_round(v[1]), 0xaa);
    if constexpr (kPass) {
      const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(w, c16(0x7fff)), c16(0x7f80));
      w = _mm256_or_si256(w, _mm256_and_si256(nan, c16(0x40)));
    }
    _mm256_storeu_si256(static_cast<__m256i*>(p), w);
  }
};

// The fast fp8 loops (fp8_loops.h) on 32 codes per block. Encoding moves
// the value's bits down under a constant exponent so that vcvtps2ph
// (rounding to nearest even by its immediate) rounds at the code's last bit,
// saturates in 16-bit lanes, and reassembles the bytes.
template <class Tr>
struct Fp8Fast : Fp8Blocks<Ymm, Tr> {
  using F = Fp8Format<Tr>;
  using R = typename Fp8Blocks<Ymm, Tr>::R;
  static constexpr int kShift = 10 - F::kMan;  // the code's last bit -> bit 13

  // Eight values -> eight halves s << 15 | (1 << 10) + m, where m is the
  // value's bits from the code's last one up, rounded there: the code itself
  // when in range, more when the value is beyond the largest finite one.
  // (A finite fp8 sum or product never reaches the float exponent bit that
  // the mask drops.)
  template <bool kJam>
  static __m128i halves(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    __m256i y = _mm256_or_si256(_mm256_and_si256(_mm256_srai_epi32(u, kShift), c32(0x807fffffu)), c32(113u << 23));
    if constexpr (kJam) y = _mm256_or_si256(y, _mm256_and_si256(u, c32((1u << kShift) - 1)));
    return _mm256_cvtps_ph(_mm256_castsi256_ps(y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // Sixteen halves -> code | s << 7 in 16-bit lanes, saturated.
  static __m256i codes(__m256i h) {
    const __m256i m = _mm256_min_epu16(_mm256_and_si256(h, c16(0x7fff)), c16(0x0400 + F::kMaxCode));
    return _mm256_or_si256(_mm256_and_si256(m, c16(0x7f)), _mm256_and_si256(_mm256_srli_epi16(h, 8), c16(0x80)));
  }
  template <bool kJam>
  static R encode(const F32::V* v) {
    // Words j < 8: codes 4j (from v[0]) and 4j+1 (v[1]); words 8 + j: codes 4j+2 and 4j+3.
    const __m256i e = codes(_mm256_set_m128i(halves<kJam>(v[2]), halves<kJam>(v[0])));
    const __m256i o = codes(_mm256_set_m128i(halves<kJam>(v[3]), halves<kJam>(v[1])));
    const __m256i pairs = _mm256_permute4x64_epi64(_mm256_or_si256(e, _mm256_slli_epi16(o, 8)), 0xd8);
    return _mm256_shuffle_epi8(pairs, _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,  //
                                                       0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
  }

  // Max/Min: the magnitude, negated for negative codes (so -0 == +0); NaN
  // gets the key below (Max) or above (Min) every other.
  template <ReduceOp kOp>
  static R key(R c) {
    const __m256i m = _mm256_and_si256(c, c8(0x7f));
    const __m256i nan = _mm256_cmpgt_epi8(m, c8(F::kNanMag - 1));
    return _mm256_blendv_epi8(_mm256_sign_epi8(m, c), c8(kOp == ReduceOp::Max ? 0x80 : 0x7f), nan);
  }
  // acc stays where it beats x or x is NaN; otherwise (ties included) x wins.
  template <ReduceOp kOp>
  static void step(R& acc, R& acc_key, R x) {
    const __m256i m = _mm256_and_si256(x, c8(0x7f));
    const __m256i kx = _mm256_sign_epi8(m, x);
    const __m256i beats = kOp == ReduceOp::Max ? _mm256_cmpgt_epi8(acc_key, kx) : _mm256_cmpgt_epi8(kx, acc_key);
    const __m256i keep = _mm256_or_si256(beats, _mm256_cmpgt_epi8(m, c8(F::kNanMag - 1)));
    acc = _mm256_blendv_epi8(x, acc, keep);
    acc_key = _mm256_blendv_epi8(kx, acc_key, keep);
  }
  static R finish(R r) {
    if constexpr (std::is_same_v<Tr, E5m2Traits>) {
      const __m256i m = _mm256_and_si256(r, c8(0x7f));
      r = _mm256_add_epi8(r, _mm256_cmpeq_epi8(m, c8(F::kInfMag)));  // inf -> largest finite
      r = _mm256_or_si256(r, _mm256_and_si256(_mm256_cmpgt_epi8(m, c8(F::kInfMag)), c8(0x7f)));
    }
    return r;
  }
};

}  // namespace
}  // namespace meshccl::kernels::avx2

namespace meshccl::kernels {

void fill_avx2_fp8_arith(KernelTable& t) { avx2::fill_fp8_arith<avx2::Fp8Fast>(t); }
void fill_avx2_fp8_select(KernelTable& t) { avx2::fill_fp8_select<avx2::Fp8Fast>(t); }

const KernelTable& avx2_table() {
  static const KernelTable table = [] {
    using namespace avx2;
    KernelTable t{};
    t.name = "avx2";
    fill_generic(t);
    fill_vec_type<F32, HalfCodec, HalfTraits>(t, ncclFloat16);
    fill_vec_type<F32, PlainCodec<float, 32>, NativeFloatTraits<float>>(t, ncclFloat32);
    fill_vec_type<F64, PlainCodec<double, 32>, NativeFloatTraits<double>>(t, ncclFloat64);
    fill_vec_type<F32, Bf16Codec, Bf16Traits>(t, ncclBfloat16);
    fill_vec_type<F32, E4m3Codec<Ymm>, E4m3Traits>(t, ncclFloat8e4m3);
    fill_vec_type<F32, E5m2Codec<Ymm>, E5m2Traits>(t, ncclFloat8e5m2);
    fill_avx2_fp8_arith(t);
    fill_avx2_fp8_select(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
