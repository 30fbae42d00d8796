#include "sched/executor.h"

#include <cstring>

#include "kernels/reduce.h"

namespace meshccl {

namespace {
class HostExecutor final : public Executor {
 public:
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
  }
  void reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) override {
    kernels::reduce2(dt, op, dst, a, b, count);
  }
  void divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) override {
    kernels::divide(dt, dst, src, count, divisor);
  }
  void scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) override {
    kernels::scale(dt, dst, src, count, scalar);
  }
};
}  // namespace

Executor& host_executor() {
  static HostExecutor e;
  return e;
}

}  // namespace meshccl
