// The memory-bandwidth limit a shared-memory collective cannot beat on this
// machine, measured in the same run as the collectives:
//   copy      memcpy of B bytes on each of 1..T threads   GB/s = threads * B / t
//   sum2      c = a + b over float arrays of B bytes      GB/s = threads * B / t
//   allreduce_limit  the work of an ideal shared-memory AllReduce of B bytes
//             over R ranks: each rank (one thread per rank, at most T threads)
//             sums its 1/R of the buffer from R inputs into its output, then,
//             after a barrier, copies the other (R-1)/R from the owners'
//             outputs. Reported as AllReduce busbw: B / t * 2(R-1)/R.
// Best of -n repetitions. Output: CSV kind,ranks,threads,bytes,time_us,gbs
//   membw -b 64M [-e 64M] [-r 2] [-t 2] [-n 5]
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool ParseSize(const char* s, size_t* out) {
  char* end = nullptr;
  const double v = strtod(s, &end);
  if (end == s || v <= 0) return false;
  double m = 1;
  if (*end == 'K' || *end == 'k') m = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024 * 1024, end++;
  if (*end) return false;
  *out = static_cast<size_t>(v * m);
  return true;
}

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int i = 0; gen_.load(std::memory_order_acquire) == gen; i++)
      if (i > 64) sched_yield();
  }

 private:
  const int n_;
  std::atomic<int> count_{0}, gen_{0};
};

void Sum(float* __restrict c, const float* __restrict a, const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

void Accumulate(float* __restrict c, const float* __restrict a, size_t n) {
  for (size_t i = 0; i < n; i++) c[i] += a[i];
}

std::vector<float> Buffer(size_t bytes, float v) { return std::vector<float>(bytes / 4, v); }

// Runs fn(thread) on `threads` threads at once, `reps` times; best wall time.
template <class Fn>
double Best(int threads, int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    Barrier start(threads + 1);
    std::vector<std::thread> pool;
    std::atomic<int> done{0};
    double t0 = 0;
    for (int t = 0; t < threads; t++)
      pool.emplace_back([&, t] {
        start.Wait();
        fn(t);
        done++;
      });
    t0 = Now();
    start.Wait();
    for (auto& th : pool) th.join();
    best = std::min(best, Now() - t0);
  }
  return best;
}

void Row(const char* kind, int ranks, int threads, size_t bytes, double sec, double gbs) {
  printf("%s,%d,%d,%zu,%.3f,%.4f\n", kind, ranks, threads, bytes, sec * 1e6, gbs);
  fflush(stdout);
}

void Measure(size_t bytes, int ranks, int threads, int reps) {
  const size_t n = bytes / 4;
  for (int t = 1; t <= threads; t++) {
    std::vector<std::vector<float>> src, dst, a, b;
    for (int i = 0; i < t; i++) {
      src.push_back(Buffer(bytes, 1.0f));
      dst.push_back(Buffer(bytes, 0.0f));
    }
    double sec = Best(t, reps, [&](int i) { memcpy(dst[i].data(), src[i].data(), bytes); });
    Row("copy", 0, t, bytes, sec, static_cast<double>(bytes) * t / 1e9 / sec);
    for (int i = 0; i < t; i++) a.push_back(Buffer(bytes, 2.0f));
    sec = Best(t, reps, [&](int i) { Sum(dst[i].data(), src[i].data(), a[i].data(), n); });
    Row("sum2", 0, t, bytes, sec, static_cast<double>(bytes) * t / 1e9 / sec);
  }

  // The ideal shared-memory AllReduce: rank k owns chunk k.
  std::vector<std::vector<float>> in, out;
  for (int r = 0; r < ranks; r++) {
    in.push_back(Buffer(bytes, static_cast<float>(r + 1)));
    out.push_back(Buffer(bytes, 0.0f));
  }
  const int workers = std::min(threads, ranks);
  const size_t chunk = n / ranks;
  auto lo = [&](int k) { return chunk * k; };
  auto len = [&](int k) { return k == ranks - 1 ? n - chunk * k : chunk; };
  Barrier mid(workers);
  const double sec = Best(workers, reps, [&](int w) {
    for (int k = w; k < ranks; k += workers) {
      float* o = out[k].data() + lo(k);
      if (ranks == 1) {
        memcpy(o, in[0].data(), len(k) * 4);
        continue;
      }
      Sum(o, in[0].data() + lo(k), in[1].data() + lo(k), len(k));
      for (int r = 2; r < ranks; r++) Accumulate(o, in[r].data() + lo(k), len(k));
    }
    mid.Wait();
    for (int k = w; k < ranks; k += workers)
      for (int j = 0; j < ranks; j++)
        if (j != k) memcpy(out[k].data() + lo(j), out[j].data() + lo(j), len(j) * 4);
  });
  float expect = 0;
  for (int r = 0; r < ranks; r++) expect += static_cast<float>(r + 1);
  for (int r = 0; r < ranks; r++)
    for (size_t i = 0; i < n; i += 4097)
      if (out[r][i] != expect) {
        fprintf(stderr, "membw: allreduce_limit produced %g at [%d][%zu], expected %g\n", out[r][i], r, i, expect);
        exit(1);
      }
  const double algbw = static_cast<double>(bytes) / 1e9 / sec;
  Row("allreduce_limit", ranks, workers, bytes, sec, ranks > 1 ? algbw * 2.0 * (ranks - 1) / ranks : algbw);
}

}  // namespace

int main(int argc, char** argv) {
  size_t min_bytes = 64u << 20, max_bytes = 0;
  int ranks = 2, threads = 2, reps = 5;
  bool header = true;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--no-header") {
      header = false;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "membw: missing value after %s\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "-b") ok = ParseSize(v, &min_bytes);
    else if (a == "-e") ok = ParseSize(v, &max_bytes);
    else if (a == "-r") ok = (ranks = atoi(v)) >= 1;
    else if (a == "-t") ok = (threads = atoi(v)) >= 1;
    else if (a == "-n") ok = (reps = atoi(v)) >= 1;
    else ok = false;
    if (!ok) {
      fprintf(stderr, "usage: membw [-b 64M] [-e size] [-r ranks] [-t threads] [-n reps] [--no-header]\n");
      return 2;
    }
  }
  if (max_bytes < min_bytes) max_bytes = min_bytes;
  if (header) printf("kind,ranks,threads,bytes,time_us,gbs\n");
  for (size_t b = min_bytes; b <= max_bytes; b *= 2) Measure(b, ranks, threads, reps);
  return 0;
}
