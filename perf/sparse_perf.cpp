// sparse_perf: meshcclSparseAllReduce against ncclAllReduce of the densified
// tensor, across densities (docs/sparse.md).
//
// N forked ranks (one host, shm; or MESHCCL_TRANSPORT=socket) each hold a
// rows x rowLen float tensor of which a fraction (the density) of rows, chosen
// at random per rank, is non-zero. For each strategy (MESHCCL_SPARSE_ALGO =
// gather, dense, auto: one communicator each, created in turn) and density,
// the sparse call and ncclAllReduce of the densified tensor alternate on the
// same communicator; the table gives their median times and the ratio
// sparse / ncclAllReduce (below 1: the sparse call is faster), so each ratio
// is taken within one run on one communicator.
// Usage: sparse_perf [-n ranks] [-r rows] [-l rowLen] [-i iterations]
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "meshccl.h"
#include "bench_util.h"

namespace {

using perf_util::median;
using perf_util::now_us;

const double kDensities[] = {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0};
constexpr int kNumDensities = sizeof kDensities / sizeof kDensities[0];
const char* const kAlgos[] = {"gather", "dense", "auto"};
constexpr int kNumAlgos = 3;

struct Cell {
  double sparse_us, dense_us;
};

// One density on one communicator: the sparse call and the dense all-reduce, alternating.
Cell measure(ncclComm_t comm, int rank, size_t rows, size_t len, double density, int iters) {
  std::mt19937 g(static_cast<unsigned>(rank) * 7919 + 1);
  std::vector<int64_t> all(rows);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), g);
  const size_t nnz = std::max<size_t>(1, static_cast<size_t>(density * static_cast<double>(rows)));
  std::vector<int64_t> idx(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(nnz));
  std::vector<float> vals(nnz * len, 0.5f), dense(rows * len, 0.0f), out(rows * len), dout(rows * len);
  for (size_t k = 0; k < nnz; ++k) std::fill_n(dense.begin() + static_cast<std::ptrdiff_t>(idx[k] * len), len, 0.5f);
  std::vector<double> s, d;
  for (int i = -1; i < iters; ++i) {  // i = -1: warm-up
    double t0 = now_us();
    CHECK(meshcclSparseAllReduce(vals.data(), idx.data(), nnz, out.data(), rows, len, ncclFloat32, ncclSum, comm,
                                 nullptr));
    double t1 = now_us();
    CHECK(ncclAllReduce(dense.data(), dout.data(), rows * len, ncclFloat32, ncclSum, comm, nullptr));
    double t2 = now_us();
    if (i >= 0) s.push_back(t1 - t0), d.push_back(t2 - t1);
  }
  if (std::memcmp(out.data(), dout.data(), out.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "sparse_perf: rank %d: the sparse result differs from ncclAllReduce's\n", rank);
    std::exit(4);
  }
  return {median(s), median(d)};
}

void run_rank(int rank, int n, const ncclUniqueId* ids, size_t rows, size_t len, int iters, int out_fd) {
  Cell cells[kNumAlgos][kNumDensities];
  for (int a = 0; a < kNumAlgos; ++a) {
    setenv("MESHCCL_SPARSE_ALGO", kAlgos[a], 1);
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, n, ids[a], rank));
    for (int k = 0; k < kNumDensities; ++k) cells[a][k] = measure(comm, rank, rows, len, kDensities[k], iters);
    CHECK(ncclCommDestroy(comm));
  }
  if (rank == 0 && write(out_fd, cells, sizeof cells) != static_cast<ssize_t>(sizeof cells)) std::exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 4, iters = 10;
  size_t rows = 16384, len = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-n")) n = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-r")) rows = std::strtoull(argv[i + 1], nullptr, 0);
    else if (!std::strcmp(argv[i], "-l")) len = std::strtoull(argv[i + 1], nullptr, 0);
    else if (!std::strcmp(argv[i], "-i")) iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [-n ranks] [-r rows] [-l rowLen] [-i iterations]\n", argv[0]);
      return 1;
    }
  }
  if (n < 1 || n > 64 || iters < 1 || rows < 1 || len < 1 || rows * len > (size_t{1} << 28)) {
    std::fprintf(stderr, "sparse_perf: need 1..64 ranks, >= 1 iteration, 1 <= rows x rowLen <= 2^28\n");
    return 1;
  }
  ncclUniqueId ids[kNumAlgos];
  for (auto& id : ids) CHECK(ncclGetUniqueId(&id));
  int fds[2];
  if (pipe(fds) != 0) return 1;
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t p = fork();
    if (p == 0) {
      close(fds[0]);
      run_rank(r, n, ids, rows, len, iters, fds[1]);
      _exit(0);
    }
    kids.push_back(p);
  }
  close(fds[1]);
  Cell cells[kNumAlgos][kNumDensities];
  const bool got = read(fds[0], cells, sizeof cells) == static_cast<ssize_t>(sizeof cells);
  int failed = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  if (!got || failed) {
    std::fprintf(stderr, "sparse_perf: %d rank(s) failed\n", failed);
    return 2;
  }
  std::printf("# %d ranks, %zu rows x %zu floats (%.1f MiB dense), median of %d; ratio = sparse / ncclAllReduce\n", n,
              rows, len, static_cast<double>(rows * len * 4) / (1 << 20), iters);
  std::printf("%8s", "density");
  for (const char* a : kAlgos) std::printf(" | %9s %9s %6s", a, "allreduce", "ratio");
  std::printf("\n");
  for (int k = 0; k < kNumDensities; ++k) {
    std::printf("%7.1f%%", kDensities[k] * 100);
    for (int a = 0; a < kNumAlgos; ++a)
      std::printf(" | %7.0fus %7.0fus %6.2f", cells[a][k].sparse_us, cells[a][k].dense_us,
                  cells[a][k].sparse_us / cells[a][k].dense_us);
    std::printf("\n");
  }
  return 0;
}
