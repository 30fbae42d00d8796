// Argument checks shared by every entry point. Each failure returns
// ncclInvalidArgument (the call had no effect) or the communicator's state
// error, with a WARN naming the function and the bad value.
#pragma once

#include "collectives/algorithms.h"
#include "comm/comm.h"
#include "nccl.h"

struct meshcclStream;

namespace meshccl {

// Keeps a communicator from being freed (destroy/abort wait for users == 0)
// while this thread is inside the library on it.
struct UseGuard {
  ncclComm* c;
  explicit UseGuard(ncclComm* comm) : c(comm) { ++c->sched.users; }
  ~UseGuard() { --c->sched.users; }
  UseGuard(const UseGuard&) = delete;
  UseGuard& operator=(const UseGuard&) = delete;
};

// comm is non-null, live and ready for communication.
Status check_comm(const char* fn, const ncclComm* comm);
// comm is non-null and live (any state).
Status check_comm_handle(const char* fn, const ncclComm* comm);
Status check_dtype(const char* fn, ncclDataType_t dt);
// Resolves op for comm and dt into the OpDesc's reduction fields.
Status resolve_op(const char* fn, ncclComm* comm, ncclRedOp_t op, ncclDataType_t dt, OpDesc* desc);
Status check_rank(const char* fn, const char* what, int r, int nranks);
Status check_buffer(const char* fn, const char* what, const void* p, size_t count);
// NULL (or CUDA's legacy/per-thread default stream handles) -> *out = nullptr.
Status resolve_stream(const char* fn, cudaStream_t stream, meshcclStream** out);

}  // namespace meshccl
