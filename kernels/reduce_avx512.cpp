// The AVX-512 implementation (F, BW, VL, DQ): compiled with those flags and
// called only after the runtime CPU check. Floating-point types use the
// vector loops of simd_loops.h with the 16-lane codecs of x86_codecs.h
// (half in 8 lanes; bfloat16's codec is in avx512_codecs.h); integer types
// use the generic loops, which the compiler vectorises for AVX-512. fp8
// Sum/Prod take the fast loops of reduce_avx512_fp8.cpp where the CPU has
// AVX512-BF16, VBMI and VBMI2, the AVX2 ones otherwise; fp8 Max/Min compare
// codes with the AVX2 loops (AVX-512 compares only produce mask registers,
// and those made the 512-bit version the slower one).
#define MESHCCL_KERNEL_NS avx512
#include "kernels/avx512_codecs.h"

namespace meshccl::kernels {

const KernelTable& avx512_table() {
  static const KernelTable table = [] {
    using namespace avx512;
    KernelTable t{};
    t.name = "avx512";
    fill_generic(t);
    fill_vec_type<F32x8, HalfCodec, HalfTraits>(t, ncclFloat16);
    fill_vec_type<F32, PlainCodec<float, 64>, NativeFloatTraits<float>>(t, ncclFloat32);
    fill_vec_type<F64, PlainCodec<double, 64>, NativeFloatTraits<double>>(t, ncclFloat64);
    fill_vec_type<F32, Bf16Codec, Bf16Traits>(t, ncclBfloat16);
    fill_vec_type<F32, E4m3Codec<Zmm>, E4m3Traits>(t, ncclFloat8e4m3);
    fill_vec_type<F32, E5m2Codec<Zmm>, E5m2Traits>(t, ncclFloat8e5m2);
    if (avx512_fp8_extras_supported()) {
      fill_avx512_fp8_arith(t);
    } else {
      fill_avx2_fp8_arith(t);
    }
    fill_avx2_fp8_select(t);
    return t;
  }();
  return table;
}

}  // namespace meshccl::kernels
