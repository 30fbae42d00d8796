// ncclCommShrink: ranks (forked processes) are SIGKILLed in the middle of a
// stream of collectives; the survivors see an error, shrink with
// NCCL_SHRINK_ABORT, and the shrunk communicator computes correct results.
// Also: NCCL_SHRINK_DEFAULT on a healthy communicator, and the bad calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kChildDeadline = 60;  // MESHCCL_TIMEOUT is 10 (meson.build)

struct Report {
  int ops_before = -1;  // collectives that completed (and were checked) on the parent
  int error = -1;       // what the failing collective returned
  int shrink = -1;      // ncclCommShrink's result
  int new_rank = -1, new_size = -1;
  char message[200] = {};
};

bool is_peer_failure(int r) { return r == ncclRemoteError || r == ncclSystemError || r == ncclInvalidUsage; }

// Each rank contributes rank-dependent values; checks every element.
template <class T>
int allreduce_check(ncclComm_t comm, int rank, int nranks, size_t count, ncclDataType_t dt, bool in_place,
                    const std::vector<int>& value_ranks, int code) {
  std::vector<T> send(count), recv(count, T(-1));
  for (size_t i = 0; i < count; ++i) send[i] = T((value_ranks[rank] + 1) * (i % 97 + 1));
  T* out = in_place ? send.data() : recv.data();
  ncclResult_t res = ncclAllReduce(send.data(), out, count, dt, ncclSum, comm, nullptr);
  if (res != ncclSuccess) return res == ncclSuccess ? 0 : -static_cast<int>(res);
  T per = 0;
  for (int r = 0; r < nranks; ++r) per += T(value_ranks[r] + 1);
  for (size_t i = 0; i < count; ++i)
    if (out[i] != per * T(i % 97 + 1)) {
      std::fprintf(stderr, "rank %d: allreduce[%zu] of %zu = %g, want %g\n", rank, i, count, double(out[i]),
                   double(per * T(i % 97 + 1)));
      return code;
    }
  return 0;
}

// The shrunk communicator: allreduce (sizes, in/out of place, two dtypes),
// broadcast, a send/recv ring. `old_ranks[i]` is the parent rank of child
// rank i, so values name the processes, not positions.
int check_comm(ncclComm_t comm, int rank, int nranks, const std::vector<int>& old_ranks) {
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1031), size_t(65537), size_t(300007)}) {
    int rc = allreduce_check<float>(comm, rank, nranks, count, ncclFloat, count % 2 == 1, old_ranks, 40);
    if (rc != 0) return rc < 0 ? fail(41, rank, "child ncclAllReduce float", ncclResult_t(-rc)) : rc;
    rc = allreduce_check<int64_t>(comm, rank, nranks, count, ncclInt64, count % 2 == 0, old_ranks, 42);
    if (rc != 0) return rc < 0 ? fail(43, rank, "child ncclAllReduce int64", ncclResult_t(-rc)) : rc;
  }
  const int root = nranks - 1;
  std::vector<int32_t> bc(100003);
  for (size_t i = 0; i < bc.size(); ++i) bc[i] = rank == root ? int32_t(i * 3 + old_ranks[root]) : -1;
  ncclResult_t res = ncclBroadcast(bc.data(), bc.data(), bc.size(), ncclInt32, root, comm, nullptr);
  if (res != ncclSuccess) return fail(44, rank, "child ncclBroadcast", res);
  for (size_t i = 0; i < bc.size(); ++i)
    if (bc[i] != int32_t(i * 3 + old_ranks[root])) return 45;
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  std::vector<int32_t> out(20011), in(20011, -1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(old_ranks[rank] * 1000003 + i);
  if ((res = ncclGroupStart()) != ncclSuccess) return fail(46, rank, "ncclGroupStart", res);
  ncclResult_t rs = ncclSend(out.data(), out.size(), ncclInt32, next, comm, nullptr);
  ncclResult_t rr = ncclRecv(in.data(), in.size(), ncclInt32, prev, comm, nullptr);
  res = ncclGroupEnd();
  if (rs != ncclSuccess || rr != ncclSuccess || res != ncclSuccess) return fail(47, rank, "child send/recv", res);
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != int32_t(old_ranks[prev] * 1000003 + i)) return 48;
  return 0;
}

struct KillCase {
  const char* name;
  int nranks;
  std::vector<int> victims;
  const char* transport;  // MESHCCL_TRANSPORT, or nullptr
  bool hosts;             // MESHCCL_HOSTID: two ranks per host (socket between hosts)
  bool plans;             // MESHCCL_DIRECT_SLOT_BYTES=0: plans on one host
};

void PrintTo(const KillCase& c, std::ostream* os) { *os << c.name; }

class ShrinkAfterKill : public ::testing::TestWithParam<KillCase> {};

// Survivors run collectives of varying sizes until one fails (a victim
// killed itself at a random moment inside the stream), then shrink.
TEST_P(ShrinkAfterKill, SurvivorsComputeCorrectly) {
  const KillCase& kc = GetParam();
  const int n = kc.nranks;
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedArray<Report> reports(n);
  const unsigned seed = static_cast<unsigned>(std::random_device{}());
  std::vector<int> survivors;
  for (int r = 0; r < n; ++r)
    if (std::find(kc.victims.begin(), kc.victims.end(), r) == kc.victims.end()) survivors.push_back(r);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    if (kc.transport) setenv("MESHCCL_TRANSPORT", kc.transport, 1);
    if (kc.hosts) setenv("MESHCCL_HOSTID", ("host" + std::to_string(rank / 2)).c_str(), 1);
    if (kc.plans) setenv("MESHCCL_DIRECT_SLOT_BYTES", "0", 1);
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    const bool victim = std::find(kc.victims.begin(), kc.victims.end(), rank) != kc.victims.end();
    if (victim) {
      // Dies at a random moment, most likely inside a collective.
      std::thread([seed, rank] {
        std::mt19937 rng(seed + static_cast<unsigned>(rank));
        std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 60000));
        raise(SIGKILL);
      }).detach();
    }
    std::vector<int> identity(n);
    for (int r = 0; r < n; ++r) identity[r] = r;
    Report& rep = reports[rank];
    rep.ops_before = 0;
    const size_t sizes[] = {1, 4099, 65537, 17, 250007};
    int rc = 0;
    for (int it = 0; it < 200000 && rc == 0; ++it) {
      rc = allreduce_check<float>(comm, rank, n, sizes[it % 5], ncclFloat, it % 2 == 0, identity, 20);
      if (rc == 0) ++rep.ops_before;
    }
    if (rc > 0) return rc;  // a wrong answer before the failure
    // A victim whose peer died first may see the error before its own kill
    // comes (notices travel fast): it waits for it.
    for (int i = 0; victim && i < 1000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (victim) return 21;  // never reached: the victim is killed
    rep.error = -rc;
    std::snprintf(rep.message, sizeof(rep.message), "%s", ncclGetLastError(nullptr));
    ncclComm_t child = nullptr;
    std::vector<int> excl = kc.victims;
    res = ncclCommShrink(comm, excl.data(), static_cast<int>(excl.size()), &child, nullptr, NCCL_SHRINK_ABORT);
    rep.shrink = res;
    if (res != ncclSuccess) return fail(30, rank, "ncclCommShrink", res);
    if (ncclCommUserRank(child, &rep.new_rank) != ncclSuccess || ncclCommCount(child, &rep.new_size) != ncclSuccess)
      return 31;
    std::vector<int> old_ranks;
    for (int r = 0; r < n; ++r)
      if (std::find(excl.begin(), excl.end(), r) == excl.end()) old_ranks.push_back(r);
    rc = check_comm(child, rep.new_rank, rep.new_size, old_ranks);
    if (rc != 0) return rc;
    if ((res = ncclCommAbort(comm)) != ncclSuccess) return fail(32, rank, "parent ncclCommAbort", res);
    if ((res = ncclCommDestroy(child)) != ncclSuccess) return fail(33, rank, "child ncclCommDestroy", res);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  for (const Child& k : kids) {
    const bool victim = std::find(kc.victims.begin(), kc.victims.end(), k.rank) != kc.victims.end();
    if (victim) {
      EXPECT_TRUE(!k.killed_at_deadline && WIFSIGNALED(k.status) && WTERMSIG(k.status) == SIGKILL) << describe(k);
      continue;
    }
    const Report& rep = reports[k.rank];
    EXPECT_TRUE(exited_ok(k)) << describe(k) << " shrink " << rep.shrink;
    EXPECT_TRUE(is_peer_failure(rep.error)) << "rank " << k.rank << " failing collective returned " << rep.error;
    const int want_rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), k.rank) - survivors.begin());
    EXPECT_EQ(rep.new_rank, want_rank) << "rank " << k.rank;
    EXPECT_EQ(rep.new_size, static_cast<int>(survivors.size())) << "rank " << k.rank;
    std::printf("[ shrink ] %s: rank %d: %d collectives, then %s (%s); child rank %d of %d\n", kc.name, k.rank,
                rep.ops_before, ncclGetErrorString(ncclResult_t(rep.error)), rep.message, rep.new_rank, rep.new_size);
  }
}

INSTANTIATE_TEST_SUITE_P(Kill, ShrinkAfterKill,
                         ::testing::Values(KillCase{"n3_shm_direct", 3, {1}, nullptr, false, false},
                                           KillCase{"n4_shm_plans", 4, {0}, nullptr, false, true},
                                           KillCase{"n5_socket_two", 5, {1, 4}, "socket", false, false},
                                           KillCase{"n6_hosts", 6, {2}, nullptr, true, false},
                                           KillCase{"n8_shm_three", 8, {0, 3, 7}, nullptr, false, false},
                                           KillCase{"n7_socket_plans", 7, {6}, "socket", false, true}),
                         [](const ::testing::TestParamInfo<KillCase>& info) { return std::string(info.param.name); });

// An operation that fails returns while its send may still be waiting for
// the receiver. The caller then owns its buffer again (here it overwrites
// it), so the receiver must never take the overwritten bytes as the message:
// it gets an error (the sender withdrew the send when its operation failed),
// or the message as it was when it was sent.
struct Withdrawn {
  volatile int sender_returned = 0;
  int send_result = -1;
  int recv_result = -1;
  int recv_wrong = -1;  // elements of the received message that are not what was sent
  char message[200] = {};
};

TEST(FailedOperation, PeerNeverTakesAReturnedBuffer) {
  const int n = 3;                       // rank 0 sends to rank 1 and receives from rank 2, which dies
  const size_t count = size_t(1) << 20;  // 4 MiB: over the transports' eager limits
  SharedArray<SharedId> sid(1);
  SharedArray<Withdrawn> w(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_P2P_EAGER", "0", 1);  // the send waits for its receive, reading the caller's buffer
    ncclComm_t comm = nullptr;
    ncclResult_t res = shared_init(sid, n, rank, &comm);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    if (rank == 2) raise(SIGKILL);
    std::vector<int32_t> buf(count);
    if (rank == 0) {
      for (size_t i = 0; i < count; ++i) buf[i] = int32_t(i * 7 + 1);
      std::vector<int32_t> from2(16);
      ncclGroupStart();
      ncclSend(buf.data(), count, ncclInt32, 1, comm, nullptr);
      ncclRecv(from2.data(), from2.size(), ncclInt32, 2, comm, nullptr);
      w[0].send_result = ncclGroupEnd();
      std::fill(buf.begin(), buf.end(), int32_t(-7));  // the caller's buffer is its own again
      __atomic_store_n(&w[0].sender_returned, 1, __ATOMIC_RELEASE);
      for (int i = 0; i < 3000 && w[0].recv_result < 0; ++i) usleep(10000);
      ncclCommAbort(comm);
      return 0;
    }
    for (int i = 0; i < 3000 && __atomic_load_n(&w[0].sender_returned, __ATOMIC_ACQUIRE) == 0; ++i) usleep(10000);
    std::fill(buf.begin(), buf.end(), int32_t(-1));
    res = ncclRecv(buf.data(), count, ncclInt32, 0, comm, nullptr);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += buf[i] != int32_t(i * 7 + 1) ? 1 : 0;
    w[0].recv_wrong = wrong;
    std::snprintf(w[0].message, sizeof(w[0].message), "%s", ncclGetLastError(comm));
    __atomic_store_n(&w[0].recv_result, int(res), __ATOMIC_RELEASE);
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(n));
  EXPECT_TRUE(exited_ok(kids[0])) << describe(kids[0]);
  EXPECT_TRUE(exited_ok(kids[1])) << describe(kids[1]);
  EXPECT_TRUE(is_peer_failure(w[0].send_result)) << "the sender's group returned " << w[0].send_result;
  // Success only with the message as sent.
  if (w[0].recv_result == ncclSuccess) {
    EXPECT_EQ(w[0].recv_wrong, 0) << "the receive succeeded with bytes the sender wrote after its call returned";
  } else {
    EXPECT_TRUE(is_peer_failure(w[0].recv_result)) << "the receive returned " << w[0].recv_result;
  }
  std::printf("[ withdrawn ] receive: %s (%s)\n", ncclGetErrorString(ncclResult_t(w[0].recv_result)), w[0].message);
}

// A live peer that aborts its communicator while this rank waits for it in
// a collective (on one host: the direct shared-memory rounds, where no
// connection closes) ends the wait with an error naming it, not at
// MESHCCL_TIMEOUT.
TEST(FailedOperation, PeerThatAbortsEndsTheWait) {
  SharedArray<SharedId> sid(1);
  SharedArray<Withdrawn> w(1);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    ncclResult_t res = shared_init(sid, 2, rank, &comm);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    if (rank == 1) {
      usleep(200000);  // rank 0 waits in its AllReduce by then
      if ((res = ncclCommAbort(comm)) != ncclSuccess) return fail(11, rank, "ncclCommAbort", res);
      // Alive until rank 0 is done: only the abort can tell rank 0.
      for (int i = 0; i < 3000 && __atomic_load_n(&w[0].recv_result, __ATOMIC_ACQUIRE) < 0; ++i) usleep(10000);
      return 0;
    }
    std::vector<float> buf(256, 1.0f);
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    std::snprintf(w[0].message, sizeof(w[0].message), "%s", ncclGetLastError(comm));
    __atomic_store_n(&w[0].recv_result, int(res), __ATOMIC_RELEASE);
    ncclCommAbort(comm);
    return 0;
  });
  ASSERT_EQ(kids.size(), size_t(2));
  for (const Child& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
  EXPECT_EQ(w[0].recv_result, ncclRemoteError) << w[0].message;
  EXPECT_EQ(std::string(w[0].message).find("timed out"), std::string::npos) << w[0].message;
  std::printf("[ aborted peer ] %s\n", w[0].message);
}

// NCCL_SHRINK_DEFAULT on a healthy communicator: the excluded ranks (alive)
// do not call it; the parent stays usable by the survivors afterwards for
// nothing collective (its excluded members have left), and both are freed.
TEST(Shrink, DefaultOnHealthyCommunicator) {
  const int n = 5;
  const std::vector<int> excl = {1, 3};
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedArray<Report> reports(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<int> identity = {0, 1, 2, 3, 4};
    int rc = allreduce_check<float>(comm, rank, n, 1000, ncclFloat, false, identity, 11);
    if (rc != 0) return rc < 0 ? fail(12, rank, "ncclAllReduce", ncclResult_t(-rc)) : rc;
    if (std::find(excl.begin(), excl.end(), rank) != excl.end()) {
      res = ncclCommDestroy(comm);
      return res == ncclSuccess ? 0 : fail(13, rank, "excluded ncclCommDestroy", res);
    }
    ncclComm_t child = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    res = ncclCommShrink(comm, const_cast<int*>(excl.data()), 2, &child, &cfg, NCCL_SHRINK_DEFAULT);
    reports[rank].shrink = res;
    if (res != ncclSuccess) return fail(14, rank, "ncclCommShrink", res);
    ncclCommUserRank(child, &reports[rank].new_rank);
    ncclCommCount(child, &reports[rank].new_size);
    rc = check_comm(child, reports[rank].new_rank, reports[rank].new_size, {0, 2, 4});
    if (rc != 0) return rc;
    if ((res = ncclCommDestroy(child)) != ncclSuccess) return fail(15, rank, "child ncclCommDestroy", res);
    if ((res = ncclCommDestroy(comm)) != ncclSuccess) return fail(16, rank, "parent ncclCommDestroy", res);
    return 0;
  });
  for (const Child& k : kids) {
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    if (k.rank % 2 == 0) {
      EXPECT_EQ(reports[k.rank].new_rank, k.rank / 2);
      EXPECT_EQ(reports[k.rank].new_size, 3);
    }
  }
}

// Bad calls: clear errors, no communicator made, nothing sent.
TEST(Shrink, BadArguments) {
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedArray<Report> reports(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, 2, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    ncclComm_t child = reinterpret_cast<ncclComm_t>(0x1);
    int self = rank, out = 2, neg = -1, other = 1 - rank;
    int both[2] = {0, 1}, twice[2] = {other, other};
    if (ncclCommShrink(comm, &self, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 11;
    if (child != nullptr) return 12;
    if (ncclCommShrink(comm, &out, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 13;
    if (ncclCommShrink(comm, &neg, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 14;
    if (ncclCommShrink(comm, both, 2, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 15;
    if (ncclCommShrink(comm, twice, 2, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 16;
    if (ncclCommShrink(comm, nullptr, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 17;
    if (ncclCommShrink(comm, &other, 1, &child, nullptr, 7) != ncclInvalidArgument) return 18;
    if (ncclCommShrink(comm, &other, 1, nullptr, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidArgument) return 19;
    if (ncclCommShrink(nullptr, &other, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) == ncclSuccess) return 20;
    // Nothing excluded: a copy of the communicator, which works.
    res = ncclCommShrink(comm, nullptr, 0, &child, nullptr, NCCL_SHRINK_DEFAULT);
    if (res != ncclSuccess) return fail(21, rank, "ncclCommShrink of nothing", res);
    int rc = check_comm(child, rank, 2, {0, 1});
    if (rc != 0) return rc;
    if (ncclCommDestroy(child) != ncclSuccess || ncclCommDestroy(comm) != ncclSuccess) return 22;
    return 0;
  });
  for (const Child& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
}

// A failed communicator cannot be shrunk with NCCL_SHRINK_DEFAULT; survivors
// told different exclude lists fail with ncclInvalidUsage, not a hang.
TEST(Shrink, DefaultAfterFailureAndDisagreement) {
  const int n = 4;
  SharedArray<SharedId> sid(1);  // made by rank 0 after the fork (procs.h)
  SharedArray<Report> reports(n);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclUniqueId id;
    ncclResult_t res = shared_id(sid, rank, &id);
    if (res != ncclSuccess) return fail(9, rank, "ncclGetUniqueId", res);
    ncclComm_t comm = nullptr;
    res = ncclCommInitRank(&comm, n, id, rank);
    if (res != ncclSuccess) return fail(10, rank, "ncclCommInitRank", res);
    std::vector<float> buf(1000, 1.0f);
    if (ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) return 11;
    if (rank == 3) raise(SIGKILL);
    res = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    if (!is_peer_failure(res)) return 12;
    ncclComm_t child = nullptr;
    int dead = 3;
    if (ncclCommShrink(comm, &dead, 1, &child, nullptr, NCCL_SHRINK_DEFAULT) != ncclInvalidUsage) return 13;
    // Rank 2 believes rank 1 is the one to drop; 0 and 1 drop rank 3.
    int wrong[2] = {1, 3};
    if (rank == 2) res = ncclCommShrink(comm, wrong, 2, &child, nullptr, NCCL_SHRINK_ABORT);
    else res = ncclCommShrink(comm, &dead, 1, &child, nullptr, NCCL_SHRINK_ABORT);
    reports[rank].shrink = res;
    std::snprintf(reports[rank].message, sizeof(reports[rank].message), "%s", ncclGetLastError(nullptr));
    if (res == ncclSuccess) ncclCommAbort(child);
    ncclCommAbort(comm);
    return 0;
  });
  for (const Child& k : kids) {
    if (k.rank == 3) continue;
    EXPECT_TRUE(exited_ok(k)) << describe(k);
    // Rank 0 sees rank 2's record disagree; rank 1 may instead lose rank 0
    // when it gives up; neither succeeds and none hangs.
    EXPECT_NE(reports[k.rank].shrink, ncclSuccess) << "rank " << k.rank;
    if (k.rank == 2) EXPECT_EQ(reports[k.rank].shrink, ncclInvalidUsage) << reports[k.rank].message;
    std::printf("[ disagree ] rank %d: %s: %s\n", k.rank, ncclGetErrorString(ncclResult_t(reports[k.rank].shrink)),
                reports[k.rank].message);
  }
}

}  // namespace
