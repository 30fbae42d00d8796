// The cache-line round trip between two cores, the floor under any handoff
// between two ranks through shared memory: two threads, pinned to cores a
// and b, pass one cache line back and forth (each waits for the other's
// value, then writes its own into a line of its own). Reports the fastest
// and the median of -n chunks of -c round trips: on a shared machine a chunk
// that a preemption hits is slower, so the fastest chunk is the round trip
// itself and the median says how often the cores were taken.
//   line_rtt [-a 0] [-b 1] [-n 200] [-c 10000]
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<unsigned long> v{0};
};
Line ping, pong;

bool pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int a = 0, b = 1;
  unsigned long chunks = 200, chunk = 10000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "-a") == 0) a = static_cast<int>(v);
    else if (std::strcmp(argv[i], "-b") == 0) b = static_cast<int>(v);
    else if (std::strcmp(argv[i], "-n") == 0 && v > 0) chunks = static_cast<unsigned long>(v);
    else if (std::strcmp(argv[i], "-c") == 0 && v > 0) chunk = static_cast<unsigned long>(v);
    else {
      std::fprintf(stderr, "usage: line_rtt [-a core] [-b core] [-n chunks] [-c round trips per chunk]\n");
      return 2;
    }
  }
  const unsigned long total = chunks * chunk;
  std::thread echo([&] {
    if (!pin(b)) std::fprintf(stderr, "line_rtt: cannot pin to core %d\n", b);
    for (unsigned long i = 1; i <= total; ++i) {
      while (ping.v.load(std::memory_order_acquire) != i) {}
      pong.v.store(i, std::memory_order_release);
    }
  });
  if (!pin(a)) std::fprintf(stderr, "line_rtt: cannot pin to core %d\n", a);
  std::vector<double> ns;
  unsigned long i = 1;
  for (unsigned long c = 0; c < chunks; ++c) {
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned long k = 0; k < chunk; ++k, ++i) {
      ping.v.store(i, std::memory_order_release);
      while (pong.v.load(std::memory_order_acquire) != i) {}
    }
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(chunk));
  }
  echo.join();
  std::sort(ns.begin(), ns.end());
  std::printf("cores %d and %d: cache-line round trip %.0f ns (fastest of %lu chunks of %lu), median chunk %.0f ns\n",
              a, b, ns.front(), chunks, chunk, ns[ns.size() / 2]);
  return 0;
}
