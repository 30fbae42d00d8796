// Device buffers between processes of one host: 2-4 ranks as forked
// processes, several on one GPU when there are fewer GPUs than ranks. The
// parent never touches CUDA (a forked CUDA context is unusable): each child
// loads the driver itself, and exits 77 when it finds no GPU, which skips the
// test with the child's reason.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/driver.h"
#include "nccl.h"

namespace {

constexpr int kNoGpu = 77;

// The rank's work; returns the process exit code (0 = pass).
int child(int n, int r, const ncclUniqueId& id) {
  namespace mc = meshccl::cuda;
  if (!mc::available()) {
    std::fprintf(stderr, "no GPU: %s\n", mc::why_unavailable().c_str());
    return kNoGpu;
  }
  const mc::Driver& d = *mc::driver();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream s = nullptr;
  if (d.cuDeviceGet(&dev, r % d.devices) || d.cuDevicePrimaryCtxRetain(&ctx, dev) || d.cuCtxSetCurrent(ctx) ||
      d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING))
    return 2;
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 3;
  int fails = 0;
  for (size_t count : {size_t{1}, size_t{4099}, size_t{1} << 20}) {
    CUdeviceptr send = 0, recv = 0;
    if (d.cuMemAlloc(&send, count * 4 * n) || d.cuMemAlloc(&recv, count * 4 * n)) return 4;
    // This rank's block of send holds r + 1: the AllReduce input, then the
    // in-place AllGather's (sendbuff = recvbuff + rank * count).
    const CUdeviceptr mine = send + static_cast<CUdeviceptr>(r) * count * 4;
    d.cuMemsetD32Async(mine, static_cast<unsigned>(r + 1), count, s);
    if (ncclAllReduce(reinterpret_cast<void*>(mine), reinterpret_cast<void*>(recv), count, ncclInt32, ncclSum, comm,
                      s) != ncclSuccess)
      return 5;
    if (ncclAllGather(reinterpret_cast<void*>(mine), reinterpret_cast<void*>(send), count, ncclInt32, comm, s) !=
        ncclSuccess)
      return 6;
    d.cuStreamSynchronize(s);
    std::vector<int32_t> out(count * n);
    d.cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), recv, count * 4);
    for (size_t i = 0; i < count; ++i) fails += out[i] != n * (n + 1) / 2;
    d.cuMemcpy(reinterpret_cast<CUdeviceptr>(out.data()), send, count * 4 * n);
    for (int k = 0; k < n; ++k) fails += out[count * k] != k + 1 || out[count * (k + 1) - 1] != k + 1;
    d.cuMemFree(send);
    d.cuMemFree(recv);
  }
  if (ncclCommDestroy(comm) != ncclSuccess) return 7;
  return fails == 0 ? 0 : 8;
}

class CudaProcess : public ::testing::TestWithParam<int> {};

TEST_P(CudaProcess, DeviceBuffersAcrossProcesses) {
  const int n = GetParam();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) _exit(child(n, r, id));
    pids.push_back(p);
  }
  int skipped = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    ASSERT_EQ(waitpid(pids[r], &st, 0), pids[r]);
    ASSERT_TRUE(WIFEXITED(st)) << "rank " << r << " died";
    if (WEXITSTATUS(st) == kNoGpu) ++skipped;
    else EXPECT_EQ(WEXITSTATUS(st), 0) << "rank " << r;
  }
  if (skipped == n) GTEST_SKIP() << "no GPU in the rank processes (see their stderr)";
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaProcess, ::testing::Values(2, 3, 4));

}  // namespace
