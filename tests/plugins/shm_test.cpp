// shm-specific behaviour: the three ways a rendezvous reads the sender's
// memory (same process, a mapped shared region, process_vm_readv) and the
// streamed fallback, ring wrap-around, handle validation, settings.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "plugins/builtin.h"
#include "plugins/shm/shm_comm.h"
#include "tests/plugins/test_host.h"

namespace meshccl::test {
namespace {

const meshccl_transport_v1_t* const t = &meshccl_transport_shm;
constexpr size_t kMiB = 1u << 20;

struct Pair {
  void* sctx = nullptr;
  void* rctx = nullptr;
  void* scomm = nullptr;
  void* rcomm = nullptr;
  bool open() {
    return t->init(test_host(), &sctx) == 0 && t->init(test_host(), &rctx) == 0 &&
           connect_pair(t, sctx, rctx, &scomm, &rcomm) == 0;
  }
  ~Pair() {
    if (scomm != nullptr) t->close_send(scomm);
    if (rcomm != nullptr) t->close_recv(rcomm);
    if (sctx != nullptr) t->finalize(sctx);
    if (rctx != nullptr) t->finalize(rctx);
  }
};

// The child sends `sizes` (content seeded by index) from `src` buffers made by
// make_src, all at once or each after the previous completed; the parent
// receives and checks them. Returns the child's status.
int ReceiveFromChild(const std::vector<size_t>& sizes, const std::function<unsigned char*(size_t)>& make_src,
                     bool one_at_a_time = false) {
  Child child = spawn([&](int fd) -> int {
    void* ctx = nullptr;
    CHILD_CHECK(t->init(test_host(), &ctx) == MESHCCL_T_SUCCESS);
    void* scomm = nullptr;
    CHILD_CHECK(connect_peer(t, ctx, fd, &scomm) == MESHCCL_T_SUCCESS);
    std::vector<void*> reqs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      unsigned char* src = make_src(sizes[k]);
      fill(src, sizes[k], k);
      void* s = nullptr;
      CHILD_CHECK(t->isend(scomm, src, sizes[k], k % 2, nullptr, &s) == MESHCCL_T_SUCCESS);
      if (one_at_a_time) CHILD_CHECK(wait_request(t, s) == MESHCCL_T_SUCCESS);
      else reqs.push_back(s);
    }
    std::vector<int> res;
    CHILD_CHECK(wait_all(t, reqs, &res));
    for (int r : res) CHILD_CHECK(r == MESHCCL_T_SUCCESS);
    CHILD_CHECK(t->close_send(scomm) == MESHCCL_T_SUCCESS);
    CHILD_CHECK(t->finalize(ctx) == MESHCCL_T_SUCCESS);
    return 0;
  });
  void* ctx = nullptr;
  EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  void* rcomm = nullptr;
  EXPECT_EQ(accept_peer(t, ctx, child.fd, &rcomm), MESHCCL_T_SUCCESS);
  std::vector<std::vector<unsigned char>> dst;
  std::vector<void*> reqs;
  for (size_t k = 0; k < sizes.size(); ++k) {
    dst.emplace_back(sizes[k]);
    void* r = nullptr;
    EXPECT_EQ(t->irecv(rcomm, dst.back().data(), sizes[k], k % 2, nullptr, &r), MESHCCL_T_SUCCESS);
    reqs.push_back(r);
  }
  std::vector<int> res;
  EXPECT_TRUE(wait_all(t, reqs, &res));
  for (size_t k = 0; k < sizes.size(); ++k) {
    EXPECT_EQ(res[k], MESHCCL_T_SUCCESS) << "message " << k;
    EXPECT_EQ(check(dst[k].data(), sizes[k], k), SIZE_MAX) << "message " << k;
  }
  t->close_recv(rcomm);
  t->finalize(ctx);
  return reap(child);
}

TEST(Shm, RendezvousWithProcessVmReadv) {
  clear_log();
  std::vector<std::vector<unsigned char>> keep;
  auto heap = [&](size_t n) {
    keep.emplace_back(n);
    return keep.back().data();
  };
  EXPECT_EQ(ReceiveFromChild({3 * kMiB + 5, 100, 70000, 16 * kMiB}, heap), 0);
  EXPECT_FALSE(logged("mapped shared region"));
  EXPECT_FALSE(logged("stream through the ring"));
}

TEST(Shm, RendezvousFromMappedSharedRegion) {
  clear_log();
  // The child sends out of one memfd region; the parent maps it once and
  // copies from the mapping for every message.
  std::unique_ptr<SharedBuffer> region;
  size_t used = 0;
  auto shared = [&](size_t n) {
    if (region == nullptr) region = std::make_unique<SharedBuffer>(64 * kMiB);
    unsigned char* p = region->data() + used;
    used += (n + 4095) / 4096 * 4096;
    return p;
  };
  EXPECT_EQ(ReceiveFromChild({5 * kMiB, 100, 200000, 3 * kMiB + 1}, shared), 0);
  EXPECT_EQ(count_logged("mapped shared region"), 1u) << "one mapping serves every message";
}

// A region freed and a new one allocated under the same fd number is a new
// file: the receiver must notice (by inode) and map the new one.
TEST(Shm, ReusedFdNamesANewRegion) {
  clear_log();
  std::unique_ptr<SharedBuffer> region;
  auto fresh_region_each_time = [&](size_t n) {
    region.reset();  // frees the previous memfd; the next one gets its fd number
    region = std::make_unique<SharedBuffer>(n);
    return region->data();
  };
  // One connection; each message is read before its region is replaced.
  EXPECT_EQ(ReceiveFromChild({2 * kMiB, 2 * kMiB, 2 * kMiB}, fresh_region_each_time, true), 0);
  EXPECT_EQ(count_logged("mapped shared region"), 3u);
}

TEST(Shm, StreamsThroughTheRingWithoutCma) {
  ScopedEnv cma("MESHCCL_SHM_CMA", "0");
  std::vector<std::vector<unsigned char>> keep;
  auto heap = [&](size_t n) {
    keep.emplace_back(n);
    return keep.back().data();
  };
  clear_log();
  EXPECT_EQ(ReceiveFromChild({64 * kMiB, 1, 300000, 2 * kMiB + 3, 0}, heap), 0);
  EXPECT_TRUE(logged("stream through the ring"));
}

// A tiny ring forces wrap-around padding, back-pressure on the sender, and
// streamed chunks next to eager records.
TEST(Shm, SmallRingManyMessages) {
  ScopedEnv ring("MESHCCL_SHM_BUFFSIZE", "64K");
  ScopedEnv eager("MESHCCL_SHM_EAGER", "8K");
  ScopedEnv cma("MESHCCL_SHM_CMA", "0");
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 600; ++i) sizes.push_back((i * 2654435761u) % 50000);
  std::vector<std::vector<unsigned char>> keep;
  auto heap = [&](size_t n) {
    keep.emplace_back(n);
    return keep.back().data();
  };
  EXPECT_EQ(ReceiveFromChild(sizes, heap), 0);
}

// The ring belongs to the receiver: a sender whose own settings allow larger
// eager messages than that ring holds must not wedge on it.
TEST(Shm, SenderEagerLargerThanReceiversRing) {
  void* sctx = nullptr;
  void* rctx = nullptr;
  {
    ScopedEnv ring("MESHCCL_SHM_BUFFSIZE", "4M");
    ScopedEnv eager("MESHCCL_SHM_EAGER", "1000K");
    ASSERT_EQ(t->init(test_host(), &sctx), MESHCCL_T_SUCCESS);
  }
  {
    ScopedEnv ring("MESHCCL_SHM_BUFFSIZE", "64K");
    ScopedEnv eager("MESHCCL_SHM_EAGER", "4K");
    ASSERT_EQ(t->init(test_host(), &rctx), MESHCCL_T_SUCCESS);
  }
  void *s, *r;
  ASSERT_EQ(connect_pair(t, sctx, rctx, &s, &r), MESHCCL_T_SUCCESS);
  std::vector<unsigned char> src(512 << 10), dst(512 << 10);
  fill(src.data(), src.size(), 9);
  void *sq, *rq;
  ASSERT_EQ(t->isend(s, src.data(), src.size(), 0, nullptr, &sq), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(r, dst.data(), dst.size(), 0, nullptr, &rq), MESHCCL_T_SUCCESS);
  std::vector<int> res;
  ASSERT_TRUE(wait_all(t, {sq, rq}, &res, nullptr, 10));
  EXPECT_EQ(res[0], MESHCCL_T_SUCCESS);
  EXPECT_EQ(res[1], MESHCCL_T_SUCCESS);
  EXPECT_EQ(check(dst.data(), dst.size(), 9), SIZE_MAX);
  t->close_send(s);
  t->close_recv(r);
  t->finalize(sctx);
  t->finalize(rctx);
}

// One huge receive is copied a chunk per test(): a small message on another
// connection completes while it is still under way.
TEST(Shm, LargeCopyDoesNotStarveOtherConnections) {
  Pair big, small;
  ASSERT_TRUE(big.open());
  ASSERT_TRUE(small.open());
  std::vector<unsigned char> src(64 * kMiB, 1), dst(64 * kMiB);
  void *bs, *br;
  ASSERT_EQ(t->isend(big.scomm, src.data(), src.size(), 1, nullptr, &bs), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(big.rcomm, dst.data(), dst.size(), 1, nullptr, &br), MESHCCL_T_SUCCESS);
  int done = 0;
  ASSERT_EQ(t->test(br, &done, nullptr), MESHCCL_T_SUCCESS);  // the copy starts
  ASSERT_EQ(done, 0);
  char a[64] = "ping", b[64] = {};
  void *ss, *sr;
  ASSERT_EQ(t->isend(small.scomm, a, sizeof(a), 2, nullptr, &ss), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(small.rcomm, b, sizeof(b), 2, nullptr, &sr), MESHCCL_T_SUCCESS);
  // Poll everything, as a host does; the small pair must finish first.
  std::vector<void*> reqs = {br, bs, sr, ss};
  std::vector<void*> order;
  for (int spins = 0; order.size() < 4 && spins < 10'000'000; ++spins) {
    for (void*& q : reqs) {
      if (q == nullptr) continue;
      ASSERT_EQ(t->test(q, &done, nullptr), MESHCCL_T_SUCCESS);
      if (done) {
        order.push_back(q);
        q = nullptr;
      }
    }
  }
  ASSERT_EQ(order.size(), 4u);
  EXPECT_TRUE(order[0] == sr || order[0] == ss);
  EXPECT_TRUE(order[1] == sr || order[1] == ss);
  EXPECT_STREQ(b, "ping");
  EXPECT_EQ(dst[64 * kMiB - 1], 1);
}

// A sender that closes withdraws its rendezvous payloads: once close_send
// has returned, the receiver never reads the buffer again (it used to copy
// on from memory the sender had freed), and its receive fails.
TEST(Shm, CloseWithdrawsPayloadsBeingRead) {
  Pair p;
  ASSERT_TRUE(p.open());
  const size_t size = 64 * kMiB;  // many copy chunks
  const long page = sysconf(_SC_PAGESIZE);
  const size_t len = (size + page - 1) / page * page;
  auto* src =
      static_cast<unsigned char*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(src, MAP_FAILED);
  std::memset(src, 7, size);
  std::vector<unsigned char> dst(size);
  void* sreq = nullptr;
  void* rreq = nullptr;
  ASSERT_EQ(t->isend(p.scomm, src, size, 1, nullptr, &sreq), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(p.rcomm, dst.data(), size, 1, nullptr, &rreq), MESHCCL_T_SUCCESS);
  int done = 0;
  size_t got = 0;
  ASSERT_EQ(t->test(rreq, &done, &got), MESHCCL_T_SUCCESS);  // matches, copies a first chunk
  ASSERT_EQ(done, 0);
  ASSERT_EQ(t->close_send(p.scomm), MESHCCL_T_SUCCESS);
  p.scomm = nullptr;
  munmap(src, len);  // the owner frees it: a read now would fault
  int rc = MESHCCL_T_SUCCESS;
  for (int i = 0; i < 1000000 && !done; ++i) rc = t->test(rreq, &done, &got);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(rc, MESHCCL_T_REMOTE_ERROR);
}

// A receiver's read position the sender could never have allowed (ahead of
// what it wrote, or behind what it saw before): the sender's messages fail at
// once with an error naming the corrupt ring, instead of waiting for room
// until MESHCCL_TIMEOUT.
TEST(Shm, CorruptReadPositionFailsTheSenderAtOnce) {
  ScopedEnv ring("MESHCCL_SHM_BUFFSIZE", "64K");
  ScopedEnv eager("MESHCCL_SHM_EAGER", "8K");
  for (uint64_t bad : {uint64_t(1) << 40, uint64_t(0)}) {
    Pair p;
    ASSERT_TRUE(p.open());
    auto* sc = static_cast<plugin::shm::SendComm*>(p.scomm);
    std::vector<unsigned char> msg(6000, 3), dst(6000);
    // Two messages the receiver takes, so the sender has seen a read
    // position above 0; then the position is overwritten.
    for (int k = 0; k < 2; ++k) {
      void* sreq = nullptr;
      void* rreq = nullptr;
      ASSERT_EQ(t->isend(p.scomm, msg.data(), msg.size(), 1, nullptr, &sreq), MESHCCL_T_SUCCESS);
      ASSERT_EQ(t->irecv(p.rcomm, dst.data(), dst.size(), 1, nullptr, &rreq), MESHCCL_T_SUCCESS);
      ASSERT_EQ(wait_request(t, rreq), MESHCCL_T_SUCCESS);
      ASSERT_EQ(wait_request(t, sreq), MESHCCL_T_SUCCESS);
    }
    // The sender reads the position again only when the ring looks full.
    for (int k = 0; k < 12 && sc->tail_cache == 0; ++k) {
      void* sreq = nullptr;
      ASSERT_EQ(t->isend(p.scomm, msg.data(), msg.size(), 1, nullptr, &sreq), MESHCCL_T_SUCCESS);
    }
    ASSERT_GT(sc->tail_cache, 0u) << "the sender never read the receiver's position";
    sc->seg->tail.v.store(bad, std::memory_order_release);
    clear_log();
    void* last = nullptr;
    int rc = MESHCCL_T_SUCCESS, done = 0;
    for (int k = 0; k < 12 && rc == MESHCCL_T_SUCCESS; ++k)
      rc = t->isend(p.scomm, msg.data(), msg.size(), 1, nullptr, &last);
    if (rc == MESHCCL_T_SUCCESS)
      for (int i = 0; i < 1000 && !done; ++i) rc = t->test(last, &done, nullptr);
    EXPECT_EQ(rc, MESHCCL_T_INTERNAL_ERROR) << "read position " << bad;
    EXPECT_TRUE(logged("the shared ring is corrupt: the receiver's read position")) << "read position " << bad;
  }
}

TEST(Shm, StaleOrForeignHandlesAreRefused) {
  void* ctx = nullptr;
  ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  unsigned char handle[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  void* out = nullptr;

  // Wrong nonce: the fd is right but the segment does not vouch for it.
  ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);
  unsigned char forged[MESHCCL_TRANSPORT_HANDLE_BYTES];
  std::memcpy(forged, handle, sizeof(forged));
  forged[24] ^= 0xff;  // inside the nonce
  EXPECT_EQ(t->connect(ctx, 0, forged, &out), MESHCCL_T_INTERNAL_ERROR);
  EXPECT_EQ(out, nullptr);
  // A second sender for one listener.
  ASSERT_EQ(connect_loop(t, ctx, handle, &out), MESHCCL_T_SUCCESS);
  void* second = nullptr;
  EXPECT_EQ(t->connect(ctx, 0, handle, &second), MESHCCL_T_INTERNAL_ERROR);
  EXPECT_EQ(second, nullptr);
  void* rcomm = nullptr;
  ASSERT_EQ(accept_loop(t, lcomm, &rcomm), MESHCCL_T_SUCCESS);
  EXPECT_EQ(t->accept(lcomm, &second), MESHCCL_T_INTERNAL_ERROR);
  // After accept the listener's fd is closed: the same handle is stale.
  EXPECT_EQ(t->connect(ctx, 0, handle, &second), MESHCCL_T_REMOTE_ERROR);
  t->close_listen(lcomm);
  t->close_send(out);
  t->close_recv(rcomm);

  // A listener closed without accepting its (attached) sender: the sender's
  // large message fails instead of waiting for a reader that never comes.
  ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);
  ASSERT_EQ(connect_loop(t, ctx, handle, &out), MESHCCL_T_SUCCESS);
  t->close_listen(lcomm);
  std::vector<unsigned char> big(4 * kMiB);
  void* req = nullptr;
  int rc = t->isend(out, big.data(), big.size(), 0, nullptr, &req);
  if (rc == MESHCCL_T_SUCCESS) rc = wait_request(t, req, nullptr, 10);
  EXPECT_EQ(rc, MESHCCL_T_REMOTE_ERROR);
  t->close_send(out);

  // A handle naming a descriptor that is not a segment at all.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  ASSERT_EQ(t->listen(ctx, 0, handle, &lcomm), MESHCCL_T_SUCCESS);
  std::memcpy(forged, handle, sizeof(forged));
  std::memcpy(forged + 12, &pipefd[0], sizeof(int));  // Handle::fd
  EXPECT_NE(t->connect(ctx, 0, forged, &out), MESHCCL_T_SUCCESS);
  close(pipefd[0]);
  close(pipefd[1]);
  t->close_listen(lcomm);
  EXPECT_EQ(t->finalize(ctx), MESHCCL_T_SUCCESS);
}

TEST(Shm, BadSettingsAreRefused) {
  void* ctx = nullptr;
  {
    ScopedEnv e("MESHCCL_SHM_EAGER", "lots");
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_INVALID_USAGE);
  }
  {
    ScopedEnv e("MESHCCL_SHM_BUFFSIZE", "4096");
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_INVALID_USAGE);
  }
  {
    ScopedEnv r("MESHCCL_SHM_BUFFSIZE", "1M");
    ScopedEnv e("MESHCCL_SHM_EAGER", "1M");  // more than a quarter of the ring
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_INVALID_USAGE);
  }
  {
    ScopedEnv e("MESHCCL_SHM_CMA", "yes");
    EXPECT_EQ(t->init(test_host(), &ctx), MESHCCL_T_INVALID_USAGE);
  }
  EXPECT_EQ(ctx, nullptr);
  ScopedEnv e("MESHCCL_SHM_EAGER", "0");  // everything but empty messages by rendezvous
  Pair p;
  ASSERT_TRUE(p.open());
  std::vector<unsigned char> src(10), dst(10);
  fill(src.data(), 10, 3);
  void *s, *r;
  ASSERT_EQ(t->isend(p.scomm, src.data(), 10, 0, nullptr, &s), MESHCCL_T_SUCCESS);
  ASSERT_EQ(t->irecv(p.rcomm, dst.data(), 10, 0, nullptr, &r), MESHCCL_T_SUCCESS);
  std::vector<int> res;
  ASSERT_TRUE(wait_all(t, {s, r}, &res));
  EXPECT_EQ(res[0], MESHCCL_T_SUCCESS);
  EXPECT_EQ(res[1], MESHCCL_T_SUCCESS);
  EXPECT_EQ(check(dst.data(), 10, 3), SIZE_MAX);
}

// Segments are memfds: a SIGKILLed peer leaves nothing behind in /dev/shm.
TEST(Shm, KilledPeerLeavesNoSharedMemoryFiles) {
  auto before = dev_shm_entries();
  Child child = spawn([&](int fd) -> int {
    void* ctx = nullptr;
    CHILD_CHECK(t->init(test_host(), &ctx) == MESHCCL_T_SUCCESS);
    void* rcomm = nullptr;
    CHILD_CHECK(accept_peer(t, ctx, fd, &rcomm) == MESHCCL_T_SUCCESS);
    CHILD_CHECK(write_all(fd, "r", 1));
    sleep(60);
    return 5;
  });
  void* ctx = nullptr;
  ASSERT_EQ(t->init(test_host(), &ctx), MESHCCL_T_SUCCESS);
  void* scomm = nullptr;
  ASSERT_EQ(connect_peer(t, ctx, child.fd, &scomm), MESHCCL_T_SUCCESS);
  char ready;
  ASSERT_TRUE(read_all(child.fd, &ready, 1));
  EXPECT_EQ(dev_shm_added(before), std::set<std::string>{});
  kill(child.pid, SIGKILL);
  EXPECT_EQ(reap(child), 128 + SIGKILL);
  char msg[8] = {};
  void* s = nullptr;
  // Small sends are written into the (still mapped) ring and complete; a
  // large one needs the dead receiver and fails.
  std::vector<unsigned char> big(4 * kMiB);
  ASSERT_EQ(t->isend(scomm, msg, sizeof(msg), 1, nullptr, &s), MESHCCL_T_SUCCESS);
  EXPECT_EQ(wait_request(t, s), MESHCCL_T_SUCCESS);
  int rc = t->isend(scomm, big.data(), big.size(), 1, nullptr, &s);
  if (rc == MESHCCL_T_SUCCESS) rc = wait_request(t, s, nullptr, 10);
  EXPECT_EQ(rc, MESHCCL_T_REMOTE_ERROR);
  t->close_send(scomm);
  t->finalize(ctx);
  EXPECT_EQ(dev_shm_added(before), std::set<std::string>{});
}

}  // namespace
}  // namespace meshccl::test
