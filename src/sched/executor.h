// Where a plan's local work runs: copies, reductions, the Avg division and
// the PreMulSum scaling. The engine owns one executor and never touches
// memory itself; the host executor calls the CPU kernels, and a device
// executor can take its place for device buffers.
#pragma once

#include <cstddef>

#include "base/op.h"
#include "nccl.h"

namespace meshccl {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // dst = a op b, count elements; dst may alias a or b.
  virtual void reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) = 0;
  virtual void divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) = 0;
  virtual void scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) = 0;
};

// The host-memory executor (kernels/), shared by every engine.
Executor& host_executor();

}  // namespace meshccl
