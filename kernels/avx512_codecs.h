// AVX-512 (F, BW, VL, DQ) math and codec policies for simd_loops.h and
// fp8_loops.h: included by reduce_avx512.cpp and by reduce_avx512_fp8.cpp,
// whose fast fp8 loops fall back to these codecs. Shares the including
// file's namespace.
#pragma once

#include <immintrin.h>

#include "kernels/fp8_loops.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {
namespace {

struct F32 {
  using V = __m512;
  static constexpr size_t W = 16;
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  // maxps returns its second operand on NaN; where b is the NaN, take a.
  static V max(V a, V b) { return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
};

struct F64 {
  using V = __m512d;
  static constexpr size_t W = 8;
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V div(V a, V b) { return _mm512_div_pd(a, b); }
  static V set1(double v) { return _mm512_set1_pd(v); }
  static V max(V a, V b) { return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(b, b, _CMP_UNORD_Q), a); }
};

// 256-bit lanes for half: on CPUs that split 512-bit conversions in two
// (AMD Zen 4) the ymm form of vcvtph2ps/vcvtps2ph is the faster one.
struct F32x8 {
  using V = __m256;
  static constexpr size_t W = 8;
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V max(V a, V b) { return _mm256_mask_mov_ps(_mm256_max_ps(a, b), _mm256_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
  static V min(V a, V b) { return _mm256_mask_mov_ps(_mm256_min_ps(a, b), _mm256_cmp_ps_mask(b, b, _CMP_UNORD_Q), a); }
};

inline __m512i c32(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
inline __m512i c16(uint16_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }
inline __m512i c8(uint8_t v) { return _mm512_set1_epi8(static_cast<char>(v)); }

// vcvtph2ps/vcvtps2ph quieten a signalling NaN as the scalar conversions do.
struct HalfCodec8 {
  static constexpr int kVecs = 2;
  static void load(const void* p, __m256* v) {
    v[0] = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    v[1] = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p) + 1));
  }
  template <bool kPass>
  static void store(void* p, const __m256* v) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v[0], kRound));
    _mm_storeu_si128(static_cast<__m128i*>(p) + 1, _mm256_cvtps_ph(v[1], kRound));
  }
};

struct F32Codec {
  static constexpr int kVecs = 2;
  static void load(const void* p, __m512* v) {
    v[0] = _mm512_loadu_ps(p);
    v[1] = _mm512_loadu_ps(static_cast<const float*>(p) + 16);
  }
  template <bool kPass>
  static void store(void* p, const __m512* v) {
    _mm512_storeu_ps(p, v[0]);
    _mm512_storeu_ps(static_cast<float*>(p) + 16, v[1]);
  }
};

struct F64Codec {
  static constexpr int kVecs = 2;
  static void load(const void* p, __m512d* v) {
    v[0] = _mm512_loadu_pd(p);
    v[1] = _mm512_loadu_pd(static_cast<const double*>(p) + 8);
  }
  template <bool kPass>
  static void store(void* p, const __m512d* v) {
    _mm512_storeu_pd(p, v[0]);
    _mm512_storeu_pd(static_cast<double*>(p) + 8, v[1]);
  }
};

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
  static void load(const void* p, __m512* v) {
    const __m512i x = _mm512_loadu_si512(p);
    v[0] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    v[1] = _mm512_castsi512_ps(_mm512_and_si512(x, c32(0xffff0000u)));
  }
  template <bool kPass>
  static void store(void* p, const __m512* v) {
    __m512i w = _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(bf16_round(v[0]), 16), bf16_round(v[1]));
    if constexpr (kPass) {
      const __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(w, c16(0x7fff)), c16(0x7f80));
      w = _mm512_mask_mov_epi16(w, nan, _mm512_or_si512(w, c16(0x40)));
    }
    _mm512_storeu_si512(p, w);
  }
};

// float -> fp8 code with M mantissa bits and bias B, round to nearest even,
// saturating; the vector form of f2fp8 in convert.h, independent of MXCSR.
// Both fp8 NaN codes have every bit of the largest finite code set, so NaN
// lanes just OR in 0x7f.
template <unsigned M, unsigned B, int kMaxCode>
inline __m512i fp8_codes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(u, c32(0x7fffffff));
  // Normal target: round the float's mantissa at bit 23-M; the exponent
  // rebias is folded into the rounding constant (valid where a is normal).
  constexpr int kShift = 23 - static_cast<int>(M);
  constexpr int kBias = (1 << (kShift - 1)) - 1 - ((127 - static_cast<int>(B)) << 23);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kShift), c32(1));
  __m512i normal = _mm512_srli_epi32(_mm512_add_epi32(a, _mm512_add_epi32(lsb, c32(kBias))), kShift);
  normal = _mm512_min_epi32(normal, c32(kMaxCode));
  // Subnormal target: the value in units of the smallest subnormal, rounded
  // to nearest even by the instruction's own rounding mode (not MXCSR).
  const float unit = static_cast<float>(1u << (M + B - 1));  // 2^(M - (1 - B))
  const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(unit));
  const __m512i sub = _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 is_normal = _mm512_cmpgt_epi32_mask(a, c32(((128u - B) << 23) - 1));
  __m512i code = _mm512_mask_mov_epi32(sub, is_normal, normal);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(a, c32(0x7f800000));
  code = _mm512_mask_or_epi32(code, is_nan, code, c32(0x7f));
  // code | (sign bit moved to bit 7)
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24), c32(0x80), 0xf8);  // A | (B & C)
}

// The general fp8 codec: exact for every input and every MXCSR setting; the
// fast loops fall back to it.
template <unsigned M, unsigned B, int kMaxCode>
struct Fp8Store {
  static constexpr int kVecs = 2;
  template <bool kPass>
  static void store(void* p, const __m512* v) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(fp8_codes<M, B, kMaxCode>(v[0])));
    _mm_storeu_si128(static_cast<__m128i*>(p) + 1, _mm512_cvtepi32_epi8(fp8_codes<M, B, kMaxCode>(v[1])));
  }
};

struct E5m2Codec : Fp8Store<2, 15, 0x7b> {
  static __m512 load16(const void* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(_mm256_slli_epi16(b, 8));
  }
  static void load(const void* p, __m512* v) {
    v[0] = load16(p);
    v[1] = load16(static_cast<const unsigned char*>(p) + 16);
  }
};

struct E4m3Codec : Fp8Store<3, 7, 0x7e> {
  static __m512 load16(const void* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    // (b << 8 & 0x8000) | mag << 7: the e4m3 fields placed as a binary16.
    __m256i h = _mm256_ternarylogic_epi32(_mm256_slli_epi16(b, 8), _mm256_set1_epi16(static_cast<short>(0x8000)),
                                          _mm256_slli_epi16(mag, 7), 0xea);  // (A & B) | C
    // S.1111.111 is NaN: give those lanes an all-ones half exponent.
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f));
    h = _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(h, _mm256_set1_epi16(0x7c00)));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
  }
  static void load(const void* p, __m512* v) {
    v[0] = load16(p);
    v[1] = load16(static_cast<const unsigned char*>(p) + 16);
  }
};

template <class Tr>
using Fp8Codec = std::conditional_t<std::is_same_v<Tr, E4m3Traits>, E4m3Codec, E5m2Codec>;

}  // namespace
}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
