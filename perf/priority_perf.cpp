// priority_perf: latency of urgent traffic while a bulk all-reduce saturates
// the links (docs/priority.md).
//
// Each of N forked ranks (one host, shm; or MESHCCL_TRANSPORT=socket) makes two
// communicators in the same run: one with priority scheduling
// (MESHCCL_PRIORITY=1) and one FIFO (MESHCCL_PRIORITY=0). On each it measures
//   - a 64 KiB high-priority send (ping-pong between ranks 0 and 1, half the
//     round trip) and a 1 KiB high-priority AllReduce, on an idle link and
//     while a low-priority bulk AllReduce (default 256 MiB) runs on another
//     stream of the same communicator;
//   - the bulk AllReduce's bus bandwidth alone and with the urgent traffic.
// Prints one table and the ratios the targets name (loaded / idle latency <=
// 1.5, bulk bandwidth loss <= 5%). Usage: priority_perf [-n ranks] [-b bytes]
// [-i urgent iterations] [-d 0|1]; or under meshrun (-n is then the
// launcher's), e.g.
// meshrun --cluster NAME -n 2 -x MESHCCL_TRANSPORT=socket priority_perf -b ...
// On one host the bulk AllReduce goes through a plan (MESHCCL_DIRECT_MAX_BYTES
// is set to 64 KiB unless the environment sets it); -d 1 leaves the limit
// alone, so that the bulk takes the direct shared-memory algorithm, whose
// rounds priority scheduling cuts into chunks too.
// Between two urgent operations each rank pauses: asleep by default (the
// application computes elsewhere, on an accelerator, and the bulk's stream
// has the core), or -p spin: busy, as a rank whose CPU computes (on two cores
// and two ranks that takes half the bulk's CPU). The bulk's loaded time ends
// when the bulk completes (a thread waits for it), not with the urgent loop.
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"
#include "bench_util.h"

namespace {

using perf_util::median;
using perf_util::now_us;

bool g_spin_pause = false;  // -p spin

void pause_for(double us) {
  if (!g_spin_pause) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
    return;
  }
  const double until = now_us() + us;
  while (now_us() < until) {}
}

struct Result {
  double send_idle, send_load, ar_idle, ar_load, bulk_alone_us, bulk_loaded_us;
  double ar_load_max;  // the slowest loaded AllReduce: with FIFO the one that waited for the bulk
};

struct Rank {
  int rank, n;
  ncclComm_t comm;
  meshcclStream_t lo, hi;
  std::vector<char> pp;      // 64 KiB
  std::vector<float> small;  // 1 KiB
  std::vector<float> bulk;

  // One 64 KiB ping-pong between ranks 0 and 1 (others idle): half the round trip.
  double ping() {
    const double t0 = now_us();
    if (rank == 0) {
      CHECK(ncclSend(pp.data(), pp.size(), ncclChar, 1, comm, meshcclStreamAsCuda(hi)));
      CHECK(ncclRecv(pp.data(), pp.size(), ncclChar, 1, comm, meshcclStreamAsCuda(hi)));
    } else if (rank == 1) {
      CHECK(ncclRecv(pp.data(), pp.size(), ncclChar, 0, comm, meshcclStreamAsCuda(hi)));
      CHECK(ncclSend(pp.data(), pp.size(), ncclChar, 0, comm, meshcclStreamAsCuda(hi)));
    }
    CHECK(meshcclStreamSynchronize(hi));
    return (now_us() - t0) / 2;
  }
  double small_allreduce() {
    const double t0 = now_us();
    CHECK(ncclAllReduce(small.data(), small.data(), small.size(), ncclFloat, ncclSum, comm, meshcclStreamAsCuda(hi)));
    CHECK(meshcclStreamSynchronize(hi));
    return now_us() - t0;
  }
  void barrier() {
    float x = 0;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, meshcclStreamAsCuda(hi)));
    CHECK(meshcclStreamSynchronize(hi));
  }
  void start_bulk() {
    CHECK(ncclAllReduce(bulk.data(), bulk.data(), bulk.size(), ncclFloat, ncclSum, comm, meshcclStreamAsCuda(lo)));
  }

  Result measure(int iters) {
    Result r{};
    std::vector<double> s, a;
    for (int i = 0; i < iters; ++i) {
      barrier();
      s.push_back(ping());
      barrier();
      a.push_back(small_allreduce());
    }
    r.send_idle = median(s);
    r.ar_idle = median(a);
    // Bulk alone.
    barrier();
    double t0 = now_us();
    start_bulk();
    CHECK(meshcclStreamSynchronize(lo));
    r.bulk_alone_us = now_us() - t0;
    // Bulk with urgent traffic: the same iterations, spread over the bulk's
    // time (each rank waits the same pause between urgent operations).
    barrier();
    const double pause = r.bulk_alone_us / (2.0 * iters + 2);
    s.clear();
    a.clear();
    t0 = now_us();
    start_bulk();
    double bulk_end = 0;
    std::thread bulk_wait([&] {
      CHECK(meshcclStreamSynchronize(lo));
      bulk_end = now_us();
    });
    for (int i = 0; i < iters; ++i) {
      pause_for(pause);
      s.push_back(ping());
      pause_for(pause);
      a.push_back(small_allreduce());
    }
    bulk_wait.join();
    r.bulk_loaded_us = bulk_end - t0;
    r.send_load = median(s);
    r.ar_load = median(a);
    r.ar_load_max = *std::max_element(a.begin(), a.end());
    return r;
  }
};

// make(mode, &comm): mode 0 = the priority communicator, 1 = the FIFO one.
// Returns both results (meaningful on rank 0).
template <class Make>
void run_rank(int rank, int n, size_t bytes, int iters, bool direct_bulk, Make make, Result res[2]) {
  Rank r{rank,
         n,
         nullptr,
         nullptr,
         nullptr,
         std::vector<char>(64 << 10, 1),
         std::vector<float>(256, 1.f),
         std::vector<float>(bytes / sizeof(float), 1.f)};
  int least = 0, greatest = 0;
  CHECK(meshcclStreamGetPriorityRange(&least, &greatest));
  CHECK(meshcclStreamCreateWithPriority(&r.lo, least));
  CHECK(meshcclStreamCreateWithPriority(&r.hi, greatest));
  for (int mode = 0; mode < 2; ++mode) {
    setenv("MESHCCL_PRIORITY", mode == 0 ? "1" : "0", 1);
    // The bulk through a plan (Links' chunks), unless -d 1: then through the
    // direct algorithm (its lanes' chunk-sized rounds).
    if (!direct_bulk && std::getenv("MESHCCL_DIRECT_MAX_BYTES") == nullptr)
      setenv("MESHCCL_DIRECT_MAX_BYTES", "65536", 1);
    make(mode, &r.comm);
    r.measure(2);  // warm-up: connections, scratch
    res[mode] = r.measure(iters);
  }
  meshcclStreamDestroy(r.lo);
  meshcclStreamDestroy(r.hi);
}

void print_results(int n, size_t bytes, int iters, bool direct_bulk, const Result res[2]) {
  const char* transport = std::getenv("MESHCCL_TRANSPORT");
  const char* limit = std::getenv("MESHCCL_DIRECT_MAX_BYTES");
  std::printf(
      "# priority_perf: %d ranks, %s, bulk AllReduce %zu bytes (%s), %d urgent operations of each kind, "
      "%s pauses\n",
      n, transport != nullptr ? transport : "default transport", bytes,
      direct_bulk && limit == nullptr ? "direct allowed" : "direct up to MESHCCL_DIRECT_MAX_BYTES", iters,
      g_spin_pause ? "busy" : "sleeping");
  std::printf("# %-9s %12s %12s %8s %12s %12s %8s %12s %12s %12s %8s\n", "mode", "send64K_idle", "send64K_load",
              "ratio", "ar1K_idle", "ar1K_load", "ratio", "ar1K_max", "bulk_GB/s", "bulk_load", "loss");
  for (int m = 0; m < 2; ++m) {
    const Result& x = res[m];
    const double busbw = 2.0 * (n - 1) / n * bytes / (x.bulk_alone_us * 1e3);
    const double busbw_l = 2.0 * (n - 1) / n * bytes / (x.bulk_loaded_us * 1e3);
    std::printf("  %-9s %10.1fus %10.1fus %8.2f %10.1fus %10.1fus %8.2f %10.1fus %12.2f %12.2f %7.1f%%\n",
                m == 0 ? "priority" : "fifo", x.send_idle, x.send_load, x.send_load / x.send_idle, x.ar_idle, x.ar_load,
                x.ar_load / x.ar_idle, x.ar_load_max, busbw, busbw_l, 100.0 * (1 - busbw_l / busbw));
  }
  const Result& p = res[0];
  std::printf(
      "# targets (priority): send loaded/idle %.2f (<= 1.5: %s), allreduce loaded/idle %.2f (<= 1.5: %s), "
      "bulk loss %.1f%% (<= 5%%: %s)\n",
      p.send_load / p.send_idle, p.send_load <= 1.5 * p.send_idle ? "met" : "not met", p.ar_load / p.ar_idle,
      p.ar_load <= 1.5 * p.ar_idle ? "met" : "not met", 100.0 * (1 - p.bulk_alone_us / p.bulk_loaded_us),
      p.bulk_loaded_us <= p.bulk_alone_us / 0.95 ? "met" : "not met");
}

// Under meshrun (one process per rank, for instance on the hosts of an
// emulated cluster): the priority communicator from the launcher's
// environment, the FIFO one split from it.
int run_launched(size_t bytes, int iters, bool direct_bulk) {
  ncclComm_t world = nullptr, fifo = nullptr;
  Result res[2];
  int rank = 0, n = 0;
  run_rank(
      std::atoi(std::getenv("MESHCCL_RANK")), std::atoi(std::getenv("MESHCCL_NRANKS")), bytes, iters, direct_bulk,
      [&](int mode, ncclComm_t* comm) {
        if (mode == 0) {
          CHECK(meshcclCommInitFromEnv(&world, nullptr));
          CHECK(ncclCommUserRank(world, &rank));
          CHECK(ncclCommCount(world, &n));
          *comm = world;
        } else {
          CHECK(ncclCommSplit(world, 0, rank, &fifo, nullptr));
          *comm = fifo;
        }
      },
      res);
  CHECK(ncclCommDestroy(fifo));
  CHECK(ncclCommDestroy(world));
  if (rank == 0) print_results(n, bytes, iters, direct_bulk, res);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2, iters = 20;
  bool direct_bulk = false;
  size_t bytes = size_t{256} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-n")) n = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-b")) bytes = std::strtoull(argv[i + 1], nullptr, 0);
    else if (!std::strcmp(argv[i], "-i")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-d")) direct_bulk = std::atoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "-p") && (!std::strcmp(argv[i + 1], "spin") || !std::strcmp(argv[i + 1], "sleep")))
      g_spin_pause = !std::strcmp(argv[i + 1], "spin");
    else {
      std::fprintf(stderr,
                   "usage: %s [-n ranks] [-b bulk bytes] [-i urgent iterations] [-d 0|1: bulk may go direct] "
                   "[-p sleep|spin: pause between urgent operations]\n",
                   argv[0]);
      return 1;
    }
  }
  if (n < 2 || n > 64 || iters < 1 || bytes < 4096) {
    std::fprintf(stderr, "priority_perf: need 2..64 ranks, >= 1 iteration, >= 4096 bulk bytes\n");
    return 1;
  }
  if (std::getenv("MESHCCL_COMM_FILE") != nullptr && std::getenv("MESHCCL_RANK") != nullptr &&
      std::getenv("MESHCCL_NRANKS") != nullptr)
    return run_launched(bytes, iters, direct_bulk);
  ncclUniqueId id_prio, id_fifo;
  CHECK(ncclGetUniqueId(&id_prio));
  CHECK(ncclGetUniqueId(&id_fifo));
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      close(fds[0]);
      Result res[2];
      ncclComm_t comms[2] = {nullptr, nullptr};
      run_rank(
          r, n, bytes, iters, direct_bulk,
          [&](int mode, ncclComm_t* comm) {
            CHECK(ncclCommInitRank(&comms[mode], n, mode == 0 ? id_prio : id_fifo, r));
            *comm = comms[mode];
          },
          res);
      for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c));
      if (r == 0 && write(fds[1], res, sizeof res) != static_cast<ssize_t>(sizeof res)) _exit(3);
      _exit(0);
    }
    pids.push_back(p);
  }
  close(fds[1]);
  Result res[2];
  const bool got = read(fds[0], res, sizeof res) == static_cast<ssize_t>(sizeof res);
  int failed = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  if (!got || failed) {
    std::fprintf(stderr, "priority_perf: %d ranks failed\n", failed);
    return 2;
  }
  print_results(n, bytes, iters, direct_bulk, res);
  return 0;
}
