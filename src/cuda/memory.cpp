#include "cuda/memory.h"

#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "cuda/driver.h"

namespace meshccl::cuda {

MemKind classify(const void* p) {
  const Driver* d = driver();
  if (d == nullptr || p == nullptr) return MemKind::Host;
  const CUdeviceptr dp = reinterpret_cast<CUdeviceptr>(p);
  unsigned int type = 0;
  // A pointer CUDA never saw fails with CUDA_ERROR_INVALID_VALUE: host memory.
  if (d->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp) != CUDA_SUCCESS) return MemKind::Host;
  if (type != CU_MEMORYTYPE_DEVICE) return MemKind::Host;
  unsigned int managed = 0;
  if (d->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dp) == CUDA_SUCCESS && managed != 0)
    return MemKind::Host;
  return MemKind::Device;
}

namespace {
std::mutex g_mu;
std::unordered_map<void*, size_t>& blocks() {
  static auto* m = new std::unordered_map<void*, size_t>();
  return *m;
}
}  // namespace

Status device_alloc(void** ptr, size_t size, bool* handled) {
  *handled = false;
  const Driver* d = driver();
  if (d == nullptr) return kOk;
  CUcontext ctx = nullptr;
  if (d->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return kOk;
  *handled = true;
  CUdeviceptr p = 0;
  MC_CU(d->cuMemAlloc(&p, size == 0 ? 1 : size), "ncclMemAlloc");
  *ptr = reinterpret_cast<void*>(p);
  std::lock_guard<std::mutex> lock(g_mu);
  blocks()[*ptr] = size;
  return kOk;
}

Status device_free(void* ptr, bool* handled) {
  *handled = false;
  const Driver* d = driver();
  if (d == nullptr) return kOk;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = blocks().find(ptr);
    if (it == blocks().end()) return kOk;
    blocks().erase(it);
  }
  *handled = true;
  MC_CU(d->cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)), "ncclMemFree");
  return kOk;
}

std::string describe() {
  char line[256];
  std::string out;
  const Driver* d = driver();
  const int rt = runtime_version();
  if (d == nullptr) {
    std::snprintf(line, sizeof line, "  cuda runtime: %s\n  no GPU: %s\n",
                  rt ? (std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10)).c_str() : "not found",
                  why_unavailable().c_str());
    return line;
  }
  std::snprintf(line, sizeof line, "  driver %d.%d (CUDA API), runtime %d.%d%s, %d GPU(s)\n", d->version / 1000,
                (d->version % 1000) / 10, rt / 1000, (rt % 1000) / 10, rt ? "" : " (libcudart not found)", d->devices);
  out += line;
  for (int i = 0; i < d->devices; ++i) {
    CUdevice dev = 0;
    if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    char name[128] = {};
    char bus[32] = {};
    int major = 0, minor = 0;
    size_t mem = 0;
    d->cuDeviceGetName(name, sizeof name, dev);
    d->cuDeviceGetPCIBusId(bus, sizeof bus, dev);
    d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    d->cuDeviceTotalMem(&mem, dev);
    std::snprintf(line, sizeof line, "  gpu %d: %s, sm_%d%d, %.1f GiB, bus %s\n", i, name, major, minor,
                  static_cast<double>(mem) / (1u << 30), bus);
    out += line;
  }
  return out;
}

}  // namespace meshccl::cuda
