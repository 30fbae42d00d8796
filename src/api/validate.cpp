#include "api/validate.h"

#include <cstring>

#include "sched/stream.h"
#include "util/log.h"

namespace meshccl {

Status check_comm_handle(const char* fn, const ncclComm* comm) {
  if (comm == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : comm argument is NULL", fn);
  if (!comm_is_live(comm))
    return MC_ERROR(ncclInvalidArgument, "%s : comm %p is not a live communicator (destroyed or never created)", fn,
                    static_cast<const void*>(comm));
  return kOk;
}

Status check_comm(const char* fn, const ncclComm* comm) {
  MC_TRY(check_comm_handle(fn, comm));
  int async = comm->async_error.load();
  if (async == ncclInProgress)
    return MC_ERROR(ncclInvalidUsage, "%s : comm %p is still being set up (poll ncclCommGetAsyncError)", fn,
                    static_cast<const void*>(comm));
  if (async != ncclSuccess)
    return MC_ERROR(static_cast<ncclResult_t>(async), "%s : comm %p failed earlier (%s); abort it", fn,
                    static_cast<const void*>(comm), ncclGetErrorString(static_cast<ncclResult_t>(async)));
  switch (comm->state.load()) {
    case ncclComm::State::Ready: break;
    case ncclComm::State::Finalized:
      return MC_ERROR(ncclInvalidUsage, "%s : comm %p was finalized", fn, static_cast<const void*>(comm));
    default:
      return MC_ERROR(ncclInvalidUsage, "%s : comm %p is not initialized", fn, static_cast<const void*>(comm));
  }
  if (comm->engine && !comm->engine->fatal().ok())
    return MC_ERROR(comm->engine->fatal().code(), "%s : comm %p failed earlier (%s); abort it", fn,
                    static_cast<const void*>(comm), ncclGetErrorString(comm->engine->fatal().code()));
  return kOk;
}

Status check_dtype(const char* fn, ncclDataType_t dt) {
  if (static_cast<int>(dt) < 0 || dt >= ncclNumTypes)
    return MC_ERROR(ncclInvalidArgument, "%s : invalid type %d", fn, static_cast<int>(dt));
  return kOk;
}

Status resolve_op(const char* fn, ncclComm* comm, ncclRedOp_t op, ncclDataType_t dt, OpDesc* desc) {
  desc->avg = false;
  desc->premul = false;
  switch (op) {
    case ncclSum: desc->op = ReduceOp::Sum; return kOk;
    case ncclProd: desc->op = ReduceOp::Prod; return kOk;
    case ncclMax: desc->op = ReduceOp::Max; return kOk;
    case ncclMin: desc->op = ReduceOp::Min; return kOk;
    case ncclAvg:
      desc->op = ReduceOp::Sum;
      desc->avg = true;
      return kOk;
    default: break;
  }
  int idx = static_cast<int>(op) - static_cast<int>(ncclNumOps);
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  if (static_cast<int>(op) < 0 || idx < 0 || idx >= static_cast<int>(comm->dyn_ops.size()) || !comm->dyn_ops[idx].in_use)
    return MC_ERROR(ncclInvalidArgument, "%s : invalid reduction operation %d (unknown to this communicator)", fn,
                    static_cast<int>(op));
  const DynamicOp& d = comm->dyn_ops[idx];
  if (d.dtype != dt)
    return MC_ERROR(ncclInvalidArgument, "%s : reduction operation %d was created for type %d, used with type %d", fn,
                    static_cast<int>(op), static_cast<int>(d.dtype), static_cast<int>(dt));
  desc->op = ReduceOp::Sum;
  desc->premul = true;
  size_t es = dtype_size(dt);
  if (d.residence == ncclScalarHostImmediate) std::memcpy(desc->scalar, d.value, es);
  else std::memcpy(desc->scalar, d.ptr, es);  // read at each use
  return kOk;
}

Status check_rank(const char* fn, const char* what, int r, int nranks) {
  if (r < 0 || r >= nranks) return MC_ERROR(ncclInvalidArgument, "%s : invalid %s %d (nranks %d)", fn, what, r, nranks);
  return kOk;
}

Status check_buffer(const char* fn, const char* what, const void* p, size_t count) {
  if (p == nullptr && count > 0) return MC_ERROR(ncclInvalidArgument, "%s : %s is NULL", fn, what);
  return kOk;
}

Status resolve_stream(const char* fn, cudaStream_t stream, meshcclStream** out) {
  uintptr_t v = reinterpret_cast<uintptr_t>(stream);
  if (v == 0 || v == 1 || v == 2) {  // NULL, cudaStreamLegacy, cudaStreamPerThread
    *out = nullptr;
    return kOk;
  }
  *out = find_stream(stream);
  if (*out == nullptr)
    return MC_ERROR(ncclInvalidArgument,
                    "%s : stream %p is neither NULL nor a live meshccl host stream (CUDA streams need CUDA memory support)",
                    fn, static_cast<void*>(stream));
  return kOk;
}

}  // namespace meshccl
