// Vector loops for the floating-point types, written once over two policies
// that each ISA file supplies:
//   M  (math): vector type V of W lanes and the ops add, mul, max, min, div,
//      set1; max/min follow the scalar rule in typed.h bit for bit.
//   Cd (codec): load(p) widens W stored elements at p to a V, store(p, v)
//      rounds a V back, with the same rounding as the scalar conversions;
//      store2(p, v0, v1) stores 2W elements (narrowing packs pairs cheaper).
// The last count % W elements go through the generic scalar loop, which gives
// identical results, so the split point never shows in the output.
//
// Included inside an ISA file after its policies; shares its namespace.
#pragma once

#include "collectives/kernels/typed.h"

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

template <class M, class Cd, class Tr, ReduceOp kOp>
void reduce2_vec(void* dst, const void* a, const void* b, size_t count) {
  constexpr size_t W = M::W, S = sizeof(typename Tr::Store);
  size_t i = 0;
  // Two vectors per step keep both load ports busy; every load of a step
  // happens before its stores, so dst == a or dst == b is safe.
  for (; i + 2 * W <= count; i += 2 * W) {
    const typename M::V x0 = Cd::load(at(a, i * S)), x1 = Cd::load(at(a, (i + W) * S));
    const typename M::V y0 = Cd::load(at(b, i * S)), y1 = Cd::load(at(b, (i + W) * S));
    Cd::store2(at(dst, i * S), vop<M, kOp>(x0, y0), vop<M, kOp>(x1, y1));
  }
  for (; i + W <= count; i += W) {
    Cd::store(at(dst, i * S), vop<M, kOp>(Cd::load(at(a, i * S)), Cd::load(at(b, i * S))));
  }
  if (i < count) reduce2_generic<Tr, kOp>(at(dst, i * S), at(a, i * S), at(b, i * S), count - i);
}

// Four accumulators in registers per step; each source is read once, in
// order, and the sum is rounded once when stored.
template <class M, class Cd, class Tr, ReduceOp kOp>
void reduce_n_vec(void* dst, const void* const* srcs, int nsrc, size_t count) {
  constexpr size_t W = M::W, S = sizeof(typename Tr::Store);
  size_t i = 0;
  for (; i + 4 * W <= count; i += 4 * W) {
    const void* s0 = srcs[0];
    typename M::V a0 = Cd::load(at(s0, i * S)), a1 = Cd::load(at(s0, (i + W) * S));
    typename M::V a2 = Cd::load(at(s0, (i + 2 * W) * S)), a3 = Cd::load(at(s0, (i + 3 * W) * S));
    for (int k = 1; k < nsrc; ++k) {
      const void* s = srcs[k];
      a0 = vop<M, kOp>(a0, Cd::load(at(s, i * S)));
      a1 = vop<M, kOp>(a1, Cd::load(at(s, (i + W) * S)));
      a2 = vop<M, kOp>(a2, Cd::load(at(s, (i + 2 * W) * S)));
      a3 = vop<M, kOp>(a3, Cd::load(at(s, (i + 3 * W) * S)));
    }
    Cd::store2(at(dst, i * S), a0, a1);
    Cd::store2(at(dst, (i + 2 * W) * S), a2, a3);
  }
  for (; i + W <= count; i += W) {
    typename M::V acc = Cd::load(at(srcs[0], i * S));
    for (int k = 1; k < nsrc; ++k) acc = vop<M, kOp>(acc, Cd::load(at(srcs[k], i * S)));
    Cd::store(at(dst, i * S), acc);
  }
  if (i < count) reduce_n_range<Tr, kOp>(dst, srcs, nsrc, i, count);
}

template <class M, class Cd, class Tr>
void divide_vec(void* dst, const void* src, size_t count, int divisor) {
  constexpr size_t W = M::W, S = sizeof(typename Tr::Store);
  const typename M::V q = M::set1(static_cast<typename Tr::Compute>(divisor));
  size_t i = 0;
  for (; i + W <= count; i += W) Cd::store(at(dst, i * S), M::div(Cd::load(at(src, i * S)), q));
  if (i < count) divide_generic<Tr>(at(dst, i * S), at(src, i * S), count - i, divisor);
}

template <class M, class Cd, class Tr>
void scale_vec(void* dst, const void* src, size_t count, const void* scalar) {
  constexpr size_t W = M::W, S = sizeof(typename Tr::Store);
  typename Tr::Store raw;
  std::memcpy(&raw, scalar, sizeof raw);
  const typename M::V k = M::set1(Tr::load(raw));
  size_t i = 0;
  for (; i + W <= count; i += W) Cd::store(at(dst, i * S), M::mul(Cd::load(at(src, i * S)), k));
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
