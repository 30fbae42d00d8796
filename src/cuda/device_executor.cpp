#include "cuda/device_executor.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda/driver.h"
#include "kernels/cuda/fatbin.h"

namespace meshccl::cuda {

constexpr int kDtypes = 12;
constexpr int kOps = 4;

// The kernels of one context, loaded at its first use and kept for the life
// of the process (a context outlives its communicators).
struct DeviceExecutor::Kernels {
  CUmodule module = nullptr;
  CUfunction reduce2[kDtypes][kOps] = {};
  CUfunction divide[kDtypes] = {};
  CUfunction scale[kDtypes] = {};
};

namespace {
Status load_kernels(const Driver* d, DeviceExecutor::Kernels* k) {
  MC_CU(d->cuModuleLoadData(&k->module, kernels::cuda_fatbin()), "loading the meshccl CUDA kernels");
  char name[64];
  for (int dt = 0; dt < kDtypes; ++dt) {
    for (int op = 0; op < kOps; ++op) {
      std::snprintf(name, sizeof name, "meshccl_reduce2_%d_%d", dt, op);
      MC_CU(d->cuModuleGetFunction(&k->reduce2[dt][op], k->module, name), name);
    }
    std::snprintf(name, sizeof name, "meshccl_divide_%d", dt);
    MC_CU(d->cuModuleGetFunction(&k->divide[dt], k->module, name), name);
    std::snprintf(name, sizeof name, "meshccl_scale_%d", dt);
    MC_CU(d->cuModuleGetFunction(&k->scale[dt], k->module, name), name);
  }
  return kOk;
}

bool valid_dt(ncclDataType_t dt) { return static_cast<int>(dt) >= 0 && static_cast<int>(dt) < kDtypes; }
}  // namespace

Status DeviceExecutor::create(CUstream stream, std::unique_ptr<DeviceExecutor>* out) {
  const Driver* d = driver();
  if (d == nullptr) return MC_ERROR(ncclInvalidUsage, "device executor : %s", why_unavailable().c_str());
  CUcontext ctx = nullptr;
  MC_CU(d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) return MC_ERROR(ncclInvalidUsage, "device executor : no CUDA context is current on this thread");
  static std::mutex mu;
  static auto* per_ctx = new std::map<CUcontext, Kernels*>();
  std::lock_guard<std::mutex> lock(mu);
  Kernels*& k = (*per_ctx)[ctx];
  if (k == nullptr) {
    auto fresh = std::make_unique<Kernels>();
    Status s = load_kernels(d, fresh.get());
    if (!s.ok()) {
      per_ctx->erase(ctx);
      return s;
    }
    k = fresh.release();
  }
  out->reset(new DeviceExecutor(stream, k));
  return kOk;
}

Status DeviceExecutor::launch(CUfunction f, size_t count, void** args) {
  if (count == 0) return kOk;
  constexpr unsigned kThreads = 256;
  // A grid-stride loop: enough blocks to fill any GPU, never more than needed.
  const size_t want = (count + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(want < 4096 ? want : 4096);
  MC_CU(driver()->cuLaunchKernel(f, blocks, 1, 1, kThreads, 1, 1, 0, stream_, args, nullptr), "cuLaunchKernel");
  return kOk;
}

Status DeviceExecutor::copy_async(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return kOk;
  MC_CU(driver()->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), bytes, stream_),
        "cuMemcpyAsync");
  return kOk;
}

Status DeviceExecutor::reduce2_async(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b,
                                     size_t count) {
  const int o = static_cast<int>(op);
  if (!valid_dt(dt) || o < 0 || o >= kOps)
    return MC_ERROR(ncclInvalidArgument, "device reduce : datatype %d / op %d unknown", static_cast<int>(dt), o);
  void* args[] = {&dst, &a, &b, &count};
  return launch(k_->reduce2[dt][o], count, args);
}

Status DeviceExecutor::divide_async(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) {
  if (!valid_dt(dt)) return MC_ERROR(ncclInvalidArgument, "device divide : datatype %d unknown", static_cast<int>(dt));
  void* args[] = {&dst, &src, &count, &divisor};
  return launch(k_->divide[dt], count, args);
}

Status DeviceExecutor::scale_async(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) {
  if (!valid_dt(dt)) return MC_ERROR(ncclInvalidArgument, "device scale : datatype %d unknown", static_cast<int>(dt));
  uint64_t bits = 0;  // the element in the low bytes, as the kernel reads it
  std::memcpy(&bits, scalar, dtype_size(dt));
  void* args[] = {&dst, &src, &count, &bits};
  return launch(k_->scale[dt], count, args);
}

Status DeviceExecutor::synchronize() {
  MC_CU(driver()->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  return kOk;
}

void DeviceExecutor::copy(void* dst, const void* src, size_t bytes) {
  Status s = copy_async(dst, src, bytes);
  keep(s.ok() ? synchronize() : s);
}
void DeviceExecutor::reduce2(ncclDataType_t dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  Status s = reduce2_async(dt, op, dst, a, b, count);
  keep(s.ok() ? synchronize() : s);
}
void DeviceExecutor::divide(ncclDataType_t dt, void* dst, const void* src, size_t count, int divisor) {
  Status s = divide_async(dt, dst, src, count, divisor);
  keep(s.ok() ? synchronize() : s);
}
void DeviceExecutor::scale(ncclDataType_t dt, void* dst, const void* src, size_t count, const void* scalar) {
  Status s = scale_async(dt, dst, src, count, scalar);
  keep(s.ok() ? synchronize() : s);
}

}  // namespace meshccl::cuda
