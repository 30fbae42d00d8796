// Ranks as forked processes for tests: children are forked before they
// create any thread and report through exit codes and shared anonymous
// memory; every child is killed at a deadline, so no case can hang a suite.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "meshccl.h"

namespace meshccl_test {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What a child leaves for the parent, in memory shared across fork.
struct Slot {
  int result = -1;      // an ncclResult_t the child wants checked
  double seconds = -1;  // how long the interesting call took
  char message[256] = {};
};

struct Child {
  int rank;
  pid_t pid;
  int status = -1;     // waitpid status; -1 while running
  double seconds = 0;  // from fork to exit
  bool killed_at_deadline = false;
};

// n default-initialised T, shared by the parent and the children it forks.
template <class T>
class SharedArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  explicit SharedArray(int n) : n_(n) {
    void* p = mmap(nullptr, sizeof(T) * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    slots_ = static_cast<T*>(p);
    for (int i = 0; i < n; ++i) slots_[i] = T{};
  }
  ~SharedArray() { munmap(slots_, sizeof(T) * n_); }
  T& operator[](int i) { return slots_[i]; }

 private:
  int n_;
  T* slots_;
};
using SharedSlots = SharedArray<Slot>;

// An id made by rank 0 after the fork, so that the parent forks while it has
// no thread of the library (ncclGetUniqueId starts one; forking beside it
// could copy a held lock into a child, which then hangs).
struct SharedId {
  volatile int ready = 0;
  ncclUniqueId id;
};
// The k-th id of the array (one per communicator a case makes).
inline ncclResult_t shared_id(SharedArray<SharedId>& sid, int rank, ncclUniqueId* out, int k = 0) {
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&sid[k].id);
    if (r != ncclSuccess) return r;
    __atomic_store_n(&sid[k].ready, 1, __ATOMIC_RELEASE);
  }
  auto t0 = Clock::now();
  while (__atomic_load_n(&sid[k].ready, __ATOMIC_ACQUIRE) == 0) {
    if (since(t0) > 30) return ncclSystemError;
    usleep(1000);
  }
  *out = sid[k].id;
  return ncclSuccess;
}

// Joins the communicator of n ranks whose id is the k-th of the array.
inline ncclResult_t shared_init(SharedArray<SharedId>& sid, int n, int rank, ncclComm_t* comm, int k = 0) {
  ncclUniqueId id;
  ncclResult_t r = shared_id(sid, rank, &id, k);
  return r != ncclSuccess ? r : ncclCommInitRank(comm, n, id, rank);
}

// Forks n children; child r runs body(r) and exits with its return value.
// Children still running after deadline_s are killed with SIGKILL.
inline std::vector<Child> run_procs(int n, double deadline_s, const std::function<int(int)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<Child> kids;
  auto t0 = Clock::now();
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed: " << std::strerror(errno);
      break;
    }
    if (pid == 0) {
      int code = 99;
      try {
        code = body(r);
      } catch (...) { code = 98; }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    kids.push_back(Child{r, pid});
  }
  size_t done = 0;
  while (done < kids.size()) {
    bool late = since(t0) > deadline_s;
    for (auto& k : kids) {
      if (k.status != -1) continue;
      if (late && !k.killed_at_deadline) {
        kill(k.pid, SIGKILL);
        k.killed_at_deadline = true;
      }
      int st = 0;
      pid_t got = waitpid(k.pid, &st, late ? 0 : WNOHANG);
      if (got == k.pid) {
        k.status = st;
        k.seconds = since(t0);
        ++done;
      }
    }
    if (done < kids.size()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return kids;
}

inline std::string describe(const Child& k) {
  char buf[160];
  if (k.killed_at_deadline)
    std::snprintf(buf, sizeof(buf), "rank %d killed at the deadline after %.2f s", k.rank, k.seconds);
  else if (WIFEXITED(k.status))
    std::snprintf(buf, sizeof(buf), "rank %d exited %d after %.2f s", k.rank, WEXITSTATUS(k.status), k.seconds);
  else if (WIFSIGNALED(k.status))
    std::snprintf(buf, sizeof(buf), "rank %d died of signal %d after %.2f s", k.rank, WTERMSIG(k.status), k.seconds);
  else std::snprintf(buf, sizeof(buf), "rank %d status 0x%x", k.rank, k.status);
  return buf;
}

inline bool exited_ok(const Child& k) {
  return !k.killed_at_deadline && WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0;
}

// Child-side failure report: prints and yields the exit code.
inline int fail(int code, int rank, const char* what, ncclResult_t res) {
  std::fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, ncclGetErrorString(res), ncclGetLastError(nullptr));
  return code;
}

}  // namespace meshccl_test
