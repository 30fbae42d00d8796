// What the x86 math and codec policies of simd_loops.h and fp8_loops.h have
// in common at both widths, written once: the float math but max and min, the
// codecs of float, double, half and both fp8 formats. reduce_avx2.cpp
// instantiates them on 256-bit vectors, the AVX-512 files (avx512_codecs.h)
// on 512-bit ones, each compiled with its own flags and in its own
// namespace; bfloat16's codec, whose store blends and masks differently at
// each width, stays in those files.
//
// Lane arithmetic uses GCC's vector operators, which compile to the
// instructions of the matching intrinsics at either width. What has no
// operator comes from the including file's ISA policy X, which derives from
// VecWidth below (kBytes and the vector types) and adds:
//   M                           the float math policy (F32) at that width
//   min_i32(a, b)               signed 32-bit minimum
//   round_i32(v)                floats -> int32, to nearest even by the
//                               instruction's own rounding, not MXCSR's
//   store_bytes(p, c0, c1)      two vectors of 32-bit lanes holding values
//                               below 2^8 -> 2W bytes in order at p
//   widen_bytes(p)              W bytes at p -> W 16-bit lanes (H)
//   cvtph(h)                    W binary16 lanes -> W floats (vcvtph2ps)
//   maddubs(a, b)               vpmaddubsw
//   any_ff(r)                   whether any byte of r is 0xff
//
// Included inside an ISA file; shares its namespace.
#pragma once

#include <immintrin.h>

#include <type_traits>
#include <utility>

#include "kernels/simd_loops.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {
namespace {

// A GCC vector of kBytes bytes of T. The intrinsic types (__m256, __m512i, ...)
// are such vectors too, but carry attributes that a template argument drops.
template <class T, size_t kBytes>
struct VecOf {
  typedef T type __attribute__((vector_size(kBytes)));
};
template <class T, size_t kBytes>
using Vec = typename VecOf<T, kBytes>::type;

// The vectors of one width: W = kBytes / 4 floats, W int32 (I), W 16-bit
// lanes (H), and the raw bytes as the intrinsics' integer type (R).
template <size_t kBytes_>
struct VecWidth {
  static constexpr size_t kBytes = kBytes_;
  using F = Vec<float, kBytes>;
  using I = Vec<int32_t, kBytes>;
  using H = Vec<uint16_t, kBytes / 2>;
  using R = Vec<long long, kBytes>;
};

// Loads and stores at any address, through a type that may alias anything:
// what the intrinsics' loadu and storeu do.
template <class V>
using Lane = std::remove_cvref_t<decltype(std::declval<V>()[0])>;
template <class V>
inline V loadu(const void* p) {
  typedef Lane<V> U __attribute__((vector_size(sizeof(V)), may_alias, aligned(1)));
  return *static_cast<const U*>(p);
}
template <class V>
inline void storeu(void* p, V v) {
  typedef Lane<V> U __attribute__((vector_size(sizeof(V)), may_alias, aligned(1)));
  *static_cast<U*>(p) = v;
}

// The part of a math policy (simd_loops.h's M) that is the same at every
// width; the ISA file adds max and min, whose NaN rule needs its own blend.
template <class E, size_t kBytes>
struct FloatOps {
  using V = Vec<E, kBytes>;
  static constexpr size_t W = kBytes / sizeof(E);
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V set1(E x) {
    V v{};
    for (size_t i = 0; i < W; ++i) v[i] = x;
    return v;
  }
};

// float and double stored as they are: a block is two vectors.
template <class E, size_t kBytes>
struct PlainCodec {
  using V = Vec<E, kBytes>;
  static constexpr int kVecs = 2;
  static void load(const void* p, V* v) {
    v[0] = loadu<V>(p);
    v[1] = loadu<V>(at(p, kBytes));
  }
  template <bool kPass>
  static void store(void* p, const V* v) {
    storeu(p, v[0]);
    storeu(at(p, kBytes), v[1]);
  }
};

// Half in 256-bit lanes at every width: on CPUs that split 512-bit
// conversions in two (AMD Zen 4) the ymm form of vcvtph2ps/vcvtps2ph is the
// faster one. They quieten a signalling NaN as the scalar conversions do.
struct HalfCodec {
  using V = Vec<float, 32>;
  static constexpr int kVecs = 2;
  static void load(const void* p, V* v) {
    v[0] = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
    v[1] = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p) + 1));
  }
  template <bool kPass>
  static void store(void* p, const V* v) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_storeu_si128(static_cast<__m128i*>(p), _mm256_cvtps_ph(v[0], kRound));
    _mm_storeu_si128(static_cast<__m128i*>(p) + 1, _mm256_cvtps_ph(v[1], kRound));
  }
};

// float -> fp8 code with M mantissa bits and bias B, round to nearest even,
// saturating; the vector form of f2fp8 in convert.h, independent of MXCSR.
// Both fp8 NaN codes have every bit of the largest finite code set, so NaN
// lanes just OR in 0x7f.
template <class X, unsigned M, unsigned B, int kMaxCode>
inline typename X::I fp8_codes(typename X::F v) {
  using I = typename X::I;
  using U = Vec<uint32_t, X::kBytes>;
  const U u = reinterpret_cast<U>(v);
  const U a = u & 0x7fffffffu;
  // Normal target: round the float's mantissa at bit 23-M; the exponent
  // rebias is folded into the rounding constant (valid where a is normal).
  constexpr int kShift = 23 - static_cast<int>(M);
  constexpr uint32_t kBias = (1u << (kShift - 1)) - 1u - ((127u - B) << 23);
  const U lsb = (a >> kShift) & 1u;
  const I normal = X::min_i32(reinterpret_cast<I>((a + (lsb + kBias)) >> kShift), I{} + kMaxCode);
  // Subnormal target: the value in units of the smallest subnormal, rounded
  // to nearest even by the instruction, not by MXCSR.
  const float unit = static_cast<float>(1u << (M + B - 1));  // 2^(M - (1 - B))
  const I sub = X::round_i32(reinterpret_cast<typename X::F>(a) * unit);
  const I ai = reinterpret_cast<I>(a);
  I code = ai > static_cast<int32_t>(((128u - B) << 23) - 1) ? normal : sub;
  code |= (ai > 0x7f800000) & 0x7f;
  return code | reinterpret_cast<I>((u >> 24) & 0x80u);  // the sign moved to bit 7
}

// The general fp8 codec: exact for every input and every MXCSR setting; the
// fast loops fall back to it. A block is two float vectors. The store is
// inlined into every loop: GCC's unit growth limit, reached in the AVX-512
// file, would otherwise leave some loops calling it once per block.
template <class X, unsigned M, unsigned B, int kMaxCode>
struct Fp8Store {
  using V = typename X::F;
  static constexpr int kVecs = 2;
  template <bool kPass>
  [[gnu::always_inline]] static void store(void* p, const V* v) {
    X::store_bytes(p, fp8_codes<X, M, B, kMaxCode>(v[0]), fp8_codes<X, M, B, kMaxCode>(v[1]));
  }
};

template <class X>
struct E5m2Codec : Fp8Store<X, 2, 15, 0x7b> {
  using V = typename X::F;
  // e5m2 is the top byte of a binary16.
  static V load_w(const void* p) { return X::cvtph(X::widen_bytes(p) << 8); }
  static void load(const void* p, V* v) {
    v[0] = load_w(p);
    v[1] = load_w(at(p, X::kBytes / 4));
  }
};

template <class X>
struct E4m3Codec : Fp8Store<X, 3, 7, 0x7e> {
  using V = typename X::F;
  static V load_w(const void* p) {
    using H = typename X::H;
    const H b = X::widen_bytes(p);
    const H mag = b & 0x7f;
    // The e4m3 fields placed as a binary16: the value times 2^-8.
    H h = ((b << 8) & 0x8000) | (mag << 7);
    // S.1111.111 is NaN: give those lanes an all-ones half exponent.
    h |= reinterpret_cast<H>(mag == 0x7f) & 0x7c00;
    return X::cvtph(h) * 256.0f;
  }
  static void load(const void* p, V* v) {
    v[0] = load_w(p);
    v[1] = load_w(at(p, X::kBytes / 4));
  }
};

template <class X, class Tr>
using Fp8Codec = std::conditional_t<std::is_same_v<Tr, E4m3Traits>, E4m3Codec<X>, E5m2Codec<X>>;

}  // namespace
}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
