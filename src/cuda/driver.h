// The CUDA driver, loaded at run time. meshccl never links libcuda or
// libcudart: the first use dlopens libcuda.so.1, and when it is missing, fails
// to initialise or sees no device, available() is false and the library
// behaves exactly as the CPU build (device pointers never occur).
#pragma once

#include <cuda.h>

#include <string>

#include "util/status.h"

namespace meshccl::cuda {

// Every driver entry point meshccl calls, with the ABI version named in
// cuda.h (the _v2 and _v3 names its macros select).
struct Driver {
#define MESHCCL_CU_FN(name) decltype(&::name) name = nullptr;
#include "cuda/driver_fns.def"
#undef MESHCCL_CU_FN
  int version = 0;  // cuDriverGetVersion
  int devices = 0;  // cuDeviceGetCount
};

// The loaded driver, or null (then why_unavailable() says why, in one line).
const Driver* driver();
inline bool available() { return driver() != nullptr; }
const std::string& why_unavailable();

// A failed driver call as a Status: ncclUnhandledCudaError with the driver's
// name for the error and what was being done.
Status cu_status(CUresult r, const char* what);

// The CUDA runtime library's version (libcudart.so, loaded only to ask), or 0.
int runtime_version();

}  // namespace meshccl::cuda

#define MC_CU(call, what)                                                            \
  do {                                                                               \
    CUresult mc_cu_r_ = (call);                                                      \
    if (mc_cu_r_ != CUDA_SUCCESS) return ::meshccl::cuda::cu_status(mc_cu_r_, what); \
  } while (0)
