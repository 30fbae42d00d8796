// Typed element loops shared by every ISA build. Each datatype has a traits
// type saying how an element widens to its compute type and rounds back; each
// op is a function of two compute values. The generic loops here are written
// so the compiler vectorises them for the flags of the including file; the
// AVX2 and AVX-512 files override the floating-point entries with
// hand-written vector code.
//
// Like convert.h, everything lives in the MESHCCL_KERNEL_NS namespace so that
// each ISA build keeps its own copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/convert.h"
#include "kernels/table.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {

// ---- datatypes --------------------------------------------------------------

template <class T>
struct IntTraits {
  using Store = T;
  using Compute = T;
  // Wrapping arithmetic happens in an unsigned type at least as wide as int,
  // so neither signed overflow nor promotion of small types is undefined.
  using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  static constexpr bool kFloat = false;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

template <class T>
struct NativeFloatTraits {
  using Store = T;
  using Compute = T;
  static constexpr bool kFloat = true;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

// Half, bfloat16 and fp8: stored narrow, computed in float, converted by the
// scalar functions of convert.h.
template <class S, float (*kLoad)(S), S (*kStore)(float)>
struct NarrowFloatTraits {
  using Store = S;
  using Compute = float;
  static constexpr bool kFloat = true;
  static float load(S v) { return kLoad(v); }
  static S store(float v) { return kStore(v); }
};

using HalfTraits = NarrowFloatTraits<uint16_t, h2f, f2h>;
using Bf16Traits = NarrowFloatTraits<uint16_t, b2f, f2b>;
using E4m3Traits = NarrowFloatTraits<uint8_t, e4m3_2f, f2e4m3>;
using E5m2Traits = NarrowFloatTraits<uint8_t, e5m2_2f, f2e5m2>;

// ---- ops on compute values --------------------------------------------------

template <class Tr, ReduceOp kOp>
inline typename Tr::Compute combine(typename Tr::Compute a, typename Tr::Compute b) {
  using C = typename Tr::Compute;
  if constexpr (Tr::kFloat) {
    if constexpr (kOp == ReduceOp::Sum) return a + b;
    if constexpr (kOp == ReduceOp::Prod) return a * b;
    // fmax/fmin semantics: a NaN operand yields the other one. Written as the
    // compare-and-select of maxps/minps (second operand on ties and NaN) so
    // that the vector code gives bit-identical results, signed zeros included.
    if constexpr (kOp == ReduceOp::Max) return b != b ? a : (a > b ? a : b);
    if constexpr (kOp == ReduceOp::Min) return b != b ? a : (a < b ? a : b);
  } else {
    using W = typename Tr::Wide;
    if constexpr (kOp == ReduceOp::Sum) return static_cast<C>(static_cast<W>(a) + static_cast<W>(b));
    if constexpr (kOp == ReduceOp::Prod) return static_cast<C>(static_cast<W>(a) * static_cast<W>(b));
    if constexpr (kOp == ReduceOp::Max) return a > b ? a : b;
    if constexpr (kOp == ReduceOp::Min) return a < b ? a : b;
  }
}

// ---- generic loops ------------------------------------------------------------
// Elements are read and written through memcpy: buffers need not be aligned
// even to their element size, and the compiler then never assumes they are.

template <class S>
inline S ld(const void* p, size_t i) {
  S v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * sizeof(S), sizeof(S));
  return v;
}

template <class S>
inline void st(void* p, size_t i, S v) {
  std::memcpy(static_cast<unsigned char*>(p) + i * sizeof(S), &v, sizeof(S));
}

template <class Tr, ReduceOp kOp>
void reduce2_generic(void* dst, const void* a, const void* b, size_t count) {
  using S = typename Tr::Store;
  for (size_t i = 0; i < count; ++i) {
    st<S>(dst, i, Tr::store(combine<Tr, kOp>(Tr::load(ld<S>(a, i)), Tr::load(ld<S>(b, i)))));
  }
}

// Elements [begin, end) of a reduction of nsrc sources, a block at a time so
// every source streams through once and the accumulator stays in L1; dst is
// written only after the block of every source has been read, which is what
// makes dst == srcs[k] safe.
template <class Tr, ReduceOp kOp>
void reduce_n_range(void* dst, const void* const* srcs, int nsrc, size_t begin, size_t end) {
  using S = typename Tr::Store;
  using C = typename Tr::Compute;
  constexpr size_t kBlock = 512;
  C acc[kBlock];
  for (size_t base = begin; base < end; base += kBlock) {
    const size_t n = end - base < kBlock ? end - base : kBlock;
    const void* s0 = static_cast<const unsigned char*>(srcs[0]) + base * sizeof(S);
    for (size_t i = 0; i < n; ++i) acc[i] = Tr::load(ld<S>(s0, i));
    for (int k = 1; k < nsrc; ++k) {
      const void* s = static_cast<const unsigned char*>(srcs[k]) + base * sizeof(S);
      for (size_t i = 0; i < n; ++i) acc[i] = combine<Tr, kOp>(acc[i], Tr::load(ld<S>(s, i)));
    }
    void* d = static_cast<unsigned char*>(dst) + base * sizeof(S);
    for (size_t i = 0; i < n; ++i) st<S>(d, i, Tr::store(acc[i]));
  }
}

template <class Tr, ReduceOp kOp>
void reduce_n_generic(void* dst, const void* const* srcs, int nsrc, size_t count) {
  reduce_n_range<Tr, kOp>(dst, srcs, nsrc, 0, count);
}

template <class Tr>
void divide_generic(void* dst, const void* src, size_t count, int divisor) {
  using S = typename Tr::Store;
  using C = typename Tr::Compute;
  if constexpr (Tr::kFloat) {
    const C q = static_cast<C>(divisor);
    for (size_t i = 0; i < count; ++i) st<S>(dst, i, Tr::store(Tr::load(ld<S>(src, i)) / q));
  } else {
    if (divisor == 0) return;  // the caller divides by a rank count; never 0
    if (std::is_signed_v<S> && divisor == -1) {
      // x / -1 overflows for the most negative value; negate with wrap-around.
      using W = typename Tr::Wide;
      for (size_t i = 0; i < count; ++i) st<S>(dst, i, static_cast<S>(W{0} - static_cast<W>(ld<S>(src, i))));
      return;
    }
    if constexpr (std::is_unsigned_v<S>) {
      // An average over a rank count never divides by a negative number, and
      // C's conversion of one to unsigned would give nonsense: leave dst as is.
      if (divisor < 0) return;
    }
    if constexpr (sizeof(S) <= 4) {
      // Integer division does not vectorise; a floating-point one does, and
      // is exact here: a quotient that is not an integer lies at least
      // 1/|divisor| from one, far more than the rounding error of float (for
      // 8-bit values) or double (for 32-bit values), so truncating the
      // rounded quotient gives C's answer.
      using F = std::conditional_t<(sizeof(S) == 1), float, double>;
      using I = std::conditional_t<std::is_signed_v<S> || sizeof(S) == 1, int32_t, int64_t>;
      const F q = static_cast<F>(divisor);
      for (size_t i = 0; i < count; ++i) {
        st<S>(dst, i, static_cast<S>(static_cast<I>(static_cast<F>(ld<S>(src, i)) / q)));
      }
    } else {
      const S q = static_cast<S>(divisor);
      for (size_t i = 0; i < count; ++i) st<S>(dst, i, static_cast<S>(ld<S>(src, i) / q));
    }
  }
}

template <class Tr>
void scale_generic(void* dst, const void* src, size_t count, const void* scalar) {
  using S = typename Tr::Store;
  using C = typename Tr::Compute;
  S raw;
  std::memcpy(&raw, scalar, sizeof raw);
  const C k = Tr::load(raw);
  for (size_t i = 0; i < count; ++i) st<S>(dst, i, Tr::store(combine<Tr, ReduceOp::Prod>(Tr::load(ld<S>(src, i)), k)));
}

// ---- table filling --------------------------------------------------------------

template <class Tr>
void fill_generic_type(KernelTable& t, ncclDataType_t dt) {
  t.reduce2[dt][0] = reduce2_generic<Tr, ReduceOp::Sum>;
  t.reduce2[dt][1] = reduce2_generic<Tr, ReduceOp::Prod>;
  t.reduce2[dt][2] = reduce2_generic<Tr, ReduceOp::Max>;
  t.reduce2[dt][3] = reduce2_generic<Tr, ReduceOp::Min>;
  t.reduce_n[dt][0] = reduce_n_generic<Tr, ReduceOp::Sum>;
  t.reduce_n[dt][1] = reduce_n_generic<Tr, ReduceOp::Prod>;
  t.reduce_n[dt][2] = reduce_n_generic<Tr, ReduceOp::Max>;
  t.reduce_n[dt][3] = reduce_n_generic<Tr, ReduceOp::Min>;
  t.divide[dt] = divide_generic<Tr>;
  t.scale[dt] = scale_generic<Tr>;
}

inline void fill_generic(KernelTable& t) {
  fill_generic_type<IntTraits<int8_t>>(t, ncclInt8);
  fill_generic_type<IntTraits<uint8_t>>(t, ncclUint8);
  fill_generic_type<IntTraits<int32_t>>(t, ncclInt32);
  fill_generic_type<IntTraits<uint32_t>>(t, ncclUint32);
  fill_generic_type<IntTraits<int64_t>>(t, ncclInt64);
  fill_generic_type<IntTraits<uint64_t>>(t, ncclUint64);
  fill_generic_type<HalfTraits>(t, ncclFloat16);
  fill_generic_type<NativeFloatTraits<float>>(t, ncclFloat32);
  fill_generic_type<NativeFloatTraits<double>>(t, ncclFloat64);
  fill_generic_type<Bf16Traits>(t, ncclBfloat16);
  fill_generic_type<E4m3Traits>(t, ncclFloat8e4m3);
  fill_generic_type<E5m2Traits>(t, ncclFloat8e5m2);
}

}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
