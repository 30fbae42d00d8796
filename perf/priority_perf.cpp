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
//
// -s: what priority scheduling costs when nothing urgent runs. Both
// communicators run the same collectives on the NULL stream, with the
// library's defaults (the direct algorithms as configured), sizes from 8 B
// to 64 MiB, alternating in blocks so that outside load falls on both alike;
// one row per collective and size with the median time per call of each and
// their ratio (target: priority / FIFO <= 1.1 up to 1 MiB, bulk within 5%).
// -z SIZES (comma-separated bytes, K/M suffixes), -k KINDS (comma-separated:
// allreduce, broadcast, allgather, reducescatter, alltoall, sendrecv) and
// -r blocks change the sweep.
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
#include "format.h"

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

// -s: one collective of `bytes` (nccl-tests' size: the larger of the two
// buffers) on comm, NULL stream; kind "sendrecv" is half a ping-pong
// between ranks 0 and 1.
struct Sweep {
  int rank, n;
  std::vector<char> a, b;

  void once(ncclComm_t comm, const std::string& kind, size_t bytes) {
    const size_t elems = std::max<size_t>(bytes / sizeof(float), 1);
    const size_t piece = std::max<size_t>(elems / static_cast<size_t>(n), 1);
    float* x = reinterpret_cast<float*>(a.data());
    float* y = reinterpret_cast<float*>(b.data());
    if (kind == "allreduce") {
      CHECK(ncclAllReduce(x, y, elems, ncclFloat, ncclSum, comm, nullptr));
    } else if (kind == "broadcast") {
      CHECK(ncclBroadcast(x, y, elems, ncclFloat, 0, comm, nullptr));
    } else if (kind == "allgather") {
      CHECK(ncclAllGather(x, y, piece, ncclFloat, comm, nullptr));
    } else if (kind == "reducescatter") {
      CHECK(ncclReduceScatter(x, y, piece, ncclFloat, ncclSum, comm, nullptr));
    } else if (kind == "alltoall") {
      CHECK(ncclAlltoAll(x, y, piece, ncclFloat, comm, nullptr));
    } else if (rank < 2) {  // sendrecv
      const int peer = 1 - rank;
      for (int leg = 0; leg < 2; ++leg) {
        if ((leg == 0) == (rank == 0)) CHECK(ncclSend(x, elems, ncclFloat, peer, comm, nullptr));
        else CHECK(ncclRecv(y, elems, ncclFloat, peer, comm, nullptr));
      }
    }
  }
  // Microseconds per call over iters calls, after a barrier (rank 0's clock).
  double block(ncclComm_t comm, const std::string& kind, size_t bytes, int iters) {
    float z = 0;
    CHECK(ncclAllReduce(&z, &z, 1, ncclFloat, ncclSum, comm, nullptr));
    const double t0 = now_us();
    for (int i = 0; i < iters; ++i) once(comm, kind, bytes);
    const double per = (now_us() - t0) / iters;
    return kind == "sendrecv" ? per / 2 : per;
  }
};

// -z: comma-separated sizes (perf::ParseSize: K, M, G suffixes), each
// positive; false when one is not.
bool parse_sizes(const std::string& text, std::vector<size_t>* out) {
  out->clear();
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    size_t bytes = 0;
    if (!perf::ParseSize(text.substr(at, comma - at).c_str(), &bytes) || bytes == 0) return false;
    out->push_back(bytes);
    at = comma + 1;
  }
  return true;
}

// comms[0] priority, comms[1] FIFO; rank 0 prints the table.
void run_sweep(int rank, int n, ncclComm_t comms[2], const std::vector<size_t>& list, const std::string& kinds,
               int reps) {
  const size_t most = *std::max_element(list.begin(), list.end());
  Sweep sw{rank, n, std::vector<char>(most + 64, 1), std::vector<char>(most * static_cast<size_t>(n) + 64, 1)};
  if (rank == 0) {
    std::printf("# priority_perf -s: %d ranks, %s, NULL stream, median of %d alternating blocks per point\n", n,
                std::getenv("MESHCCL_TRANSPORT") != nullptr ? std::getenv("MESHCCL_TRANSPORT") : "default transport",
                reps);
    std::printf("# %-13s %10s %12s %12s %10s\n", "collective", "bytes", "priority_us", "fifo_us", "prio/fifo");
  }
  for (const char* kind : {"allreduce", "broadcast", "allgather", "reducescatter", "alltoall", "sendrecv"}) {
    if (!kinds.empty() && ("," + kinds + ",").find(std::string(",") + kind + ",") == std::string::npos) continue;
    for (size_t bytes : list) {
      const int iters = bytes <= (32u << 10) ? 200 : bytes <= (2u << 20) ? 40 : 3;
      for (ncclComm_t c : {comms[0], comms[1]}) sw.block(c, kind, bytes, iters > 3 ? 10 : 1);  // warm-up
      std::vector<double> t[2];
      for (int r = 0; r < reps; ++r)
        for (int k = 0; k < 2; ++k) {
          const int m = (r + k) % 2;  // alternate which goes first
          t[m].push_back(sw.block(comms[m], kind, bytes, iters));
        }
      if (rank == 0) {
        const double p = median(t[0]), f = median(t[1]);
        std::printf("  %-13s %10zu %12.2f %12.2f %10.2f\n", kind, bytes, p, f, f > 0 ? p / f : 0.0);
        std::fflush(stdout);
      }
    }
  }
}

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

// The scheduling of communicator `mode` (0 priority, 1 FIFO), whatever
// MESHCCL_PRIORITY says.
meshcclConfig_t config_for(int mode) {
  meshcclConfig_t cfg;
  meshcclConfigInit(&cfg);
  cfg.priority = mode == 0 ? 1 : 0;
  return cfg;
}

// The command line.
struct Args {
  int n = 2, iters = 20, reps = 7;
  bool direct_bulk = false, sweep = false;
  size_t bytes = size_t{256} << 20;
  std::vector<size_t> sizes;
  std::string kinds;
};

// One rank's part: the idle-cost sweep over both communicators (-s), or the
// loaded run. make(mode, &comm) makes communicator `mode` into comms[mode];
// mode 0 first.
template <class Make>
void rank_main(int rank, const Args& a, Make make, ncclComm_t comms[2], Result res[2]) {
  if (!a.sweep) return run_rank(rank, a.n, a.bytes, a.iters, a.direct_bulk, make, res);
  ncclComm_t c = nullptr;
  make(0, &c);
  make(1, &c);
  run_sweep(rank, a.n, comms, a.sizes, a.kinds, a.reps);
  std::fflush(stdout);
}

// Under meshrun (one process per rank, for instance on the hosts of an
// emulated cluster): the priority communicator from the launcher's
// environment, the FIFO one made from an id rank 0 broadcasts over it (a
// split child would keep its parent's scheduling).
int run_launched(const Args& a) {
  const int rank = std::atoi(std::getenv("MESHCCL_RANK"));
  ncclComm_t comms[2] = {nullptr, nullptr};
  auto make = [&](int mode, ncclComm_t* comm) {
    meshcclConfig_t cfg = config_for(mode);
    if (mode == 0) {
      CHECK(meshcclCommInitFromEnv(&comms[0], &cfg.nccl));
    } else {
      ncclUniqueId id{};
      if (rank == 0) CHECK(ncclGetUniqueId(&id));
      CHECK(ncclBroadcast(&id, &id, sizeof id, ncclChar, 0, comms[0], nullptr));
      CHECK(ncclCommInitRankConfig(&comms[1], a.n, id, rank, &cfg.nccl));
    }
    *comm = comms[mode];
  };
  Result res[2];
  rank_main(rank, a, make, comms, res);
  CHECK(ncclCommDestroy(comms[1]));
  CHECK(ncclCommDestroy(comms[0]));
  if (rank == 0 && !a.sweep) print_results(a.n, a.bytes, a.iters, a.direct_bulk, res);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string sizes = "8,64,512,4K,32K,256K,1M,64M";
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "-s")) {
      a.sweep = true;
      --i;  // no value
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "priority_perf: %s needs a value\n", argv[i]);
      return 1;
    } else if (!std::strcmp(argv[i], "-n")) a.n = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-z")) sizes = argv[i + 1];
    else if (!std::strcmp(argv[i], "-r")) a.reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-k")) a.kinds = argv[i + 1];
    else if (!std::strcmp(argv[i], "-b")) {
      if (!perf::ParseSize(argv[i + 1], &a.bytes)) a.bytes = 0;  // refused below
    } else if (!std::strcmp(argv[i], "-i")) a.iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-d")) a.direct_bulk = std::atoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "-p") && (!std::strcmp(argv[i + 1], "spin") || !std::strcmp(argv[i + 1], "sleep")))
      g_spin_pause = !std::strcmp(argv[i + 1], "spin");
    else {
      std::fprintf(
          stderr,
          "usage: %s [-n ranks] [-b bulk bytes] [-i urgent iterations] [-d 0|1: bulk may go direct] "
          "[-p sleep|spin: pause between urgent operations] [-s: idle cost sweep [-z sizes] [-k kinds] [-r blocks]]\n",
          argv[0]);
      return 1;
    }
  }
  if (a.n < 2 || a.n > 64 || a.iters < 1 || a.bytes < 4096 || a.reps < 1) {
    std::fprintf(stderr, "priority_perf: need 2..64 ranks, >= 1 iteration, >= 4096 bulk bytes, >= 1 block\n");
    return 1;
  }
  if (!parse_sizes(sizes, &a.sizes)) {
    std::fprintf(stderr, "priority_perf: -z %s: sizes are positive byte counts (K, M, G suffixes)\n", sizes.c_str());
    return 1;
  }
  if (std::getenv("MESHCCL_COMM_FILE") != nullptr && std::getenv("MESHCCL_RANK") != nullptr &&
      std::getenv("MESHCCL_NRANKS") != nullptr) {
    a.n = std::atoi(std::getenv("MESHCCL_NRANKS"));
    return run_launched(a);
  }
  ncclUniqueId id_prio, id_fifo;
  CHECK(ncclGetUniqueId(&id_prio));
  CHECK(ncclGetUniqueId(&id_fifo));
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < a.n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      close(fds[0]);
      Result res[2] = {};
      ncclComm_t comms[2] = {nullptr, nullptr};
      auto make = [&](int mode, ncclComm_t* comm) {
        meshcclConfig_t cfg = config_for(mode);
        CHECK(ncclCommInitRankConfig(&comms[mode], a.n, mode == 0 ? id_prio : id_fifo, r, &cfg.nccl));
        *comm = comms[mode];
      };
      rank_main(r, a, make, comms, res);
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
  if (!a.sweep) print_results(a.n, a.bytes, a.iters, a.direct_bulk, res);
  return 0;
}
