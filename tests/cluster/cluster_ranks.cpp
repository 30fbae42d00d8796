// One rank of a job across emulated hosts (meshrun --cluster). Checks where
// it runs, then every collective over a matrix of counts (0, 1, primes),
// datatypes, operations, roots, in and out of place, and reports the first
// wrong element. Uses only the public API.
//
//   cluster_ranks [--quick]
//   cluster_ranks --die R   rank R SIGKILLs itself after one collective; the
//                           others run allreduces until one fails and print
//                           "rank N saw the dead peer after S s: <error>"
//   cluster_ranks --shrink V[,V...]
//                           ncclCommShrink across hosts: first with
//                           NCCL_SHRINK_DEFAULT on the healthy communicator
//                           (the ranks V stay out), then the ranks V SIGKILL
//                           themselves at a random moment inside a stream of
//                           checked allreduces; the survivors shrink with
//                           NCCL_SHRINK_ABORT and check every collective on
//                           the child. Each survivor prints "rank R shrink ok
//                           ..." and exits 0
//
// Prints one line "rank R host NETNS local L/S ok N checks" and exits 0, or
// prints what failed and exits 1. --quick runs one size per collective.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "meshccl.h"

namespace {

int g_rank = 0, g_n = 1;
long g_checks = 0;
int g_failures = 0;

#define NCCL_OK(call)                                                                                \
  do {                                                                                               \
    ncclResult_t res_ = (call);                                                                      \
    if (res_ != ncclSuccess) {                                                                       \
      std::fprintf(stderr, "rank %d: %s failed: %s (%s)\n", g_rank, #call, ncclGetErrorString(res_), \
                   ncclGetLastError(nullptr));                                                       \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

struct Type {
  ncclDataType_t dt;
  const char* name;
  size_t size;
  bool is_float;
};
const Type kTypes[] = {
    {ncclInt8, "int8", 1, false},      {ncclInt32, "int32", 4, false},    {ncclUint64, "uint64", 8, false},
    {ncclFloat32, "float32", 4, true}, {ncclFloat64, "float64", 8, true}, {ncclBfloat16, "bfloat16", 2, true},
};
struct Op {
  ncclRedOp_t op;
  const char* name;
};
const Op kOps[] = {{ncclSum, "sum"}, {ncclProd, "prod"}, {ncclMax, "max"}, {ncclMin, "min"}, {ncclAvg, "avg"}};

// 1 or 2, exact in every type; a product over 8 ranks is at most 8.
double input(int rank, size_t i) { return (rank + i) % 3 == 0 ? 2 : 1; }
double pattern(int rank, size_t i) { return static_cast<double>((rank * 31 + i * 7) % 97); }

void put(const Type& t, void* base, size_t i, double v) {
  char* p = static_cast<char*>(base) + i * t.size;
  switch (t.dt) {
    case ncclInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case ncclInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case ncclUint64: {
      uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case ncclFloat32: {
      float x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case ncclFloat64: std::memcpy(p, &v, 8); break;
    case ncclBfloat16: {  // small integers: the top half of the float is exact
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t x = static_cast<uint16_t>(bits >> 16);
      std::memcpy(p, &x, 2);
      break;
    }
    default: std::abort();
  }
}

double get(const Type& t, const void* base, size_t i) {
  const char* p = static_cast<const char*>(base) + i * t.size;
  switch (t.dt) {
    case ncclInt8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case ncclInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ncclUint64: {
      uint64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case ncclFloat32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case ncclFloat64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case ncclBfloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      uint32_t bits = static_cast<uint32_t>(x) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: std::abort();
  }
}

double reduced(ncclRedOp_t op, int n, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < n; ++r) {
    double v = input(r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    else if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = v > acc ? v : acc;
    else acc = v < acc ? v : acc;
  }
  return op == ncclAvg ? acc / n : acc;
}

struct Buf {
  Buf(const Type& t, size_t count) : type(t), bytes(count * t.size + 64) { data.assign(bytes, 0x5a); }
  const Type& type;
  size_t bytes;
  std::vector<unsigned char> data;
  void* at(size_t i) { return data.data() + i * type.size; }
  void fill(size_t from, size_t count, double (*f)(int, size_t), int rank) {
    for (size_t i = 0; i < count; ++i) put(type, at(from + i), 0, f(rank, i));
  }
};

// Compares count elements of b from offset `from` with want(i).
template <class Want>
void expect(const char* what, const Type& t, ncclRedOp_t op, size_t count, bool in_place, int root, Buf& b, size_t from,
            Want want) {
  ++g_checks;
  double tol = (op == ncclAvg && t.is_float) ? (t.dt == ncclBfloat16 ? 2e-2 : 1e-6) : 0;
  for (size_t i = 0; i < count; ++i) {
    double got = get(t, b.at(from + i), 0), w = want(i);
    if (std::fabs(got - w) > tol * std::fabs(w)) {
      if (++g_failures <= 10)
        std::fprintf(stderr, "rank %d: %s %s count %zu %s root %d %s: element %zu is %g, want %g\n", g_rank, what,
                     t.name, count,
                     op == ncclSum    ? "sum"
                     : op == ncclProd ? "prod"
                     : op == ncclMax  ? "max"
                     : op == ncclMin  ? "min"
                                      : "avg",
                     root, in_place ? "in place" : "out of place", i, got, w);
      return;
    }
  }
}

void run_reductions(ncclComm_t comm, const Type& t, const Op& o, size_t count) {
  const int n = g_n, me = g_rank;
  auto want = [&](size_t i) { return reduced(o.op, n, i); };
  for (bool in_place : {false, true}) {
    {  // AllReduce
      Buf s(t, count), r(t, count);
      s.fill(0, count, input, me);
      Buf& out = in_place ? s : r;
      NCCL_OK(ncclAllReduce(s.at(0), out.at(0), count, t.dt, o.op, comm, nullptr));
      expect("AllReduce", t, o.op, count, in_place, -1, out, 0, want);
    }
    for (int root : {0, n - 1}) {  // Reduce
      Buf s(t, count), r(t, count);
      s.fill(0, count, input, me);
      Buf& out = in_place ? s : r;
      NCCL_OK(ncclReduce(s.at(0), out.at(0), count, t.dt, o.op, root, comm, nullptr));
      if (me == root) expect("Reduce", t, o.op, count, in_place, root, out, 0, want);
      if (n == 1 || root == n - 1) break;
    }
    {  // ReduceScatter: recvcount per rank, input n * count
      Buf s(t, count * n), r(t, count);
      for (int b = 0; b < n; ++b)
        for (size_t i = 0; i < count; ++i) put(t, s.at(b * count + i), 0, input(me, b * count + i));
      void* out = in_place ? s.at(me * count) : r.at(0);
      NCCL_OK(ncclReduceScatter(s.at(0), out, count, t.dt, o.op, comm, nullptr));
      expect("ReduceScatter", t, o.op, count, in_place, -1, in_place ? s : r, in_place ? me * count : 0,
             [&](size_t i) { return reduced(o.op, n, me * count + i); });
    }
  }
}

void run_movement(ncclComm_t comm, const Type& t, size_t count) {
  const int n = g_n, me = g_rank;
  for (bool in_place : {false, true}) {
    for (int root : {0, n - 1}) {  // Broadcast
      Buf s(t, count), r(t, count);
      if (me == root) s.fill(0, count, pattern, root);
      Buf& out = in_place ? s : r;
      NCCL_OK(ncclBroadcast(s.at(0), out.at(0), count, t.dt, root, comm, nullptr));
      expect("Broadcast", t, ncclSum, count, in_place, root, out, 0, [&](size_t i) { return pattern(root, i); });
      if (n == 1) break;
    }
    {  // AllGather
      Buf s(t, count), r(t, count * n);
      void* src = s.at(0);
      if (in_place) {
        r.fill(me * count, count, pattern, me);
        src = r.at(me * count);
      } else {
        s.fill(0, count, pattern, me);
      }
      NCCL_OK(ncclAllGather(src, r.at(0), count, t.dt, comm, nullptr));
      for (int b = 0; b < n; ++b)
        expect("AllGather", t, ncclSum, count, in_place, -1, r, b * count, [&](size_t i) { return pattern(b, i); });
    }
    {  // AlltoAll: block j of rank i's input holds pattern(i * n + j)
      Buf s(t, count * n), r(t, count * n);
      for (int b = 0; b < n; ++b) s.fill(b * count, count, pattern, me * n + b);
      Buf& out = in_place ? s : r;
      NCCL_OK(ncclAlltoAll(s.at(0), out.at(0), count, t.dt, comm, nullptr));
      for (int b = 0; b < n; ++b)
        expect("AlltoAll", t, ncclSum, count, in_place, -1, out, b * count,
               [&](size_t i) { return pattern(b * n + me, i); });
    }
    for (int root : {0, n - 1}) {  // Gather
      Buf s(t, count), r(t, count * n);
      void* src = s.at(0);
      if (in_place && me == root) {
        r.fill(me * count, count, pattern, me);
        src = r.at(me * count);
      } else {
        s.fill(0, count, pattern, me);
      }
      NCCL_OK(ncclGather(src, r.at(0), count, t.dt, root, comm, nullptr));
      if (me == root)
        for (int b = 0; b < n; ++b)
          expect("Gather", t, ncclSum, count, in_place, root, r, b * count, [&](size_t i) { return pattern(b, i); });
      if (n == 1) break;
    }
    for (int root : {0, n - 1}) {  // Scatter
      Buf s(t, count * n), r(t, count);
      if (me == root)
        for (int b = 0; b < n; ++b) s.fill(b * count, count, pattern, b);
      void* dst = (in_place && me == root) ? s.at(root * count) : r.at(0);
      NCCL_OK(ncclScatter(s.at(0), dst, count, t.dt, root, comm, nullptr));
      expect("Scatter", t, ncclSum, count, in_place, root, (in_place && me == root) ? s : r,
             (in_place && me == root) ? root * count : 0, [&](size_t i) { return pattern(me, i); });
      if (n == 1) break;
    }
  }
  {  // Send/Recv: a ring in both directions in one group
    Buf s(t, count), r1(t, count), r2(t, count);
    s.fill(0, count, pattern, me);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(s.at(0), count, t.dt, next, comm, nullptr));
    NCCL_OK(ncclRecv(r1.at(0), count, t.dt, prev, comm, nullptr));
    NCCL_OK(ncclSend(s.at(0), count, t.dt, prev, comm, nullptr));
    NCCL_OK(ncclRecv(r2.at(0), count, t.dt, next, comm, nullptr));
    NCCL_OK(ncclGroupEnd());
    expect("SendRecv", t, ncclSum, count, false, prev, r1, 0, [&](size_t i) { return pattern(prev, i); });
    expect("SendRecv", t, ncclSum, count, false, next, r2, 0, [&](size_t i) { return pattern(next, i); });
  }
}

std::string netns_name() {
  struct stat self {};
  if (stat("/proc/self/ns/net", &self) != 0) return "?";
  std::string name = "netns" + std::to_string(self.st_ino);
  char path[512];
  for (int h = 0; h < 256; ++h) {  // names of the form scripts/cluster makes
    const char* cl = std::getenv("CLUSTER_NAME");
    if (cl == nullptr) break;
    std::snprintf(path, sizeof path, "/run/netns/mcc-%s-h%d", cl, h);
    struct stat st {};
    if (stat(path, &st) != 0) break;
    if (st.st_ino == self.st_ino && st.st_dev == self.st_dev) return std::string(path + 11);
  }
  return name;
}

// Every collective on `comm` as rank `rank` of `n` (the child's ranks, so
// the expected values are the child's too): every type and operation at
// count 7 (`all`) or float sum and float64 movement only, then larger counts.
void check_every_collective(ncclComm_t comm, int rank, int n, bool all) {
  const int saved_rank = g_rank, saved_n = g_n;
  g_rank = rank;
  g_n = n;
  for (const Type& t : kTypes) {
    if (!all) break;
    for (const Op& o : kOps) {
      if (o.op == ncclAvg && !t.is_float) continue;
      run_reductions(comm, t, o, 7);
    }
    run_movement(comm, t, 7);
  }
  run_reductions(comm, kTypes[3], kOps[0], 65537);
  run_movement(comm, kTypes[4], 4099);
  g_rank = saved_rank;
  g_n = saved_n;
}

// The child's members in order, as ranks of the parent: each member
// contributes its parent rank; must be `want`.
bool check_members(ncclComm_t child, int n, const std::vector<int>& want) {
  std::vector<int32_t> got(n);
  int32_t mine = g_rank;
  NCCL_OK(ncclAllGather(&mine, got.data(), 1, ncclInt32, child, nullptr));
  for (int i = 0; i < n; ++i)
    if (i >= static_cast<int>(want.size()) || got[i] != want[i]) {
      std::fprintf(stderr, "rank %d: child rank %d is parent rank %d, want %d\n", g_rank, i, got[i],
                   i < static_cast<int>(want.size()) ? want[i] : -1);
      return false;
    }
  return n == static_cast<int>(want.size());
}

// Checked float allreduces of varying sizes on the parent until one fails;
// returns the failing result (wrong answers count in g_failures and stop).
ncclResult_t allreduce_until_error(ncclComm_t comm, long* done) {
  const size_t sizes[] = {1, 4099, 65537, 17, 250007};
  std::vector<float> in(250007), out(250007);
  for (long it = 0; it < 1'000'000; ++it) {
    const size_t c = sizes[it % 5];
    for (size_t i = 0; i < c; ++i) in[i] = static_cast<float>((g_rank + 1) * (i % 97 + 1));
    ncclResult_t r = ncclAllReduce(in.data(), out.data(), c, ncclFloat32, ncclSum, comm, nullptr);
    if (r != ncclSuccess) return r;
    const float per = static_cast<float>(g_n * (g_n + 1) / 2);
    for (size_t i = 0; i < c; ++i)
      if (out[i] != per * static_cast<float>(i % 97 + 1)) {
        std::fprintf(stderr, "rank %d: WRONG allreduce %ld element %zu of %zu: %g, want %g\n", g_rank, it, i, c, out[i],
                     per * static_cast<float>(i % 97 + 1));
        ++g_failures;
        return ncclSuccess;
      }
    ++*done;
  }
  return ncclSuccess;
}

// ncclCommShrink across hosts (see the top of the file).
int shrink_job(ncclComm_t comm, const std::vector<int>& victims) {
  const bool victim = std::find(victims.begin(), victims.end(), g_rank) != victims.end();
  std::vector<int> members;
  for (int r = 0; r < g_n; ++r)
    if (std::find(victims.begin(), victims.end(), r) == victims.end()) members.push_back(r);
  const int cn = static_cast<int>(members.size());
  const int crank = static_cast<int>(std::find(members.begin(), members.end(), g_rank) - members.begin());
  // 1. NCCL_SHRINK_DEFAULT on the healthy communicator; the excluded ranks
  // wait in the parent's next allreduce, which every rank then completes.
  if (!victim) {
    ncclComm_t child = nullptr;
    NCCL_OK(ncclCommShrink(comm, const_cast<int*>(victims.data()), static_cast<int>(victims.size()), &child, nullptr,
                           NCCL_SHRINK_DEFAULT));
    int r = -1, n = -1;
    NCCL_OK(ncclCommUserRank(child, &r));
    NCCL_OK(ncclCommCount(child, &n));
    if (r != crank || n != cn || !check_members(child, n, members)) return 1;
    check_every_collective(child, r, n, false);
    NCCL_OK(ncclCommDestroy(child));
  }
  float one = 1, sum = 0;
  NCCL_OK(ncclAllReduce(&one, &sum, 1, ncclFloat32, ncclSum, comm, nullptr));
  if (sum != static_cast<float>(g_n)) {
    std::fprintf(stderr, "rank %d: WRONG parent allreduce after the shrink: %g, want %d\n", g_rank, sum, g_n);
    return 1;
  }
  const long default_checks = g_checks;
  // 2. The victims die at a random moment, most likely inside a collective.
  if (victim) {
    std::thread([] {
      std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
      std::this_thread::sleep_for(std::chrono::microseconds(50000 + rng() % 900000));
      std::fflush(stdout);
      raise(SIGKILL);
    }).detach();
  }
  long done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t err = allreduce_until_error(comm, &done);
  if (g_failures > 0) return 1;
  if (victim && err != ncclSuccess) {
    // Another victim died first: wait for our own SIGKILL (due within 1 s).
    for (int i = 0; i < 100; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (err == ncclSuccess || victim) {
    std::fprintf(stderr, "rank %d: no error after %ld allreduces\n", g_rank, done);
    return 1;
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ncclComm_t child = nullptr;
  NCCL_OK(ncclCommShrink(comm, const_cast<int*>(victims.data()), static_cast<int>(victims.size()), &child, nullptr,
                         NCCL_SHRINK_ABORT));
  NCCL_OK(ncclCommAbort(comm));
  int r = -1, n = -1;
  NCCL_OK(ncclCommUserRank(child, &r));
  NCCL_OK(ncclCommCount(child, &n));
  if (r != crank || n != cn || !check_members(child, n, members)) return 1;
  check_every_collective(child, r, n, true);
  NCCL_OK(ncclCommDestroy(child));
  if (g_failures > 0) {
    std::fprintf(stderr, "rank %d: %d of %ld checks wrong\n", g_rank, g_failures, g_checks);
    return 1;
  }
  std::printf(
      "rank %d shrink ok: default -> %d/%d %ld checks; %ld allreduces, then after %.1f s %s; abort -> %d/%d %ld "
      "checks\n",
      g_rank, crank, cn, default_checks, done, took, ncclGetErrorString(err), r, n, g_checks - default_checks);
  return 0;
}

}  // namespace

// A peer dies in the middle of a job: every survivor's next collective fails
// with an error naming the cause, within MESHCCL_TIMEOUT, instead of hanging.
int dead_peer(ncclComm_t comm, int victim) {
  std::vector<float> buf(1 << 18, 1.0f);
  NCCL_OK(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr));
  if (g_rank == victim) {
    std::fflush(stdout);
    raise(SIGKILL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  double took = 0;
  for (long i = 0; i < 10'000'000 && took < 900; ++i) {
    ncclResult_t r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
    took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r != ncclSuccess) {
      std::printf("rank %d saw the dead peer after %.1f s: %s: %s\n", g_rank, took, ncclGetErrorString(r),
                  ncclGetLastError(comm));
      ncclCommAbort(comm);
      return 0;
    }
  }
  std::printf("rank %d: no error %.0f s after rank %d died\n", g_rank, took, victim);
  return 1;
}

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--die") == 0) {
    ncclComm_t comm = nullptr;
    NCCL_OK(meshcclCommInitFromEnv(&comm, nullptr));
    int local = 0;
    NCCL_OK(meshcclGetLaunchInfo(&g_rank, &g_n, &local));
    return dead_peer(comm, std::atoi(argv[2]));
  }
  if (argc > 2 && std::strcmp(argv[1], "--shrink") == 0) {
    ncclComm_t comm = nullptr;
    NCCL_OK(meshcclCommInitFromEnv(&comm, nullptr));
    int local = 0;
    NCCL_OK(meshcclGetLaunchInfo(&g_rank, &g_n, &local));
    std::vector<int> victims;
    for (const char* p = argv[2]; *p != '\0';) {
      char* end = nullptr;
      victims.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      p = *end == ',' ? end + 1 : end;
      if (end == p && *p != '\0') return 2;
    }
    return shrink_job(comm, victims);
  }
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  ncclComm_t comm = nullptr;
  NCCL_OK(meshcclCommInitFromEnv(&comm, nullptr));
  int local = 0;
  NCCL_OK(meshcclGetLaunchInfo(&g_rank, &g_n, &local));
  const std::string host = netns_name();

  // Every rank learns every rank's namespace: ranks meshrun put on one host
  // must share it, ranks on different hosts must not.
  struct stat self {};
  stat("/proc/self/ns/net", &self);
  std::vector<uint64_t> ns(g_n);
  uint64_t mine = self.st_ino;
  NCCL_OK(ncclAllGather(&mine, ns.data(), 1, ncclUint64, comm, nullptr));
  int same = 0;
  for (uint64_t v : ns) same += v == mine;
  const char* ls = std::getenv("MESHCCL_LOCAL_SIZE");
  if (ls == nullptr || same != std::atoi(ls)) {
    std::fprintf(stderr, "rank %d: %d ranks share this network namespace, MESHCCL_LOCAL_SIZE=%s\n", g_rank, same,
                 ls ? ls : "(unset)");
    return 1;
  }

  const size_t counts_full[] = {0, 1, 7, 1031};
  const size_t counts_quick[] = {7};
  const size_t* counts = quick ? counts_quick : counts_full;
  const size_t ncounts = quick ? 1 : 4;
  for (size_t c = 0; c < ncounts; ++c) {
    for (const Type& t : kTypes) {
      for (const Op& o : kOps) {
        if (o.op == ncclAvg && !t.is_float) continue;
        run_reductions(comm, t, o, counts[c]);
      }
      run_movement(comm, t, counts[c]);
    }
  }
  // Larger than the socket transport's chunks and the direct algorithms'
  // inline sizes: one prime count per collective family.
  const size_t big = quick ? 4099 : 65537;
  run_reductions(comm, kTypes[3], kOps[0], big);
  run_reductions(comm, kTypes[0], kOps[2], big);
  run_movement(comm, kTypes[4], big);

  int bad = g_failures > 0, any_bad = 0;
  NCCL_OK(ncclAllReduce(&bad, &any_bad, 1, ncclInt32, ncclMax, comm, nullptr));
  NCCL_OK(ncclCommDestroy(comm));
  if (g_failures > 0) {
    std::fprintf(stderr, "rank %d: %d of %ld checks wrong\n", g_rank, g_failures, g_checks);
    return 1;
  }
  std::printf("rank %d host %s local %d/%s ok %ld checks%s\n", g_rank, host.c_str(), local, ls, g_checks,
              any_bad ? " (another rank failed)" : "");
  return any_bad ? 1 : 0;
}
