// transport_pingpong: latency and bandwidth of the built-in transports
// between two forked processes.
//
//   transport_pingpong [shm|socket|ofi|ucx|all] [--quick]
//
// Loadable transports (ofi, ucx) come from $MESHCCL_TEST_PLUGIN_DIR, as in
// the contract suite; "all" runs the built-in ones.
//
// Overhead: an 8-byte send and receive polled by one thread (the code path's
// own cost). Latency: 8-byte ping-pong, half the round trip. Bandwidth: the parent
// streams a window of messages, the child answers each window with a 1-byte
// ack (osu_bw style), bytes / time. Settings such as MESHCCL_SHM_EAGER are
// read from the environment as usual.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "plugins/builtin.h"
#include "tests/plugins/test_host.h"

using namespace meshccl::test;

namespace {

using Clock = std::chrono::steady_clock;

struct Link {
  const meshccl_transport_v1_t* t = nullptr;
  void* ctx = nullptr;
  void* scomm = nullptr;
  void* rcomm = nullptr;
};

bool post_wait_send(const Link& l, const void* buf, size_t n, uint64_t tag) {
  void* r = nullptr;
  return l.t->isend(l.scomm, buf, n, tag, nullptr, &r) == 0 && wait_request(l.t, r) == 0;
}

bool post_wait_recv(const Link& l, void* buf, size_t n, uint64_t tag) {
  void* r = nullptr;
  return l.t->irecv(l.rcomm, buf, n, tag, nullptr, &r) == 0 && wait_request(l.t, r) == 0;
}

// Parent and child each listen once and connect once, giving one connection
// per direction. `first` listens first (so the two do not wait on each other).
bool setup(Link& l, int fd, bool first) {
  if (l.t->init(test_host(), &l.ctx) != 0) return false;
  unsigned char mine[MESHCCL_TRANSPORT_HANDLE_BYTES], theirs[MESHCCL_TRANSPORT_HANDLE_BYTES];
  void* lcomm = nullptr;
  if (l.t->listen(l.ctx, 0, mine, &lcomm) != 0) return false;
  if (first) {
    if (!write_all(fd, mine, sizeof(mine)) || !read_all(fd, theirs, sizeof(theirs))) return false;
  } else {
    if (!read_all(fd, theirs, sizeof(theirs)) || !write_all(fd, mine, sizeof(mine))) return false;
  }
  // Connect and accept interleaved: each side's accept needs the other's connect.
  l.scomm = l.rcomm = nullptr;
  for (int spins = 0; l.scomm == nullptr || l.rcomm == nullptr; ++spins) {
    if (l.scomm == nullptr && l.t->connect(l.ctx, 0, theirs, &l.scomm) != 0) return false;
    if (l.rcomm == nullptr && l.t->accept(lcomm, &l.rcomm) != 0) return false;
    if (spins > 100'000'000) return false;
  }
  l.t->close_listen(lcomm);
  return true;
}

void teardown(Link& l) {
  l.t->close_send(l.scomm);
  l.t->close_recv(l.rcomm);
  l.t->finalize(l.ctx);
}

struct Plan {
  int lat_iters;
  std::vector<std::pair<size_t, int>> bw;  // size, windows
  int window;
};

// The child mirrors the parent's sequence: echo pings, absorb windows.
int child_main(const meshccl_transport_v1_t* t, const Plan& plan, int fd) {
  Link l;
  l.t = t;
  if (!setup(l, fd, false)) return 1;
  char small[8];
  for (int i = 0; i < plan.lat_iters + plan.lat_iters / 10; ++i) {
    if (!post_wait_recv(l, small, 8, 1) || !post_wait_send(l, small, 8, 1)) return 2;
  }
  size_t max = 0;
  for (auto& [size, n] : plan.bw) max = std::max(max, size);
  std::vector<unsigned char> buf(max);
  for (auto& [size, windows] : plan.bw) {
    for (int w = 0; w < windows + 1; ++w) {  // +1: warm-up window
      std::vector<void*> reqs(plan.window);
      for (void*& r : reqs)
        if (t->irecv(l.rcomm, buf.data(), size, 2, nullptr, &r) != 0) return 3;
      std::vector<int> res;
      if (!wait_all(t, reqs, &res, nullptr, 120)) return 4;
      for (int r : res) if (r != 0) return 5;
      if (!post_wait_send(l, small, 1, 3)) return 6;
    }
  }
  teardown(l);
  return 0;
}

// The transport's own cost per message, free of scheduling: one thread
// posts a receive and a send on a self-connection and polls both.
bool overhead(const meshccl_transport_v1_t* t, int iters) {
  void* ctx = nullptr;
  void *s, *r;
  if (t->init(test_host(), &ctx) != 0 || connect_pair(t, ctx, ctx, &s, &r) != 0) return false;
  char a[8] = "x", b[8];
  Clock::time_point start;
  for (int i = 0; i < iters + iters / 10; ++i) {
    if (i == iters / 10) start = Clock::now();
    void *sq, *rq;
    if (t->irecv(r, b, 8, 1, nullptr, &rq) != 0 || t->isend(s, a, 8, 1, nullptr, &sq) != 0) return false;
    std::vector<int> res;
    if (!wait_all(t, {sq, rq}, &res) || res[0] != 0 || res[1] != 0) return false;
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
  std::printf("%-8s overhead   %10s %8d  %8.2f us  (send+receive in one thread)\n", t->name, "8 B", iters, us);
  t->close_send(s);
  t->close_recv(r);
  t->finalize(ctx);
  return true;
}

bool run(const meshccl_transport_v1_t* t, const Plan& plan) {
  if (!overhead(t, plan.lat_iters)) {
    std::fprintf(stderr, "%s: in-process round trip failed\n", t->name);
    return false;
  }
  Child child = spawn([&](int fd) { return child_main(t, plan, fd); });
  Link l;
  l.t = t;
  if (!setup(l, child.fd, true)) {
    std::fprintf(stderr, "%s: connection setup failed\n", t->name);
    reap(child);
    return false;
  }
  char small[8] = "ping";
  int warm = plan.lat_iters / 10;
  Clock::time_point start;
  for (int i = 0; i < plan.lat_iters + warm; ++i) {
    if (i == warm) start = Clock::now();
    if (!post_wait_send(l, small, 8, 1) || !post_wait_recv(l, small, 8, 1)) return false;
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / plan.lat_iters / 2;
  std::printf("%-8s latency    %10s %8d  %8.2f us\n", t->name, "8 B", plan.lat_iters, us);
  std::fflush(stdout);

  size_t max = 0;
  for (auto& [size, n] : plan.bw) max = std::max(max, size);
  std::vector<unsigned char> buf(max, 1);
  for (auto& [size, windows] : plan.bw) {
    for (int w = 0; w < windows + 1; ++w) {
      if (w == 1) start = Clock::now();
      std::vector<void*> reqs(plan.window);
      for (void*& r : reqs)
        if (t->isend(l.scomm, buf.data(), size, 2, nullptr, &r) != 0) return false;
      std::vector<int> res;
      if (!wait_all(t, reqs, &res, nullptr, 120)) return false;
      for (int r : res) if (r != 0) return false;
      if (!post_wait_recv(l, small, 1, 3)) return false;
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    double gbs = static_cast<double>(size) * plan.window * windows / s / 1e9;
    std::printf("%-8s bandwidth  %7zu MiB %8d  %8.2f GB/s\n", t->name, size >> 20, windows * plan.window, gbs);
    std::fflush(stdout);
  }
  teardown(l);
  int rc = reap(child, 60);
  if (rc != 0) std::fprintf(stderr, "%s: child exited with %d\n", t->name, rc);
  return rc == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (argv[i][0] != '-') which = argv[i];
    else {
      std::fprintf(stderr, "usage: %s [shm|socket|ofi|ucx|all] [--quick]\n", argv[0]);
      return 2;
    }
  }
  Plan plan;
  plan.lat_iters = quick ? 2000 : 20000;
  plan.window = 4;
  int f = quick ? 1 : 4;
  plan.bw = {{1u << 20, 25 * f}, {16u << 20, 4 * f}, {64u << 20, 1 * f}};
  std::printf("%-8s %-10s %10s %8s  %s\n", "#", "test", "size", "msgs", "result");
  bool ok = true;
  if (which != "all" && which != "shm" && which != "socket") {
    std::string why;
    const meshccl_transport_v1_t* t = load_transport(which, &why);
    if (t == nullptr) {
      std::fprintf(stderr, "%s\n", why.c_str());
      return 2;
    }
    return run(t, plan) ? 0 : 1;
  }
  for (const meshccl_transport_v1_t* t : {&meshccl_transport_shm, &meshccl_transport_socket}) {
    if (which != "all" && which != t->name) continue;
    ok = run(t, plan) && ok;
  }
  return ok ? 0 : 1;
}
