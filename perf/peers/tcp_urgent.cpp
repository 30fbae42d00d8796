// tcp_urgent: the floor under priority_perf's socket targets (docs/priority.md).
// Two forked processes on one machine do by hand, over loopback TCP, what
// `MESHCCL_TRANSPORT=socket priority_perf -n 2` asks of meshccl, in the best
// arrangement plain sockets allow: the urgent traffic has a connection of its
// own (nothing of the bulk is queued ahead of it in any socket buffer), and
// the bulk all-reduce runs on another connection in two threads per process
// (a sender and a receiver that reduces), so no scheduling of ours stands
// between them. What is left is the machine: the cores, the scheduler and the
// kernel's TCP. Measured like priority_perf:
//   - a 64 KiB send (ping-pong, half the round trip) and a 1 KiB all-reduce
//     (both send, both receive and add), idle, and while the bulk runs;
//   - the bulk all-reduce (default 256 MiB: reduce-scatter then all-gather
//     between the two, 1 MiB pieces, pipelined) alone and under that traffic,
//     with the same sleeping pauses between urgent operations.
// A target priority_perf misses over sockets that this also misses is not
// meshccl's to meet on this machine; one that this meets, meshccl should.
//   tcp_urgent [-b bytes] [-i iterations] [-w block|poll]
// -w poll: the urgent receives poll (MSG_DONTWAIT in a loop) instead of
// blocking in the kernel. Every wait is bounded (60 s socket timeouts, and an
// alarm of 300 s on each process).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp_urgent: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool g_poll = false;

void send_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void recv_all(int fd, void* p, size_t n, bool poll) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, poll ? MSG_DONTWAIT : 0);
    if (r < 0) {
      if (errno == EINTR || (poll && (errno == EAGAIN || errno == EWOULDBLOCK))) continue;
      die("recv");
    }
    if (r == 0) {
      errno = ECONNRESET;
      die("recv (the peer closed)");
    }
    c += r;
    n -= static_cast<size_t>(r);
  }
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Rank 0 listens on an ephemeral loopback port before the fork; each rank
// ends with two connections: [0] bulk, [1] urgent.
struct Links {
  int bulk = -1, urgent = -1;
};

Links connect_pair(int rank, int listener, uint16_t port) {
  Links l;
  int* order[2] = {&l.bulk, &l.urgent};
  for (int* fd : order) {
    if (rank == 0) {
      *fd = accept(listener, nullptr, nullptr);
      if (*fd < 0) die("accept");
    } else {
      *fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (*fd < 0 || connect(*fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
    }
    tune(*fd);
  }
  return l;
}

struct Rank {
  int rank;
  Links links;
  std::vector<float> bulk, scratch;
  std::vector<char> msg = std::vector<char>(64u << 10);
  std::vector<float> small = std::vector<float>(256), small_in = std::vector<float>(256);

  void barrier() {
    char b = 0;
    send_all(links.urgent, &b, 1);
    recv_all(links.urgent, &b, 1, g_poll);
  }
  double ping() {
    const double t0 = now_us();
    if (rank == 0) {
      send_all(links.urgent, msg.data(), msg.size());
      recv_all(links.urgent, msg.data(), msg.size(), g_poll);
    } else {
      recv_all(links.urgent, msg.data(), msg.size(), g_poll);
      send_all(links.urgent, msg.data(), msg.size());
    }
    return (now_us() - t0) / 2;
  }
  double small_allreduce() {
    const double t0 = now_us();
    send_all(links.urgent, small.data(), small.size() * sizeof(float));
    recv_all(links.urgent, small_in.data(), small_in.size() * sizeof(float), g_poll);
    for (size_t i = 0; i < small.size(); ++i) small[i] += small_in[i];
    return now_us() - t0;
  }

  // The bulk all-reduce between the two: this rank owns half `rank`. A
  // sender thread sends the other half's pieces, then each own piece once
  // reduced; this thread receives the peer's pieces of our half, adds them,
  // then receives the peer's reduced half in place.
  void bulk_allreduce() {
    constexpr size_t kPiece = (1u << 20) / sizeof(float);
    const size_t half = bulk.size() / 2;
    float* mine = bulk.data() + static_cast<size_t>(rank) * half;
    float* theirs = bulk.data() + static_cast<size_t>(1 - rank) * half;
    const size_t pieces = (half + kPiece - 1) / kPiece;
    std::mutex mu;
    std::condition_variable cv;
    size_t reduced = 0;
    std::thread sender([&] {
      for (size_t k = 0; k < pieces; ++k) {
        const size_t n = std::min(kPiece, half - k * kPiece);
        send_all(links.bulk, theirs + k * kPiece, n * sizeof(float));
      }
      for (size_t k = 0; k < pieces; ++k) {
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return reduced > k; });
        }
        const size_t n = std::min(kPiece, half - k * kPiece);
        send_all(links.bulk, mine + k * kPiece, n * sizeof(float));
      }
    });
    for (size_t k = 0; k < pieces; ++k) {
      const size_t n = std::min(kPiece, half - k * kPiece);
      recv_all(links.bulk, scratch.data(), n * sizeof(float), false);
      float* dst = mine + k * kPiece;
      for (size_t i = 0; i < n; ++i) dst[i] += scratch[i];
      {
        std::lock_guard<std::mutex> lk(mu);
        reduced = k + 1;
      }
      cv.notify_one();
    }
    recv_all(links.bulk, theirs, half * sizeof(float), false);
    sender.join();
  }
};

struct Result {
  double send_idle, send_load, ar_idle, ar_load, ar_max, bulk_alone_us, bulk_loaded_us;
};

Result run(Rank& r, int iters) {
  Result res{};
  std::vector<double> s, a;
  for (int i = 0; i < iters; ++i) {
    r.barrier();
    s.push_back(r.ping());
    r.barrier();
    a.push_back(r.small_allreduce());
  }
  res.send_idle = median(s);
  res.ar_idle = median(a);
  r.barrier();
  double t0 = now_us();
  r.bulk_allreduce();
  res.bulk_alone_us = now_us() - t0;
  // Both ranks pause as long: rank 0's figure.
  double alone = res.bulk_alone_us;
  if (r.rank == 0) send_all(r.links.urgent, &alone, sizeof(alone));
  else recv_all(r.links.urgent, &alone, sizeof(alone), g_poll);
  const double pause = alone / (2.0 * iters + 2);
  s.clear();
  a.clear();
  r.barrier();
  t0 = now_us();
  double bulk_end = 0;
  std::thread bulk([&] {
    r.bulk_allreduce();
    bulk_end = now_us();
  });
  for (int i = 0; i < iters; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(pause));
    s.push_back(r.ping());
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(pause));
    a.push_back(r.small_allreduce());
  }
  bulk.join();
  res.bulk_loaded_us = bulk_end - t0;
  res.send_load = median(s);
  res.ar_load = median(a);
  res.ar_max = *std::max_element(a.begin(), a.end());
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 256u << 20;
  int iters = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-b")) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "-i")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-w") && (!std::strcmp(argv[i + 1], "block") || !std::strcmp(argv[i + 1], "poll")))
      g_poll = !std::strcmp(argv[i + 1], "poll");
    else {
      std::fprintf(stderr, "usage: tcp_urgent [-b bytes] [-i iterations] [-w block|poll]\n");
      return 2;
    }
  }
  if (argc % 2 == 0 || bytes < 2 * sizeof(float) || iters < 1 || iters > 100000) {
    std::fprintf(stderr, "usage: tcp_urgent [-b bytes >= 8] [-i iterations 1-100000] [-w block|poll]\n");
    return 2;
  }
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listener, 4) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    die("listen on loopback");
  const uint16_t port = ntohs(a.sin_port);
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) die("fork");
  const int rank = child == 0 ? 1 : 0;
  alarm(300);
  if (rank == 1) close(listener);
  Rank r{rank, connect_pair(rank, listener, port), {}, {}};
  if (rank == 0) close(listener);
  const size_t elems = bytes / sizeof(float) / 2 * 2;
  r.bulk.assign(elems, 1.0f);
  r.scratch.assign((1u << 20) / sizeof(float), 0.0f);
  const Result res = run(r, iters);
  if (rank == 1) return 0;
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "tcp_urgent: rank 1 failed\n");
    return 1;
  }
  const double busbw = static_cast<double>(elems * sizeof(float)) / res.bulk_alone_us / 1e3;
  const double busbw_l = static_cast<double>(elems * sizeof(float)) / res.bulk_loaded_us / 1e3;
  std::printf(
      "# tcp_urgent: 2 processes, loopback TCP, bulk all-reduce %zu bytes (own connection, 2 threads each), "
      "%d urgent operations of each kind on another connection, %s receives, sleeping pauses\n",
      elems * sizeof(float), iters, g_poll ? "polling" : "blocking");
  std::printf("# %-8s %12s %12s %8s %12s %12s %8s %12s %12s %12s %8s\n", "mode", "send64K_idle", "send64K_load",
              "ratio", "ar1K_idle", "ar1K_load", "ratio", "ar1K_max", "bulk_GB/s", "bulk_load", "loss");
  std::printf("  %-8s %10.1fus %10.1fus %8.2f %10.1fus %10.1fus %8.2f %10.1fus %12.2f %12.2f %7.1f%%\n", "tcp",
              res.send_idle, res.send_load, res.send_load / res.send_idle, res.ar_idle, res.ar_load,
              res.ar_load / res.ar_idle, res.ar_max, busbw, busbw_l, 100.0 * (1.0 - busbw_l / busbw));
  return 0;
}
