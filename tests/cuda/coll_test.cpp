// Collectives on device buffers and CUDA streams, 1-4 ranks as threads of one
// process; several ranks share a GPU when there are fewer GPUs than ranks
// (rank r uses GPU r % count). Skipped, with the reason, without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cuda/memory.h"
#include "gpu.h"
#include "nccl.h"

namespace {

using namespace meshccl_test;

// body(comm, rank, stream) per rank on its own thread, with its GPU's context
// current and a stream of its own.
void run_gpu_ranks(int n, const std::function<void(ncclComm_t, int, CUstream)>& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      use_device(r % gpu_count());
      CUstream s = nullptr;
      ASSERT_EQ(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
      ncclComm_t comm = nullptr;
      ASSERT_EQ(ncclCommInitRank(&comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      body(comm, r, s);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      cu().cuStreamDestroy(s);
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<float> fill(size_t count, int rank) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i % 97) + 1000 * rank);
  return v;
}

void sync(CUstream s) { ASSERT_EQ(cu().cuStreamSynchronize(s), CUDA_SUCCESS); }

class CudaColl : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaColl, EveryCollectiveOnDeviceBuffers) {
  const int n = GetParam();
  for (size_t count : {size_t{1}, size_t{1031}, size_t{300007}}) {
    run_gpu_ranks(n, [&](ncclComm_t comm, int r, CUstream s) {
      const size_t bytes = count * sizeof(float);
      auto in = fill(count, r);
      DevBuf send(bytes * n), recv(bytes * n);
      std::vector<float> out(count * n);
      // AllReduce, out of place and in place.
      send.put(in.data(), bytes);
      ASSERT_EQ(ncclAllReduce(send.get(), recv.get(), count, ncclFloat32, ncclSum, comm, s), ncclSuccess);
      ASSERT_EQ(ncclAllReduce(send.get(), send.get(), count, ncclFloat32, ncclSum, comm, s), ncclSuccess);
      sync(s);
      recv.get_to(out.data(), bytes);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want += static_cast<float>((i % 97) + 1000 * k);
        ASSERT_EQ(out[i], want) << "allreduce i " << i;
      }
      send.get_to(out.data(), bytes);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want += static_cast<float>((i % 97) + 1000 * k);
        ASSERT_EQ(out[i], want) << "allreduce in place i " << i;
      }
      // Broadcast from the last rank.
      send.put(in.data(), bytes);
      ASSERT_EQ(ncclBroadcast(send.get(), recv.get(), count, ncclFloat32, n - 1, comm, s), ncclSuccess);
      sync(s);
      recv.get_to(out.data(), bytes);
      EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + count), fill(count, n - 1));
      // Reduce (max) to rank 0.
      ASSERT_EQ(ncclReduce(send.get(), recv.get(), count, ncclFloat32, ncclMax, 0, comm, s), ncclSuccess);
      sync(s);
      if (r == 0) {
        recv.get_to(out.data(), bytes);
        EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + count), fill(count, n - 1));
      }
      // AllGather, in place (sendbuff inside recvbuff at this rank's block).
      float* mine = recv.as<float>() + count * r;
      ASSERT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(mine), reinterpret_cast<CUdeviceptr>(send.get()), bytes),
                CUDA_SUCCESS);
      ASSERT_EQ(ncclAllGather(mine, recv.get(), count, ncclFloat32, comm, s), ncclSuccess);
      sync(s);
      recv.get_to(out.data(), bytes * n);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(std::vector<float>(out.begin() + count * k, out.begin() + count * (k + 1)), fill(count, k)) << k;
      // ReduceScatter of the gathered blocks: block b sums n copies of fill(count, b).
      ASSERT_EQ(ncclReduceScatter(recv.get(), send.get(), count, ncclFloat32, ncclSum, comm, s), ncclSuccess);
      sync(s);
      send.get_to(out.data(), bytes);
      const std::vector<float> own = fill(count, r);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[i], own[i] * static_cast<float>(n)) << i;
      // AlltoAll: block k of rank r's input is r*n+k.
      std::vector<float> a2a(count * n);
      for (int k = 0; k < n; ++k) std::fill(a2a.begin() + count * k, a2a.begin() + count * (k + 1), float(r * n + k));
      send.put(a2a.data(), bytes * n);
      ASSERT_EQ(ncclAlltoAll(send.get(), recv.get(), count, ncclFloat32, comm, s), ncclSuccess);
      sync(s);
      recv.get_to(out.data(), bytes * n);
      for (int k = 0; k < n; ++k) ASSERT_EQ(out[count * k], float(k * n + r)) << k;
      // Send/recv around the ring, in one group.
      send.put(in.data(), bytes);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      ASSERT_EQ(ncclSend(send.get(), count, ncclFloat32, (r + 1) % n, comm, s), ncclSuccess);
      ASSERT_EQ(ncclRecv(recv.get(), count, ncclFloat32, (r + n - 1) % n, comm, s), ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
      sync(s);
      recv.get_to(out.data(), bytes);
      EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + count), fill(count, (r + n - 1) % n));
    });
  }
}

TEST_P(CudaColl, StreamOrdering) {
  // The op reads its input only after earlier work on the stream, and later
  // work on the stream sees its output.
  const int n = GetParam();
  const size_t count = 1 << 20;
  run_gpu_ranks(n, [&](ncclComm_t comm, int r, CUstream s) {
    DevBuf send(count * 4), recv(count * 4);
    for (int round = 1; round <= 3; ++round) {
      ASSERT_EQ(cu().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(send.get()), r + round, count, s), CUDA_SUCCESS);
      ASSERT_EQ(ncclAllReduce(send.get(), recv.get(), count, ncclInt32, ncclSum, comm, s), ncclSuccess);
      // Overwrites the input right behind the op: must not change its result.
      ASSERT_EQ(cu().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(send.get()), 0, count, s), CUDA_SUCCESS);
      // Later work reads the output: doubling it in place through the stream.
      ASSERT_EQ(ncclAllReduce(recv.get(), recv.get(), count, ncclInt32, ncclSum, comm, s), ncclSuccess);
      sync(s);
      std::vector<int32_t> out(count);
      recv.get_to(out.data(), count * 4);
      const int32_t want = static_cast<int32_t>(n) * (n * (n - 1) / 2 + n * round);
      for (size_t i = 0; i < count; i += 4093) ASSERT_EQ(out[i], want) << "round " << round << " i " << i;
    }
  });
}

TEST_P(CudaColl, MixedHostAndDeviceBuffers) {
  const int n = GetParam();
  const size_t count = 4099;
  run_gpu_ranks(n, [&](ncclComm_t comm, int r, CUstream s) {
    auto in = fill(count, r);
    DevBuf dev(count * 4);
    std::vector<float> host_out(count), out(count);
    // Host input, device output; then device input, host output.
    ASSERT_EQ(ncclAllReduce(in.data(), dev.get(), count, ncclFloat32, ncclMax, comm, s), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(dev.get(), host_out.data(), count, ncclFloat32, ncclMin, comm, s), ncclSuccess);
    sync(s);
    dev.get_to(out.data(), count * 4);
    EXPECT_EQ(out, fill(count, n - 1));
    EXPECT_EQ(host_out, fill(count, n - 1));
    // A host-only op on the NULL stream right after: runs after the device work.
    std::vector<float> h(count, 1.0f);
    ASSERT_EQ(ncclAllReduce(h.data(), h.data(), count, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(h[count - 1], static_cast<float>(n));
  });
}

TEST_P(CudaColl, NullStreamAvgAndDeviceScalar) {
  const int n = GetParam();
  const size_t count = 513;
  run_gpu_ranks(n, [&](ncclComm_t comm, int r, CUstream s) {
    std::vector<double> in(count, static_cast<double>(r + 1)), out(count);
    DevBuf buf(count * 8), scalar(8);
    buf.put(in.data(), count * 8);
    // The NULL (legacy) stream is one per GPU and process: ranks of one
    // process sharing a GPU would serialise on it and wait for each other
    // forever (with NCCL too), so they use their own streams.
    CUstream null_or_own = n <= gpu_count() ? nullptr : s;
    ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), count, ncclFloat64, ncclAvg, comm, null_or_own), ncclSuccess);
    ASSERT_EQ(cu().cuStreamSynchronize(null_or_own), CUDA_SUCCESS);
    buf.get_to(out.data(), count * 8);
    EXPECT_EQ(out[0], (n + 1) / 2.0);
    // PreMulSum with the scalar in device memory, read where the stream reaches the op.
    const double two = 2.0;
    scalar.put(&two, 8);
    ncclRedOp_t op;
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, scalar.get(), ncclFloat64, ncclScalarDevice, comm), ncclSuccess);
    buf.put(in.data(), count * 8);
    ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), count, ncclFloat64, op, comm, s), ncclSuccess);
    sync(s);
    buf.get_to(out.data(), count * 8);
    EXPECT_EQ(out[count - 1], static_cast<double>(n * (n + 1)));
    EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
  });
}

TEST_P(CudaColl, MemAllocGivesDeviceMemory) {
  const int n = GetParam();
  run_gpu_ranks(n, [&](ncclComm_t comm, int r, CUstream s) {
    void* p = nullptr;
    ASSERT_EQ(ncclMemAlloc(&p, 1 << 16), ncclSuccess);
    EXPECT_EQ(meshccl::cuda::classify(p), meshccl::cuda::MemKind::Device);
    void* handle = nullptr;
    ASSERT_EQ(ncclCommRegister(comm, p, 1 << 16, &handle), ncclSuccess);
    ASSERT_EQ(cu().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(p), r, 1 << 14, s), CUDA_SUCCESS);
    ASSERT_EQ(ncclAllReduce(p, p, 1 << 14, ncclUint32, ncclSum, comm, s), ncclSuccess);
    sync(s);
    uint32_t v = 0;
    ASSERT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(&v), reinterpret_cast<CUdeviceptr>(p), 4), CUDA_SUCCESS);
    EXPECT_EQ(v, static_cast<uint32_t>(n * (n - 1) / 2));
    EXPECT_EQ(ncclCommDeregister(comm, handle), ncclSuccess);
    EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  });
}

TEST_P(CudaColl, GraphCaptureIsRefused) {
  const int n = GetParam();
  run_gpu_ranks(n, [&](ncclComm_t comm, int, CUstream s) {
    DevBuf buf(4096);
    ASSERT_EQ(cu().cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 1024, ncclFloat32, ncclSum, comm, s), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("graph"), std::string::npos) << ncclGetLastError(comm);
    CUgraph g = nullptr;
    EXPECT_EQ(cu().cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    if (g) cu().cuGraphDestroy(g);
    // The communicator still works afterwards (nothing was queued).
    EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 1024, ncclFloat32, ncclSum, comm, s), ncclSuccess);
    sync(s);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaColl, ::testing::Values(1, 2, 3, 4));

}  // namespace
