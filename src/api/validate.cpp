#include "api/validate.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "meshccl_config.h"
#include "sched/stream.h"
#include "util/log.h"
#include "util/param.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/driver.h"
#include "cuda/memory.h"
#endif

namespace meshccl {

namespace {

// No process addresses more: 57-bit virtual addresses are the most any
// supported CPU offers to user space.
constexpr size_t kMaxBufferBytes = size_t{1} << 57;

// Every byte of [lo, hi) lies in a mapping of this process that can be read
// (and written, when asked), according to /proc/self/maps. Never touches the
// range itself, so a bogus pointer is reported instead of faulting.
bool range_accessible(uintptr_t lo, uintptr_t hi, bool write, std::string* why) {
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot read /proc/self/maps";
    return false;
  }
  std::string text;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  uintptr_t at = lo;  // first byte not yet found in a mapping
  size_t pos = 0;
  while (pos < text.size() && at < hi) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    uintmax_t start = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%" SCNxMAX "-%" SCNxMAX " %4s", &start, &end, perms) != 3) continue;
    if (end <= at) continue;
    if (start > at) break;  // a hole
    if (perms[0] != 'r' || (write && perms[1] != 'w')) {
      char msg[128];
      std::snprintf(msg, sizeof msg, "the mapping at 0x%" PRIxMAX " is %s", start, perms);
      *why = msg;
      return false;
    }
    at = static_cast<uintptr_t>(end);
  }
  if (at >= hi) return true;
  char msg[96];
  std::snprintf(msg, sizeof msg, "nothing is mapped at 0x%" PRIxPTR, at);
  *why = msg;
  return false;
}

}  // namespace

void note_comm_error(ncclComm* comm, ncclResult_t r) {
  if (r == ncclSuccess || r == ncclInProgress || comm == nullptr || !comm_is_live(comm)) return;
  std::string msg = thread_last_error();
  std::lock_guard<std::mutex> lock(comm->error_mu);
  comm->last_error = std::move(msg);
}

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
    default: return MC_ERROR(ncclInvalidUsage, "%s : comm %p is not initialized", fn, static_cast<const void*>(comm));
  }
  if (comm->engine && !comm->engine->fatal().ok())
    return MC_ERROR(comm->engine->fatal().code(), "%s : comm %p failed earlier (%s); abort it", fn,
                    static_cast<const void*>(comm), ncclGetErrorString(comm->engine->fatal().code()));
  return kOk;
}

Status check_dtype(const char* fn, int dt, ncclDataType_t* out) {
  if (dt < 0 || dt >= static_cast<int>(ncclNumTypes))
    return MC_ERROR(ncclInvalidArgument, "%s : invalid type %d", fn, dt);
  *out = static_cast<ncclDataType_t>(dt);
  return kOk;
}

Status resolve_op(const char* fn, ncclComm* comm, int op, ncclDataType_t dt, OpDesc* desc) {
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
  std::lock_guard<std::mutex> lock(comm->ops_mu);
  const int idx = op - static_cast<int>(ncclNumOps);
  if (op < 0 || idx < 0 || idx >= static_cast<int>(comm->dyn_ops.size()) || !comm->dyn_ops[idx].in_use)
    return MC_ERROR(ncclInvalidArgument, "%s : invalid reduction operation %d (unknown to this communicator)", fn, op);
  const DynamicOp& d = comm->dyn_ops[idx];
  if (d.dtype != dt)
    return MC_ERROR(ncclInvalidArgument, "%s : reduction operation %d was created for type %d, used with type %d", fn,
                    op, static_cast<int>(d.dtype), static_cast<int>(dt));
  desc->op = ReduceOp::Sum;
  desc->premul = true;
  size_t es = dtype_size(dt);
  if (d.residence == ncclScalarHostImmediate) std::memcpy(desc->scalar, d.value, es);
#if MESHCCL_HAVE_CUDA
  else if (cuda::classify(d.ptr) == cuda::MemKind::Device) desc->scalar_ptr = d.ptr;  // staged by the device path
#endif
  else {
    std::memcpy(desc->scalar, d.ptr, es);  // its value now, for an operation that runs now
    desc->scalar_src = d.ptr;              // and when its stream reaches it
  }
  return kOk;
}

Status check_rank(const char* fn, const char* what, int r, int nranks) {
  if (r < 0 || r >= nranks) return MC_ERROR(ncclInvalidArgument, "%s : invalid %s %d (nranks %d)", fn, what, r, nranks);
  return kOk;
}

Status check_size(const char* fn, size_t count, size_t mult, size_t elem_size) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, elem_size, &bytes) || __builtin_mul_overflow(bytes, mult == 0 ? 1 : mult, &bytes) ||
      bytes > kMaxBufferBytes)
    return MC_ERROR(ncclInvalidArgument, "%s : count %zu of %zu-byte elements is more than a process can address", fn,
                    count, elem_size);
  return kOk;
}

Status check_buffer(const char* fn, const char* what, const void* p, size_t bytes, bool write) {
  if (bytes == 0) return kOk;
  if (p == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : %s is NULL", fn, what);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  uintptr_t hi = 0;
  if (bytes > kMaxBufferBytes || __builtin_add_overflow(lo, bytes, &hi))
    return MC_ERROR(ncclInvalidArgument, "%s : %s %p with %zu bytes runs past the end of the address space", fn, what,
                    p, bytes);
  if (param_int(Param::CheckPointers) != 0) {
    std::string why;
    if (!range_accessible(lo, hi, write, &why))
      return MC_ERROR(ncclInvalidArgument,
                      "%s : %s [%p, +%zu bytes) is not %s memory of this process: %s "
                      "(MESHCCL_CHECK_POINTERS)",
                      fn, what, p, bytes, write ? "writable" : "readable", why.c_str());
  }
  return kOk;
}

Status resolve_stream(const char* fn, cudaStream_t stream, meshcclStream** out, bool* cuda_stream) {
  uintptr_t v = reinterpret_cast<uintptr_t>(stream);
  if (cuda_stream != nullptr) *cuda_stream = false;
  if (v == 0 || v == 1 || v == 2) {  // NULL, cudaStreamLegacy, cudaStreamPerThread
    *out = nullptr;
    return kOk;
  }
  *out = find_stream(stream);
#if MESHCCL_HAVE_CUDA
  // Any other handle is a CUDA stream once the driver is loaded (the driver
  // checks it when the first copy or wait is queued on it).
  if (*out == nullptr && cuda_stream != nullptr && cuda::available()) {
    *cuda_stream = true;
    return kOk;
  }
#endif
  if (*out == nullptr)
    return MC_ERROR(
        ncclInvalidArgument,
        "%s : stream %p is neither NULL nor a live meshccl host stream (CUDA streams need CUDA memory support)", fn,
        static_cast<void*>(stream));
  return kOk;
}

}  // namespace meshccl
