#include "cuda/stream_wait.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "cuda/driver.h"
#include "util/log.h"
#include "util/param.h"
#include "util/wait.h"

namespace meshccl::cuda {

namespace {
struct HostWait {
  volatile uint32_t* flag;
  uint32_t value;
};

// Runs on CUDA's callback thread: may not call CUDA. The host always raises
// the flag, also when the operation fails or times out, so this ends.
void host_wait(void* p) {
  auto* w = static_cast<HostWait*>(p);
  Backoff backoff;
  while (static_cast<int32_t>(__atomic_load_n(w->flag, __ATOMIC_ACQUIRE) - w->value) < 0) backoff.idle();
  delete w;
}

// Latency in microseconds from raising the flag to the stream passing the
// wait, averaged over a few rounds; < 0 when the mode does not work here.
double measure(const Driver* d, WaitMode mode) {
  CUstream s = nullptr;
  CUevent ev = nullptr;
  void* host = nullptr;
  CUdeviceptr dev = 0;
  double result = -1;
  if (d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return -1;
  if (d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) goto out;
  if (d->cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS) goto out;
  if (d->cuMemHostGetDevicePointer(&dev, host, 0) != CUDA_SUCCESS) goto out;
  {
    auto* flag = static_cast<volatile uint32_t*>(host);
    *flag = 0;
    constexpr int kRounds = 20;
    double total = 0;
    for (uint32_t i = 1; i <= kRounds; ++i) {
      if (!stream_wait_flag(s, mode, flag, dev, i).ok()) goto out;
      if (d->cuEventRecord(ev, s) != CUDA_SUCCESS) goto out;
      const double t0 = now_us();
      raise_flag(flag, i);
      // Bounded: 1 s is ages for a wait that takes microseconds.
      CUresult r;
      while ((r = d->cuEventQuery(ev)) == CUDA_ERROR_NOT_READY && now_us() - t0 < 1e6) {}
      if (r != CUDA_SUCCESS) goto out;
      if (i > 2) total += now_us() - t0;  // the first rounds warm up
    }
    result = total / (kRounds - 2);
  }
out:
  if (s) {
    d->cuStreamSynchronize(s);
    d->cuStreamDestroy(s);
  }
  if (ev) d->cuEventDestroy(ev);
  if (host) d->cuMemFreeHost(host);
  return result;
}
}  // namespace

const char* wait_mode_name(WaitMode m) { return m == WaitMode::MemOps ? "memops" : "hostfunc"; }

void raise_flag(volatile uint32_t* flag, uint32_t value) { __atomic_store_n(flag, value, __ATOMIC_RELEASE); }

Status stream_wait_flag(CUstream stream, WaitMode mode, volatile uint32_t* flag, CUdeviceptr dev_flag, uint32_t value) {
  const Driver* d = driver();
  if (mode == WaitMode::MemOps) {
    MC_CU(d->cuStreamWaitValue32(stream, dev_flag, value, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
    return kOk;
  }
  auto* w = new HostWait{flag, value};
  CUresult r = d->cuLaunchHostFunc(stream, host_wait, w);
  if (r != CUDA_SUCCESS) {
    delete w;
    return cu_status(r, "cuLaunchHostFunc");
  }
  return kOk;
}

WaitMode wait_mode(const char** why) {
  static std::mutex mu;
  static bool chosen = false;
  static WaitMode mode = WaitMode::HostFunc;
  static std::string reason;
  std::lock_guard<std::mutex> lock(mu);
  if (!chosen) {
    chosen = true;
    const std::string& want = param_str(Param::CudaWait);
    const Driver* d = driver();
    if (want == "memops" || want == "hostfunc") {
      mode = want == "memops" ? WaitMode::MemOps : WaitMode::HostFunc;
      reason = "MESHCCL_CUDA_WAIT=" + want;
    } else if (d != nullptr) {
      const double memops = measure(d, WaitMode::MemOps);
      const double hostfunc = measure(d, WaitMode::HostFunc);
      mode = (memops >= 0 && (hostfunc < 0 || memops <= hostfunc)) ? WaitMode::MemOps : WaitMode::HostFunc;
      char buf[160];
      std::snprintf(buf, sizeof buf, "measured: memops %.1f us, hostfunc %.1f us (-1 = unusable)", memops, hostfunc);
      reason = buf;
    } else {
      reason = "no driver";
    }
    if (want != "auto" && want != "memops" && want != "hostfunc")
      MC_WARN("MESHCCL_CUDA_WAIT=%s is not auto, memops or hostfunc; using auto", want.c_str());
    MC_INFO(kInit, "CUDA streams wait by %s (%s)", wait_mode_name(mode), reason.c_str());
  }
  if (why != nullptr) *why = reason.c_str();
  return mode;
}

}  // namespace meshccl::cuda
