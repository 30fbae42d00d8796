// Reduction kernels on host memory: elementwise, every NCCL datatype x op.
//
// Pure functions with no communicator state. Half, bfloat16 and fp8 are
// widened to float, combined, and rounded back to nearest-even once per
// output element; integers wrap on overflow like NCCL. The implementation
// picks AVX-512 / AVX2 / portable code at first use, from the CPU, unless
// select_isa chose one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/elements.h"
#include "nccl.h"

namespace meshccl::kernels {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b.
void reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// dst[i] = op over srcs[0..nsrc)[i], accumulated in the widened type and
// rounded once. nsrc >= 1; dst may alias any src. Used by the direct
// shared-memory algorithms, which read every peer's buffer in one pass.
void reduce_n(ncclDataType_t dt, ReduceOp op, void* dst, const void* const* srcs, int nsrc, size_t count);

// dst[i] = src[i] / divisor (integers: truncating division like C; floats:
// divided in float/double and rounded to nearest-even). For ncclAvg.
void divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor);

// dst[i] = src[i] * scalar, where scalar points to one element of dt. For
// ncclRedOpCreatePreMulSum.
void scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar);

// Which implementation is in use: "avx512", "avx2" or "portable".
const char* isa_name();
// Chooses "portable", "avx2", "avx512" or "auto" (the best this CPU runs) for
// every later call in the process; returns false (and changes nothing) when
// the name is unknown or this CPU cannot run that code. The kernels read no
// settings: the runtime applies MESHCCL_KERNEL_ISA at communicator creation.
bool select_isa(const char* name);
// Whether this CPU can run the named implementation.
bool isa_supported(const char* name);

// Scalar conversions shared with tests and tools (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);
float e4m3_to_float(uint8_t v);
uint8_t float_to_e4m3(float f);  // saturates to +-448 (OCP e4m3fn has no infinity)
float e5m2_to_float(uint8_t v);
uint8_t float_to_e5m2(float f);

}  // namespace meshccl::kernels
