// What the CUDA tests share: skipping without a GPU, a rank's device context,
// stream and buffers, through the same driver table the runtime uses.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda/driver.h"

namespace meshccl_test {

#define SKIP_WITHOUT_GPU()                                                                           \
  do {                                                                                               \
    if (!meshccl::cuda::available()) GTEST_SKIP() << "no GPU: " << meshccl::cuda::why_unavailable(); \
  } while (0)

inline const meshccl::cuda::Driver& cu() { return *meshccl::cuda::driver(); }

// Makes device `dev`'s primary context current on this thread.
inline void use_device(int dev) {
  CUdevice d = 0;
  ASSERT_EQ(cu().cuDeviceGet(&d, dev), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, d), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

// Device memory holding bytes, freed at scope end.
class DevBuf {
 public:
  explicit DevBuf(size_t bytes) : bytes_(bytes) { EXPECT_EQ(cu().cuMemAlloc(&p_, bytes ? bytes : 1), CUDA_SUCCESS); }
  ~DevBuf() { cu().cuMemFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void* get() const { return reinterpret_cast<void*>(p_); }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(p_);
  }
  void put(const void* host, size_t bytes) {
    ASSERT_EQ(cu().cuMemcpy(p_, reinterpret_cast<CUdeviceptr>(host), bytes), CUDA_SUCCESS);
  }
  void get_to(void* host, size_t bytes) const {
    ASSERT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(host), p_, bytes), CUDA_SUCCESS);
  }

 private:
  CUdeviceptr p_ = 0;
  size_t bytes_;
};

inline int gpu_count() { return meshccl::cuda::available() ? meshccl::cuda::driver()->devices : 0; }

}  // namespace meshccl_test
