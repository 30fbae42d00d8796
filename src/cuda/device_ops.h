// Operations that meet CUDA: device buffers, or a CUDA stream. The engine
// runs on host memory, so a device buffer is staged: the user's stream copies
// the input to pinned host memory, then waits (stream_wait.h) while the
// communicator's proxy thread runs the operation on the host, then copies the
// output back. The operation thus starts after all earlier work on the stream
// (it waits for an event recorded behind the input copies) and later work on
// the stream waits for it, as NCCL's stream semantics say. Ops are handed to
// one proxy thread per communicator in call order, which keeps their tags in
// order.
#pragma once

#include <cuda.h>

#include <vector>

#include "sched/launch.h"
#include "util/status.h"

namespace meshccl::cuda {

struct DeviceOp {
  PendingOp op;           // op.stream is null: the proxy runs it on its own thread
  CUstream stream;        // the user's CUDA stream (0, CU_STREAM_LEGACY or _PER_THREAD included)
  bool on_stream = true;  // false: a host op routed through the proxy to keep call order; the caller waits
};

// Whether an op goes the device path: a CUDA stream (a handle that is neither
// NULL, the two special handles, nor a meshccl host stream) or a device buffer.
// False whenever the driver is not loaded.
bool wants_device(const OpDesc& desc, bool cuda_stream);

// Whether comm has device work queued or running: its host ops must then
// queue behind it (launch_device with on_stream = false).
bool busy(const CommSched* comm);

// ncclInvalidUsage when stream is capturing a CUDA graph (checked by the
// enqueue before the op takes a sequence number, so a refused call leaves the
// communicator's numbering as it was).
Status refuse_capture(const char* what, CUstream stream);

// Refuses a capturing stream (CUDA graphs) with ncclInvalidUsage, before
// anything is queued; stages, queues and hands each communicator's ops to its
// proxy as one item; waits for the items holding host ops.
Status launch_device(std::vector<DeviceOp>& ops);

// At communicator teardown: drains the proxy (bounded by the abort flag and
// MESHCCL_TIMEOUT), stops it and frees its pinned memory.
void release(CommSched* comm);

}  // namespace meshccl::cuda
