// The AVX2 implementation: compiled with -mavx2 -mf16c and called only after
// the runtime CPU check. Floating-point types use the vector loops of
// simd_loops.h with the codecs below, fp8 the loops of fp8_loops.h; integer
// types use the generic loops, which the compiler vectorises for AVX2.
#define MESHCCL_KERNEL_NS avx2
#include <immintrin.h>

#include "kernels/fp8_loops.h"

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

inline __m256i c32(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
inline __m256i c16(uint16_t v) { return _mm256_set1_epi16(static_cast<short>(v)); }
inline __m256i c8(uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }

// Codecs: a block is two vectors (16 elements).

struct F32Codec {
  static constexpr int kVecs = 2;
  static void load(const void* p, __m256* v) {
    v[0] = _mm256_loadu_ps(static_cast<const float*>(p));
    v[1] = _mm256_loadu_ps(static_cast<const float*>(p) + 8);
  }
  template <bool kPass>
  static void store(void* p, const __m256* v) {
    _mm256_storeu_ps(static_cast<float*>(p), v[0]);
    _mm256_storeu_ps(static_cast<float*>(p) + 8, v[1]);
  }
};

struct F64Codec {
  static constexpr int kVecs = 2;
  static void load(const void* p, __m256d* v) {
    v[0] = _mm256_loadu_pd(static_cast<const double*>(p));
    v[1] = _mm256_loadu_pd(static_cast<const double*>(p) + 4);
  }
  template <bool kPass>
  static void store(void* p, const __m256d* v) {
    _mm256_storeu_pd(static_cast<double*>(p), v[0]);
    _mm256_storeu_pd(static_cast<double*>(p) + 4, v[1]);
  }
};

// vcvtph2ps/vcvtps2ph quieten a signalling NaN as the scalar conversions do.
struct HalfCodec {
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
  static void load(const void* p, __m256* v) {
    const __m256i x = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    v[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(x, c32(0xffff0000u)));
  }
  template <bool kPass>
  static void store(void* p, const __m256* v) {
    __m256i w = _mm256_blend_epi16(_mm256_srli_epi32(bf16_round(v[0]), 16), bf16_round(v[1]), 0xaa);
    if constexpr (kPass) {
      const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(w, c16(0x7fff)), c16(0x7f80));
      w = _mm256_or_si256(w, _mm256_and_si256(nan, c16(0x40)));
    }
    _mm256_storeu_si256(static_cast<__m256i*>(p), w);
  }
};

// Two vectors of 32-bit lanes holding values below 2^8 -> sixteen bytes in order.
inline __m128i narrow2_32_to_8(__m256i x0, __m256i x1) {
  const __m256i w = _mm256_packus_epi32(x0, x1);  // x0[0..3] x1[0..3] | x0[4..7] x1[4..7] as u16
  const __m256i b = _mm256_packus_epi16(w, w);    // the same as bytes, twice per half
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  return _mm256_castsi256_si128(ordered);
}

// float -> fp8 code with M mantissa bits and bias B, round to nearest even,
// saturating; the vector form of f2fp8 in convert.h, independent of MXCSR.
// Both fp8 NaN codes have every bit of the largest finite code set, so NaN
// lanes just OR in 0x7f.
template <unsigned M, unsigned B, int kMaxCode>
inline __m256i fp8_codes(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(u, c32(0x7fffffff));
  // Normal target: round the float's mantissa at bit 23-M; the exponent
  // rebias is folded into the rounding constant (valid where a is normal).
  constexpr int kShift = 23 - static_cast<int>(M);
  constexpr int kBias = (1 << (kShift - 1)) - 1 - ((127 - static_cast<int>(B)) << 23);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, kShift), c32(1));
  __m256i normal = _mm256_srli_epi32(_mm256_add_epi32(a, _mm256_add_epi32(lsb, c32(kBias))), kShift);
  normal = _mm256_min_epi32(normal, c32(kMaxCode));
  // Subnormal target: the value in units of the smallest subnormal, rounded
  // to nearest even explicitly (not by MXCSR).
  const float unit = static_cast<float>(1u << (M + B - 1));  // 2^(M - (1 - B))
  const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(unit));
  const __m256i sub = _mm256_cvttps_epi32(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i is_normal = _mm256_cmpgt_epi32(a, c32(((128u - B) << 23) - 1));
  __m256i code = _mm256_blendv_epi8(sub, normal, is_normal);
  const __m256i is_nan = _mm256_cmpgt_epi32(a, c32(0x7f800000));
  code = _mm256_or_si256(code, _mm256_and_si256(is_nan, c32(0x7f)));
  return _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(u, 24), c32(0x80)));
}

// The general fp8 codec: exact for every input and every MXCSR setting; the
// fast loops fall back to it.
template <unsigned M, unsigned B, int kMaxCode>
struct Fp8Store {
  static constexpr int kVecs = 2;
  template <bool kPass>
  static void store(void* p, const __m256* v) {
    _mm_storeu_si128(static_cast<__m128i*>(p),
                     narrow2_32_to_8(fp8_codes<M, B, kMaxCode>(v[0]), fp8_codes<M, B, kMaxCode>(v[1])));
  }
};

struct E5m2Codec : Fp8Store<2, 15, 0x7b> {
  static __m256 load8(const void* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
    return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
  }
  static void load(const void* p, __m256* v) {
    v[0] = load8(p);
    v[1] = load8(static_cast<const unsigned char*>(p) + 8);
  }
};

struct E4m3Codec : Fp8Store<3, 7, 0x7e> {
  static __m256 load8(const void* p) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(static_cast<const __m128i*>(p)));
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8), _mm_slli_epi16(mag, 7));
    // S.1111.111 is NaN: give those lanes an all-ones half exponent.
    h = _mm_or_si128(h, _mm_and_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7c00)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
  }
  static void load(const void* p, __m256* v) {
    v[0] = load8(p);
    v[1] = load8(static_cast<const unsigned char*>(p) + 8);
  }
};

template <class Tr>
using Fp8Codec = std::conditional_t<std::is_same_v<Tr, E4m3Traits>, E4m3Codec, E5m2Codec>;

// The fast fp8 loops (fp8_loops.h) on 32 codes per block. Decoding: vpmaddubsw
// multiplies each code, as a signed byte, by 2^(7-kMan), which puts the
// magnitude where a float's high half wants it with the sign spread above;
// a shift and a mask then make four float vectors: lane i of v[k] is code
// 4i+k of the block. Encoding moves the value's bits down under a constant
// exponent so that vcvtps2ph (rounding to nearest even by its immediate)
// rounds at the code's last bit, saturates in 16-bit lanes, and reassembles
// the bytes.
template <class Tr_>
struct Fp8Fast {
  using Tr = Tr_;
  using F = Fp8Format<Tr>;
  using M = F32;
  using R = __m256i;
  static constexpr size_t kBlock = 32;
  static constexpr int kVecs = 4;
  static constexpr int kShift = 10 - F::kMan;  // the code's last bit -> bit 13

  static R load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static void store(void* p, R r) { _mm256_storeu_si256(static_cast<__m256i*>(p), r); }
  static R special(R x) { return _mm256_or_si256(x, c8(F::kSpecialOr)); }
  static R merge(R a, R b) { return _mm256_max_epu8(a, b); }
  static bool any_special(R acc) { return _mm256_movemask_epi8(_mm256_cmpeq_epi8(acc, c8(0xff))) != 0; }

  static void decode(R x, __m256* v) {
    const __m256i m = c32(kFp8FloatMask<Tr>);
    const __m256i even = _mm256_maddubs_epi16(c16(1u << (7 - F::kMan)), x);
    const __m256i odd = _mm256_maddubs_epi16(c16((1u << (7 - F::kMan)) << 8), x);
    v[0] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(even, 16), m));
    v[1] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(odd, 16), m));
    v[2] = _mm256_castsi256_ps(_mm256_and_si256(even, m));
    v[3] = _mm256_castsi256_ps(_mm256_and_si256(odd, m));
  }
  static __m256 unscale(__m256 v) { return _mm256_mul_ps(v, _mm256_set1_ps(F::kUnscale)); }

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
  static R encode(const __m256* v) {
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

  template <ReduceOp kOp>
  static void general2(void* dst, const void* a, const void* b, size_t count) {
    reduce2_vec<F32, Fp8Codec<Tr>, Tr, kOp>(dst, a, b, count);
  }
  static void general_n(void* dst, const void* const* srcs, int nsrc, size_t begin, size_t end) {
    reduce_n_vec_range<F32, Fp8Codec<Tr>, Tr, ReduceOp::Sum>(dst, srcs, nsrc, begin, end);
  }
};

}  // namespace
}  // namespace meshccl::kernels::avx2

namespace meshccl::kernels {

void fill_avx2_fp8_arith(KernelTable& t) {
  using namespace avx2;
  fill_fp8_arith<Fp8Fast<E4m3Traits>>(t, ncclFloat8e4m3);
  fill_fp8_arith<Fp8Fast<E5m2Traits>>(t, ncclFloat8e5m2);
}

void fill_avx2_fp8_select(KernelTable& t) {
  using namespace avx2;
  fill_fp8_select<Fp8Fast<E4m3Traits>>(t, ncclFloat8e4m3);
  fill_fp8_select<Fp8Fast<E5m2Traits>>(t, ncclFloat8e5m2);
}

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
    fill_avx2_fp8_arith(t);
    fill_avx2_fp8_select(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
