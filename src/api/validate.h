// Argument checks shared by every entry point. Each failure returns
// ncclInvalidArgument (the call had no effect) or the communicator's state
// error, with a WARN naming the function and the bad value.
#pragma once

#include <cstring>

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

// A call on comm failed with r: its message (the calling thread's last
// error) becomes comm's last error. Nothing happens for success or a dead comm.
void note_comm_error(ncclComm* comm, ncclResult_t r);

// comm is non-null, live and ready for communication.
Status check_comm(const char* fn, const ncclComm* comm);
// comm is non-null and live (any state).
Status check_comm_handle(const char* fn, const ncclComm* comm);
// The raw value of an enum argument, read without loading it as the enum
// type: a caller may pass any int, and only a validated value is converted.
template <typename E>
int enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
// dt is a valid ncclDataType_t; *out is set from it only then.
Status check_dtype(const char* fn, int dt, ncclDataType_t* out);
// Resolves op (raw value) for comm and dt into the OpDesc's reduction fields.
Status resolve_op(const char* fn, ncclComm* comm, int op, ncclDataType_t dt, OpDesc* desc);
Status check_rank(const char* fn, const char* what, int r, int nranks);
// count elements of elem_size bytes (times mult) fit the address space.
Status check_size(const char* fn, size_t count, size_t mult, size_t elem_size);
// p can hold `bytes` bytes: not NULL unless bytes == 0, the range does not
// wrap, and with MESHCCL_CHECK_POINTERS=1 every byte of it is mapped with the
// access asked for (read, or read and write).
Status check_buffer(const char* fn, const char* what, const void* p, size_t bytes, bool write);
// NULL (or CUDA's legacy/per-thread default stream handles) -> *out = nullptr.
// With the CUDA driver loaded, any other handle that is not a meshccl host
// stream is a CUDA stream: *out = nullptr and *cuda_stream = true (when
// cuda_stream is given; otherwise such a handle is refused).
Status resolve_stream(const char* fn, cudaStream_t stream, meshcclStream** out, bool* cuda_stream = nullptr);

}  // namespace meshccl
