// The AVX-512 implementation (F, BW, VL, DQ): compiled with those flags and
// called only after the runtime CPU check. Floating-point types use the
// vector loops of simd_loops.h with 16-lane codecs; integer types use the
// generic loops, which the compiler vectorises for AVX-512.
#define MESHCCL_KERNEL_NS avx512
#include <immintrin.h>

#include "collectives/kernels/simd_loops.h"

namespace meshccl::kernels::avx512 {
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

struct HalfCodec8 {
  static __m256 load(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p))); }
  static void store(void* p, __m256 v) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store2(void* p, __m256 v0, __m256 v1) {
    store(p, v0);
    store(static_cast<uint16_t*>(p) + 8, v1);
  }
};

struct F32Codec {
  static __m512 load(const void* p) { return _mm512_loadu_ps(p); }
  static void store(void* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static void store2(void* p, __m512 v0, __m512 v1) {
    store(p, v0);
    store(static_cast<float*>(p) + 16, v1);
  }
};

struct F64Codec {
  static __m512d load(const void* p) { return _mm512_loadu_pd(p); }
  static void store(void* p, __m512d v) { _mm512_storeu_pd(p, v); }
  static void store2(void* p, __m512d v0, __m512d v1) {
    store(p, v0);
    store(static_cast<double*>(p) + 8, v1);
  }
};

struct HalfCodec {
  static __m512 load(const void* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  static void store(void* p, __m512 v) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store2(void* p, __m512 v0, __m512 v1) {
    store(p, v0);
    store(static_cast<uint16_t*>(p) + 16, v1);
  }
};

// Round-to-nearest-even float -> bfloat16 bits in the low half of each lane.
inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  // A NaN keeps its top payload bits and becomes quiet (rounding could carry it into inf).
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, hi, _mm512_set1_epi32(0x40));
}

struct Bf16Codec {
  static __m512 load(const void* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(void* p, __m512 v) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(v)));
  }
  static void store2(void* p, __m512 v0, __m512 v1) {
    // The even 16-bit words of the pair, in order, in one permute.
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,  //
                                          30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    _mm512_storeu_si512(p, _mm512_permutex2var_epi16(bf16_bits(v0), even, bf16_bits(v1)));
  }
};

// float -> fp8 code with M mantissa bits and bias B, round to nearest even,
// saturating; the vector form of f2fp8 in convert.h. Both fp8 NaN codes have
// every bit of the largest finite code set, so NaN lanes just OR in 0x7f.
template <unsigned M, unsigned B, int kMaxCode>
inline __m512i fp8_codes(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  // Normal target: round the float's mantissa at bit 23-M; the exponent
  // rebias is folded into the rounding constant (valid where a is normal).
  constexpr int kShift = 23 - static_cast<int>(M);
  constexpr int kBias = (1 << (kShift - 1)) - 1 - ((127 - static_cast<int>(B)) << 23);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kShift), _mm512_set1_epi32(1));
  __m512i normal = _mm512_srli_epi32(_mm512_add_epi32(a, _mm512_add_epi32(lsb, _mm512_set1_epi32(kBias))), kShift);
  normal = _mm512_min_epi32(normal, _mm512_set1_epi32(kMaxCode));
  // Subnormal target: the value in units of the smallest subnormal, rounded
  // to nearest even by the instruction's own rounding mode (not MXCSR).
  const float unit = static_cast<float>(1u << (M + B - 1));  // 2^(M - (1 - B))
  const __m512 scaled = _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(unit));
  const __m512i sub = _mm512_cvt_roundps_epi32(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 is_normal = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(static_cast<int>((128u - B) << 23) - 1));
  __m512i code = _mm512_mask_mov_epi32(sub, is_normal, normal);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000));
  code = _mm512_mask_or_epi32(code, is_nan, code, _mm512_set1_epi32(0x7f));
  // code | (sign bit moved to bit 7)
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80), 0xf8);  // A | (B & C)
}

template <unsigned M, unsigned B, int kMaxCode>
struct Fp8Store {
  static void store(void* p, __m512 v) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm512_cvtepi32_epi8(fp8_codes<M, B, kMaxCode>(v)));
  }
  static void store2(void* p, __m512 v0, __m512 v1) {
    store(p, v0);
    store(static_cast<unsigned char*>(p) + 16, v1);
  }
};

struct E5m2Codec : Fp8Store<2, 15, 0x7b> {
  static __m512 load(const void* p) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    return _mm512_cvtph_ps(_mm256_slli_epi16(b, 8));
  }
};

struct E4m3Codec : Fp8Store<3, 7, 0x7e> {
  static __m512 load(const void* p) {
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
};

}  // namespace
}  // namespace meshccl::kernels::avx512

namespace meshccl::kernels {

const KernelTable& avx512_table() {
  static const KernelTable table = [] {
    using namespace avx512;
    KernelTable t{};
    t.name = "avx512";
    fill_generic(t);
    fill_vec_type<F32x8, HalfCodec8, HalfTraits>(t, ncclFloat16);
    fill_vec_type<F32, F32Codec, NativeFloatTraits<float>>(t, ncclFloat32);
    fill_vec_type<F64, F64Codec, NativeFloatTraits<double>>(t, ncclFloat64);
    fill_vec_type<F32, Bf16Codec, Bf16Traits>(t, ncclBfloat16);
    fill_vec_type<F32, E4m3Codec, E4m3Traits>(t, ncclFloat8e4m3);
    fill_vec_type<F32, E5m2Codec, E5m2Traits>(t, ncclFloat8e5m2);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
