// The executor for device memory: copies with cuMemcpyAsync and reductions
// with the CUDA kernels (kernels/cuda), queued on one CUDA stream. It stands
// behind the same seam as the host executor (sched/executor.h); each call of
// that interface completes before it returns, the *_async calls only queue.
#pragma once

#include <cuda.h>

#include <memory>

#include "base/op.h"
#include "nccl.h"
#include "sched/executor.h"
#include "util/status.h"

namespace meshccl::cuda {

class DeviceExecutor final : public Executor {
 public:
  // For the current context of this thread, queuing on stream (0: the legacy
  // default stream). Fails when no context is current or the kernels do not
  // load for this GPU.
  static Status create(CUstream stream, std::unique_ptr<DeviceExecutor>* out);

  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) override;
  void divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) override;
  void scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) override;
  // The first error of the calls above (they return nothing).
  Status status() const { return status_; }

  Status copy_async(void* dst, const void* src, size_t bytes);
  Status reduce2_async(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count);
  Status divide_async(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor);
  Status scale_async(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar);
  Status synchronize();

  struct Kernels;

 private:
  DeviceExecutor(CUstream s, const Kernels* k) : stream_(s), k_(k) {}
  void keep(Status s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }
  Status launch(CUfunction f, size_t count, void** args);

  CUstream stream_;
  const Kernels* k_;
  Status status_;
};

}  // namespace meshccl::cuda
