// The CUDA reduction kernels against the host kernels, bit for bit: every
// datatype x Sum/Prod/Max/Min, the Avg division and the PreMulSum scaling,
// through the device executor. Without a GPU only the build's part is
// checked (the embedded image holds every kernel; pointers classify as host).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/op.h"
#include "cuda/device_executor.h"
#include "cuda/device_ops.h"
#include "cuda/driver.h"
#include "cuda/memory.h"
#include "gpu.h"
#include "kernels/cuda/fatbin.h"
#include "kernels/reduce.h"

namespace {

using meshccl::ReduceOp;
using meshccl::cuda::DeviceExecutor;
using namespace meshccl_test;

constexpr ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                     ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                     ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};

// count elements of dt: integers as random bytes (wrap-around is part of the
// contract), floating types as small values with fractions and signs, so no
// NaN occurs (GPUs and CPUs quieten NaN payloads differently).
std::vector<unsigned char> values(ncclDataType_t dt, size_t count, uint32_t seed) {
  namespace k = meshccl::kernels;
  const size_t es = meshccl::dtype_size(dt);
  std::vector<unsigned char> out(count * es);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    const float f = static_cast<float>(static_cast<int>(rng() % 33) - 16) * 0.375f;
    unsigned char* p = out.data() + i * es;
    switch (dt) {
      case ncclFloat16: {
        uint16_t v = k::float_to_half(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case ncclBfloat16: {
        uint16_t v = k::float_to_bf16(f);
        std::memcpy(p, &v, 2);
        break;
      }
      case ncclFloat8e4m3: *p = k::float_to_e4m3(f); break;
      case ncclFloat8e5m2: *p = k::float_to_e5m2(f); break;
      case ncclFloat32: std::memcpy(p, &f, 4); break;
      case ncclFloat64: {
        double d = static_cast<double>(f) * 1.0000001;
        std::memcpy(p, &d, 8);
        break;
      }
      default:
        for (size_t b = 0; b < es; ++b) p[b] = static_cast<unsigned char>(rng());
    }
  }
  return out;
}

TEST(CudaKernels, ImageHoldsEveryKernel) {
  // Checked on every machine: the build embedded a fat binary naming all 72.
  const std::string image(reinterpret_cast<const char*>(meshccl::kernels::cuda_fatbin()),
                          meshccl::kernels::cuda_fatbin_size());
  ASSERT_GT(image.size(), 1000u);
  for (int dt = 0; dt < 12; ++dt) {
    for (int op = 0; op < 4; ++op) {
      const std::string name = "meshccl_reduce2_" + std::to_string(dt) + "_" + std::to_string(op);
      EXPECT_NE(image.find(name + '\0'), std::string::npos) << name;
    }
    EXPECT_NE(image.find("meshccl_divide_" + std::to_string(dt) + '\0'), std::string::npos) << dt;
    EXPECT_NE(image.find("meshccl_scale_" + std::to_string(dt) + '\0'), std::string::npos) << dt;
  }
}

TEST(CudaKernels, HostPointersAreHost) {
  // With or without a driver, host memory is host memory and an op on it
  // takes the CPU path.
  std::vector<float> v(16);
  EXPECT_EQ(meshccl::cuda::classify(v.data()), meshccl::cuda::MemKind::Host);
  EXPECT_EQ(meshccl::cuda::classify(nullptr), meshccl::cuda::MemKind::Host);
  meshccl::OpDesc d;
  d.sendbuff = v.data();
  d.recvbuff = v.data();
  d.count = v.size();
  EXPECT_FALSE(meshccl::cuda::wants_device(d, false));
  if (!meshccl::cuda::available()) {
    EXPECT_FALSE(meshccl::cuda::wants_device(d, true));
    EXPECT_FALSE(meshccl::cuda::why_unavailable().empty());
  }
}

class CudaKernelsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    use_device(0);
    ASSERT_TRUE(DeviceExecutor::create(nullptr, &exec_).ok());
  }
  std::unique_ptr<DeviceExecutor> exec_;
};

TEST_F(CudaKernelsGpu, Reduce2MatchesHost) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}, size_t{262147}}) {
    for (ncclDataType_t dt : kTypes) {
      const size_t bytes = count * meshccl::dtype_size(dt);
      auto a = values(dt, count, 1 + static_cast<uint32_t>(dt));
      auto b = values(dt, count, 100 + static_cast<uint32_t>(dt));
      DevBuf da(bytes), db(bytes), dd(bytes);
      da.put(a.data(), bytes);
      db.put(b.data(), bytes);
      for (ReduceOp op : kOps) {
        std::vector<unsigned char> want(bytes), got(bytes);
        meshccl::kernels::reduce2(dt, op, want.data(), a.data(), b.data(), count);
        exec_->reduce2(dt, op, dd.get(), da.get(), db.get(), count);
        ASSERT_TRUE(exec_->status().ok());
        dd.get_to(got.data(), bytes);
        EXPECT_EQ(want, got) << "dtype " << dt << " op " << static_cast<int>(op) << " count " << count;
      }
      // In place: dst aliases a.
      std::vector<unsigned char> want(bytes), got(bytes);
      meshccl::kernels::reduce2(dt, ReduceOp::Sum, want.data(), a.data(), b.data(), count);
      exec_->reduce2(dt, ReduceOp::Sum, da.get(), da.get(), db.get(), count);
      da.get_to(got.data(), bytes);
      EXPECT_EQ(want, got) << "in place, dtype " << dt;
    }
  }
}

TEST_F(CudaKernelsGpu, DivideAndScaleMatchHost) {
  const size_t count = 4099;
  for (ncclDataType_t dt : kTypes) {
    const size_t bytes = count * meshccl::dtype_size(dt);
    auto a = values(dt, count, 7 + static_cast<uint32_t>(dt));
    DevBuf da(bytes), dd(bytes);
    da.put(a.data(), bytes);
    for (int divisor : {1, 2, 3, 7, 8}) {
      std::vector<unsigned char> want(bytes), got(bytes);
      meshccl::kernels::divide(dt, want.data(), a.data(), count, divisor);
      exec_->divide(dt, dd.get(), da.get(), count, divisor);
      ASSERT_TRUE(exec_->status().ok());
      dd.get_to(got.data(), bytes);
      EXPECT_EQ(want, got) << "divide dtype " << dt << " by " << divisor;
    }
    auto scalar = values(dt, 1, 99);
    std::vector<unsigned char> want(bytes), got(bytes);
    meshccl::kernels::scale(dt, want.data(), a.data(), count, scalar.data());
    exec_->scale(dt, dd.get(), da.get(), count, scalar.data());
    ASSERT_TRUE(exec_->status().ok());
    dd.get_to(got.data(), bytes);
    EXPECT_EQ(want, got) << "scale dtype " << dt;
  }
}

TEST_F(CudaKernelsGpu, CopyAndClassify) {
  std::vector<uint32_t> h(1000), back(1000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint32_t>(i * 2654435761u);
  DevBuf a(4000), b(4000);
  EXPECT_EQ(meshccl::cuda::classify(a.get()), meshccl::cuda::MemKind::Device);
  EXPECT_EQ(meshccl::cuda::classify(h.data()), meshccl::cuda::MemKind::Host);
  a.put(h.data(), 4000);
  exec_->copy(b.get(), a.get(), 4000);
  ASSERT_TRUE(exec_->status().ok());
  b.get_to(back.data(), 4000);
  EXPECT_EQ(h, back);
}

}  // namespace
