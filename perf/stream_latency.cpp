// Small-operation latency on host streams against the NULL stream, one
// process per rank (under meshrun):
//
//   meshrun -n 2 build/perf/stream_latency [-s bytes] [-n iterations] [-r rounds]
//
// Each rank creates two host streams of different priority, then times, in
// rounds that alternate the three, AllReduce (float sum) on the NULL stream,
// on the low-priority and on the high-priority stream, each call followed by
// a synchronize of its stream. It prints per stream the median and the 90th
// percentile of a round's per-call time (us) and the context switches per
// call (getrusage, all threads of the process), and the ratio of each
// stream's median to the NULL stream's. A slow mode (waits left in their
// sleeping phase, a worker thread woken for nothing at every synchronize)
// shows as a ratio far above 1 or as context switches per call well above 0.
#include <meshccl/meshccl.h>
#include <nccl.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                                           \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "stream_latency: %s failed: %s\n", #call, ncclGetErrorString(r_)); \
      std::exit(3);                                                                           \
    }                                                                                         \
  } while (0)

long switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Series {
  const char* name;
  meshcclStream_t stream;  // nullptr: the NULL stream
  std::vector<double> us;  // per-call time of each round
  long switches = 0;
  long calls = 0;
};

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1024;
  int iters = 200, rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (v <= 0) {
      std::fprintf(stderr, "stream_latency: %s needs a positive number\n", a.c_str());
      return 6;
    }
    if (a == "-s") bytes = static_cast<size_t>(v);
    else if (a == "-n") iters = static_cast<int>(v);
    else if (a == "-r") rounds = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: stream_latency [-s bytes] [-n iterations] [-r rounds]\n");
      return 6;
    }
  }
  ncclComm_t comm = nullptr;
  CHECK(meshcclCommInitFromEnv(&comm, nullptr));
  int rank = 0;
  CHECK(ncclCommUserRank(comm, &rank));
  int least = 0, greatest = 0;
  CHECK(meshcclStreamGetPriorityRange(&least, &greatest));
  meshcclStream_t lo = nullptr, hi = nullptr;
  CHECK(meshcclStreamCreateWithPriority(&lo, least));
  CHECK(meshcclStreamCreateWithPriority(&hi, greatest));
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  std::vector<float> send(count, 1.0f), recv(count);
  Series all[] = {{"NULL", nullptr, {}}, {"low priority", lo, {}}, {"high priority", hi, {}}};

  auto call = [&](Series& s) {
    CHECK(ncclAllReduce(send.data(), recv.data(), count, ncclFloat32, ncclSum, comm,
                        s.stream ? meshcclStreamAsCuda(s.stream) : nullptr));
    if (s.stream) CHECK(meshcclStreamSynchronize(s.stream));
  };
  for (Series& s : all)
    for (int i = 0; i < 20; ++i) call(s);  // warm-up
  for (int r = 0; r < rounds; ++r) {
    for (Series& s : all) {
      const long sw = switches();
      const double t0 = now_us();
      for (int i = 0; i < iters; ++i) call(s);
      s.us.push_back((now_us() - t0) / iters);
      s.switches += switches() - sw;
      s.calls += iters;
    }
  }
  int nranks = 0;
  CHECK(ncclCommCount(comm, &nranks));
  if (recv[0] != static_cast<float>(nranks) || recv[count - 1] != static_cast<float>(nranks)) {
    std::fprintf(stderr, "stream_latency: wrong result %g, expected %d\n", recv[0], nranks);
    return 7;
  }
  if (rank == 0) {
    double null_median = 0;
    std::printf("# stream_latency: AllReduce %zu B, %d rounds of %d calls, synchronize after each\n", count * 4, rounds,
                iters);
    std::printf("%-14s %10s %10s %14s %8s\n", "stream", "median_us", "p90_us", "switches/call", "ratio");
    for (Series& s : all) {
      std::sort(s.us.begin(), s.us.end());
      const double med = s.us[s.us.size() / 2];
      const double p90 = s.us[std::min(s.us.size() - 1, s.us.size() * 9 / 10)];
      if (s.stream == nullptr) null_median = med;
      std::printf("%-14s %10.2f %10.2f %14.3f %8.2f\n", s.name, med, p90,
                  static_cast<double>(s.switches) / static_cast<double>(s.calls), med / null_median);
    }
  }
  CHECK(meshcclStreamDestroy(lo));
  CHECK(meshcclStreamDestroy(hi));
  CHECK(ncclCommDestroy(comm));
  return 0;
}
