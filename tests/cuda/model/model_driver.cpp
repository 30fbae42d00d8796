// A model of the CUDA driver, built as libcuda.so.1 for the tests only, so
// that the device path (staging, stream ordering, the proxy, graph capture
// refusal, ncclMemAlloc) runs on a machine without a GPU. It is not a GPU:
// "device memory" lives at addresses the host cannot touch (a PROT_NONE
// reservation; the bytes are kept in a mirror only the model's copies reach),
// so any host access to a device buffer by the library crashes the test.
// Streams run their work in order on a thread each (the legacy stream is one
// more); events complete when their stream reaches them; stream waits poll
// host memory. Kernels do not exist here: modules fail to load.
#include <cuda.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#define API extern "C" __attribute__((visibility("default")))

namespace {

constexpr size_t kSpace = size_t{4} << 30;  // virtual only
char* g_dev = nullptr;                      // device addresses (PROT_NONE)
char* g_mirror = nullptr;                   // their bytes
std::atomic<size_t> g_next{0};
std::mutex g_mu;
std::set<void*> g_host_alloc;
CUctx_st* const kCtx = reinterpret_cast<CUctx_st*>(0x1000);
thread_local CUcontext t_ctx = nullptr;

bool is_dev(uintptr_t p) {
  return g_dev && p >= reinterpret_cast<uintptr_t>(g_dev) && p < reinterpret_cast<uintptr_t>(g_dev) + kSpace;
}
void* host_of(uintptr_t p) {
  return is_dev(p) ? g_mirror + (p - reinterpret_cast<uintptr_t>(g_dev)) : reinterpret_cast<void*>(p);
}

struct Stream {
  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::function<void()>> q;
  bool busy = false, stop = false, capturing = false;
  std::thread th;
  Stream() : th([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> l(mu);
      stop = true;
    }
    cv.notify_all();
    th.join();
  }
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return stop || !q.empty(); });
        if (q.empty()) return;
        f = std::move(q.front());
        q.pop_front();
        busy = true;
      }
      f();
      {
        std::lock_guard<std::mutex> l(mu);
        busy = false;
      }
      idle_cv.notify_all();
    }
  }
  void push(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(mu);
      q.push_back(std::move(f));
    }
    cv.notify_one();
  }
  void sync() {
    std::unique_lock<std::mutex> l(mu);
    idle_cv.wait(l, [&] { return q.empty() && !busy; });
  }
};

Stream* legacy() {
  static Stream* s = new Stream();
  return s;
}
Stream* S(CUstream h) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(h);
  return v <= 2 ? legacy() : reinterpret_cast<Stream*>(h);
}

struct Event {
  std::atomic<uint64_t> recorded{0}, reached{0};
};

}  // namespace

API CUresult cuInit(unsigned int) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_dev == nullptr) {
    g_dev = static_cast<char*>(mmap(nullptr, kSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    g_mirror = static_cast<char*>(
        mmap(nullptr, kSpace, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (g_dev == MAP_FAILED || g_mirror == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}
API CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
API CUresult cuGetErrorName(CUresult, const char** s) {
  *s = "CUDA_ERROR_MODEL";
  return CUDA_SUCCESS;
}
API CUresult cuGetErrorString(CUresult, const char** s) {
  *s = "error in the model driver";
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGet(CUdevice* d, int i) {
  if (i != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, len, "model GPU (no hardware)");
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
  return CUDA_SUCCESS;
}
API CUresult cuDeviceGetPCIBusId(char* s, int len, CUdevice) {
  std::snprintf(s, len, "0000:00:00.0");
  return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t* b, CUdevice) {
  *b = kSpace;
  return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = kCtx;
  return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
API CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = t_ctx;
  return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext c) {
  t_ctx = c;
  return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice* d) {
  *d = 0;
  return t_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  bool host;
  {
    std::lock_guard<std::mutex> l(g_mu);
    host = g_host_alloc.count(reinterpret_cast<void*>(p)) > 0;
  }
  if (!is_dev(p) && !host) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
    *static_cast<unsigned*>(data) = is_dev(p) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  else if (a == CU_POINTER_ATTRIBUTE_IS_MANAGED) *static_cast<unsigned*>(data) = 0;
  else return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}
API CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  if (!t_ctx) return CUDA_ERROR_INVALID_CONTEXT;
  const size_t at = g_next.fetch_add((n + 255) & ~size_t{255});
  if (at + n > kSpace) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(g_dev + at);
  return CUDA_SUCCESS;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { return is_dev(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuMemHostAlloc(void** p, size_t n, unsigned) {
  *p = std::calloc(1, n ? n : 1);
  std::lock_guard<std::mutex> l(g_mu);
  g_host_alloc.insert(*p);
  return CUDA_SUCCESS;
}
API CUresult cuMemFreeHost(void* p) {
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (!g_host_alloc.erase(p)) return CUDA_ERROR_INVALID_VALUE;
  }
  std::free(p);
  return CUDA_SUCCESS;
}
API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* d, void* p, unsigned) {
  *d = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  legacy()->sync();
  std::memmove(host_of(dst), host_of(src), n);
  return CUDA_SUCCESS;
}
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  if (S(s)->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  S(s)->push([=] { std::memmove(host_of(dst), host_of(src), n); });
  return CUDA_SUCCESS;
}
API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned v, size_t n, CUstream s) {
  S(s)->push([=] {
    auto* p = static_cast<uint32_t*>(host_of(dst));
    for (size_t i = 0; i < n; ++i) p[i] = v;
  });
  return CUDA_SUCCESS;
}
API CUresult cuStreamCreate(CUstream* s, unsigned) {
  *s = reinterpret_cast<CUstream>(new Stream());
  return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream s) {
  S(s)->sync();
  if (S(s) != legacy()) delete S(s);
  return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream s) {
  S(s)->sync();
  return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) {
  *st = S(s)->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
API CUresult cuStreamGetCtx(CUstream, CUcontext* c) {
  *c = kCtx;
  return CUDA_SUCCESS;
}
API CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t v, unsigned) {
  auto* p = static_cast<volatile uint32_t*>(host_of(addr));
  S(s)->push([=] {
    while (static_cast<int32_t>(__atomic_load_n(p, __ATOMIC_ACQUIRE) - v) < 0)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return CUDA_SUCCESS;
}
API CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t v, unsigned) {
  auto* p = static_cast<volatile uint32_t*>(host_of(addr));
  S(s)->push([=] { __atomic_store_n(p, v, __ATOMIC_RELEASE); });
  return CUDA_SUCCESS;
}
API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  S(s)->push([=] { fn(data); });
  return CUDA_SUCCESS;
}
API CUresult cuEventCreate(CUevent* e, unsigned) {
  *e = reinterpret_cast<CUevent>(new Event());
  return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent e) {
  delete reinterpret_cast<Event*>(e);
  return CUDA_SUCCESS;
}
API CUresult cuEventRecord(CUevent e, CUstream s) {
  auto* ev = reinterpret_cast<Event*>(e);
  const uint64_t n = ++ev->recorded;
  S(s)->push([ev, n] { ev->reached.store(n); });
  return CUDA_SUCCESS;
}
API CUresult cuEventQuery(CUevent e) {
  auto* ev = reinterpret_cast<Event*>(e);
  return ev->reached.load() >= ev->recorded.load() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent e) {
  while (cuEventQuery(e) != CUDA_SUCCESS) std::this_thread::sleep_for(std::chrono::microseconds(20));
  return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float* ms, CUevent, CUevent) {
  *ms = 0;
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuModuleLoadData(CUmodule*, const void*) { return CUDA_ERROR_NOT_SUPPORTED; }
API CUresult cuModuleUnload(CUmodule) { return CUDA_ERROR_NOT_SUPPORTED; }
API CUresult cuModuleGetFunction(CUfunction*, CUmodule, const char*) { return CUDA_ERROR_NOT_SUPPORTED; }
API CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                            void**, void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode) {
  S(s)->capturing = true;
  return CUDA_SUCCESS;
}
API CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
  S(s)->capturing = false;
  *g = reinterpret_cast<CUgraph>(new char);
  return CUDA_SUCCESS;
}
API CUresult cuGraphDestroy(CUgraph g) {
  delete reinterpret_cast<char*>(g);
  return CUDA_SUCCESS;
}
