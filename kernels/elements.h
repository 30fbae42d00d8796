// What the reduction kernels compute on: the elementwise operators and the
// size of one element of each NCCL datatype. A leaf (NCCL's header only), so
// the kernels include nothing of the runtime; src/base/op.h builds the
// runtime's vocabulary on it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl.h"

namespace meshccl {

// The elementwise operator of a reduction. Avg reduces as Sum; the caller
// divides once at the end. PreMulSum reduces as Sum after each rank scaled
// its own input.
enum class ReduceOp : uint8_t { Sum = 0, Prod = 1, Max = 2, Min = 3 };

// Size in bytes of one element; 0 for an invalid datatype.
constexpr size_t dtype_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

}  // namespace meshccl
