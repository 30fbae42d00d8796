// Vector loops for the floating-point types, written once over two policies
// that each ISA file supplies:
//   M  (math): vector type V of W lanes and the ops add, mul, max, min, div,
//      set1; max/min follow the scalar rule in typed.h bit for bit.
//   Cd (codec): kVecs vectors of V make one block of kVecs * W stored
//      elements. load(p, v) widens the block at p into v[0..kVecs);
//      store<kPass>(p, v) rounds it back with the rounding of the scalar
//      conversions. The lanes may hold the block's elements in any order that
//      load and store agree on (bfloat16 splits even and odd elements, which
//      costs less than keeping them in order). kPass says the values may be
//      inputs passed through untouched (Max/Min, a single source), so a
//      signalling NaN must come out quiet, as the scalar store makes it; after
//      arithmetic every NaN already is.
// The last elements that do not fill a block go through the generic scalar
// loop, which gives identical results, so the split point never shows.
//
// Included inside an ISA file after its policies; shares its namespace.
#pragma once

#include "kernels/typed.h"

namespace meshccl::kernels::MESHCCL_KERNEL_NS {

template <class M, ReduceOp kOp>
inline typename M::V vop(typename M::V a, typename M::V b) {
  if constexpr (kOp == ReduceOp::Sum) return M::add(a, b);
  if constexpr (kOp == ReduceOp::Prod) return M::mul(a, b);
  if constexpr (kOp == ReduceOp::Max) return M::max(a, b);
  if constexpr (kOp == ReduceOp::Min) return M::min(a, b);
}

inline const unsigned char* at(const void* p, size_t byte) { return static_cast<const unsigned char*>(p) + byte; }
inline unsigned char* at(void* p, size_t byte) { return static_cast<unsigned char*>(p) + byte; }

template <ReduceOp kOp>
inline constexpr bool kPassesInputs = kOp == ReduceOp::Max || kOp == ReduceOp::Min;

template <class M, class Cd, class Tr, ReduceOp kOp>
void reduce2_vec(void* dst, const void* a, const void* b, size_t count) {
  using V = typename M::V;
  constexpr int kV = Cd::kVecs;
  constexpr size_t B = kV * M::W, S = sizeof(typename Tr::Store);
  size_t i = 0;
  // Every load of a block happens before its store, so dst == a or dst == b is safe.
  for (; i + B <= count; i += B) {
    V x[kV], y[kV];
    Cd::load(at(a, i * S), x);
    Cd::load(at(b, i * S), y);
#pragma GCC unroll 8
    for (int k = 0; k < kV; ++k) x[k] = vop<M, kOp>(x[k], y[k]);
    Cd::template store<kPassesInputs<kOp>>(at(dst, i * S), x);
  }
  if (i < count) reduce2_generic<Tr, kOp>(at(dst, i * S), at(a, i * S), at(b, i * S), count - i);
}

// Elements [begin, end) of a reduction of nsrc sources. Each step keeps U
// blocks of accumulators in registers (four vectors or more); each source is
// read once, in order, and the result is rounded once when stored.
template <class M, class Cd, class Tr, ReduceOp kOp>
void reduce_n_vec_range(void* dst, const void* const* srcs, int nsrc, size_t begin, size_t end) {
  using V = typename M::V;
  constexpr int kV = Cd::kVecs, U = kV >= 4 ? 1 : 4 / kV;
  constexpr size_t B = kV * M::W, S = sizeof(typename Tr::Store);
  const bool pass = kPassesInputs<kOp> || nsrc == 1;
  size_t i = begin;
  for (; i + U * B <= end; i += U * B) {
    V acc[U * kV];
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) Cd::load(at(srcs[0], (i + u * B) * S), acc + u * kV);
    for (int k = 1; k < nsrc; ++k) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        V x[kV];
        Cd::load(at(srcs[k], (i + u * B) * S), x);
#pragma GCC unroll 8
        for (int j = 0; j < kV; ++j) acc[u * kV + j] = vop<M, kOp>(acc[u * kV + j], x[j]);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      if (pass) {
        Cd::template store<true>(at(dst, (i + u * B) * S), acc + u * kV);
      } else {
        Cd::template store<false>(at(dst, (i + u * B) * S), acc + u * kV);
      }
    }
  }
  for (; i + B <= end; i += B) {
    V acc[kV], x[kV];
    Cd::load(at(srcs[0], i * S), acc);
    for (int k = 1; k < nsrc; ++k) {
      Cd::load(at(srcs[k], i * S), x);
#pragma GCC unroll 8
      for (int j = 0; j < kV; ++j) acc[j] = vop<M, kOp>(acc[j], x[j]);
    }
    if (pass) {
      Cd::template store<true>(at(dst, i * S), acc);
    } else {
      Cd::template store<false>(at(dst, i * S), acc);
    }
  }
  if (i < end) reduce_n_range<Tr, kOp>(dst, srcs, nsrc, i, end);
}

template <class M, class Cd, class Tr, ReduceOp kOp>
void reduce_n_vec(void* dst, const void* const* srcs, int nsrc, size_t count) {
  reduce_n_vec_range<M, Cd, Tr, kOp>(dst, srcs, nsrc, 0, count);
}

template <class M, class Cd, class Tr>
void divide_vec(void* dst, const void* src, size_t count, int divisor) {
  using V = typename M::V;
  constexpr int kV = Cd::kVecs;
  constexpr size_t B = kV * M::W, S = sizeof(typename Tr::Store);
  const V q = M::set1(static_cast<typename Tr::Compute>(divisor));
  size_t i = 0;
  for (; i + B <= count; i += B) {
    V x[kV];
    Cd::load(at(src, i * S), x);
#pragma GCC unroll 8
    for (int k = 0; k < kV; ++k) x[k] = M::div(x[k], q);
    Cd::template store<false>(at(dst, i * S), x);
  }
  if (i < count) divide_generic<Tr>(at(dst, i * S), at(src, i * S), count - i, divisor);
}

template <class M, class Cd, class Tr>
void scale_vec(void* dst, const void* src, size_t count, const void* scalar) {
  using V = typename M::V;
  constexpr int kV = Cd::kVecs;
  constexpr size_t B = kV * M::W, S = sizeof(typename Tr::Store);
  typename Tr::Store raw;
  std::memcpy(&raw, scalar, sizeof raw);
  const V k = M::set1(Tr::load(raw));
  size_t i = 0;
  for (; i + B <= count; i += B) {
    V x[kV];
    Cd::load(at(src, i * S), x);
#pragma GCC unroll 8
    for (int j = 0; j < kV; ++j) x[j] = M::mul(x[j], k);
    Cd::template store<false>(at(dst, i * S), x);
  }
  if (i < count) scale_generic<Tr>(at(dst, i * S), at(src, i * S), count - i, scalar);
}

template <class M, class Cd, class Tr>
void fill_vec_type(KernelTable& t, ncclDataType_t dt) {
  t.reduce2[dt][0] = reduce2_vec<M, Cd, Tr, ReduceOp::Sum>;
  t.reduce2[dt][1] = reduce2_vec<M, Cd, Tr, ReduceOp::Prod>;
  t.reduce2[dt][2] = reduce2_vec<M, Cd, Tr, ReduceOp::Max>;
  t.reduce2[dt][3] = reduce2_vec<M, Cd, Tr, ReduceOp::Min>;
  t.reduce_n[dt][0] = reduce_n_vec<M, Cd, Tr, ReduceOp::Sum>;
  t.reduce_n[dt][1] = reduce_n_vec<M, Cd, Tr, ReduceOp::Prod>;
  t.reduce_n[dt][2] = reduce_n_vec<M, Cd, Tr, ReduceOp::Max>;
  t.reduce_n[dt][3] = reduce_n_vec<M, Cd, Tr, ReduceOp::Min>;
  t.divide[dt] = divide_vec<M, Cd, Tr>;
  t.scale[dt] = scale_vec<M, Cd, Tr>;
}

}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
