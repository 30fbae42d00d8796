// Point-to-point that NCCL completes, over the transport MESHCCL_TRANSPORT
// names (meson runs this once per transport): sends of up to
// MESHCCL_P2P_EAGER bytes complete without waiting for the matching receive,
// so ranks that each send to the other and then receive, outside a group,
// finish; a receiver gets the data while its sender does nothing; and a
// wait that runs out of time says so, naming the rank, the operation and
// the time, instead of blaming a peer that lives. Tagged point-to-point
// (meshcclSendTagged) matches by (peer, tag), whatever order the receiver
// posts in.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kChildDeadline = 60;

int64_t word(int rank, size_t i, size_t round) { return int64_t(rank) * 1000000007 + int64_t(i) * 3 + int64_t(round); }

// Every rank sends `bytes` to rank + shift and then receives from rank -
// shift, each call on its own (no group), NULL stream, and checks the data.
int send_then_recv(ncclComm_t comm, int n, int rank, int shift, size_t bytes, size_t round) {
  const int to = (rank + shift) % n, from = (rank + n - shift) % n;
  const size_t words = bytes / sizeof(int64_t);
  std::vector<int64_t> out(words), in(words, -1);
  for (size_t i = 0; i < words; ++i) out[i] = word(rank, i, round);
  ncclResult_t r = ncclSend(out.data(), words, ncclInt64, to, comm, nullptr);
  if (r != ncclSuccess) return fail(20, rank, "ncclSend", r);
  r = ncclRecv(in.data(), words, ncclInt64, from, comm, nullptr);
  if (r != ncclSuccess) return fail(21, rank, "ncclRecv", r);
  for (size_t i = 0; i < words; ++i)
    if (in[i] != word(from, i, round)) {
      std::fprintf(stderr, "rank %d: %zu bytes: word %zu = %lld\n", rank, bytes, i, static_cast<long long>(in[i]));
      return 22;
    }
  return 0;
}

void expect_all_ok(const std::vector<Child>& kids, int n) {
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
}

// The case: two ranks, each ncclSend to the other and then ncclRecv,
// from 8 bytes to the eager limit (4 MiB), the sizes between the transports'
// own eager sizes and their rendezvous included.
TEST(P2pEager, CrossingSendsCompleteUpToTheLimit) {
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    size_t round = 0;
    for (size_t bytes : {size_t{8}, size_t{64} << 10, size_t{128} << 10, size_t{1} << 20, size_t{4} << 20})
      if (int e = send_then_recv(comm, 2, rank, 1, bytes, round++)) return e;
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, 2);
}

// Three ranks around a ring, and a rank that sends to itself.
TEST(P2pEager, RingAndSelfComplete) {
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(3, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 3, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    if (int e = send_then_recv(comm, 3, rank, 1, size_t{1} << 20, 0)) return e;
    if (int e = send_then_recv(comm, 3, rank, 0, size_t{1} << 20, 1)) return e;  // to itself
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, 3);
}

// The sender's call returns and it makes no other call for a while: the data
// still reaches the receiver (nothing waits for the sender's next call).
TEST(P2pEager, ReceiverGetsDataWhileTheSenderIsIdle) {
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    const size_t words = (size_t{4} << 20) / sizeof(int64_t);
    std::vector<int64_t> buf(words, -1);
    if (rank == 0) {
      for (size_t i = 0; i < words; ++i) buf[i] = word(0, i, 7);
      ncclResult_t r = ncclSend(buf.data(), words, ncclInt64, 1, comm, nullptr);
      if (r != ncclSuccess) return fail(20, rank, "ncclSend", r);
      buf.assign(words, -2);  // the call returned: the buffer is the caller's again
      sleep(3);
    } else {
      usleep(200000);  // the receive is posted after the sender's call returned
      auto t0 = Clock::now();
      ncclResult_t r = ncclRecv(buf.data(), words, ncclInt64, 0, comm, nullptr);
      slots[1].seconds = since(t0);
      if (r != ncclSuccess) return fail(21, rank, "ncclRecv", r);
      for (size_t i = 0; i < words; ++i)
        if (buf[i] != word(0, i, 7)) return 22;
    }
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, 2);
  EXPECT_LT(slots[1].seconds, 2.0) << "the receive waited for the sender's next call";
}

// A receive whose send never comes, the sender alive: after MESHCCL_TIMEOUT
// the error says it timed out, which rank, which operation, how long.
TEST(P2pEager, TimeoutIsReportedAsATimeout) {
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    setenv("MESHCCL_TIMEOUT", "2", 1);
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    if (rank == 0) {
      sleep(5);
    } else {
      int64_t v = 0;
      slots[1].result = ncclRecv(&v, 1, ncclInt64, 0, comm, nullptr);
      std::snprintf(slots[1].message, sizeof(slots[1].message), "%s", ncclGetLastError(comm));
    }
    (void)ncclCommAbort(comm);
    return 0;
  });
  expect_all_ok(kids, 2);
  EXPECT_EQ(slots[1].result, ncclRemoteError);
  const std::string msg = slots[1].message;
  EXPECT_NE(msg.find("timed out: rank 1: Recv made no progress for 2 s (MESHCCL_TIMEOUT=2), waiting for rank 0"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("exited"), std::string::npos) << msg;
}

// A receive on a host stream fails on the stream's worker thread (the send is
// larger), while another thread of the process makes an error of its own:
// meshcclStreamSynchronize hands the failed operation's own text to its
// caller, and ncclGetLastError(NULL) there says what failed, not what the
// other thread did.
TEST(P2pEager, StreamFailureTextReachesTheSynchronizingThread) {
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<int64_t> buf(1000, 5);
    if (rank == 0) {
      usleep(300000);  // the receiver's call has returned by now
      ncclResult_t r = ncclSend(buf.data(), buf.size(), ncclInt64, 1, comm, nullptr);
      slots[0].result = r;
      usleep(1500000);
    } else {
      meshcclStream_t stream = nullptr;
      if (meshcclStreamCreate(&stream) != ncclSuccess) return 30;
      ncclResult_t r = ncclRecv(buf.data(), 10, ncclInt64, 0, comm, meshcclStreamAsCuda(stream));
      if (r != ncclSuccess) return fail(31, rank, "ncclRecv", r);
      usleep(800000);  // the receive failed on the stream's thread meanwhile
      std::thread other([] { (void)ncclAllReduce(nullptr, nullptr, 1, ncclInt8, ncclSum, nullptr, nullptr); });
      other.join();
      slots[1].result = meshcclStreamSynchronize(stream);
      std::snprintf(slots[1].message, sizeof(slots[1].message), "%s", ncclGetLastError(nullptr));
      (void)meshcclStreamDestroy(stream);
    }
    (void)ncclCommAbort(comm);
    return 0;
  });
  expect_all_ok(kids, 2);
  EXPECT_EQ(slots[1].result, ncclInvalidUsage) << slots[1].message;
  EXPECT_NE(std::string(slots[1].message).find("larger than the 80 bytes"), std::string::npos) << slots[1].message;
}

// meshcclSendTagged/meshcclRecvTagged: the receiver takes the messages in
// another order than they were sent, by tag; two messages of one tag stay in
// order; an untagged ncclSend between them keeps its own order. Then both
// ranks exchange two messages above the eager limit in a group, received in
// the reverse tag order. Bad arguments name the tagged function.
TEST(P2pTagged, MessagesMatchByTagInAnyOrder) {
  SharedArray<SharedId> sid(1);
  SharedSlots slots(2);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    struct Msg {
      int tag;  // -2: untagged ncclSend
      size_t words;
      size_t round;
    };
    const Msg sent[] = {{7, 100, 1}, {3, 20000, 2}, {-2, 50, 3}, {-1, 10, 4}, {7, 100, 5}};
    const int take[] = {3, 2, 0, 1, 4};  // the receiver's order, as indices into sent
    if (rank == 0) {
      for (const Msg& m : sent) {
        std::vector<int64_t> out(m.words);
        for (size_t i = 0; i < m.words; ++i) out[i] = word(0, i, m.round);
        ncclResult_t r = m.tag == -2 ? ncclSend(out.data(), m.words, ncclInt64, 1, comm, nullptr)
                                     : meshcclSendTagged(out.data(), m.words, ncclInt64, 1, m.tag, comm, nullptr);
        if (r != ncclSuccess) return fail(20, rank, "send", r);
      }
    } else {
      for (int k : take) {
        const Msg& m = sent[k];
        std::vector<int64_t> in(m.words, -1);
        ncclResult_t r = m.tag == -2 ? ncclRecv(in.data(), m.words, ncclInt64, 0, comm, nullptr)
                                     : meshcclRecvTagged(in.data(), m.words, ncclInt64, 0, m.tag, comm, nullptr);
        if (r != ncclSuccess) return fail(21, rank, "recv", r);
        for (size_t i = 0; i < m.words; ++i)
          if (in[i] != word(0, i, m.round)) {
            std::fprintf(stderr, "rank 1: tag %d: word %zu = %lld\n", m.tag, i, static_cast<long long>(in[i]));
            return 22;
          }
      }
    }
    // Above the eager limit, both directions, in groups: tags 11 and 12 sent
    // in that order, received as 12 then 11.
    const size_t words = (size_t{6} << 20) / sizeof(int64_t);
    const int peer = 1 - rank;
    std::vector<int64_t> a(words), b(words), ra(words, -1), rb(words, -1);
    for (size_t i = 0; i < words; ++i) {
      a[i] = word(rank, i, 11);
      b[i] = word(rank, i, 12);
    }
    ncclGroupStart();
    meshcclSendTagged(a.data(), words, ncclInt64, peer, 11, comm, nullptr);
    meshcclSendTagged(b.data(), words, ncclInt64, peer, 12, comm, nullptr);
    meshcclRecvTagged(rb.data(), words, ncclInt64, peer, 12, comm, nullptr);
    meshcclRecvTagged(ra.data(), words, ncclInt64, peer, 11, comm, nullptr);
    if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess) return fail(23, rank, "ncclGroupEnd", r);
    for (size_t i = 0; i < words; ++i)
      if (ra[i] != word(peer, i, 11) || rb[i] != word(peer, i, 12)) return 24;
    // A bad peer fails the call, naming the function; the communicator stays usable.
    slots[rank].result = meshcclSendTagged(a.data(), 1, ncclInt64, 5, 1, comm, nullptr);
    std::snprintf(slots[rank].message, sizeof(slots[rank].message), "%s", ncclGetLastError(comm));
    if (int e = send_then_recv(comm, 2, rank, 1, 64, 9)) return e;
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(slots[r].result, ncclInvalidArgument);
    EXPECT_NE(std::string(slots[r].message).find("meshcclSendTagged"), std::string::npos) << slots[r].message;
  }
}

}  // namespace
