#include "cuda/driver.h"

#include <dlfcn.h>

#include <mutex>

#include "util/log.h"
#include "util/param.h"

namespace meshccl::cuda {

namespace {
#define MC_STR2(x) #x
#define MC_STR(x) MC_STR2(x)

struct Loaded {
  Driver drv;
  bool ok = false;
  std::string why;
};

Loaded* load() {
  auto* l = new Loaded();
  if (param_int(Param::Cuda) == 0) {
    l->why = "MESHCCL_CUDA=0";
    return l;
  }
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    l->why = "no CUDA driver (libcuda.so.1 not found)";
    return l;
  }
  Driver& d = l->drv;
#define MESHCCL_CU_FN(name)                                            \
  d.name = reinterpret_cast<decltype(d.name)>(dlsym(h, MC_STR(name))); \
  if (d.name == nullptr) {                                             \
    l->why = std::string("the CUDA driver lacks ") + MC_STR(name);     \
    return l;                                                          \
  }
#include "cuda/driver_fns.def"
#undef MESHCCL_CU_FN
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(r, &name);
    l->why = std::string("cuInit failed: ") + (name ? name : "unknown error");
    return l;
  }
  d.cuDriverGetVersion(&d.version);
  if (d.cuDeviceGetCount(&d.devices) != CUDA_SUCCESS || d.devices == 0) {
    l->why = "no CUDA device";
    return l;
  }
  l->ok = true;
  MC_INFO(kInit, "CUDA driver %d.%d, %d device(s)", d.version / 1000, (d.version % 1000) / 10, d.devices);
  return l;
}

// Loaded once; the handle stays open for the life of the process.
Loaded& loaded() {
  static Loaded* l = load();
  return *l;
}
}  // namespace

const Driver* driver() {
  Loaded& l = loaded();
  return l.ok ? &l.drv : nullptr;
}

const std::string& why_unavailable() { return loaded().why; }

Status cu_status(CUresult r, const char* what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (const Driver* d = driver()) {
    d->cuGetErrorName(r, &name);
    d->cuGetErrorString(r, &text);
  }
  return MC_ERROR(ncclUnhandledCudaError, "%s : CUDA error %d %s (%s)", what, static_cast<int>(r), name ? name : "?",
                  text ? text : "?");
}

int runtime_version() {
  static int v = [] {
    // The one the process already uses (PyTorch's), else the toolkit's.
    void* h = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (h != nullptr) break;
    }
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
      if (h == nullptr) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    }
    if (h == nullptr) return 0;
    using Fn = int (*)(int*);
    auto fn = reinterpret_cast<Fn>(dlsym(h, "cudaRuntimeGetVersion"));
    int ver = 0;
    if (fn == nullptr || fn(&ver) != 0) ver = 0;
    return ver;
  }();
  return v;
}

}  // namespace meshccl::cuda
