// One rank of a launched job, for the launch_env tests: joins the world with
// meshcclCommInitFromEnv and checks that the communicator really connects the
// ranks the launcher started. Exits 0 on success; on failure prints why and
// exits non-zero.
//
//   info                 print meshcclGetLaunchInfo's answer
//   allreduce [K]        create K (default 1) world communicators one after the
//                        other, allreduce on each, check, destroy
//   nonblocking          the same with config.blocking = 0
//
// With LAUNCH_ENV_HELPER_UID=N (started as root) it first becomes user N, to
// play another user than the test's (exit 77 when it cannot).
#include <grp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "nccl.h"

namespace {

int fail(const char* what, ncclResult_t r) {
  std::fprintf(stderr, "%s failed: %s (%d): %s\n", what, ncclGetErrorString(r), static_cast<int>(r),
               ncclGetLastError(nullptr));
  return 1;
}

// Waits for a non-blocking communicator to leave ncclInProgress.
ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  for (int i = 0; i < 60000 && st == ncclInProgress; ++i) {
    if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return ncclInternalError;
    if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return st;
}

int check_world(ncclComm_t comm, int rank, int nranks, bool nonblocking) {
  int count = -1, me = -1;
  ncclResult_t r;
  if ((r = ncclCommCount(comm, &count)) != ncclSuccess) return fail("ncclCommCount", r);
  if ((r = ncclCommUserRank(comm, &me)) != ncclSuccess) return fail("ncclCommUserRank", r);
  if (count != nranks || me != rank) {
    std::fprintf(stderr, "communicator says rank %d of %d, launcher says %d of %d\n", me, count, rank, nranks);
    return 1;
  }
  // A sum that only comes out right if every rank contributed exactly once.
  const size_t n = 1000;
  std::vector<int> send(n), recv(n, -1);
  for (size_t i = 0; i < n; ++i) send[i] = (rank + 1) * static_cast<int>(i + 1);
  r = ncclAllReduce(send.data(), recv.data(), n, ncclInt32, ncclSum, comm, nullptr);
  if (nonblocking && r == ncclInProgress) r = settle(comm);
  if (r != ncclSuccess) return fail("ncclAllReduce", r);
  const int ranks_sum = nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < n; ++i) {
    int want = ranks_sum * static_cast<int>(i + 1);
    if (recv[i] != want) {
      std::fprintf(stderr, "allreduce: element %zu is %d, expected %d\n", i, recv[i], want);
      return 1;
    }
  }
  return 0;
}

// Becomes the user LAUNCH_ENV_HELPER_UID names, if any; false when it cannot.
bool become_user() {
  const char* v = std::getenv("LAUNCH_ENV_HELPER_UID");
  if (v == nullptr) return true;
  const uid_t uid = static_cast<uid_t>(std::strtoul(v, nullptr, 10));
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) {
    std::fprintf(stderr, "cannot become uid %u: %s\n", static_cast<unsigned>(uid), std::strerror(errno));
    return false;
  }
  // Still readable through /proc by the job's other ranks (same user), as a
  // process started by that user would be.
  ::prctl(PR_SET_DUMPABLE, 1);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!become_user()) return 77;
  std::string mode = argc > 1 ? argv[1] : "";
  int rank = -1, nranks = -1, local = -1;
  ncclResult_t r = meshcclGetLaunchInfo(&rank, &nranks, &local);
  if (r != ncclSuccess) return fail("meshcclGetLaunchInfo", r);
  if (mode == "info") {
    std::printf("rank=%d nranks=%d local=%d\n", rank, nranks, local);
    return 0;
  }
  if (mode != "allreduce" && mode != "nonblocking") {
    std::fprintf(stderr, "usage: launch_env_helper info|allreduce [K]|nonblocking\n");
    return 64;
  }
  const bool nonblocking = mode == "nonblocking";
  const int rounds = (mode == "allreduce" && argc > 2) ? std::atoi(argv[2]) : 1;
  const char* file = std::getenv("MESHCCL_COMM_FILE");
  for (int round = 0; round < rounds; ++round) {
    ncclComm_t comm = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = nonblocking ? 0 : 1;
    r = meshcclCommInitFromEnv(&comm, &config);
    if (nonblocking && r == ncclInProgress) r = settle(comm);
    if (r != ncclSuccess) return fail("meshcclCommInitFromEnv", r);
    if (int rc = check_world(comm, rank, nranks, nonblocking)) return rc;
    // Rank 0 cleans up the id once a blocking init has completed.
    if (!nonblocking && rank == 0 && file && *file && ::access(file, F_OK) == 0) {
      std::fprintf(stderr, "the id file %s is still there after init\n", file);
      return 1;
    }
    if ((r = ncclCommDestroy(comm)) != ncclSuccess) return fail("ncclCommDestroy", r);
  }
  std::printf("ok rank %d of %d\n", rank, nranks);
  return 0;
}
