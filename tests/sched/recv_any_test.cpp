// Receives from any source (meshcclRecvAnySource, meshcclRecvTaggedAnySource)
// over the transport MESHCCL_TRANSPORT names (meson runs this once per
// transport): every message is taken exactly once, a peer's messages in the
// order it sent them, whatever the senders race; receives from one peer,
// from any source and with tags mix; bad calls fail with a message and
// leave the communicator usable.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "meshccl.h"
#include "tests/common/procs.h"

namespace {

using namespace meshccl_test;

constexpr double kChildDeadline = 90;

// Word i of the seq-th message from rank `from`, and its first word (which
// names both, so that a receiver can tell where a message came from).
int64_t word(int from, size_t seq, size_t i) { return (int64_t(from) << 40) + (int64_t(seq) << 24) + int64_t(i); }

int send_msg(ncclComm_t comm, int rank, int to, size_t seq, size_t words, int tag) {
  std::vector<int64_t> out(words);
  for (size_t i = 0; i < words; ++i) out[i] = word(rank, seq, i);
  ncclResult_t r = tag < 0 ? ncclSend(out.data(), words, ncclInt64, to, comm, nullptr)
                           : meshcclSendTagged(out.data(), words, ncclInt64, to, tag, comm, nullptr);
  return r == ncclSuccess ? 0 : fail(20, rank, "send", r);
}

// Receives one message from any source; checks that it is the next one
// expected from its sender (next[sender]) and whole.
int recv_any(ncclComm_t comm, int rank, size_t words, int tag, std::vector<size_t>& next, int* from = nullptr) {
  std::vector<int64_t> in(words, -1);
  int src = -7;
  ncclResult_t r = tag < 0 ? meshcclRecvAnySource(in.data(), words, ncclInt64, &src, comm, nullptr)
                           : meshcclRecvTaggedAnySource(in.data(), words, ncclInt64, tag, &src, comm, nullptr);
  if (r != ncclSuccess) return fail(21, rank, "recv any source", r);
  if (src < 0 || src >= static_cast<int>(next.size()) || src == rank) {
    std::fprintf(stderr, "rank %d: source %d\n", rank, src);
    return 22;
  }
  const size_t seq = next[static_cast<size_t>(src)]++;
  for (size_t i = 0; i < words; ++i)
    if (in[i] != word(src, seq, i)) {
      std::fprintf(stderr, "rank %d: from %d message %zu word %zu = %llx\n", rank, src, seq, i,
                   static_cast<unsigned long long>(in[i]));
      return 23;
    }
  if (from != nullptr) *from = src;
  return 0;
}

void expect_all_ok(const std::vector<Child>& kids, int n) {
  ASSERT_EQ(kids.size(), size_t(n));
  for (auto& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k);
}

// PyTorch's test_send_recv_any_source: each rank in turn receives two
// messages from every other rank, from any source, while they send.
void each_receives_from_all(int n, size_t words) {
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, n, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<size_t> next(static_cast<size_t>(n), 0), sent(static_cast<size_t>(n), 0);
    for (int dst = 0; dst < n; ++dst) {
      if (dst != rank) {
        for (int k = 0; k < 2; ++k)
          if (int e = send_msg(comm, rank, dst, sent[static_cast<size_t>(dst)]++, words, -1)) return e;
        continue;
      }
      std::vector<int> got(static_cast<size_t>(n), 0);
      for (int k = 0; k < 2 * (n - 1); ++k) {
        int from = -1;
        if (int e = recv_any(comm, rank, words, -1, next, &from)) return e;
        ++got[static_cast<size_t>(from)];
      }
      for (int p = 0; p < n; ++p)
        if (p != rank && got[static_cast<size_t>(p)] != 2) return 24;
    }
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, n);
}

TEST(RecvAny, TwoRanks) { each_receives_from_all(2, 10); }
TEST(RecvAny, ThreeRanks) { each_receives_from_all(3, 10); }
TEST(RecvAny, ThreeRanksLarge) { each_receives_from_all(3, (size_t{6} << 20) / sizeof(int64_t)); }

// A rank that destroys its communicator and exits fails none of the others'
// traffic that does not involve it: rank 0 leaves at once, and rank 2 waits
// (past the 100 ms after which a stalled operation looks for dead peers) for
// messages rank 1 sends late: from rank 1, then from any source. Before,
// rank 0's death failed both receives ("peer rank 0 has exited").
TEST(RecvAny, PeerThatLeftFailsNoTrafficWithoutIt) {
  constexpr int n = 3;
  constexpr size_t words = 1000;
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, n, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    int64_t token = 0;
    if (ncclAllReduce(&token, &token, 1, ncclInt64, ncclSum, comm, nullptr) != ncclSuccess) return 26;
    if (rank == 0) {
      ncclResult_t r = ncclCommDestroy(comm);
      return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
    }
    std::vector<size_t> next(n, 0);
    for (size_t seq = 0; seq < 2; ++seq) {
      if (rank == 1) {
        usleep(400 * 1000);
        if (int e = send_msg(comm, rank, 2, seq, words, -1)) return e;
      } else if (seq == 0) {
        std::vector<int64_t> in(words, -1);
        if (ncclResult_t r = ncclRecv(in.data(), words, ncclInt64, 1, comm, nullptr); r != ncclSuccess)
          return fail(21, rank, "recv", r);
        if (in[words - 1] != word(1, seq, words - 1)) return 23;
        ++next[1];
      } else if (int e = recv_any(comm, rank, words, -1, next)) {
        return e;
      }
    }
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, n);
}

// Three senders race, each sending rank 0 a run of messages, which it takes
// all from any source: none lost, none twice, each sender's in order
// (recv_any checks). A run for each size: eager, in chunks, above the eager
// limit (all messages of a run have one size: a receive from any source
// must fit whichever message it takes).
TEST(RecvAny, RacingSendersLoseNothing) {
  constexpr int n = 4;
  struct Run {
    size_t msgs, words;
  };
  const Run runs[] = {{40, 3}, {10, 40000}, {3, (size_t{5} << 20) / 8}};
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, n, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<size_t> next(n, 0);
    size_t seq = 0;
    for (const Run& run : runs) {
      if (rank != 0) {
        for (size_t s = 0; s < run.msgs; ++s)
          if (int e = send_msg(comm, rank, 0, seq++, run.words, -1)) return e;
      } else {
        for (size_t s = 0; s < run.msgs * (n - 1); ++s)
          if (int e = recv_any(comm, rank, run.words, -1, next)) return e;
        seq += run.msgs;
        for (int p = 1; p < n; ++p)
          if (next[static_cast<size_t>(p)] != seq) return 25;
      }
      int64_t token = 0;
      if (ncclAllReduce(&token, &token, 1, ncclInt64, ncclSum, comm, nullptr) != ncclSuccess) return 26;
    }
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, n);
}

// Tags keep their own orders: any-source receives of one tag never take a
// message of another tag or an untagged one, and mix with receives from one
// peer (which take their message when called, before a later any-source
// receive looks). A receive on a host stream sets its source by the time the
// stream is synchronized.
TEST(RecvAny, TagsAndDirectedReceivesMix) {
  constexpr int n = 3;
  SharedArray<SharedId> sid(1);
  auto kids = run_procs(n, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, n, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    if (rank == 1) {
      // seq numbers count per (tag) stream of this sender: tag 5: 0, 1; untagged: 0; tag 6: 0.
      if (int e = send_msg(comm, rank, 0, 0, 100, 5)) return e;
      if (int e = send_msg(comm, rank, 0, 0, 50, -1)) return e;
      if (int e = send_msg(comm, rank, 0, 1, 100, 5)) return e;
      if (int e = send_msg(comm, rank, 0, 0, 70, 6)) return e;
    } else if (rank == 2) {
      if (int e = send_msg(comm, rank, 0, 0, 30, 9)) return e;
    } else {
      usleep(200000);  // everything has arrived: the receives choose by tag only
      std::vector<size_t> t5(n, 0), t6(n, 0), untagged(n, 0), t9(n, 0);
      int from = -1;
      if (int e = recv_any(comm, rank, 70, 6, t6, &from); e != 0 || from != 1) return 30 + e;
      if (int e = recv_any(comm, rank, 50, -1, untagged, &from); e != 0 || from != 1) return 31 + e;
      std::vector<int64_t> in(100, -1);
      if (meshcclRecvTagged(in.data(), 100, ncclInt64, 1, 5, comm, nullptr) != ncclSuccess) return 32;
      if (in[0] != word(1, 0, 0) || in[99] != word(1, 0, 99)) return 33;
      t5[1] = 1;  // the directed receive took the first
      if (int e = recv_any(comm, rank, 100, 5, t5, &from); e != 0 || from != 1) return 34 + e;
      meshcclStream_t stream = nullptr;
      if (meshcclStreamCreate(&stream) != ncclSuccess) return 35;
      std::vector<int64_t> in9(30, -1);
      int src = -1;
      if (meshcclRecvTaggedAnySource(in9.data(), 30, ncclInt64, 9, &src, comm, meshcclStreamAsCuda(stream)) !=
          ncclSuccess)
        return 36;
      if (meshcclStreamSynchronize(stream) != ncclSuccess || src != 2 || in9[29] != word(2, 0, 29)) return 37;
      (void)meshcclStreamDestroy(stream);
    }
    ncclResult_t r = ncclCommDestroy(comm);
    return r == ncclSuccess ? 0 : fail(11, rank, "ncclCommDestroy", r);
  });
  expect_all_ok(kids, n);
}

// Bad calls fail at once with a message naming the function, and the
// communicator goes on; a message larger than its receive fails the receive
// with ncclInvalidUsage, saying so.
TEST(RecvAny, BadCallsAndWrongSizeSayWhy) {
  SharedArray<SharedId> sid(1);
  SharedSlots slots(4);
  auto kids = run_procs(2, kChildDeadline, [&](int rank) {
    ncclComm_t comm = nullptr;
    if (ncclResult_t r = shared_init(sid, 2, rank, &comm); r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<int64_t> buf(100, 0);
    if (rank == 0) {
      int src = 0;
      slots[0].result = meshcclRecvAnySource(buf.data(), 10, ncclInt64, nullptr, comm, nullptr);
      std::snprintf(slots[0].message, sizeof(slots[0].message), "%s", ncclGetLastError(comm));
      ncclGroupStart();
      slots[1].result = meshcclRecvTaggedAnySource(buf.data(), 10, ncclInt64, 3, &src, comm, nullptr);
      std::snprintf(slots[1].message, sizeof(slots[1].message), "%s", ncclGetLastError(comm));
      (void)ncclGroupEnd();
      src = 5;
      if (meshcclRecvAnySource(buf.data(), 0, ncclInt64, &src, comm, nullptr) != ncclSuccess || src != -1) return 40;
      // Still usable: a message from rank 1 is received.
      std::vector<size_t> next(2, 0);
      if (int e = recv_any(comm, rank, 20, -1, next)) return e;
      slots[2].result = meshcclRecvAnySource(buf.data(), 10, ncclInt64, &src, comm, nullptr);  // 80 of 800 bytes
      std::snprintf(slots[2].message, sizeof(slots[2].message), "%s", ncclGetLastError(comm));
    } else {
      if (int e = send_msg(comm, rank, 0, 0, 20, -1)) return e;
      slots[3].result = ncclSend(buf.data(), 100, ncclInt64, 0, comm, nullptr);
    }
    usleep(300000);
    (void)ncclCommAbort(comm);
    return 0;
  });
  expect_all_ok(kids, 2);
  EXPECT_EQ(slots[0].result, ncclInvalidArgument);
  EXPECT_NE(std::string(slots[0].message).find("meshcclRecvAnySource : source is NULL"), std::string::npos)
      << slots[0].message;
  EXPECT_EQ(slots[1].result, ncclInvalidUsage);
  EXPECT_NE(std::string(slots[1].message).find("not allowed inside a group"), std::string::npos) << slots[1].message;
  EXPECT_EQ(slots[2].result, ncclInvalidUsage) << slots[2].message;
  EXPECT_NE(std::string(slots[2].message).find("larger than the 80 bytes"), std::string::npos) << slots[2].message;
}

}  // namespace
