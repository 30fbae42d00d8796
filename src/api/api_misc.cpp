// Library-wide entry points: version, errors, logging, memory, and the host
// side of NCCL's device API.
#include <cstdio>
#include <cstring>
#include <string>

#include "api/export.h"
#include "api/validate.h"
#include "mem/memalloc.h"
#include "meshccl_config.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/memory.h"
#endif

using namespace meshccl;

MESHCCL_EXPORT ncclResult_t pncclGetVersion(int* version) {
  return api_guard("ncclGetVersion", [&]() -> Status {
    if (version == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclGetVersion : version is NULL");
    *version = NCCL_VERSION_CODE;
    return kOk;
  });
}

MESHCCL_EXPORT const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

MESHCCL_EXPORT const char* pncclGetLastError(ncclComm_t comm) {
  // A live communicator: the last failed call on it. Otherwise the calling
  // thread's last error, else the process's (an error of a background thread,
  // such as a non-blocking init). The text lands in a fixed buffer of the
  // calling thread that is only ever overwritten, never freed, so a pointer
  // returned earlier stays readable (as NCCL's does) until the thread exits.
  thread_local char text[4096];
  std::string now;
  if (comm != nullptr && comm_is_live(comm)) {
    std::lock_guard<std::mutex> lock(comm->error_mu);
    now = comm->last_error;
  } else {
    now = thread_last_error();
    if (now.empty()) now = last_error();
  }
  std::snprintf(text, sizeof text, "%s", now.c_str());
  return text;
}

MESHCCL_EXPORT void pncclResetDebugInit(void) { log_reset(); }
MESHCCL_EXPORT void ncclResetDebugInitInternal(void) { log_reset(); }

MESHCCL_EXPORT ncclResult_t pncclMemAlloc(void** ptr, size_t size) {
  return api_guard("ncclMemAlloc", [&]() -> Status {
#if MESHCCL_HAVE_CUDA
    // With a CUDA context current (a GPU program), NCCL's meaning: device memory.
    if (ptr == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclMemAlloc : ptr is NULL");
    bool handled = false;
    MC_TRY(cuda::device_alloc(ptr, size, &handled));
    if (handled) return kOk;
#endif
    return mem_alloc(ptr, size);
  });
}

MESHCCL_EXPORT ncclResult_t pncclMemFree(void* ptr) {
  return api_guard("ncclMemFree", [&]() -> Status {
#if MESHCCL_HAVE_CUDA
    bool handled = false;
    MC_TRY(cuda::device_free(ptr, &handled));
    if (handled) return kOk;
#endif
    return mem_free(ptr);
  });
}

// ---- Device API (nccl_device.h). Device communicators need CUDA kernels;
// the team queries are answered from the host communicator.

extern "C" {
struct ncclTeam {
  int nRanks, rank, stride;
};
}

namespace {
// Ranks sharing this rank's host, if they are contiguous (NCCL's LSA team).
ncclTeam lsa_team(const ncclComm* c) {
  int lo = c->rank, hi = c->rank;
  while (lo > 0 && c->peers[lo - 1].host_hash == c->peers[c->rank].host_hash) --lo;
  while (hi + 1 < c->nranks && c->peers[hi + 1].host_hash == c->peers[c->rank].host_hash) ++hi;
  return ncclTeam{hi - lo + 1, c->rank - lo, 1};
}
bool usable(const ncclComm* c) { return c != nullptr && comm_is_live(c) && !c->peers.empty(); }
}  // namespace

MESHCCL_EXPORT ncclResult_t pncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  (void)reqs;
  (void)outDevComm;
  return api_guard("ncclDevCommCreate", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclDevCommCreate", comm));
    return MC_ERROR(ncclInvalidUsage,
                    "ncclDevCommCreate : the device API needs CUDA device kernels, which this build does not provide");
  });
}

MESHCCL_EXPORT ncclResult_t pncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  (void)devComm;
  return api_guard("ncclDevCommDestroy", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclDevCommDestroy", comm));
    return MC_ERROR(ncclInvalidUsage,
                    "ncclDevCommDestroy : no device communicator was created (device API unsupported)");
  });
}

MESHCCL_EXPORT ncclTeam pncclTeamWorld(ncclComm_t comm) {
  if (!usable(comm)) return ncclTeam{0, 0, 1};
  return ncclTeam{comm->nranks, comm->rank, 1};
}

MESHCCL_EXPORT ncclTeam pncclTeamLsa(ncclComm_t comm) {
  if (!usable(comm)) return ncclTeam{0, 0, 1};
  return lsa_team(comm);
}

MESHCCL_EXPORT ncclTeam pncclTeamRail(ncclComm_t comm) {
  if (!usable(comm)) return ncclTeam{0, 0, 1};
  ncclTeam lsa = lsa_team(comm);
  return ncclTeam{comm->nranks / lsa.nRanks, comm->rank / lsa.nRanks, lsa.nRanks};
}

MESHCCL_EXPORT int pncclTeamRankToWorld(ncclComm_t comm, ncclTeam team, int rank) {
  if (!usable(comm)) return -1;
  return comm->rank + (rank - team.rank) * team.stride;
}

MESHCCL_EXPORT int pncclTeamRankToLsa(ncclComm_t comm, ncclTeam team, int rank) {
  if (!usable(comm)) return -1;
  int world = comm->rank + (rank - team.rank) * team.stride;
  ncclTeam lsa = lsa_team(comm);
  return world - (comm->rank - lsa.rank);
}

MESHCCL_EXPORT ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam team, int nBarriers, void* outHandle,
                                                             void* outReq) {
  (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return MC_ERROR(ncclInvalidUsage, "ncclLsaBarrierCreateRequirement : the device API is not supported by this build")
      .code();
}

MESHCCL_EXPORT ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam team, int nBarriers,
                                                             void* outHandle, void* outReq) {
  (void)comm, (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return MC_ERROR(ncclInvalidUsage, "ncclGinBarrierCreateRequirement : the device API is not supported by this build")
      .code();
}

MESHCCL_EXPORT int pncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  // Slots of 16-byte lines needed to hold maxElts elements of maxEltSize bytes.
  if (maxElts <= 0 || maxEltSize <= 0) return 0;
  long long lines = (static_cast<long long>(maxEltSize) + 7) / 8;
  return static_cast<int>(lines * maxElts);
}

MESHCCL_EXPORT ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots, void* outHandle, void* outReq) {
  (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
  return MC_ERROR(ncclInvalidUsage, "ncclLLA2ACreateRequirement : the device API is not supported by this build")
      .code();
}

MESHCCL_WEAK_ALIAS(ncclGetVersion)
MESHCCL_WEAK_ALIAS(ncclGetErrorString)
MESHCCL_WEAK_ALIAS(ncclGetLastError)
MESHCCL_WEAK_ALIAS(ncclResetDebugInit)
MESHCCL_WEAK_ALIAS(ncclMemAlloc)
MESHCCL_WEAK_ALIAS(ncclMemFree)
MESHCCL_WEAK_ALIAS(ncclDevCommCreate)
MESHCCL_WEAK_ALIAS(ncclDevCommDestroy)
MESHCCL_WEAK_ALIAS(ncclTeamWorld)
MESHCCL_WEAK_ALIAS(ncclTeamLsa)
MESHCCL_WEAK_ALIAS(ncclTeamRail)
MESHCCL_WEAK_ALIAS(ncclTeamRankToWorld)
MESHCCL_WEAK_ALIAS(ncclTeamRankToLsa)
MESHCCL_WEAK_ALIAS(ncclLsaBarrierCreateRequirement)
MESHCCL_WEAK_ALIAS(ncclGinBarrierCreateRequirement)
MESHCCL_WEAK_ALIAS(ncclLLA2ACalcSlots)
MESHCCL_WEAK_ALIAS(ncclLLA2ACreateRequirement)
