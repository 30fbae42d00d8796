// 1,000 communicators created, used and destroyed, with ranks as threads and
// as processes: afterwards the process holds no more descriptors, threads,
// file mappings or memfds than before.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/harness.h"

using meshccl_test::ScopedEnv;

namespace {

constexpr int kCycles = 1000;

struct Counts {
  int fds = 0, threads = 0, file_maps = 0, memfds = 0;
  bool operator==(const Counts& o) const {
    return fds == o.fds && threads == o.threads && file_maps == o.file_maps && memfds == o.memfds;
  }
  std::string str() const {
    char b[128];
    std::snprintf(b, sizeof b, "fds %d threads %d file mappings %d memfds %d", fds, threads, file_maps, memfds);
    return b;
  }
};

int entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

Counts counts() {
  Counts c;
  c.fds = entries("/proc/self/fd") - 1;  // the listing's own descriptor
  c.threads = entries("/proc/self/task");
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:") != std::string::npos) ++c.memfds;
    if (line.find('/') != std::string::npos || line.find("memfd:") != std::string::npos) ++c.file_maps;
  }
  return c;
}

// Detached bootstrap root threads end shortly after their communicator is
// made: wait (bounded) until the counts come back.
Counts settled(const Counts& want) {
  Counts now = counts();
  for (int i = 0; i < 300 && !(now == want); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = counts();
  }
  return now;
}

bool cycle_threads() {
  ncclComm_t c[2];
  if (ncclCommInitAll(c, 2, nullptr) != ncclSuccess) return false;
  int v[2] = {1, 2};
  bool ok = ncclGroupStart() == ncclSuccess;
  for (int r = 0; r < 2; ++r) ok = ok && ncclAllReduce(&v[r], &v[r], 1, ncclInt, ncclSum, c[r], nullptr) == ncclSuccess;
  ok = ncclGroupEnd() == ncclSuccess && ok && v[0] == 3 && v[1] == 3;
  for (ncclComm_t comm : c) ok = ncclCommDestroy(comm) == ncclSuccess && ok;
  return ok;
}

TEST(Leaks, ThousandCommunicatorsAsThreads) {
  ScopedEnv env({{"MESHCCL_TUNE_MEASURE", "0"}});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cycle_threads()) << ncclGetLastError(nullptr);  // lazily made state settles
  const Counts before = settled(counts());
  for (int i = 0; i < kCycles; ++i) ASSERT_TRUE(cycle_threads()) << "cycle " << i << ": " << ncclGetLastError(nullptr);
  const Counts after = settled(before);
  EXPECT_EQ(after.str(), before.str());
  std::printf("[ leaks  ] %d cycles as threads: %s -> %s\n", kCycles, before.str().c_str(), after.str().c_str());
}

// Two forked ranks; rank 0 hands each cycle's id to rank 1 through shared
// memory. Each child compares its own counts.
struct Mailbox {
  volatile int seq;
  ncclUniqueId id;
  Counts before[2], after[2];
};

int child(Mailbox* box, int rank) {
  auto one = [&](int seq) -> bool {
    if (rank == 0) {
      if (ncclGetUniqueId(&box->id) != ncclSuccess) return false;
      __atomic_store_n(&box->seq, seq, __ATOMIC_RELEASE);
    } else {
      auto t0 = std::chrono::steady_clock::now();
      while (__atomic_load_n(&box->seq, __ATOMIC_ACQUIRE) < seq) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) return false;
        std::this_thread::yield();
      }
    }
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, 2, box->id, rank) != ncclSuccess) return false;
    int v = rank + 1;
    bool ok = ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, comm, nullptr) == ncclSuccess && v == 3;
    return ncclCommDestroy(comm) == ncclSuccess && ok;
  };
  int seq = 0;
  for (int i = 0; i < 3; ++i)
    if (!one(++seq)) return 2;
  box->before[rank] = settled(counts());
  for (int i = 0; i < kCycles; ++i)
    if (!one(++seq)) return 3;
  box->after[rank] = settled(box->before[rank]);
  return box->after[rank] == box->before[rank] ? 0 : 4;
}

TEST(Leaks, ThousandCommunicatorsAsProcesses) {
  ScopedEnv env({{"MESHCCL_TUNE_MEASURE", "0"}});
  void* p = mmap(nullptr, sizeof(Mailbox), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  auto* box = new (p) Mailbox{};
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    ASSERT_GE(kids[r], 0);
    if (kids[r] == 0) _exit(child(box, r));
  }
  // Bounded: a child that hangs is killed.
  auto t0 = std::chrono::steady_clock::now();
  int status[2] = {-1, -1};
  for (int left = 2; left > 0;) {
    for (int r = 0; r < 2; ++r)
      if (status[r] == -1 && waitpid(kids[r], &status[r], WNOHANG) == kids[r]) --left;
      else if (status[r] == -1 && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(240))
        kill(kids[r], SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " status " << status[r] << ": " << box->before[r].str() << " -> " << box->after[r].str();
    std::printf("[ leaks  ] %d cycles, rank %d as a process: %s -> %s\n", kCycles, r, box->before[r].str().c_str(),
                box->after[r].str().c_str());
  }
  munmap(p, sizeof(Mailbox));
}

}  // namespace
