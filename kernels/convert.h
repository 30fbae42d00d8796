// Scalar conversions between float and the narrow floating types, inline so
// that typed loops and vector tails use exactly the rounding of the public
// functions. Every conversion rounds to nearest even by integer arithmetic, so
// the result does not depend on the thread's MXCSR rounding mode or on
// flush-to-zero settings.
//
// Included by several translation units compiled for different ISAs: the
// contents live in a namespace chosen by MESHCCL_KERNEL_NS, so an inline
// function compiled with AVX-512 can never be picked by the linker for the
// portable path.
#pragma once

#include <cstdint>
#include <cstring>

#ifndef MESHCCL_KERNEL_NS
#error "define MESHCCL_KERNEL_NS before including convert.h"
#endif

// The CUDA kernels (kernels/cuda) compile the same functions for the device.
#ifndef MESHCCL_HD
#define MESHCCL_HD
#endif

namespace meshccl::kernels::MESHCCL_KERNEL_NS {

MESHCCL_HD inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

MESHCCL_HD inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds the magnitude m (an integer holding the value m * 2^-shift) to nearest
// even at bit `shift`. m + 2^(shift-1) must fit in 32 bits.
MESHCCL_HD inline uint32_t round_shift_rne(uint32_t m, unsigned shift) {
  return (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
}

// ---- IEEE binary16 -------------------------------------------------------

MESHCCL_HD inline float h2f(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) {
    // Inf keeps a zero mantissa; a NaN is quietened like vcvtph2ps does.
    return float_of(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0u));
  }
  if (exp == 0) {
    // Subnormal half (or zero): man * 2^-24 is a normal float, so the product
    // is exact and unaffected by denormals-are-zero.
    const float v = static_cast<float>(man) * 0x1p-24f;
    return float_of(bits_of(v) | sign);
  }
  return float_of(sign | ((exp + 112u) << 23) | (man << 13));
}

MESHCCL_HD inline uint16_t f2h(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                              // normal half (>= 2^-14)
    return static_cast<uint16_t>(sign | (round_shift_rne(a, 13) - (112u << 10)));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero
  const uint32_t fe = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | round_shift_rne(m, 126u - fe));
}

// ---- bfloat16 --------------------------------------------------------------

MESHCCL_HD inline float b2f(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

MESHCCL_HD inline uint16_t f2b(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  // Overflow rounds into the exponent and lands on inf, as IEEE wants.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- OCP fp8 ---------------------------------------------------------------
// M mantissa bits, exponent bias B; values beyond the largest finite one
// (including inf) saturate to it, as CUDA's __NV_SATFINITE conversions do.
template <unsigned M, unsigned B, uint32_t kMaxCode, uint32_t kNanCode>
MESHCCL_HD inline uint8_t f2fp8(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | kNanCode);
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | kMaxCode);
  constexpr uint32_t kMinNormalExp = 128u - B;  // float exponent field of 2^(1-B)
  const uint32_t fe = a >> 23;
  uint32_t code;
  if (fe >= kMinNormalExp) {
    code = round_shift_rne(a, 23u - M) - ((127u - B) << M);
    if (code > kMaxCode) code = kMaxCode;
  } else {
    // Subnormal target: code = value / 2^(1-B-M), rounded; a carry out of the
    // mantissa yields the smallest normal code, which is exactly right.
    const uint32_t shift = 151u - M - B - fe;
    if (shift > 24u) return static_cast<uint8_t>(sign);
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    code = round_shift_rne(m, shift);
  }
  return static_cast<uint8_t>(sign | code);
}

MESHCCL_HD inline uint8_t f2e4m3(float f) { return f2fp8<3, 7, 0x7eu, 0x7fu>(f); }
MESHCCL_HD inline uint8_t f2e5m2(float f) { return f2fp8<2, 15, 0x7bu, 0x7fu>(f); }

// e5m2 is the top byte of a binary16 with the same exponent bias.
MESHCCL_HD inline float e5m2_2f(uint8_t v) { return h2f(static_cast<uint16_t>(v << 8)); }

// e4m3 reinterpreted as a binary16 with the exponent and mantissa moved into
// place is the value times 2^-8 for normals and subnormals alike (the biases
// differ by 8), so one exact multiply finishes it. S.1111.111 is NaN.
MESHCCL_HD inline float e4m3_2f(uint8_t v) {
  if ((v & 0x7fu) == 0x7fu) return float_of((v & 0x80u ? 0xffc00000u : 0x7fc00000u));
  const uint16_t h = static_cast<uint16_t>(((v & 0x80u) << 8) | ((v & 0x7fu) << 7));
  return h2f(h) * 256.0f;
}

}  // namespace meshccl::kernels::MESHCCL_KERNEL_NS
