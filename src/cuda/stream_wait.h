// How a CUDA stream waits for a meshccl operation that runs on the host: a
// stream memory operation (cuStreamWaitValue32 on a flag in pinned host
// memory that the host raises) or a host callback (cuLaunchHostFunc) that
// polls the same flag. MESHCCL_CUDA_WAIT forces one; otherwise the one with
// the lower latency, measured once per process on the first use.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "util/status.h"

namespace meshccl::cuda {

enum class WaitMode { MemOps, HostFunc };

// The mode in use; measured (or read from MESHCCL_CUDA_WAIT) on first call,
// with the current context. `why` (when given) says how it was chosen.
WaitMode wait_mode(const char** why = nullptr);
const char* wait_mode_name(WaitMode m);

// Queues on stream: wait until *flag >= value. dev_flag is the device address
// of the pinned host word flag. `abort` (may be null) ends a host-callback
// wait early. The flag is raised by the host with raise_flag.
Status stream_wait_flag(CUstream stream, WaitMode mode, volatile uint32_t* flag, CUdeviceptr dev_flag, uint32_t value);
void raise_flag(volatile uint32_t* flag, uint32_t value);

}  // namespace meshccl::cuda
