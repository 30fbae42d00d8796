// Entry points for communicator life and queries.
#include <algorithm>
#include <cstring>
#include <utility>
#include <thread>
#include <vector>

#include "api/export.h"
#include "api/group.h"
#include "api/validate.h"
#include "comm/comm.h"
#include "bootstrap/unique_id.h"
#include "util/live_set.h"
#include "util/log.h"
#include "util/wait.h"

using namespace meshccl;

namespace {

Status new_comm(const char* fn, ncclComm** out, int nranks, int rank, const ncclConfig_t* config) {
  if (out == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : comm argument is NULL", fn);
  *out = nullptr;
  if (nranks < 1) return MC_ERROR(ncclInvalidArgument, "%s : invalid nranks %d", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return MC_ERROR(ncclInvalidArgument, "%s : invalid rank %d (nranks %d)", fn, rank, nranks);
  CommConfig cfg;
  MC_TRY(parse_config(config, &cfg, nullptr));
  auto* c = new ncclComm();
  c->config = cfg;
  c->rank = rank;
  c->nranks = nranks;
  comm_register(c);
  *out = c;
  return kOk;
}

// A failed call on a communicator is also its last error (ncclGetLastError).
template <typename F>
ncclResult_t comm_call(const char* fn, ncclComm* comm, F&& body) {
  ncclResult_t r = api_guard(fn, std::forward<F>(body));
  note_comm_error(comm, r);
  return r;
}

void drop_comm(ncclComm* c) {
  comm_unregister(c);
  comm_free(c);
}

// Runs body now (blocking comm) or on the comm's async thread (non-blocking:
// returns ncclInProgress; ncclCommGetAsyncError reports the outcome).
template <typename F>
Status run_maybe_async(ncclComm* c, F body) {
  if (c->config.blocking) {
    Status s = body();
    c->async_error.store(s.code());
    return s;
  }
  c->async_error.store(ncclInProgress);
  if (c->async_thread.joinable()) c->async_thread.join();
  c->async_thread = std::thread([c, body] {
    Status s = body();
    note_comm_error(c, s.code());
    if (!s.ok()) c->state.store(ncclComm::State::Failed);
    c->async_error.store(s.code());
  });
  return Status(ncclInProgress);
}

Status init_rank_config(ncclComm** comm, int nranks, const ncclUniqueId& id, int rank, const ncclConfig_t* config) {
  if (comm == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommInitRank : comm argument is NULL");
  *comm = nullptr;  // also on every error below
  ncclComm* c = nullptr;
  MC_TRY(new_comm("ncclCommInitRankConfig", &c, nranks, rank, config));
  *comm = c;
  if (in_group()) {
    c->async_error.store(ncclInProgress);
    group_record_init(PendingInit{c, nranks, id, rank});
    return kOk;
  }
  Status s = run_maybe_async(c, [c, nranks, id, rank] { return comm_init_rank(c, nranks, id, rank); });
  if (!s.ok() && s.code() != ncclInProgress) {
    drop_comm(c);
    *comm = nullptr;
  }
  return s;
}

}  // namespace

MESHCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId* id) {
  return api_guard("ncclGetUniqueId", [&]() -> Status {
    if (id == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclGetUniqueId : uniqueId is NULL");
    MC_TRY(settings_refresh());
    return id_create(id);
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                    ncclConfig_t* config) {
  return api_guard("ncclCommInitRankConfig", [&] { return init_rank_config(comm, nranks, commId, rank, config); });
}

MESHCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return api_guard("ncclCommInitRank", [&] { return init_rank_config(comm, nranks, commId, rank, nullptr); });
}

MESHCCL_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  return api_guard("ncclCommInitRankScalable", [&]() -> Status {
    if (newcomm == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommInitRankScalable : newcomm is NULL");
    *newcomm = nullptr;
    if (nId < 1 || commIds == nullptr)
      return MC_ERROR(ncclInvalidArgument, "ncclCommInitRankScalable : need at least one id (nId %d)", nId);
    // One rendezvous is enough at the scales meshccl targets: every rank uses
    // the first id, which all ranks hold.
    return init_rank_config(newcomm, nranks, commIds[0], myrank, config);
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return api_guard("ncclCommInitAll", [&]() -> Status {
    if (comms == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommInitAll : comms is NULL");
    if (ndev < 1) return MC_ERROR(ncclInvalidArgument, "ncclCommInitAll : invalid ndev %d", ndev);
    for (int i = 0; i < ndev; ++i) comms[i] = nullptr;  // also on every error below
    if (devlist != nullptr)
      for (int i = 0; i < ndev; ++i)
        if (devlist[i] < 0) return MC_ERROR(ncclInvalidArgument, "ncclCommInitAll : invalid device %d", devlist[i]);
    ncclUniqueId id;
    MC_TRY(id_create(&id));
    std::vector<ncclComm*> cs(ndev, nullptr);
    for (int i = 0; i < ndev; ++i) {
      Status s = new_comm("ncclCommInitAll", &cs[i], ndev, i, nullptr);
      if (!s.ok()) {
        for (ncclComm* c : cs)
          if (c) drop_comm(c);
        return s;
      }
    }
    std::vector<Status> results(ndev);
    std::vector<std::string> messages(ndev);
    std::vector<std::thread> threads;
    for (int i = 0; i < ndev; ++i)
      threads.emplace_back([&, i] {
        results[i] = comm_init_rank(cs[i], ndev, id, i);
        if (!results[i].ok()) messages[i] = thread_last_error();
      });
    for (auto& t : threads) t.join();
    for (int i = 0; i < ndev; ++i) {
      if (!results[i].ok()) {
        for (ncclComm* c : cs) drop_comm(c);
        for (int j = 0; j < ndev; ++j) comms[j] = nullptr;
        // The caller's thread hears why (ncclGetLastError(NULL)).
        return MC_ERROR(results[i].code(), "ncclCommInitAll : rank %d: %s", i, messages[i].c_str());
      }
    }
    for (int i = 0; i < ndev; ++i) {
      cs[i]->async_error.store(ncclSuccess);
      cs[i]->cuda_dev = devlist ? devlist[i] : -1;
      comms[i] = cs[i];
    }
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                           ncclConfig_t* config) {
  return comm_call("ncclCommSplit", comm, [&]() -> Status {
    if (newcomm == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommSplit : newcomm is NULL");
    *newcomm = nullptr;
    MC_TRY(check_comm("ncclCommSplit", comm));
    UseGuard use(comm);
    CommConfig cfg;
    MC_TRY(parse_config(config, &cfg, &comm->config));
    ncclComm* child = nullptr;
    if (color >= 0) {
      child = new ncclComm();
      child->config = cfg;
      comm_register(child);
      child->async_error.store(ncclInProgress);
    }
    *newcomm = child;
    auto body = [comm, color, key, child]() -> Status {
      Status s = comm_split(comm, color, key, child);
      if (child) {
        if (!s.ok()) child->state.store(ncclComm::State::Failed);
        child->async_error.store(s.code());
      }
      return s;
    };
    if (comm->config.blocking) {
      Status s = body();
      if (!s.ok() && child) {
        drop_comm(child);
        *newcomm = nullptr;
      }
      return s;
    }
    // Non-blocking: the parent reports progress; the child's own state too.
    comm->async_error.store(ncclInProgress);
    if (comm->async_thread.joinable()) comm->async_thread.join();
    ++comm->sched.users;
    comm->async_thread = std::thread([comm, body] {
      Status s = body();
      comm->async_error.store(s.code());
      --comm->sched.users;
    });
    return Status(ncclInProgress);
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return comm_call("ncclCommShrink", comm, [&]() -> Status {
    if (newcomm == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : newcomm is NULL");
    *newcomm = nullptr;
    MC_TRY(check_comm_handle("ncclCommShrink", comm));
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
      return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : invalid flags 0x%x", shrinkFlags);
    std::vector<int> excluded;
    MC_TRY(shrink_exclude_list(comm, excludeRanksList, excludeRanksCount, &excluded));
    CommConfig cfg;
    MC_TRY(parse_config(config, &cfg, &comm->config));
    auto* child = new ncclComm();
    child->config = cfg;
    comm_register(child);
    child->async_error.store(ncclInProgress);
    *newcomm = child;
    const bool abort_parent = shrinkFlags == NCCL_SHRINK_ABORT;
    ++comm->sched.users;
    auto body = [comm, excluded, abort_parent, child]() -> Status {
      Status s = comm_shrink(comm, excluded, abort_parent, child);
      if (!s.ok()) child->state.store(ncclComm::State::Failed);
      child->async_error.store(s.code());
      --comm->sched.users;
      return s;
    };
    if (cfg.blocking) {
      Status s = body();
      if (!s.ok()) {
        drop_comm(child);
        *newcomm = nullptr;
      }
      return s;
    }
    // Non-blocking (the child's config): the child reports progress.
    child->async_thread = std::thread(body);
    return Status(ncclInProgress);
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  return comm_call("ncclCommFinalize", comm, [&]() -> Status {
    MC_TRY(check_comm("ncclCommFinalize", comm));
    ++comm->sched.users;
    Status s = run_maybe_async(comm, [comm] {
      Status r = comm_finalize(comm);
      --comm->sched.users;
      return r;
    });
    return s;
  });
}

namespace {
constexpr double kTeardownWaitS = 10;

Status teardown(const char* fn, ncclComm* comm, bool abort) {
  if (comm == nullptr) return kOk;
  if (!comm_is_live(comm))
    return MC_ERROR(ncclInvalidArgument, "%s : comm %p has already been destroyed", fn, static_cast<void*>(comm));
  // Operations this thread recorded for comm in an open group must not run
  // after it is gone: they are dropped, and ncclGroupEnd says so.
  if (size_t dropped = group_forget(comm))
    MC_WARN("%s : comm %p had %zu operations pending in the open group; they were dropped", fn,
            static_cast<void*>(comm), dropped);
  if (abort) comm->abort_flag.store(true);
  if (comm->async_thread.joinable()) comm->async_thread.join();
  // Implicit finalize (local part): let enqueued work finish.
  if (!abort && !comm_wait_idle(comm, Deadline::after(comm->timeout_s()))) comm->abort_flag.store(true);
  comm_unregister(comm);
  // Callers inside the library notice the abort flag within a poll. Should a
  // count never drop (a bug; a thread stopped in a debugger), the call still
  // returns: the communicator's memory is then kept, not freed under a user.
  Backoff backoff;
  const Deadline dl = Deadline::after(std::min(comm->timeout_s(), kTeardownWaitS));
  while (comm->sched.users.load() > 0 && !dl.expired()) backoff.idle();
  if (const int users = comm->sched.users.load(); users > 0) {
    MC_WARN(
        "%s : comm %p: %d call(s) or operation(s) still inside the library %g s after the %s; the "
        "communicator's memory is kept",
        fn, static_cast<void*>(comm), users, std::min(comm->timeout_s(), kTeardownWaitS), abort ? "abort" : "destroy");
    return kOk;
  }
  MC_INFO(kInit, "comm %p rank %d nranks %d - %s COMPLETE", static_cast<void*>(comm), comm->rank, comm->nranks,
          abort ? "Abort" : "Destroy");
  comm_free(comm);
  return kOk;
}
}  // namespace

MESHCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  return api_guard("ncclCommDestroy", [&] { return teardown("ncclCommDestroy", comm, false); });
}

MESHCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) {
  return api_guard("ncclCommAbort", [&] { return teardown("ncclCommAbort", comm, true); });
}

MESHCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return comm_call("ncclCommRevoke", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommRevoke", comm));
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
      return MC_ERROR(ncclInvalidArgument, "ncclCommRevoke : revokeFlags must be 0 (got %d)", revokeFlags);
    comm->abort_flag.store(true);  // in-flight waits end; new collectives see the comm as failed
    (void)comm_wait_idle(comm, Deadline::after(comm->timeout_s()));
    comm->async_error.store(ncclInvalidUsage);
    set_last_error("communicator was revoked");
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return comm_call("ncclCommGetAsyncError", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommGetAsyncError", comm));
    if (asyncError == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommGetAsyncError : asyncError is NULL");
    ncclResult_t e = static_cast<ncclResult_t>(comm->async_error.load());
    if (e == ncclSuccess && comm->engine) e = comm->engine->fatal().code();
    *asyncError = e;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  return comm_call("ncclCommCount", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommCount", comm));
    if (count == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommCount : count is NULL");
    *count = comm->nranks;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_call("ncclCommCuDevice", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommCuDevice", comm));
    if (device == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommCuDevice : device is NULL");
    *device = comm->cuda_dev;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_call("ncclCommUserRank", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommUserRank", comm));
    if (rank == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommUserRank : rank is NULL");
    *rank = comm->rank;
    return kOk;
  });
}

struct ncclWindow_vidmem {
  ncclComm* comm;
  void* buff;
  size_t size;
  int flags;
};

namespace {
struct Registration {
  ncclComm* comm;
  void* buff;
  size_t size;
};
// Handles given out: a handle is looked up before it is used, so a garbage
// or already-deregistered one is reported, never dereferenced.
LiveSet<Registration>& registrations() {
  static auto* s = new LiveSet<Registration>();
  return *s;
}
LiveSet<ncclWindow_vidmem>& windows() {
  static auto* s = new LiveSet<ncclWindow_vidmem>();
  return *s;
}
}  // namespace

MESHCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return comm_call("ncclCommRegister", comm, [&]() -> Status {
    MC_TRY(check_comm("ncclCommRegister", comm));
    if (handle == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommRegister : handle is NULL");
    if (buff == nullptr && size > 0) return MC_ERROR(ncclInvalidArgument, "ncclCommRegister : buff is NULL");
    // Host buffers need no pinning; shareable ones (ncclMemAlloc) are found
    // by the transports on their own. The handle records the range.
    auto* r = new Registration{comm, buff, size};
    registrations().add(r);
    *handle = r;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  return comm_call("ncclCommDeregister", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommDeregister", comm));
    auto* r = static_cast<Registration*>(handle);
    if (!registrations().take_if(r, [comm](const Registration& x) { return x.comm == comm; }))
      return MC_ERROR(ncclInvalidArgument,
                      "ncclCommDeregister : handle %p was not registered with comm %p (or was "
                      "deregistered already)",
                      handle, static_cast<void*>(comm));
    delete r;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                    int winFlags) {
  return comm_call("ncclCommWindowRegister", comm, [&]() -> Status {
    MC_TRY(check_comm("ncclCommWindowRegister", comm));
    if (win == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclCommWindowRegister : win is NULL");
    if (buff == nullptr || size == 0) return MC_ERROR(ncclInvalidArgument, "ncclCommWindowRegister : empty buffer");
    if (reinterpret_cast<uintptr_t>(buff) % NCCL_WIN_REQUIRED_ALIGNMENT != 0)
      return MC_ERROR(ncclInvalidArgument,
                      "ncclCommWindowRegister : buffer %p is not %d-byte aligned (use ncclMemAlloc)", buff,
                      NCCL_WIN_REQUIRED_ALIGNMENT);
    if (winFlags & ~NCCL_WIN_COLL_SYMMETRIC)
      return MC_ERROR(ncclInvalidArgument, "ncclCommWindowRegister : invalid flags 0x%x", winFlags);
    auto* w = new ncclWindow_vidmem{comm, buff, size, winFlags};
    windows().add(w);
    *win = w;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return comm_call("ncclCommWindowDeregister", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclCommWindowDeregister", comm));
    if (!windows().take_if(win, [comm](const ncclWindow_vidmem& w) { return w.comm == comm; }))
      return MC_ERROR(ncclInvalidArgument, "ncclCommWindowDeregister : window %p does not belong to comm %p",
                      static_cast<void*>(win), static_cast<void*>(comm));
    delete win;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  return comm_call("ncclRedOpCreatePreMulSum", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclRedOpCreatePreMulSum", comm));
    if (op == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : op is NULL");
    if (scalar == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : scalar is NULL");
    ncclDataType_t dt;
    MC_TRY(check_dtype("ncclRedOpCreatePreMulSum", enum_bits(datatype), &dt));
    const int res_raw = enum_bits(residence);
    if (res_raw != ncclScalarDevice && res_raw != ncclScalarHostImmediate)
      return MC_ERROR(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : invalid residence %d", res_raw);
    const auto res = static_cast<ncclScalarResidence_t>(res_raw);
    std::lock_guard<std::mutex> lock(comm->ops_mu);
    size_t idx = 0;
    while (idx < comm->dyn_ops.size() && comm->dyn_ops[idx].in_use) ++idx;
    if (idx == comm->dyn_ops.size()) comm->dyn_ops.emplace_back();
    DynamicOp& d = comm->dyn_ops[idx];
    d = DynamicOp{};
    d.in_use = true;
    d.dtype = dt;
    d.residence = res;
    if (res == ncclScalarHostImmediate) std::memcpy(d.value, scalar, dtype_size(dt));
    else d.ptr = scalar;
    *op = static_cast<ncclRedOp_t>(static_cast<int>(ncclNumOps) + static_cast<int>(idx));
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return comm_call("ncclRedOpDestroy", comm, [&]() -> Status {
    MC_TRY(check_comm_handle("ncclRedOpDestroy", comm));
    const int op_raw = enum_bits(op);
    if (op_raw >= 0 && op_raw < static_cast<int>(ncclNumOps))
      return MC_ERROR(ncclInvalidArgument, "ncclRedOpDestroy : operation %d is built in and cannot be destroyed",
                      op_raw);
    std::lock_guard<std::mutex> lock(comm->ops_mu);
    const long idx = static_cast<long>(op_raw) - ncclNumOps;
    if (idx < 0 || idx >= static_cast<long>(comm->dyn_ops.size()) || !comm->dyn_ops[idx].in_use)
      return MC_ERROR(ncclInvalidArgument, "ncclRedOpDestroy : operation %d is unknown to this communicator", op_raw);
    comm->dyn_ops[idx].in_use = false;
    return kOk;
  });
}

MESHCCL_WEAK_ALIAS(ncclGetUniqueId)
MESHCCL_WEAK_ALIAS(ncclCommInitRankConfig)
MESHCCL_WEAK_ALIAS(ncclCommInitRank)
MESHCCL_WEAK_ALIAS(ncclCommInitRankScalable)
MESHCCL_WEAK_ALIAS(ncclCommInitAll)
MESHCCL_WEAK_ALIAS(ncclCommSplit)
MESHCCL_WEAK_ALIAS(ncclCommShrink)
MESHCCL_WEAK_ALIAS(ncclCommFinalize)
MESHCCL_WEAK_ALIAS(ncclCommDestroy)
MESHCCL_WEAK_ALIAS(ncclCommAbort)
MESHCCL_WEAK_ALIAS(ncclCommRevoke)
MESHCCL_WEAK_ALIAS(ncclCommGetAsyncError)
MESHCCL_WEAK_ALIAS(ncclCommCount)
MESHCCL_WEAK_ALIAS(ncclCommCuDevice)
MESHCCL_WEAK_ALIAS(ncclCommUserRank)
MESHCCL_WEAK_ALIAS(ncclCommRegister)
MESHCCL_WEAK_ALIAS(ncclCommDeregister)
MESHCCL_WEAK_ALIAS(ncclCommWindowRegister)
MESHCCL_WEAK_ALIAS(ncclCommWindowDeregister)
MESHCCL_WEAK_ALIAS(ncclRedOpCreatePreMulSum)
MESHCCL_WEAK_ALIAS(ncclRedOpDestroy)
