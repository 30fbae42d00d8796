// The per-ISA kernel tables: one typed function per (datatype, op), chosen
// once per call by reduce.cpp, so no loop ever switches on a datatype.
#pragma once

#include <cstddef>

#include "kernels/reduce.h"

namespace meshccl::kernels {

constexpr int kNumTypes = 12;
constexpr int kNumOps = 4;

using Reduce2Fn = void (*)(void* dst, const void* a, const void* b, size_t count);
using ReduceNFn = void (*)(void* dst, const void* const* srcs, int nsrc, size_t count);
using DivideFn = void (*)(void* dst, const void* src, size_t count, int divisor);
using ScaleFn = void (*)(void* dst, const void* src, size_t count, const void* scalar);

struct KernelTable {
  const char* name;
  Reduce2Fn reduce2[kNumTypes][kNumOps];
  ReduceNFn reduce_n[kNumTypes][kNumOps];
  DivideFn divide[kNumTypes];
  ScaleFn scale[kNumTypes];
};

const KernelTable& portable_table();
const KernelTable& avx2_table();    // built on x86 only
const KernelTable& avx512_table();  // built on x86 only

// The fast fp8 loops (fp8_loops.h) of one ISA file, installed over the codec
// entries of a table. The AVX-512 table takes the AVX-512 Sum/Prod loops when
// the CPU also has AVX512-BF16, VBMI and VBMI2 (avx512_fp8_extras_supported),
// the AVX2 ones otherwise, and the AVX2 Max/Min loops. x86 only.
void fill_avx2_fp8_arith(KernelTable& t);
void fill_avx2_fp8_select(KernelTable& t);
void fill_avx512_fp8_arith(KernelTable& t);
bool avx512_fp8_extras_supported();

}  // namespace meshccl::kernels
