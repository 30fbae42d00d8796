// AVX-512 (F, BW, VL, DQ) math policies, the ISA policy of x86_codecs.h on
// 512-bit vectors (Zmm) and the bfloat16 codec, for simd_loops.h and
// fp8_loops.h: included by reduce_avx512.cpp and by reduce_avx512_fp8.cpp,
// whose fast fp8 loops fall back to the fp8 codecs on Zmm. Shares the
// including file's namespace.
#pragma once

#include <immintrin.h>

#include "kernels/fp8_loops.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {
namespace {

// maxps returns its second operand on NaN; where b is the NaN, take a.
struct F32 : FloatOps<float, 64> {
  static V max(V a, V b) { return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
};

struct F64 : FloatOps<double, 64> {
  static V max(V a, V b) { return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), a); }
};

// 256-bit lanes for half (see HalfCodec).
struct F32x8 : FloatOps<float, 32> {
  static V max(V a, V b) { return _mm256_mask_mov_ps(_mm256_max_ps(a, b), _mm256_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm256_mask_mov_ps(_mm256_min_ps(a, b), _mm256_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
};

// The ISA policy of x86_codecs.h on 512-bit vectors.
struct Zmm : VecWidth<64> {
  using M = F32;
  static I min_i32(I a, I b) { return reinterpret_cast<I>(_mm512_min_epi32(__m512i(a), __m512i(b))); }
  static I round_i32(F v) {
    return reinterpret_cast<I>(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_bytes(void* p, I x0, I x1) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(__m512i(x0)));
    _mm_storeu_si128(static_cast<__m128i*>(p) + 1, _mm512_cvtepi32_epi8(__m512i(x1)));
  }
  static H widen_bytes(const void* p) {
    return reinterpret_cast<H>(_mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p))));
  }
  static F cvtph(H h) { return _mm512_cvtph_ps(__m256i(h)); }
  static R maddubs(R a, R b) { return _mm512_maddubs_epi16(a, b); }
  static bool any_ff(R r) { return _mm512_cmpeq_epi8_mask(r, _mm512_set1_epi8(-1)) != 0; }
};

inline __m512i c32(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
inline __m512i c16(uint16_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }
inline __m512i c8(uint8_t v) { return _mm512_set1_epi8(static_cast<char>(v)); }

// Round-to-nearest-even at bit 16: the bfloat16 ends up in the high half.
inline __m512i bf16_round(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  return _mm512_add_epi32(_mm512_add_epi32(u, c32(0x7fff)), _mm512_and_si512(_mm512_srli_epi32(u, 16), c32(1)));
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
    const __m512i x = _mm512_loadu_si512(p);
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(x, c32(0xffff0000u)));
  }
  template <bool kPass>
  static void store(void* p, const F32::V* v) {
    __m512i w = _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(bf16_round(v[0]), 16), bf16_round(v[1]));
    if constexpr (kPass) {
      const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(w, c16(0x7fff)), c16(0x7f80));
      w = _mm512_mask_mov_epi16(w, nan, _mm512_or_si512(w, c16(0x40)));
    }
    _mm512_storeu_si512(p, w);
  }
};

}  // namespace
}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
