// Test data for the nccl-tests-compatible tools. Every rank computes its own
// input and the exact expected output locally from (seed, rank, element index),
// so checking needs no communication beyond summing the wrong-element counts.
//
// Reduction inputs are chosen so that every order of reduction gives the same
// bits: floating-point values are small integers whose partial sums, products
// and PreMulSum terms stay exactly representable in the type's mantissa; avg
// lets only two ranks contribute; integers wrap. Only avg on floating types is
// compared with a tolerance (2 units in the last place).
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl.h"

namespace perf {

enum class Op { kSum, kProd, kMax, kMin, kAvg, kMulSum, kNone };

struct TypeInfo {
  ncclDataType_t type;
  const char* name;  // as nccl-tests prints it
  size_t size;       // bytes per element
  bool is_float;
  bool is_signed;  // integers only
  int exp_bits;    // floating types only
  int mant_bits;   // floating types only (explicit fraction bits)
};

const TypeInfo* FindType(const char* name);  // nullptr if unknown
const TypeInfo& TypeOf(ncclDataType_t type);
int NumTypes();
const TypeInfo& TypeAt(int i);

const char* OpName(Op op);
bool FindOp(const char* name, Op* op);  // false if unknown
ncclRedOp_t NcclOp(Op op);              // kMulSum/kNone map to ncclSum

// Everything that determines the values of one measurement.
struct DataSpec {
  const TypeInfo* type;
  Op op;
  int nranks;
  uint64_t seed;
};

// dst[i] = value of `rank` at global element index offset + i.
void FillInput(const DataSpec& spec, int rank, size_t offset, size_t count, void* dst);
// dst[i] = the reduction over all ranks of their values at offset + i.
void FillReduced(const DataSpec& spec, size_t offset, size_t count, void* dst);
// Number of elements of `actual` that differ from `expected`.
int64_t CountWrong(const DataSpec& spec, const void* actual, const void* expected, size_t count);

// The PreMulSum scalar of a rank (1 on even ranks, 2 on odd), encoded in the
// type, for ncclRedOpCreatePreMulSum with ncclScalarHostImmediate.
void MulSumScalar(const TypeInfo& type, int rank, void* scalar);

// Exposed for tests: round-to-nearest-even encoding of a double into a
// floating type's bit pattern, and the inverse.
uint64_t EncodeFloat(const TypeInfo& type, double v);
double DecodeFloat(const TypeInfo& type, uint64_t bits);

}  // namespace perf
