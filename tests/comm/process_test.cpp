// Ranks as separate processes (fork), and failure cases that only show up
// across processes: a rank killed mid-job, abort from another thread, stray
// connections to the bootstrap root, mismatched calls, leaked descriptors.
//
// Children are forked before they create any thread and report through exit
// codes and a shared anonymous mapping; GoogleTest assertions run only in the
// parent. Every child is killed at a deadline, so no case can hang the suite.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bootstrap/unique_id.h"
#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kTimeout = 10;  // MESHCCL_TIMEOUT for every case
constexpr double kChildDeadline = 30;

void set_timeout_env() { setenv("MESHCCL_TIMEOUT", "10", 1); }

bool mentions(const char* message, const char* what) { return std::strstr(message, what) != nullptr; }

bool is_peer_failure(int r) { return r == ncclRemoteError || r == ncclSystemError || r == ncclInvalidUsage; }

// ---------------------------------------------------------------------------
// (a) Correct results with ranks as processes, over each transport mix.

struct TransportCase {
  const char* name;
  const char* transport;  // MESHCCL_TRANSPORT, or nullptr
  bool two_hosts;         // MESHCCL_HOSTID=host<rank/2>
};

class ProcessCollectives : public ::testing::TestWithParam<TransportCase> {};

int collectives_child(const ncclUniqueId& id, int n, int rank, const TransportCase& tc) {
  if (tc.transport) setenv("MESHCCL_TRANSPORT", tc.transport, 1);
  if (tc.two_hosts) {
    std::string host = "host" + std::to_string(rank / 2);
    setenv("MESHCCL_HOSTID", host.c_str(), 1);
  }
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRank(&comm, n, id, rank);
  if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);

  // Odd counts, so chunking leaves a remainder; sizes above the eager range.
  const size_t count = 300007;
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = float((rank + 1) * (i % 1000));
  res = ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr);
  if (res != ncclSuccess) return fail(11, rank, "ncclAllReduce", res);
  const float scale = float(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i)
    if (buf[i] != scale * float(i % 1000)) {
      std::fprintf(stderr, "rank %d: allreduce[%zu] = %g, want %g\n", rank, i, buf[i], scale * float(i % 1000));
      return 12;
    }

  const int root = n - 2;
  std::vector<int64_t> bc(100003);
  for (size_t i = 0; i < bc.size(); ++i) bc[i] = rank == root ? int64_t(i * 7 + 3) : -1;
  res = ncclBroadcast(bc.data(), bc.data(), bc.size(), ncclInt64, root, comm, nullptr);
  if (res != ncclSuccess) return fail(13, rank, "ncclBroadcast", res);
  for (size_t i = 0; i < bc.size(); ++i)
    if (bc[i] != int64_t(i * 7 + 3)) {
      std::fprintf(stderr, "rank %d: broadcast[%zu] = %lld\n", rank, i, static_cast<long long>(bc[i]));
      return 14;
    }

  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::vector<int32_t> out(50001), in(50001, -1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(rank * 1000003 + i);
  if ((res = ncclGroupStart()) != ncclSuccess) return fail(15, rank, "ncclGroupStart", res);
  ncclResult_t rs = ncclSend(out.data(), out.size(), ncclInt32, next, comm, nullptr);
  ncclResult_t rr = ncclRecv(in.data(), in.size(), ncclInt32, prev, comm, nullptr);
  res = ncclGroupEnd();
  if (rs != ncclSuccess) return fail(16, rank, "ncclSend", rs);
  if (rr != ncclSuccess) return fail(16, rank, "ncclRecv", rr);
  if (res != ncclSuccess) return fail(16, rank, "ncclGroupEnd", res);
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != int32_t(prev * 1000003 + i)) {
      std::fprintf(stderr, "rank %d: recv[%zu] = %d\n", rank, i, in[i]);
      return 17;
    }

  res = ncclCommDestroy(comm);
  if (res != ncclSuccess) return fail(18, rank, "ncclCommDestroy", res);
  return 0;
}

TEST_P(ProcessCollectives, AllReduceBroadcastRing) {
  set_timeout_env();
  const TransportCase tc = GetParam();
  const int n = 4;
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  auto kids = run_procs(n, kChildDeadline, [&](int r) {
    ncclUniqueId id;
    if (ncclResult_t res = shared_id(sid, r, &id); res != ncclSuccess) return fail(9, r, "ncclGetUniqueId", res);
    return collectives_child(id, n, r, tc);
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcessCollectives,
                         ::testing::Values(TransportCase{"shm", nullptr, false},
                                           TransportCase{"socket", "socket", false},
                                           TransportCase{"two_hosts", nullptr, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// (b) A rank dies between collectives: the survivors get an error long before
// MESHCCL_TIMEOUT, abort, and exit cleanly.

void killed_rank_case(const char* transport) {
  set_timeout_env();
  const int n = 4, victim = 3;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    if (transport) setenv("MESHCCL_TRANSPORT", transport, 1);
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(65536, 1.0f);
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    if (res != ncclSuccess) return fail(11, rank, "first ncclAllReduce", res);
    if (buf[0] != float(n)) return 12;
    if (rank == victim) raise(SIGKILL);
    auto t0 = Clock::now();
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    ncclResult_t ab = ncclCommAbort(comm);
    if (ab != ncclSuccess) return fail(13, rank, "ncclCommAbort", ab);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) {
    if (k.rank == victim) {
      EXPECT_TRUE(!k.killed_at_deadline && WIFSIGNALED(k.status) && WTERMSIG(k.status) == SIGKILL) << describe(k);
      continue;
    }
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    EXPECT_LT(k.seconds, 15.0) << describe(k);
    const Slot& s = slots[k.rank];
    EXPECT_TRUE(is_peer_failure(s.result)) << "rank " << k.rank << " second AllReduce returned " << s.result << " ("
                                           << ncclGetErrorString(ncclResult_t(s.result)) << "): " << s.message;
    // Noticed from the dead peer itself, not from the no-progress timeout.
    EXPECT_LT(s.seconds, kTimeout / 2) << "rank " << k.rank << ": " << s.message;
    std::printf("[ killed ] %s: rank %d second AllReduce -> %s after %.3f s: %s\n", transport ? transport : "shm",
                k.rank, ncclGetErrorString(ncclResult_t(s.result)), s.seconds, s.message);
  }
}

TEST(ProcessFailure, KilledRankShm) { killed_rank_case(nullptr); }
TEST(ProcessFailure, KilledRankSocket) { killed_rank_case("socket"); }

// ---------------------------------------------------------------------------
// (c) ncclCommAbort from a second thread ends a collective blocked on a peer
// that never joins.

TEST(ProcessFailure, AbortFromAnotherThread) {
  set_timeout_env();
  const int n = 2;
  // The id is made after the fork: forking beside ncclGetUniqueId's thread
  // can leave the sanitizer's locks held in a child (its aborter thread then
  // never ran under ASan, one run in several).
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    if (rank == 1) {
      // Never joins the collective; outlives rank 0's abort.
      std::this_thread::sleep_for(std::chrono::seconds(3));
      ncclCommAbort(comm);
      return 0;
    }
    std::thread aborter([comm] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ncclCommAbort(comm);
    });
    std::vector<float> buf(1 << 16, 1.0f);
    auto t0 = Clock::now();
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    aborter.join();
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  const Slot& s = slots[0];
  EXPECT_NE(s.result, ncclSuccess);
  EXPECT_NE(s.result, -1) << "rank 0 never returned from ncclAllReduce";
  EXPECT_GE(s.seconds, 0.4) << "returned before the abort: " << s.message;
  EXPECT_LT(s.seconds, 2.5) << "the abort did not end the wait: " << s.message;
  std::printf("[ abort  ] AllReduce -> %s after %.3f s: %s\n", ncclGetErrorString(ncclResult_t(s.result)), s.seconds,
              s.message);
}

// ---------------------------------------------------------------------------
// (c1) After a fault, every rank names the rank that failed first, on every
// transport, and ncclCommAbort returns soon whatever the peer does.

// Sets the environment of a rank on `transport`, the ranks spread over two
// emulated hosts when `two_hosts` (so a network transport carries them).
void use_transport(const char* transport, bool two_hosts, int rank) {
  if (transport != nullptr) setenv("MESHCCL_TRANSPORT", transport, 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_TLS", "tcp", 1);
  setenv("FI_TCP_IFACE", "lo", 1);
  if (two_hosts) setenv("MESHCCL_HOSTID", rank % 2 == 0 ? "hostA" : "hostB", 1);
}

bool plugin_built(const char* name) {
  std::string path = std::string(MESHCCL_TEST_PLUGIN_DIR) + "/libmeshccl-transport-" + name + ".so";
  return access(path.c_str(), R_OK) == 0;
}

// The pid of each rank, for the rank that stops or kills another.
struct PidSlot {
  volatile pid_t pid = 0;
};

// A rank stopped (SIGSTOP) in the middle of a large AllReduce between two
// hosts: its peer's ncclCommAbort (from another thread, 1 s in) returns
// within seconds on every network transport. Over ofi it waited for the
// stopped peer up to MESHCCL_TIMEOUT, closing a send libfabric still held.
void abort_with_stopped_peer(const char* transport) {
  if (transport != nullptr && std::strcmp(transport, "socket") != 0 && !plugin_built(transport))
    GTEST_SKIP() << transport << " is not built";
  set_timeout_env();
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedArray<PidSlot> pids(n);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    use_transport(transport, true, rank);
    pids[rank].pid = getpid();
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    if ((res = ncclCommInitRank(&comm, n, id, rank)) != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(size_t{32} << 20, 1.0f);
    if (rank == 1) {
      std::thread stopper([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        raise(SIGSTOP);
      });
      (void)ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      stopper.join();
      return 0;  // not reached: rank 0 kills this one
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      auto t0 = Clock::now();
      slots[0].result = ncclCommAbort(comm);
      slots[0].seconds = since(t0);
    });
    (void)ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    aborter.join();
    kill(pids[1].pid, SIGKILL);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  EXPECT_TRUE(exited_ok(kids[0])) << describe(kids[0]);
  EXPECT_EQ(slots[0].result, ncclSuccess);
  EXPECT_GE(slots[0].seconds, 0.0) << "ncclCommAbort never returned";
  EXPECT_LT(slots[0].seconds, 4.0) << "ncclCommAbort waited for the stopped peer";
  std::printf("[ stopped] %s: ncclCommAbort returned after %.3f s\n", transport ? transport : "auto", slots[0].seconds);
}

TEST(ProcessFailure, AbortReturnsSoonWithAStoppedPeerSocket) { abort_with_stopped_peer("socket"); }
TEST(ProcessFailure, AbortReturnsSoonWithAStoppedPeerUcx) { abort_with_stopped_peer("ucx"); }
TEST(ProcessFailure, AbortReturnsSoonWithAStoppedPeerOfi) { abort_with_stopped_peer("ofi"); }

// A rank is killed in the middle of a stream of AllReduces; each survivor
// aborts as soon as it sees an error. Every survivor names the killed rank as
// the one that failed first, never a survivor that only aborted (before, a
// survivor that saw another survivor's connections close blamed it).
void survivors_name_the_killed_rank(const char* transport, bool two_hosts) {
  set_timeout_env();
  const int n = 4, victim = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    use_transport(transport, two_hosts, rank);
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    if ((res = ncclCommInitRank(&comm, n, id, rank)) != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(1 << 16, 1.0f);
    std::thread killer;
    if (rank == victim)
      killer = std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        raise(SIGKILL);
      });
    for (int i = 0; i < 100000 && res == ncclSuccess; ++i)
      res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    ncclCommAbort(comm);
    if (killer.joinable()) killer.join();
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) {
    if (k.rank == victim) continue;
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    const Slot& s = slots[k.rank];
    EXPECT_EQ(s.result, ncclRemoteError) << "rank " << k.rank << ": " << s.message;
    EXPECT_TRUE(mentions(s.message, "rank 2 failed first")) << "rank " << k.rank << ": " << s.message;
    std::printf("[ killed ] %s%s: rank %d: %s\n", transport ? transport : "shm", two_hosts ? ", two hosts" : "", k.rank,
                s.message);
  }
}

TEST(ProcessFailure, SurvivorsNameTheKilledRankShm) { survivors_name_the_killed_rank(nullptr, false); }
TEST(ProcessFailure, SurvivorsNameTheKilledRankSocket) { survivors_name_the_killed_rank("socket", true); }

// A rank stops (SIGSTOP) for longer than MESHCCL_TIMEOUT in the middle of a
// stream of AllReduces over plans: every other rank fails naming it, also
// those that wait for a live rank that waits for it (before, each blamed the
// rank it waited for).
void every_rank_names_the_stopped_rank(const char* transport) {
  const int n = 4, victim = 1;
  SharedArray<SharedId> sid(1);
  SharedArray<PidSlot> pids(n);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_TIMEOUT", "2", 1);
    use_transport(transport, false, rank);
    pids[rank].pid = getpid();
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    if ((res = ncclCommInitRank(&comm, n, id, rank)) != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(1 << 16, 1.0f);
    std::thread stopper;
    if (rank == victim)
      stopper = std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        raise(SIGSTOP);
      });
    for (int i = 0; i < 100000 && res == ncclSuccess; ++i)
      res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    if (rank == 0) {
      // Every other survivor has its answer before the stopped rank goes.
      for (int k = 0; k < 100 && (slots[2].result == -1 || slots[3].result == -1); ++k)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      kill(pids[victim].pid, SIGKILL);
    }
    ncclCommAbort(comm);
    if (stopper.joinable()) stopper.join();
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) {
    if (k.rank == victim) continue;
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    const Slot& s = slots[k.rank];
    EXPECT_EQ(s.result, ncclRemoteError) << "rank " << k.rank << ": " << s.message;
    EXPECT_TRUE(mentions(s.message, "rank 1 failed first")) << "rank " << k.rank << ": " << s.message;
    std::printf("[stopped ] %s: rank %d: %s\n", transport ? transport : "shm", k.rank, s.message);
  }
}

TEST(ProcessFailure, EveryRankNamesTheStoppedRankShm) { every_rank_names_the_stopped_rank(nullptr); }
TEST(ProcessFailure, EveryRankNamesTheStoppedRankSocket) { every_rank_names_the_stopped_rank("socket"); }

// Two ranks die while they wait for a third in a collective; the third
// arrives afterwards. It is told that its peers are gone, not that the
// ranks called different things.
void late_rank_after_peers_died(const char* transport, bool two_hosts) {
  if (transport != nullptr && std::strcmp(transport, "socket") != 0 && !plugin_built(transport))
    GTEST_SKIP() << transport << " is not built";
  set_timeout_env();
  const int n = 3;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    use_transport(transport, two_hosts, rank);
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    if ((res = ncclCommInitRank(&comm, n, id, rank)) != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(size_t{1} << 18, 1.0f);
    if (rank != 0) {
      std::thread killer([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        raise(SIGKILL);
      });
      (void)ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      killer.join();
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    auto t0 = Clock::now();
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[0].seconds = since(t0);
    slots[0].result = res;
    std::snprintf(slots[0].message, sizeof(slots[0].message), "%s", ncclGetLastError(nullptr));
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  EXPECT_TRUE(exited_ok(kids[0])) << describe(kids[0]);
  const Slot& s = slots[0];
  EXPECT_EQ(s.result, ncclRemoteError) << s.message;
  EXPECT_FALSE(mentions(s.message, "mismatched")) << s.message;
  EXPECT_LT(s.seconds, kTimeout / 2) << s.message;
  std::printf("[  late  ] %s%s: %s after %.3f s\n", transport ? transport : "shm", two_hosts ? ", two hosts" : "",
              s.message, s.seconds);
}

TEST(ProcessFailure, LateRankIsToldItsPeersAreGoneShm) { late_rank_after_peers_died(nullptr, false); }
TEST(ProcessFailure, LateRankIsToldItsPeersAreGoneSocket) { late_rank_after_peers_died("socket", true); }
TEST(ProcessFailure, LateRankIsToldItsPeersAreGoneUcx) { late_rank_after_peers_died("ucx", true); }
// Open: over ofi (tcp;ofi_rxm, libfabric 1.17) the late rank dies of SIGSEGV
// inside libfabric's fi_trecv, posting a payload receive from a peer that
// died (Links::post_chunks -> ofi recv_post -> post_chunks), 3 runs in 3.
TEST(ProcessFailure, DISABLED_LateRankIsToldItsPeersAreGoneOfi) { late_rank_after_peers_died("ofi", true); }
TEST(ProcessFailure, LateRankIsToldItsPeersAreGoneShmPlans) {
  setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
  late_rank_after_peers_died(nullptr, false);
  unsetenv("MESHCCL_DIRECT_SLOT_BYTES");
}

// ---------------------------------------------------------------------------
// (c2) A real allocation failure inside a collective between two hosts: the
// rank that ran out of memory gets ncclSystemError and its communicator is
// failed, so its ncclCommAbort returns at once and its peer hears of it when
// the connection goes, instead of waiting for MESHCCL_TIMEOUT. (Both hung
// before: the failed launch kept a count that the abort waited for.)

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MESHCCL_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MESHCCL_TEST_SANITIZED 1
#endif
#endif

TEST(ProcessFailure, OutOfMemoryFailsTheCommunicatorAndAbortReturns) {
#ifdef MESHCCL_TEST_SANITIZED
  GTEST_SKIP() << "RLIMIT_AS cannot bound a sanitized process (its shadow memory is address space)";
#endif
  set_timeout_env();
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2 * n);  // [rank]: the collective, [n + rank]: the abort
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_HOSTID", rank == 0 ? "oom-host-a" : "oom-host-b", 1);
    setenv("MESHCCL_NET", "socket", 1);
    setenv("MESHCCL_ALGO", "allreduce:ring", 1);
    setenv("MESHCCL_CHUNKSIZE", "256M", 1);  // the ring's scratch: far more than the heap holds free
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(16 << 20, 1.0f);  // 64 MiB, allocated before the limit
    if (rank == 0) {
      malloc_trim(0);  // what the heap holds free would serve the scratch
      long pages = 0;
      if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
        std::fclose(f);
      }
      if (pages <= 0) return 11;
      rlimit rl{};
      getrlimit(RLIMIT_AS, &rl);
      // Room for the small allocations of error handling, not for the plan.
      rl.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (512 << 10);
      if (setrlimit(RLIMIT_AS, &rl) != 0) return 12;
    }
    auto t0 = Clock::now();
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    t0 = Clock::now();
    slots[n + rank].result = ncclCommAbort(comm);
    slots[n + rank].seconds = since(t0);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  EXPECT_EQ(slots[0].result, ncclSystemError) << slots[0].message;
  EXPECT_NE(std::string(slots[0].message).find("out of memory"), std::string::npos) << slots[0].message;
  EXPECT_NE(slots[1].result, ncclSuccess) << slots[1].message;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(slots[n + r].result, ncclSuccess) << "rank " << r << " abort";
    EXPECT_GE(slots[n + r].seconds, 0) << "rank " << r << " never returned from ncclCommAbort";
  }
  // The peer learns from the closed connection, well before MESHCCL_TIMEOUT (10 s).
  EXPECT_LT(slots[1].seconds, 8.0) << slots[1].message;
  std::printf("[ oom    ] rank 0: %s; rank 1 after %.2f s: %s; aborts %.2f s, %.2f s\n", slots[0].message,
              slots[1].seconds, slots[1].message, slots[n].seconds, slots[n + 1].seconds);
}

// ---------------------------------------------------------------------------
// (f) Ranks disagree on nranks: every rank gets an error, nobody hangs.

// A transfer that fails inside the engine on shm: the receiver cannot read
// the payload (the sender unmapped its buffer while the send waited on a host
// stream). Both ranks hear an error naming the cause well before
// MESHCCL_TIMEOUT, and the communicator fails with it: the next collective
// returns an error at once instead of waiting. Needs process_vm_readv between
// the ranks (without it the sender streams the payload itself).
TEST(ProcessFailure, FailedShmTransferFailsTheCommunicator) {
  set_timeout_env();
  const int n = 2;
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2 * n);
  SharedArray<int> sync(3);  // [0] rank 0's pid, [1] 1 = CMA works, 2 = refused, [2] buffer unmapped
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);  // through the transport, not the shared region
    setenv("MESHCCL_P2P_EAGER", "0", 1);          // the send reads the user's buffer, not a copy
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    const auto wait_for = [&](int i) {
      while (__atomic_load_n(&sync[i], __ATOMIC_SEQ_CST) == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    if (rank == 0) {
      __atomic_store_n(&sync[0], static_cast<int>(getpid()), __ATOMIC_SEQ_CST);
    } else {
      wait_for(0);
      int probe = 0;
      iovec local{&probe, sizeof probe}, remote{&sync[0], sizeof probe};
      const bool cma = process_vm_readv(sync[0], &local, 1, &remote, 1, 0) == ssize_t(sizeof probe);
      __atomic_store_n(&sync[1], cma ? 1 : 2, __ATOMIC_SEQ_CST);
    }
    wait_for(1);
    if (sync[1] != 1) {
      slots[rank].result = -2;  // skipped
      ncclCommDestroy(comm);
      return 0;
    }
    const size_t count = size_t{1} << 20;  // 4 MiB: a rendezvous, read from the sender's memory
    const size_t bytes = count * sizeof(float);
    auto t0 = Clock::now();
    if (rank == 0) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 20;
      std::memset(p, 1, bytes);
      meshcclStream_t s = nullptr;
      if (meshcclStreamCreate(&s) != ncclSuccess) return 21;
      res = ncclSend(p, count, ncclFloat, 1, comm, meshcclStreamAsCuda(s));
      munmap(p, bytes);
      __atomic_store_n(&sync[2], 1, __ATOMIC_SEQ_CST);
      if (res == ncclSuccess) res = meshcclStreamSynchronize(s);
      std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
      meshcclStreamDestroy(s);
    } else {
      wait_for(2);
      std::vector<float> buf(count);
      res = ncclRecv(buf.data(), count, ncclFloat, 0, comm, nullptr);
      std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    }
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    int x = 1;
    t0 = Clock::now();
    slots[n + rank].result = ncclAllReduce(&x, &x, 1, ncclInt, ncclSum, comm, nullptr);
    slots[n + rank].seconds = since(t0);
    std::snprintf(slots[n + rank].message, sizeof(slots[n + rank].message), "%s", ncclGetLastError(nullptr));
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  if (slots[0].result == -2) GTEST_SKIP() << "process_vm_readv between the ranks is refused here";
  for (int r = 0; r < n; ++r) {
    const Slot& s = slots[r];
    EXPECT_TRUE(is_peer_failure(s.result)) << "rank " << r << " returned " << s.result << ": " << s.message;
    EXPECT_LT(s.seconds, kTimeout) << "rank " << r << ": " << s.message;
    const Slot& after = slots[n + r];
    EXPECT_NE(after.result, ncclSuccess) << "rank " << r << ": the failed communicator still ran a collective";
    EXPECT_LT(after.seconds, kTimeout) << "rank " << r << ": " << after.message;
    std::printf("[shm failure] rank %d: %s after %.3f s: %s\n[shm failure] rank %d next: %s after %.3f s: %s\n", r,
                ncclGetErrorString(ncclResult_t(s.result)), s.seconds, s.message, r,
                ncclGetErrorString(ncclResult_t(after.result)), after.seconds, after.message);
  }
  // The receiver names the read that failed.
  EXPECT_NE(std::strstr(slots[1].message, "read"), nullptr) << slots[1].message;
}

TEST(ProcessFailure, MismatchedNranks) {
  set_timeout_env();
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    if (ncclResult_t r = shared_id(sid, rank, &id); r != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", r);
    ncclComm_t comm = nullptr;
    auto t0 = Clock::now();
    ncclResult_t res = ncclCommInitRank(&comm, rank == 0 ? 2 : 3, id, rank);
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    if (res == ncclSuccess) ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(2));
  for (auto& k : kids) {
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    const Slot& s = slots[k.rank];
    EXPECT_NE(s.result, ncclSuccess) << "rank " << k.rank;
    EXPECT_NE(s.result, -1) << "rank " << k.rank << " never returned";
    EXPECT_LT(s.seconds, kTimeout + 2) << "rank " << k.rank;
    std::printf("[mismatch] rank %d -> %s after %.3f s: %s\n", k.rank, ncclGetErrorString(ncclResult_t(s.result)),
                s.seconds, s.message);
  }
}

// ---------------------------------------------------------------------------
// (g) Mismatched calls: one rank calls a different collective, count,
// datatype, reduction or root. Every rank gets ncclInvalidUsage — never
// a hang, never a silent success everywhere.

// What one rank saw of one mismatched call, and of a correct AllReduce after it.
struct MismatchSlot {
  int result = -1;
  int after = -1;  // ncclResult_t of the AllReduce that follows; 99 = wrong sum
  char message[400] = {};
};

struct MismatchCase {
  const char* field;  // what the message must name
  // Issues the call; `odd` is the rank that deviates.
  ncclResult_t (*call)(ncclComm_t comm, bool odd, std::vector<float>& in, std::vector<float>& out);
};

const MismatchCase kMismatchCases[] = {
    {"collective",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return odd ? ncclAllGather(in.data(), out.data(), 4, ncclFloat, c, nullptr)
                  : ncclAllReduce(in.data(), out.data(), 4, ncclFloat, ncclSum, c, nullptr);
     }},
    {"count",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return ncclAllReduce(in.data(), out.data(), odd ? 5 : 4, ncclFloat, ncclSum, c, nullptr);
     }},
    {"datatype",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return ncclAllReduce(in.data(), out.data(), 4, odd ? ncclInt32 : ncclFloat, ncclSum, c, nullptr);
     }},
    {"reduction op",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return ncclAllReduce(in.data(), out.data(), 4, ncclFloat, odd ? ncclMax : ncclSum, c, nullptr);
     }},
    {"root",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return ncclBroadcast(in.data(), out.data(), 4, ncclFloat, odd ? 1 : 0, c, nullptr);
     }},
    {"count",  // an empty call against a non-empty one
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return ncclAllReduce(in.data(), out.data(), odd ? 0 : 4, ncclFloat, ncclSum, c, nullptr);
     }},
};

// A correct AllReduce: ncclSuccess with the right sum, 99 with a wrong one.
int allreduce_after(ncclComm_t comm, int rank, int n) {
  int v = rank + 1;
  ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, comm, nullptr);
  return r != ncclSuccess ? r : v == n * (n + 1) / 2 ? ncclSuccess : 99;
}

// MESHCCL_CHECKS=1, set on rank 0 only: the whole communicator checks (every
// collective a plan). Each mismatch fails on every rank before data moves, and
// the communicator stays usable.
TEST(Mismatch, ChecksNameTheDifferenceOnEveryRankAndKeepTheCommUsable) {
  set_timeout_env();
  const int n = 3, odd = 2;
  const int ncases = int(std::size(kMismatchCases));
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedArray<MismatchSlot> slots(n * ncases);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    if (ncclResult_t r = shared_id(sid, rank, &id); r != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", r);
    if (rank == 0) setenv("MESHCCL_CHECKS", "1", 1);
    ncclComm_t comm = nullptr;
    ncclResult_t res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> in(16, float(rank)), out(16 * n);
    for (int c = 0; c < ncases; ++c) {
      MismatchSlot& s = slots[c * n + rank];
      s.result = kMismatchCases[c].call(comm, rank == odd, in, out);
      std::snprintf(s.message, sizeof(s.message), "%s", ncclGetLastError(nullptr));
      s.after = allreduce_after(comm, rank, n);
    }
    res = ncclCommDestroy(comm);
    if (res != ncclSuccess) return fail(11, rank, "ncclCommDestroy", res);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  for (int c = 0; c < ncases; ++c) {
    for (int r = 0; r < n; ++r) {
      const MismatchSlot& s = slots[c * n + r];
      const char* field = kMismatchCases[c].field;
      EXPECT_EQ(s.result, ncclInvalidUsage) << "case " << field << ", rank " << r << ": " << s.message;
      EXPECT_TRUE(mentions(s.message, field) && mentions(s.message, "(this rank)"))
          << "case " << field << ", rank " << r << ": " << s.message;
      EXPECT_EQ(s.after, ncclSuccess) << "case " << field << ", rank " << r << ": the communicator is not usable";
    }
    std::printf("[mismatch] checks, %s: rank 0: %s\n[mismatch] checks, %s: rank %d: %s\n", kMismatchCases[c].field,
                slots[c * n].message, kMismatchCases[c].field, odd, slots[c * n + odd].message);
  }
}

// Without MESHCCL_CHECKS, a small call whose count differs, run as a plan (no
// shared region, so not by the direct algorithms, which compare signatures
// themselves): the rank that sees a message of the wrong size fails the
// communicator and tells its peers, so every rank reports ncclInvalidUsage (on
// that call or the next one), not ncclRemoteError at MESHCCL_TIMEOUT. Failed
// ranks either abort at once (their peers see closed connections) or stay
// until every rank has its answer (their peers notice while waiting).
void unchecked_size_mismatch(const char* transport, bool abort_at_once) {
  set_timeout_env();
  const int n = 3, odd = 2;
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedSlots slots(n);
  SharedArray<int> answered(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    if (ncclResult_t r = shared_id(sid, rank, &id); r != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", r);
    if (transport) setenv("MESHCCL_TRANSPORT", transport, 1);
    setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
    ncclComm_t comm = nullptr;
    ncclResult_t res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(3000, 1.0f);
    auto t0 = Clock::now();
    res = ncclAllReduce(buf.data(), buf.data(), rank == odd ? 3000 : 1000, ncclFloat, ncclSum, comm, nullptr);
    if (res == ncclSuccess) res = ncclResult_t(allreduce_after(comm, rank, n));
    slots[rank].seconds = since(t0);
    slots[rank].result = res;
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(nullptr));
    __atomic_add_fetch(&answered[0], 1, __ATOMIC_SEQ_CST);
    while (!abort_at_once && __atomic_load_n(&answered[0], __ATOMIC_SEQ_CST) < n)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) {
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    const Slot& s = slots[k.rank];
    EXPECT_EQ(s.result, ncclInvalidUsage) << "rank " << k.rank << ": " << s.message;
    EXPECT_TRUE(mentions(s.message, "mismatched calls")) << "rank " << k.rank << ": " << s.message;
    std::printf("[mismatch] %s, no checks, count, %s: rank %d -> %s after %.3f s: %s\n", transport ? transport : "shm",
                abort_at_once ? "abort at once" : "abort later", k.rank, ncclGetErrorString(ncclResult_t(s.result)),
                s.seconds, s.message);
  }
}

TEST(Mismatch, UncheckedSizeMismatchFailsEveryRankShm) {
  unchecked_size_mismatch(nullptr, true);
  unchecked_size_mismatch(nullptr, false);
}
TEST(Mismatch, UncheckedSizeMismatchFailsEveryRankSocket) {
  unchecked_size_mismatch("socket", true);
  unchecked_size_mismatch("socket", false);
}

// Without MESHCCL_CHECKS, large plans (no shared region here, as between
// hosts) check signatures alongside the data (free at that size): a datatype
// of the same width or a different root —
// which move the same bytes and would otherwise pass silently — fail on every
// rank. The communicator fails with them (data was in flight), so each case
// runs on its own communicator split from the first.
TEST(Mismatch, LargeCallsAreCheckedWithoutChecks) {
  set_timeout_env();
  const int n = 3, odd = 2;
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedSlots slots(2 * n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    if (ncclResult_t r = shared_id(sid, rank, &id); r != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", r);
    setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
    ncclComm_t world = nullptr, a = nullptr, b = nullptr;
    ncclResult_t res = ncclCommInitRank(&world, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    if ((res = ncclCommSplit(world, 0, rank, &a, nullptr)) != ncclSuccess) return fail(11, rank, "ncclCommSplit", res);
    if ((res = ncclCommSplit(world, 0, rank, &b, nullptr)) != ncclSuccess) return fail(11, rank, "ncclCommSplit", res);
    const size_t count = size_t{1} << 19;  // 2 MiB of 4-byte elements
    std::vector<float> buf(count, 1.0f);
    Slot& sa = slots[rank];
    sa.result = ncclAllReduce(buf.data(), buf.data(), count, rank == odd ? ncclInt32 : ncclFloat, ncclSum, a, nullptr);
    std::snprintf(sa.message, sizeof(sa.message), "%s", ncclGetLastError(nullptr));
    Slot& sb = slots[n + rank];
    sb.result = ncclBroadcast(buf.data(), buf.data(), count, ncclFloat, rank == odd ? 1 : 0, b, nullptr);
    std::snprintf(sb.message, sizeof(sb.message), "%s", ncclGetLastError(nullptr));
    ncclCommAbort(a);
    ncclCommAbort(b);
    res = ncclCommDestroy(world);
    if (res != ncclSuccess) return fail(12, rank, "ncclCommDestroy", res);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  const char* fields[2] = {"datatype", "root"};
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < n; ++r) {
      const Slot& s = slots[c * n + r];
      EXPECT_EQ(s.result, ncclInvalidUsage) << fields[c] << ", rank " << r << ": " << s.message;
      EXPECT_TRUE(mentions(s.message, fields[c])) << fields[c] << ", rank " << r << ": " << s.message;
      std::printf("[mismatch] large, no checks, %s: rank %d: %s\n", fields[c], r, s.message);
    }
}

// Without MESHCCL_CHECKS, every mismatched call fails on every rank with a
// message naming the difference, also small ones that move the same bytes
// (datatype of the same width, reduction op, root, AlltoAll against
// AllGather) and an empty call against a non-empty one, on every path: the
// direct algorithms (one host), plans on one host, and plans between two
// hosts. Before, only the direct algorithms caught these; plans returned
// success with wrong data (or, for the empty call, gave its rank the data of
// the next call). A mismatch fails the communicator, so each case runs on its
// own communicator split from the first.
const MismatchCase kSameBytesCases[] = {
    {"collective",
     [](ncclComm_t c, bool odd, std::vector<float>& in, std::vector<float>& out) {
       return odd ? ncclAlltoAll(in.data(), out.data(), 4, ncclFloat, c, nullptr)
                  : ncclAllGather(in.data(), out.data(), 4, ncclFloat, c, nullptr);
     }},
};

void default_mismatch(const char* transport, bool two_hosts, bool plans) {
  set_timeout_env();
  const int n = 3, odd = 2;
  std::vector<const MismatchCase*> cases;
  for (const MismatchCase& c : kMismatchCases) cases.push_back(&c);
  for (const MismatchCase& c : kSameBytesCases) cases.push_back(&c);
  const int ncases = int(cases.size());
  SharedArray<SharedId> sid(1);
  SharedArray<MismatchSlot> slots(n * ncases);
  auto kids = run_procs(n, 2 * kChildDeadline, [&](int rank) {
    use_transport(transport, two_hosts, rank);
    if (plans) setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t world = nullptr;
    if ((res = ncclCommInitRank(&world, n, id, rank)) != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> in(16, float(rank)), out(16 * n);
    for (int c = 0; c < ncases; ++c) {
      ncclComm_t comm = nullptr;
      if ((res = ncclCommSplit(world, 0, rank, &comm, nullptr)) != ncclSuccess) return fail(11, rank, "split", res);
      MismatchSlot& s = slots[c * n + rank];
      s.result = cases[c]->call(comm, rank == odd, in, out);
      // A rank whose call moved no data it waits for (a root, the empty
      // call) learns at its next call.
      if (s.result == ncclSuccess) s.result = allreduce_after(comm, rank, n);
      std::snprintf(s.message, sizeof(s.message), "%s", ncclGetLastError(nullptr));
      ncclCommAbort(comm);
    }
    res = ncclCommDestroy(world);
    if (res != ncclSuccess) return fail(12, rank, "ncclCommDestroy", res);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  for (int c = 0; c < ncases; ++c)
    for (int r = 0; r < n; ++r) {
      const MismatchSlot& s = slots[c * n + r];
      const char* field = cases[c]->field;
      EXPECT_EQ(s.result, ncclInvalidUsage) << "case " << field << ", rank " << r << ": " << s.message;
      EXPECT_TRUE(mentions(s.message, "mismatched")) << "case " << field << ", rank " << r << ": " << s.message;
      if (r == 0)
        std::printf("[mismatch] default, %s%s, %s: rank 0: %s\n", transport ? transport : "shm",
                    two_hosts ? ", two hosts"
                    : plans   ? ", plans"
                              : "",
                    field, s.message);
    }
}

TEST(Mismatch, DefaultCatchesEveryMismatchDirect) { default_mismatch(nullptr, false, false); }
TEST(Mismatch, DefaultCatchesEveryMismatchShmPlans) { default_mismatch(nullptr, false, true); }
TEST(Mismatch, DefaultCatchesEveryMismatchTwoHosts) { default_mismatch("socket", true, false); }

// ---------------------------------------------------------------------------
// (e) Stray connections to the bootstrap root.

struct RootAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
};

RootAddr decode_root(const ncclUniqueId& id) {
  meshccl::IdContents c;
  std::memcpy(&c, id.internal, sizeof(c));
  RootAddr a;
  EXPECT_EQ(c.magic, meshccl::kIdMagic);
  if (c.family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a.ss);
    s->sin_family = AF_INET;
    s->sin_port = c.port;
    std::memcpy(&s->sin_addr, c.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s->sin6_family = AF_INET6;
    s->sin6_port = c.port;
    std::memcpy(&s->sin6_addr, c.addr, 16);
    a.len = sizeof(sockaddr_in6);
  }
  return a;
}

int stray_connect(const RootAddr& a) {
  int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void send_garbage(int fd, size_t bytes) {
  std::vector<unsigned char> g(bytes);
  for (size_t i = 0; i < bytes; ++i) g[i] = static_cast<unsigned char>(i * 131 + 7);
  size_t off = 0;
  while (off < bytes) {
    ssize_t w = send(fd, g.data() + off, bytes - off, MSG_NOSIGNAL);
    if (w <= 0) break;
    off += size_t(w);
  }
}

// Two ranks as threads; returns the slower init's duration, or -1 on failure.
double init_two_ranks(const ncclUniqueId& id) {
  std::vector<double> secs(2, -1);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto t0 = Clock::now();
      ncclComm_t comm = nullptr;
      ncclResult_t res = ncclCommInitRank(&comm, 2, id, r);
      EXPECT_EQ(res, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(nullptr);
      if (res != ncclSuccess) return;
      float v = float(r + 1);
      EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
      EXPECT_EQ(v, 3.0f);
      secs[r] = since(t0);
      EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
    });
  for (auto& t : ts) t.join();
  return secs[0] < 0 || secs[1] < 0 ? -1 : std::max(secs[0], secs[1]);
}

TEST(StrayConnection, GarbageThenClose) {
  set_timeout_env();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  RootAddr a = decode_root(id);
  for (size_t bytes : {size_t(1), size_t(64), size_t(4096)}) {
    int fd = stray_connect(a);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    send_garbage(fd, bytes);
    close(fd);
  }
  double s = init_two_ranks(id);
  EXPECT_GE(s, 0);
  std::printf("[ stray  ] garbage+close: init+allreduce took %.3f s\n", s);
}

// Garbage larger than the greeting: rejected on content, while still open.
TEST(StrayConnection, LongGarbageHeldOpen) {
  set_timeout_env();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  int fd = stray_connect(decode_root(id));
  ASSERT_GE(fd, 0) << std::strerror(errno);
  send_garbage(fd, 4096);
  double s = init_two_ranks(id);
  close(fd);
  EXPECT_GE(s, 0);
  EXPECT_LT(s, kTimeout / 2);
  std::printf("[ stray  ] long garbage held open: init+allreduce took %.3f s\n", s);
}

// A peer that sends a few bytes and then goes quiet must not hold up the
// ranks that connect after it.
TEST(StrayConnection, ShortGarbageHeldOpen) {
  set_timeout_env();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  int fd = stray_connect(decode_root(id));
  ASSERT_GE(fd, 0) << std::strerror(errno);
  send_garbage(fd, 16);
  double s = init_two_ranks(id);
  close(fd);
  EXPECT_GE(s, 0);
  EXPECT_LT(s, kTimeout / 2);
  std::printf("[ stray  ] short garbage held open: init+allreduce took %.3f s\n", s);
}

// ---------------------------------------------------------------------------
// (d) Creating and destroying communicators leaves no descriptors, mappings
// or /dev/shm files behind.

std::set<std::string> dir_entries(const char* path) {
  std::set<std::string> out;
  DIR* d = opendir(path);
  if (d == nullptr) return out;
  while (dirent* e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.insert(e->d_name);
  closedir(d);
  return out;
}

std::string fd_target(const std::string& fd) {
  char buf[512];
  std::string link = "/proc/self/fd/" + fd;
  ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  return n < 0 ? std::string("?") : std::string(buf, size_t(n));
}

std::multiset<std::string> open_fds() {
  std::multiset<std::string> out;
  for (const auto& fd : dir_entries("/proc/self/fd")) out.insert(fd_target(fd));
  return out;
}

int memfd_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:meshccl") != std::string::npos) ++n;
  return n;
}

std::string diff(const std::multiset<std::string>& before, const std::multiset<std::string>& after) {
  std::string out;
  for (const auto& s : after)
    if (after.count(s) > before.count(s)) out += " +" + s;
  for (const auto& s : before)
    if (before.count(s) > after.count(s)) out += " -" + s;
  return out;
}

TEST(Leaks, InitAllReduceDestroyRounds) {
  set_timeout_env();
  // The directory listing itself holds a descriptor while it runs: both
  // samples include it.
  auto fds_before = open_fds();
  auto shm_before = dir_entries("/dev/shm");
  int maps_before = memfd_mappings();
  for (int round = 0; round < 3; ++round) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r)
      ts.emplace_back([&, r] {
        ncclComm_t comm = nullptr;
        ncclResult_t res = ncclCommInitRank(&comm, 3, id, r);
        EXPECT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
        if (res != ncclSuccess) return;
        std::vector<double> buf(100000, double(r));
        EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclDouble, ncclSum, comm, nullptr), ncclSuccess);
        EXPECT_EQ(buf[99999], 3.0);
        EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
      });
    for (auto& t : ts) t.join();
  }
  // The bootstrap root thread closes its sockets after it has answered the
  // ranks; give it a moment to finish.
  std::multiset<std::string> fds_after;
  for (int i = 0; i < 200; ++i) {
    fds_after = open_fds();
    if (fds_after.size() == fds_before.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(fds_after.size(), fds_before.size()) << "descriptors changed:" << diff(fds_before, fds_after);
  EXPECT_EQ(memfd_mappings(), maps_before);
  std::set<std::string> shm_after = dir_entries("/dev/shm");
  std::string new_shm;
  for (const auto& s : shm_after)
    if (!shm_before.count(s)) new_shm += " " + s;
  EXPECT_EQ(shm_after.size(), shm_before.size()) << "new in /dev/shm:" << new_shm;
  std::printf("[ leaks  ] fds %zu -> %zu, memfd mappings %d -> %d, /dev/shm %zu -> %zu\n", fds_before.size(),
              fds_after.size(), maps_before, memfd_mappings(), shm_before.size(), shm_after.size());
}

}  // namespace
