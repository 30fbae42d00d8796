// Fast fp8 (e4m3, e5m2) loops for the x86 vector files.
//
// Sum and Prod work in a scaled float domain: a code's sign, exponent and
// mantissa bits are moved into a float unchanged, which makes the float the
// fp8 value divided by 2^120 (e4m3) or 2^112 (e5m2); fp8 subnormals become float denormals with the
// same spacing, so decoding is a bit move with no special case, and rounding
// back to fp8 is a round-to-nearest-even at one fixed bit of the float's
// encoding. Scaling by a power of two is exact and float arithmetic rounds
// scaled values exactly as it rounds unscaled ones (the denormal range only
// ever holds exact multiples of the fp8 spacing), so results match the
// generic loops bit for bit. That needs denormals to stay denormals: with
// denormals-are-zero or flush-to-zero set in MXCSR a call goes to the
// general (codec) path instead, and so does every block holding a NaN or
// an infinity, which the bit move does not decode. Max and Min need no
// arithmetic at all: they compare the codes as sign-magnitude integers.
//
// A policy P supplies, for one format and ISA:
//   Tr, R (register of raw codes), kBlock (codes per R), kVecs, M (float math)
//   load(p), store(p, r)
//   special(r): r with every bit that cannot make a code NaN or inf set, so
//     that exactly the lanes of such codes are 0xff; merge(a, b) keeps the
//     0xff lanes of both; any_special(m): whether a lane is 0xff
//   decode(r, v): kVecs scaled float vectors (any lane order encode inverts)
//   unscale(v): v * kUnscale, for Prod (one operand scaled, not both)
//   encode<kJam>(v): round to codes; kJam keeps the bits that the encoder
//     shifts out as a sticky bit (only sums of three or more inputs need it:
//     the sum or product of two fp8 values never has a false tie there)
//   key<kOp>(r): the codes as ordered signed bytes (+0 and -0 equal, NaN the
//     key that never wins); step<kOp>(acc, acc_key, x): acc = Max/Min(acc, x)
//     with the generic loops' rules (a NaN x keeps acc, ties take x);
//     finish(r): what storing through a float does to the selected code
//     (e5m2: infinity saturates, NaN becomes 0x7f | sign)
//   general2<kOp>, general_n(begin, end): the codec path for the fallbacks
// Fp8Blocks below supplies all of it but encode (and key, step, finish) at
// either width, from the ISA policy X of x86_codecs.h.
//
// Included inside an ISA file; shares its namespace.
#pragma once

#include <immintrin.h>

#include "kernels/x86_codecs.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {

// Where each format's fields sit once moved into a float.
template <class Tr>
struct Fp8Format;

template <>
struct Fp8Format<E4m3Traits> {
  static constexpr int kMan = 3;                    // mantissa bits
  static constexpr float kUnscale = 0x1p120f;       // decoded float = value / kUnscale
  static constexpr float kMaxScaled = 0x1.cp-112f;  // 448 * 2^-120, the saturation value
  static constexpr int kSpecialOr = 0x80;           // (code | this) == 0xff: NaN
  static constexpr int kNanMag = 0x7f;              // magnitudes >= this are NaN
  static constexpr int kMaxCode = 0x7e;             // 448
};

template <>
struct Fp8Format<E5m2Traits> {
  static constexpr int kMan = 2;
  static constexpr float kUnscale = 0x1p112f;
  static constexpr float kMaxScaled = 0x1.cp-97f;  // 57344 * 2^-112
  static constexpr int kSpecialOr = 0x83;          // all-ones exponent: inf or NaN
  static constexpr int kNanMag = 0x7d;
  static constexpr int kInfMag = 0x7c;
  static constexpr int kMaxCode = 0x7b;  // 57344
};

// Bits of the float that hold the code's magnitude, and the sign.
template <class Tr>
inline constexpr uint32_t kFp8FloatMask = 0x80000000u | (0x7fu << (23 - Fp8Format<Tr>::kMan));

inline bool denormals_kept() { return (_mm_getcsr() & 0x8040u) == 0; }  // neither FTZ nor DAZ

// What a policy is at every width: blocks of X::kBytes codes. Decoding:
// vpmaddubsw multiplies each code, as a signed byte, by 2^(7-kMan), which
// puts the magnitude where a float's high half wants it with the sign spread
// above; a shift and a mask then make four float vectors: lane i of v[k] is
// code 4i+k of the block. The ISA file derives its policy from this one and
// adds the encoder (and, for Max/Min, the key, step and finish).
template <class X, class Tr_>
struct Fp8Blocks {
  using Tr = Tr_;
  using F = Fp8Format<Tr>;
  using M = typename X::M;
  using V = typename M::V;
  using R = typename X::R;
  using U8 = Vec<uint8_t, X::kBytes>;
  using U32 = Vec<uint32_t, X::kBytes>;
  static constexpr size_t kBlock = X::kBytes;
  static constexpr int kVecs = 4;
  static constexpr uint16_t kMul = 1u << (7 - F::kMan);

  static R load(const void* p) { return loadu<R>(p); }
  static void store(void* p, R r) { storeu(p, r); }
  static R special(R x) { return reinterpret_cast<R>(reinterpret_cast<U8>(x) | static_cast<uint8_t>(F::kSpecialOr)); }
  static R merge(R a, R b) {
    const U8 x = reinterpret_cast<U8>(a), y = reinterpret_cast<U8>(b);
    return reinterpret_cast<R>(x > y ? x : y);
  }
  static bool any_special(R acc) { return X::any_ff(acc); }

  static R each16(uint16_t k) { return reinterpret_cast<R>(Vec<uint16_t, X::kBytes>{} + k); }
  static void decode(R x, V* v) {
    const U32 even = reinterpret_cast<U32>(X::maddubs(each16(kMul), x));
    const U32 odd = reinterpret_cast<U32>(X::maddubs(each16(static_cast<uint16_t>(kMul << 8)), x));
    v[0] = reinterpret_cast<V>((even << 16) & kFp8FloatMask<Tr>);
    v[1] = reinterpret_cast<V>((odd << 16) & kFp8FloatMask<Tr>);
    v[2] = reinterpret_cast<V>(even & kFp8FloatMask<Tr>);
    v[3] = reinterpret_cast<V>(odd & kFp8FloatMask<Tr>);
  }
  static V unscale(V v) { return v * F::kUnscale; }

  template <ReduceOp kOp>
  static void general2(void* dst, const void* a, const void* b, size_t count) {
    reduce2_vec<M, Fp8Codec<X, Tr>, Tr, kOp>(dst, a, b, count);
  }
  static void general_n(void* dst, const void* const* srcs, int nsrc, size_t begin, size_t end) {
    reduce_n_vec_range<M, Fp8Codec<X, Tr>, Tr, ReduceOp::Sum>(dst, srcs, nsrc, begin, end);
  }
};

// The loops run over blocks free of special codes without any call, so the
// compiler keeps its constants in registers; a special block leaves the
// inner loop, goes to the general path, and the inner loop resumes after it.
template <class P, ReduceOp kOp>
void reduce2_fp8(void* dst, const void* a, const void* b, size_t count) {
  static_assert(kOp == ReduceOp::Sum || kOp == ReduceOp::Prod);
  using V = typename P::M::V;
  if (!denormals_kept()) return P::template general2<kOp>(dst, a, b, count);
  size_t i = 0;
  while (i + P::kBlock <= count) {
    for (; i + P::kBlock <= count; i += P::kBlock) {
      const auto x = P::load(at(a, i)), y = P::load(at(b, i));
      if (P::any_special(P::merge(P::special(x), P::special(y)))) break;
      V u[P::kVecs], v[P::kVecs];
      P::decode(x, u);
      P::decode(y, v);
#pragma GCC unroll 8
      for (int k = 0; k < P::kVecs; ++k) {
        u[k] = kOp == ReduceOp::Sum ? P::M::add(u[k], v[k]) : P::M::mul(u[k], P::unscale(v[k]));
      }
      P::store(at(dst, i), P::template encode<false>(u));
    }
    if (i + P::kBlock <= count) {
      P::template general2<kOp>(at(dst, i), at(a, i), at(b, i), P::kBlock);
      i += P::kBlock;
    }
  }
  if (i < count) P::template general2<kOp>(at(dst, i), at(a, i), at(b, i), count - i);
}

template <class P>
void reduce_n_fp8_sum(void* dst, const void* const* srcs, int nsrc, size_t count) {
  using V = typename P::M::V;
  if (!denormals_kept()) return P::general_n(dst, srcs, nsrc, 0, count);
  size_t i = 0;
  while (i + P::kBlock <= count) {
    for (; i + P::kBlock <= count; i += P::kBlock) {
      auto x = P::load(at(srcs[0], i));
      auto check = P::special(x);
      V acc[P::kVecs], v[P::kVecs];
      P::decode(x, acc);
      for (int k = 1; k < nsrc; ++k) {
        x = P::load(at(srcs[k], i));
        check = P::merge(check, P::special(x));
        P::decode(x, v);
#pragma GCC unroll 8
        for (int j = 0; j < P::kVecs; ++j) acc[j] = P::M::add(acc[j], v[j]);
      }
      if (P::any_special(check)) break;
      P::store(at(dst, i), P::template encode<true>(acc));
    }
    if (i + P::kBlock <= count) {
      P::general_n(dst, srcs, nsrc, i, i + P::kBlock);
      i += P::kBlock;
    }
  }
  if (i < count) P::general_n(dst, srcs, nsrc, i, count);
}

template <class P, ReduceOp kOp>
void select2_fp8(void* dst, const void* a, const void* b, size_t count) {
  size_t i = 0;
  for (; i + P::kBlock <= count; i += P::kBlock) {
    auto acc = P::load(at(a, i));
    auto key = P::template key<kOp>(acc);
    P::template step<kOp>(acc, key, P::load(at(b, i)));
    P::store(at(dst, i), P::finish(acc));
  }
  if (i < count) reduce2_generic<typename P::Tr, kOp>(at(dst, i), at(a, i), at(b, i), count - i);
}

template <class P, ReduceOp kOp>
void select_n_fp8(void* dst, const void* const* srcs, int nsrc, size_t count) {
  size_t i = 0;
  for (; i + P::kBlock <= count; i += P::kBlock) {
    auto acc = P::load(at(srcs[0], i));
    auto key = P::template key<kOp>(acc);
    for (int k = 1; k < nsrc; ++k) P::template step<kOp>(acc, key, P::load(at(srcs[k], i)));
    P::store(at(dst, i), P::finish(acc));
  }
  if (i < count) reduce_n_range<typename P::Tr, kOp>(dst, srcs, nsrc, i, count);
}

// Sum and Prod of reduce2, Sum of reduce_n. A product of three or more scaled
// inputs would underflow, and undoing the scale before encoding would round
// twice, so Prod of reduce_n stays on the codec path, as do divide and scale.
template <class P>
void fill_fp8_arith(KernelTable& t, ncclDataType_t dt) {
  t.reduce2[dt][0] = reduce2_fp8<P, ReduceOp::Sum>;
  t.reduce2[dt][1] = reduce2_fp8<P, ReduceOp::Prod>;
  t.reduce_n[dt][0] = reduce_n_fp8_sum<P>;
}

template <class P>
void fill_fp8_select(KernelTable& t, ncclDataType_t dt) {
  t.reduce2[dt][2] = select2_fp8<P, ReduceOp::Max>;
  t.reduce2[dt][3] = select2_fp8<P, ReduceOp::Min>;
  t.reduce_n[dt][2] = select_n_fp8<P, ReduceOp::Max>;
  t.reduce_n[dt][3] = select_n_fp8<P, ReduceOp::Min>;
}

// Both formats, from an ISA file's policy template P<Tr>.
template <template <class> class P>
void fill_fp8_arith(KernelTable& t) {
  fill_fp8_arith<P<E4m3Traits>>(t, ncclFloat8e4m3);
  fill_fp8_arith<P<E5m2Traits>>(t, ncclFloat8e5m2);
}

template <template <class> class P>
void fill_fp8_select(KernelTable& t) {
  fill_fp8_select<P<E4m3Traits>>(t, ncclFloat8e4m3);
  fill_fp8_select<P<E5m2Traits>>(t, ncclFloat8e5m2);
}

}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
