// Reduction kernels on device memory: every NCCL datatype x Sum/Prod/Max/Min,
// the Avg division and the PreMulSum scaling, with the rounding of the host
// kernels (kernels/typed.h and kernels/convert.h, compiled here for the
// device), so a device result is bit-identical to the host one.
//
// One translation unit, compiled by nvcc into a fat binary (sm_80, sm_90 and
// compute_90 PTX) that the runtime loads with the driver API (src/cuda): the
// kernels have C names, meshccl_<what>_<datatype>[_<op>], the datatype and op
// given by their numeric values in nccl.h and kernels/elements.h.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#define MESHCCL_HD __host__ __device__
#define MESHCCL_KERNEL_NS cuda_dev
#include "kernels/convert.h"

namespace meshccl::kernels::cuda_dev {

template <class T>
struct Int {
  using S = T;
  using C = T;
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  static constexpr bool kFloat = false;
  __device__ static C load(S v) { return v; }
  __device__ static S store(C v) { return v; }
};
template <class T>
struct Flt {
  using S = T;
  using C = T;
  using W = T;
  static constexpr bool kFloat = true;
  __device__ static C load(S v) { return v; }
  __device__ static S store(C v) { return v; }
};
struct Half {
  using S = uint16_t;
  using C = float;
  using W = float;
  static constexpr bool kFloat = true;
  __device__ static C load(S v) { return h2f(v); }
  __device__ static S store(C v) { return f2h(v); }
};
struct Bf16 {
  using S = uint16_t;
  using C = float;
  using W = float;
  static constexpr bool kFloat = true;
  __device__ static C load(S v) { return b2f(v); }
  __device__ static S store(C v) { return f2b(v); }
};
struct E4m3 {
  using S = uint8_t;
  using C = float;
  using W = float;
  static constexpr bool kFloat = true;
  __device__ static C load(S v) { return e4m3_2f(v); }
  __device__ static S store(C v) { return f2e4m3(v); }
};
struct E5m2 {
  using S = uint8_t;
  using C = float;
  using W = float;
  static constexpr bool kFloat = true;
  __device__ static C load(S v) { return e5m2_2f(v); }
  __device__ static S store(C v) { return f2e5m2(v); }
};

// Op numbers as kernels/elements.h's ReduceOp: Sum 0, Prod 1, Max 2, Min 3.
template <class Tr, int kOp>
__device__ inline typename Tr::C combine(typename Tr::C a, typename Tr::C b) {
  using C = typename Tr::C;
  using W = typename Tr::W;
  if constexpr (Tr::kFloat) {
    if constexpr (kOp == 0) return a + b;
    if constexpr (kOp == 1) return a * b;
    // The host's compare-and-select: second operand on ties and NaN.
    if constexpr (kOp == 2) return b != b ? a : (a > b ? a : b);
    if constexpr (kOp == 3) return b != b ? a : (a < b ? a : b);
  } else {
    if constexpr (kOp == 0) return static_cast<C>(static_cast<W>(a) + static_cast<W>(b));
    if constexpr (kOp == 1) return static_cast<C>(static_cast<W>(a) * static_cast<W>(b));
    if constexpr (kOp == 2) return a > b ? a : b;
    if constexpr (kOp == 3) return a < b ? a : b;
  }
}

template <class Tr, int kOp>
__device__ void reduce2(void* dst, const void* a, const void* b, size_t count) {
  using S = typename Tr::S;
  const S* pa = static_cast<const S*>(a);
  const S* pb = static_cast<const S*>(b);
  S* pd = static_cast<S*>(dst);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    pd[i] = Tr::store(combine<Tr, kOp>(Tr::load(pa[i]), Tr::load(pb[i])));
}

template <class Tr>
__device__ void divide(void* dst, const void* src, size_t count, int divisor) {
  using S = typename Tr::S;
  using C = typename Tr::C;
  using W = typename Tr::W;
  const S* ps = static_cast<const S*>(src);
  S* pd = static_cast<S*>(dst);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (Tr::kFloat) {
    const C q = static_cast<C>(divisor);
    for (size_t i = first; i < count; i += stride) pd[i] = Tr::store(Tr::load(ps[i]) / q);
  } else {
    if (divisor == 0) return;
    if (std::is_signed_v<S> && divisor == -1) {
      for (size_t i = first; i < count; i += stride) pd[i] = static_cast<S>(W{0} - static_cast<W>(ps[i]));
      return;
    }
    if constexpr (std::is_unsigned_v<S>) {
      if (divisor < 0) return;
    }
    // Integer division truncates like C, which is what the host computes.
    const S q = static_cast<S>(divisor);
    for (size_t i = first; i < count; i += stride) pd[i] = static_cast<S>(ps[i] / q);
  }
}

template <class Tr>
__device__ void scale(void* dst, const void* src, size_t count, uint64_t scalar_bits) {
  using S = typename Tr::S;
  S raw;
  memcpy(&raw, &scalar_bits, sizeof raw);  // little-endian: the element is the low bytes
  const typename Tr::C k = Tr::load(raw);
  const S* ps = static_cast<const S*>(src);
  S* pd = static_cast<S*>(dst);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    pd[i] = Tr::store(combine<Tr, 1>(Tr::load(ps[i]), k));
}

}  // namespace meshccl::kernels::cuda_dev

namespace k = meshccl::kernels::cuda_dev;

#define MESHCCL_DT_KERNELS(num, Tr)                                                                       \
  extern "C" __global__ void meshccl_reduce2_##num##_0(void* d, const void* a, const void* b, size_t n) { \
    k::reduce2<Tr, 0>(d, a, b, n);                                                                        \
  }                                                                                                       \
  extern "C" __global__ void meshccl_reduce2_##num##_1(void* d, const void* a, const void* b, size_t n) { \
    k::reduce2<Tr, 1>(d, a, b, n);                                                                        \
  }                                                                                                       \
  extern "C" __global__ void meshccl_reduce2_##num##_2(void* d, const void* a, const void* b, size_t n) { \
    k::reduce2<Tr, 2>(d, a, b, n);                                                                        \
  }                                                                                                       \
  extern "C" __global__ void meshccl_reduce2_##num##_3(void* d, const void* a, const void* b, size_t n) { \
    k::reduce2<Tr, 3>(d, a, b, n);                                                                        \
  }                                                                                                       \
  extern "C" __global__ void meshccl_divide_##num(void* d, const void* s, size_t n, int q) {              \
    k::divide<Tr>(d, s, n, q);                                                                            \
  }                                                                                                       \
  extern "C" __global__ void meshccl_scale_##num(void* d, const void* s, size_t n, uint64_t x) {          \
    k::scale<Tr>(d, s, n, x);                                                                             \
  }

// Datatype numbers as nccl.h's ncclDataType_t.
MESHCCL_DT_KERNELS(0, k::Int<int8_t>)
MESHCCL_DT_KERNELS(1, k::Int<uint8_t>)
MESHCCL_DT_KERNELS(2, k::Int<int32_t>)
MESHCCL_DT_KERNELS(3, k::Int<uint32_t>)
MESHCCL_DT_KERNELS(4, k::Int<int64_t>)
MESHCCL_DT_KERNELS(5, k::Int<uint64_t>)
MESHCCL_DT_KERNELS(6, k::Half)
MESHCCL_DT_KERNELS(7, k::Flt<float>)
MESHCCL_DT_KERNELS(8, k::Flt<double>)
MESHCCL_DT_KERNELS(9, k::Bf16)
MESHCCL_DT_KERNELS(10, k::E4m3)
MESHCCL_DT_KERNELS(11, k::E5m2)
