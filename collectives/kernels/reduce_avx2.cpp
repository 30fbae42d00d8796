// The AVX2 implementation: compiled with -mavx2 -mf16c and called only after
// the runtime CPU check. Floating-point types use the vector loops of
// simd_loops.h with the codecs below; integer types use the generic loops,
// which the compiler vectorises for AVX2.
#define MESHCCL_KERNEL_NS avx2
#include <immintrin.h>

#include "collectives/kernels/simd_loops.h"

namespace meshccl::kernels::avx2 {
namespace {

struct F32 {
  using V = __m256;
  static constexpr size_t W = 8;
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  // maxps returns its second operand on NaN; where b is the NaN, take a.
  static V max(V a, V b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q)); }
};

struct F64 {
  using V = __m256d;
  static constexpr size_t W = 4;
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V div(V a, V b) { return _mm256_div_pd(a, b); }
  static V set1(double v) { return _mm256_set1_pd(v); }
  static V max(V a, V b) { return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q)); }
  static V min(V a, V b) { return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(b, b, _CMP_UNORD_Q)); }
};

struct F32Codec {
  static __m256 load(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }
  static void store(void* p, __m256 v) { _mm256_storeu_ps(static_cast<float*>(p), v); }
  static void store2(void* p, __m256 v0, __m256 v1) {
    store(p, v0);
    store(static_cast<float*>(p) + 8, v1);
  }
};

struct F64Codec {
  static __m256d load(const void* p) { return _mm256_loadu_pd(static_cast<const double*>(p)); }
  static void store(void* p, __m256d v) { _mm256_storeu_pd(static_cast<double*>(p), v); }
  static void store2(void* p, __m256d v0, __m256d v1) {
    store(p, v0);
    store(static_cast<double*>(p) + 4, v1);
  }
};

struct HalfCodec {
  static __m256 load(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p))); }
  static void store(void* p, __m256 v) {
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store2(void* p, __m256 v0, __m256 v1) {
    store(p, v0);
    store(static_cast<uint16_t*>(p) + 8, v1);
  }
};

// Two vectors of 32-bit lanes holding values below 2^16 -> sixteen uint16 in
// order (packus works per 128-bit half, the permute undoes the interleave).
inline __m256i narrow2_32_to_16(__m256i x0, __m256i x1) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(x0, x1), 0xd8);
}

// Two vectors of 32-bit lanes holding values below 2^8 -> sixteen bytes in order.
inline __m128i narrow2_32_to_8(__m256i x0, __m256i x1) {
  const __m256i w = _mm256_packus_epi32(x0, x1);  // x0[0..3] x1[0..3] | x0[4..7] x1[4..7] as u16
  const __m256i b = _mm256_packus_epi16(w, w);   // the same as bytes, twice per half
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  return _mm256_castsi256_si128(ordered);
}

// Round-to-nearest-even float -> bfloat16 bits in the low half of each lane.
inline __m256i bf16_bits(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  // A NaN keeps its top payload bits and becomes quiet (rounding could carry it into inf).
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

struct Bf16Codec {
  static __m256 load(const void* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(void* p, __m256 v) {
    const __m256i x = bf16_bits(v);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0x08);
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static void store2(void* p, __m256 v0, __m256 v1) {
    _mm256_storeu_si256(static_cast<__m256i*>(p), narrow2_32_to_16(bf16_bits(v0), bf16_bits(v1)));
  }
};

// float -> fp8 code with M mantissa bits and bias B, round to nearest even,
// saturating; the vector form of f2fp8 in convert.h. Both fp8 NaN codes have
// every bit of the largest finite code set, so NaN lanes just OR in 0x7f.
template <unsigned M, unsigned B, int kMaxCode>
inline __m256i fp8_codes(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  // Normal target: round the float's mantissa at bit 23-M; the exponent
  // rebias is folded into the rounding constant (valid where a is normal).
  constexpr int kShift = 23 - static_cast<int>(M);
  constexpr int kBias = (1 << (kShift - 1)) - 1 - ((127 - static_cast<int>(B)) << 23);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, kShift), _mm256_set1_epi32(1));
  __m256i normal = _mm256_srli_epi32(_mm256_add_epi32(a, _mm256_add_epi32(lsb, _mm256_set1_epi32(kBias))), kShift);
  normal = _mm256_min_epi32(normal, _mm256_set1_epi32(kMaxCode));
  // Subnormal target: the value in units of the smallest subnormal, rounded
  // to nearest even explicitly (not by MXCSR).
  const float unit = static_cast<float>(1u << (M + B - 1));  // 2^(M - (1 - B))
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(unit));
  const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i is_normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(static_cast<int>((128u - B) << 23) - 1));
  __m256i code = _mm256_blendv_epi8(sub, normal, is_normal);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
  code = _mm256_or_si256(code, _mm256_and_si256(is_nan, _mm256_set1_epi32(0x7f)));
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80)));
}

template <unsigned M, unsigned B, int kMaxCode>
struct Fp8Store {
  static void store(void* p, __m256 v) {
    const __m128i b = narrow2_32_to_8(fp8_codes<M, B, kMaxCode>(v), _mm256_setzero_si256());
    _mm_storel_epi64(static_cast<__m128i*>(p), b);
  }
  static void store2(void* p, __m256 v0, __m256 v1) {
    _mm_storeu_si128(static_cast<__m128i*>(p),
                     narrow2_32_to_8(fp8_codes<M, B, kMaxCode>(v0), fp8_codes<M, B, kMaxCode>(v1)));
  }
};

struct E5m2Codec : Fp8Store<2, 15, 0x7b> {
  static __m256 load(const void* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
  }
};

struct E4m3Codec : Fp8Store<3, 7, 0x7e> {
  static __m256 load(const void* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(mag, 7));
    // S.1111.111 is NaN: give those lanes an all-ones half exponent.
    h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7c00)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  }
};

}  // namespace
}  // namespace meshccl::kernels::avx2

namespace meshccl::kernels {

const KernelTable& avx2_table() {
  static const KernelTable table = [] {
    using namespace avx2;
    KernelTable t{};
    t.name = "avx2";
    fill_generic(t);
    fill_vec_type<F32, HalfCodec, HalfTraits>(t, ncclFloat16);
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
