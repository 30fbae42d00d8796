// transport_pingpong: latency and bandwidth of a transport between two
// processes: a forked child, or (--pair) two ranks that meshrun started,
// e.g. on two emulated hosts:
//
//   transport_pingpong [shm|socket|ucx|ofi|all] [--quick]
//   meshrun --cluster NAME -n 2 transport_pingpong ucx --pair [--quick]
//
// Loadable transports come from $MESHCCL_TEST_PLUGIN_DIR, else from the
// build's plugins/ folder next to this program's. With --pair the two ranks
// swap handles through files in the folder of meshrun's MESHCCL_COMM_FILE,
// and rank 0 prints the results.
//
// Overhead: an 8-byte send and receive polled by one thread (the code path's
// own cost). Latency: 8-byte ping-pong, half the round trip. Bandwidth: the parent
// streams a window of messages, the child answers each window with a 1-byte
// ack (osu_bw style), bytes / time. Settings such as MESHCCL_SHM_EAGER are
// read from the environment as usual.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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

// Polls without yielding (as ucx_perftest and osu_latency do), so that the
// latency is the path's, not the scheduler's; bounded by 60 s.
bool spin(const meshccl_transport_v1_t* t, void* req) {
  Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  for (unsigned spins = 0;; ++spins) {
    int done = 0;
    if (t->test(req, &done, nullptr) != 0) return false;
    if (done) return true;
    if ((spins & 4095) == 4095 && Clock::now() > deadline) return false;
  }
}

bool post_wait_send(const Link& l, const void* buf, size_t n, uint64_t tag) {
  void* r = nullptr;
  return l.t->isend(l.scomm, buf, n, tag, nullptr, &r) == 0 && spin(l.t, r);
}

bool post_wait_recv(const Link& l, void* buf, size_t n, uint64_t tag) {
  void* r = nullptr;
  return l.t->irecv(l.rcomm, buf, n, tag, nullptr, &r) == 0 && spin(l.t, r);
}

using Handle = unsigned char[MESHCCL_TRANSPORT_HANDLE_BYTES];
// Gives our handle to the peer and takes theirs.
using Swap = std::function<bool(const Handle& mine, Handle& theirs)>;

// Over the pipe to a forked child; `first` writes first.
Swap pipe_swap(int fd, bool first) {
  return [fd, first](const Handle& mine, Handle& theirs) {
    if (first) return write_all(fd, mine, sizeof(Handle)) && read_all(fd, theirs, sizeof(Handle));
    return read_all(fd, theirs, sizeof(Handle)) && write_all(fd, mine, sizeof(Handle));
  };
}

// Through files in a folder both ranks see (written whole, then renamed).
Swap file_swap(const std::string& dir, int rank) {
  return [dir, rank](const Handle& mine, Handle& theirs) {
    std::string path = dir + "/pingpong.h" + std::to_string(rank), tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr || std::fwrite(mine, 1, sizeof(Handle), f) != sizeof(Handle) || std::fclose(f) != 0) return false;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return false;
    std::string other = dir + "/pingpong.h" + std::to_string(1 - rank);
    for (int i = 0; i < 6000; ++i) {  // 60 s
      if (FILE* g = std::fopen(other.c_str(), "rb")) {
        bool ok = std::fread(theirs, 1, sizeof(Handle), g) == sizeof(Handle);
        std::fclose(g);
        return ok;
      }
      usleep(10000);
    }
    return false;
  };
}

// Both sides listen once and connect once, giving one connection per
// direction.
bool setup(Link& l, const Swap& swap) {
  if (l.t->init(test_host(), &l.ctx) != 0) return false;
  Handle mine, theirs;
  void* lcomm = nullptr;
  if (l.t->listen(l.ctx, 0, mine, &lcomm) != 0) return false;
  if (!swap(mine, theirs)) return false;
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
int child_main(const meshccl_transport_v1_t* t, const Plan& plan, const Swap& swap) {
  Link l;
  l.t = t;
  if (!setup(l, swap)) return 1;
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
      for (int r : res)
        if (r != 0) return 5;
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

// The measuring side; finish() waits for the peer at the end.
bool measure(const meshccl_transport_v1_t* t, const Plan& plan, const Swap& swap, const std::function<bool()>& finish) {
  Link l;
  l.t = t;
  if (!setup(l, swap)) {
    std::fprintf(stderr, "%s: connection setup failed\n", t->name);
    finish();
    return false;
  }
  char small[8] = "ping";
  int warm = plan.lat_iters / 10;
  Clock::time_point start;
  // Each round trip is timed too: on a busy machine the median says what
  // the path costs, the mean what the scheduler added.
  std::vector<double> rtt;
  rtt.reserve(static_cast<size_t>(plan.lat_iters));
  for (int i = 0; i < plan.lat_iters + warm; ++i) {
    if (i == warm) start = Clock::now();
    Clock::time_point t0 = Clock::now();
    if (!post_wait_send(l, small, 8, 1) || !post_wait_recv(l, small, 8, 1)) return false;
    if (i >= warm) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / plan.lat_iters / 2;
  std::nth_element(rtt.begin(), rtt.begin() + static_cast<long>(rtt.size() / 2), rtt.end());
  std::printf("%-8s latency    %10s %8d  %8.2f us  (median %.2f us)\n", t->name, "8 B", plan.lat_iters, us,
              rtt[rtt.size() / 2] / 2);
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
      for (int r : res)
        if (r != 0) return false;
      if (!post_wait_recv(l, small, 1, 3)) return false;
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    double gbs = static_cast<double>(size) * plan.window * windows / s / 1e9;
    std::printf("%-8s bandwidth  %7zu MiB %8d  %8.2f GB/s\n", t->name, size >> 20, windows * plan.window, gbs);
    std::fflush(stdout);
  }
  teardown(l);
  return finish();
}

bool run(const meshccl_transport_v1_t* t, const Plan& plan) {
  if (!overhead(t, plan.lat_iters)) {
    std::fprintf(stderr, "%s: in-process round trip failed\n", t->name);
    return false;
  }
  Child child = spawn([&](int fd) { return child_main(t, plan, pipe_swap(fd, false)); });
  return measure(t, plan, pipe_swap(child.fd, true), [&] {
    int rc = reap(child, 60);
    if (rc != 0) std::fprintf(stderr, "%s: child exited with %d\n", t->name, rc);
    return rc == 0;
  });
}

// Two ranks of a meshrun job: rank 0 measures, rank 1 answers.
bool run_pair(const meshccl_transport_v1_t* t, const Plan& plan) {
  const char* rank = std::getenv("MESHCCL_RANK");
  const char* file = std::getenv("MESHCCL_COMM_FILE");
  if (rank == nullptr || file == nullptr) {
    std::fprintf(stderr, "--pair runs under meshrun -n 2 (MESHCCL_RANK and MESHCCL_COMM_FILE unset)\n");
    return false;
  }
  std::string dir = file;
  dir = dir.substr(0, dir.rfind('/'));
  const int me = std::atoi(rank);
  if (me == 1) return child_main(t, plan, file_swap(dir, 1)) == 0;
  return measure(t, plan, file_swap(dir, 0), [] { return true; });
}

}  // namespace

// Where this build's loadable transports are: build/plugins next to
// build/tests/plugins/transport_pingpong.
void default_plugin_dir() {
  if (std::getenv("MESHCCL_TEST_PLUGIN_DIR") != nullptr) return;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return;
  std::string path(exe, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/'));               // build/tests/plugins
  path = path.substr(0, path.rfind('/'));               // build/tests
  path = path.substr(0, path.rfind('/')) + "/plugins";  // build/plugins
  setenv("MESHCCL_TEST_PLUGIN_DIR", path.c_str(), 1);
}

int main(int argc, char** argv) {
  std::string which = "all";
  bool quick = false, pair = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--pair") == 0) pair = true;
    else if (argv[i][0] != '-') which = argv[i];
    else {
      std::fprintf(stderr, "usage: %s [shm|socket|ucx|ofi|all] [--quick] [--pair]\n", argv[0]);
      return 2;
    }
  }
  default_plugin_dir();
  Plan plan;
  plan.lat_iters = quick ? 2000 : 20000;
  plan.window = 4;
  int f = quick ? 1 : 4;
  plan.bw = {{1u << 20, 25 * f}, {16u << 20, 4 * f}, {64u << 20, 1 * f}};
  if (pair && which == "all") {
    std::fprintf(stderr, "--pair measures one transport: name it\n");
    return 2;
  }
  std::printf("%-8s %-10s %10s %8s  %s\n", "#", "test", "size", "msgs", "result");
  bool ok = true;
  for (const char* name : {"shm", "socket", "ucx", "ofi"}) {
    if (which != "all" && which != name) continue;
    std::string why;
    const meshccl_transport_v1_t* t = load_transport(name, &why);
    if (t == nullptr) {
      std::printf("%-8s skipped: %s\n", name, why.c_str());
      ok = ok && which == "all";
      continue;
    }
    ok = (pair ? run_pair(t, plan) : run(t, plan)) && ok;
  }
  return ok ? 0 : 1;
}
