// The common driver of the nccl-tests-compatible tools (nccl-tests' common.cu):
// ranks as threads of this process, processes from a launcher, or both; the
// size sweep; timing; checking; the table.
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "coll.h"
#include "format.h"
#include "hostload.h"
#include "json.h"
#include "meshccl.h"
#include "procgroup.h"

namespace perf {

// The exit statuses of nccl-tests.
enum class Status {
  kOk = 0,
  kInternal = 1,
  kCuda = 2,
  kNccl = 3,
  kTimeout = 4,
  kNotImplemented = 5,
  kInvalidUsage = 6,
  kDataError = 7
};

namespace {

char g_host[256] = "localhost";

void Chain(const char* file, int line) {
  printf(" .. %s pid %d: Test failure %s:%d\n", g_host, static_cast<int>(getpid()), file, line);
}

#define NCCLCHECK(cmd)                                                                                      \
  do {                                                                                                      \
    const ncclResult_t r_ = (cmd);                                                                          \
    if (r_ != ncclSuccess && r_ != ncclInProgress) {                                                        \
      printf("%s: Test NCCL failure %s:%d '%s / %s'\n", g_host, __FILE__, __LINE__, ncclGetErrorString(r_), \
             ncclGetLastError(nullptr));                                                                    \
      return Status::kNccl;                                                                                 \
    }                                                                                                       \
  } while (0)

#define TESTCHECK(cmd)           \
  do {                           \
    const Status s_ = (cmd);     \
    if (s_ != Status::kOk) {     \
      Chain(__FILE__, __LINE__); \
      return s_;                 \
    }                            \
  } while (0)

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Spins, then yields: threads of one run meet here between measurements, and
// on an oversubscribed machine a spinning waiter must not starve the others.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  bool Wait(const std::atomic<bool>& failed) {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
      return true;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; spins++) {
      if (failed.load(std::memory_order_relaxed)) return false;
      if (spins > 64) sched_yield();
    }
    return true;
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

struct LocalRank {
  int rank = 0;
  ncclComm_t comm = nullptr;
  meshcclStream_t stream = nullptr;
  char* send_base = nullptr;
  char* recv_base = nullptr;
  std::vector<char> expected;
  void* send_handle = nullptr;
  void* recv_handle = nullptr;
  ncclWindow_t send_win = nullptr;
  ncclWindow_t recv_win = nullptr;
};

struct Run {
  const CollTest* test = nullptr;
  Options opt;
  ProcGroup* pg = nullptr;
  const char* program = "";
  int nranks = 1;
  size_t alloc_bytes = 0;
  std::vector<LocalRank> ranks;  // nthreads * ngpus, thread-major
  std::unique_ptr<SpinBarrier> barrier;
  std::atomic<bool> failed{false};
  bool printer = false;  // process 0 prints
  double slots[64][8] = {};
  double combined[8] = {};
  JsonWriter* json = nullptr;
};

struct Thread {
  Run* run;
  int tid;
  uint64_t seed_counter = 0;
  int out_of_bounds = 0;
  double bw_sum = 0;
  int bw_count = 0;
  bool Printing() const { return run->printer && tid == 0; }
  LocalRank& Rank(int g) { return run->ranks[tid * run->opt.ngpus + g]; }
};

bool Barrier(Thread& t) {
  Run& r = *t.run;
  if (!r.barrier->Wait(r.failed)) return false;
  if (t.tid == 0 && !r.pg->Barrier()) {
    r.failed = true;
    return false;
  }
  return r.barrier->Wait(r.failed);
}

// Combines n values over every thread of every process; all threads get the
// result.
Status AllReduce(Thread& t, double* v, int n, Reduce op) {
  Run& r = *t.run;
  std::copy(v, v + n, r.slots[t.tid]);
  if (!r.barrier->Wait(r.failed)) return Status::kInternal;
  if (t.tid == 0) {
    for (int i = 0; i < n; i++) {
      double acc = r.slots[0][i];
      for (int k = 1; k < r.opt.nthreads; k++) {
        const double x = r.slots[k][i];
        acc = op == Reduce::kSum ? acc + x : op == Reduce::kMin ? std::min(acc, x) : std::max(acc, x);
      }
      r.combined[i] = acc;
    }
    if (!r.pg->AllReduce(r.combined, n, op)) r.failed = true;
  }
  if (!r.barrier->Wait(r.failed)) return Status::kInternal;
  std::copy(r.combined, r.combined + n, v);
  if (!r.barrier->Wait(r.failed)) return Status::kInternal;
  return Status::kOk;
}

Status WaitAll(Thread& t) {
  Run& r = *t.run;
  for (int g = 0; g < r.opt.ngpus; g++) {
    LocalRank& lr = t.Rank(g);
    if (lr.stream == nullptr) continue;
    if (r.opt.timeout_s <= 0) {
      NCCLCHECK(meshcclStreamSynchronize(lr.stream));
      continue;
    }
    const double deadline = Now() + r.opt.timeout_s;
    for (int spins = 0;; spins++) {
      const ncclResult_t q = meshcclStreamQuery(lr.stream);
      if (q == ncclSuccess) break;
      if (q != ncclInProgress) NCCLCHECK(q);
      ncclResult_t async = ncclSuccess;
      NCCLCHECK(ncclCommGetAsyncError(lr.comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) NCCLCHECK(async);
      if (Now() > deadline) {
        printf("%s: Test timeout (%ds) %s:%d\n", g_host, r.opt.timeout_s, __FILE__, __LINE__);
        for (int k = 0; k < r.opt.ngpus; k++) ncclCommAbort(t.Rank(k).comm);
        r.failed = true;
        return Status::kTimeout;
      }
      if (spins > 64) sched_yield();
    }
  }
  return Status::kOk;
}

struct Pointers {
  char* send;
  char* recv;
};

Pointers BufferPointers(Thread& t, int g, const Counts& c, size_t elt, bool in_place, size_t shift) {
  LocalRank& lr = t.Rank(g);
  const size_t skew = static_cast<size_t>(t.run->opt.unalign) * elt;
  char* recv = lr.recv_base + skew + shift;
  if (!in_place) return {lr.send_base + skew + shift, recv};
  const size_t rank = static_cast<size_t>(lr.rank);
  return {recv + c.send_inplace_offset * rank * elt, recv + c.recv_inplace_offset * rank * elt};
}

// Issues one operation on every local rank (grouped when a thread drives
// several ranks), rotated by `shift` bytes inside the allocation.
Status Issue(Thread& t, const Counts& c, const TypeInfo& type, Op op, int root, bool in_place, size_t shift) {
  Run& r = *t.run;
  const int ngpus = r.opt.ngpus;
  if (ngpus > 1) NCCLCHECK(ncclGroupStart());
  for (int g = 0; g < ngpus; g++) {
    LocalRank& lr = t.Rank(g);
    const Pointers p = BufferPointers(t, g, c, type.size, in_place, shift);
    ncclRedOp_t redop = NcclOp(op);
    if (op == Op::kMulSum) {
      alignas(8) char scalar[8];
      MulSumScalar(type, lr.rank, scalar);
      NCCLCHECK(ncclRedOpCreatePreMulSum(&redop, scalar, type.type, ncclScalarHostImmediate, lr.comm));
    }
    const CallArgs a{p.send, p.recv,  &c,       &type,   redop,
                     root,   lr.rank, r.nranks, lr.comm, meshcclStreamAsCuda(lr.stream)};
    NCCLCHECK(r.test->run(a));
    if (op == Op::kMulSum) NCCLCHECK(ncclRedOpDestroy(redop, lr.comm));
  }
  if (ngpus > 1) NCCLCHECK(ncclGroupEnd());
  return Status::kOk;
}

// Zeroes the recv region, writes inputs and expected values for one seed.
void InitData(Thread& t, const Counts& c, const DataSpec& spec, int root, bool in_place) {
  const size_t elt = spec.type->size;
  for (int g = 0; g < t.run->opt.ngpus; g++) {
    LocalRank& lr = t.Rank(g);
    const Pointers p = BufferPointers(t, g, c, elt, in_place, 0);
    const size_t rank = static_cast<size_t>(lr.rank);
    size_t zero_elems = c.recv_count;
    if (in_place) {
      zero_elems = std::max(c.recv_inplace_offset * rank + c.recv_count, c.send_inplace_offset * rank + c.send_count);
      std::memset(lr.recv_base + static_cast<size_t>(t.run->opt.unalign) * elt, 0, zero_elems * elt);
    } else {
      std::memset(p.recv, 0, zero_elems * elt);
    }
    const InitArgs a{&spec, &c, lr.rank, root, in_place, p.send, lr.expected.data()};
    t.run->test->init(a);
  }
}

struct Measurement {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = -1;  // -1: not checked
  // With MESHCCL_PERF_NETDEV: hosts counted, their mean TCP payload per op,
  // and the ranks' CPU time over the timed loop's wall time (cores).
  int hosts = 0;
  double payload_per_host = 0;
  double cores = 0;
};

Status BenchTime(Thread& t, const Counts& c, const TypeInfo& type, Op op, int root, bool in_place, Measurement* m) {
  Run& r = *t.run;
  const Options& o = r.opt;
  const CollTest& test = *r.test;
  const size_t elt = type.size;
  DataSpec spec{&type, test.reduces ? op : Op::kNone, r.nranks, 99};

  if (o.check) InitData(t, c, spec, root, in_place);
  TESTCHECK(Issue(t, c, type, op, root, in_place, 0));
  TESTCHECK(WaitAll(t));
  if (!Barrier(t)) return Status::kInternal;

  // Rotate through the allocation so that successive ops do not reuse cached data.
  const size_t total = std::max(c.send_count, c.recv_count) * elt;
  const size_t steps = total ? std::max<size_t>(1, r.alloc_bytes / total) : 1;
  const int launches = std::max(1, o.graph);
  double elapsed = 0, enqueue = 0;
  int64_t shift_iter = 0;
  // One process per host reads the device: the one of local rank 0.
  const bool sample = !NetDev().empty() && t.tid == 0;
  const bool count_net = sample && r.pg->local_rank() == 0;
  HostLoad load0, load1;
  if (sample && !SampleHostLoad(count_net, &load0)) r.failed = true;
  for (int l = 0; l < launches; l++) {
    const double t0 = Now();
    double excluded = 0;
    for (int it = 0; it < o.iters; it++) {
      if (o.agg_iters > 1) NCCLCHECK(ncclGroupStart());
      for (int a = 0; a < o.agg_iters; a++) {
        const size_t shift = total * (static_cast<size_t>(shift_iter++) % steps);
        TESTCHECK(Issue(t, c, type, op, root, in_place, shift));
      }
      if (o.agg_iters > 1) NCCLCHECK(ncclGroupEnd());
      if (o.blocking > 0) {
        TESTCHECK(WaitAll(t));
        if (o.blocking == 1 && !Barrier(t)) return Status::kInternal;
        if (o.blocking == 3) {
          const double b0 = Now();
          if (!Barrier(t)) return Status::kInternal;
          excluded += Now() - b0;
        }
      }
    }
    enqueue += Now() - t0 - excluded;
    TESTCHECK(WaitAll(t));
    elapsed += Now() - t0 - excluded;
  }
  const double ops = static_cast<double>(o.iters) * o.agg_iters * launches;
  if (sample && !SampleHostLoad(false, &load1)) r.failed = true;
  if (!NetDev().empty()) {
    // The device is read after every rank has finished: a rank's op is done
    // when its own data has arrived, while its last sends may still sit in
    // its socket or the link's queue (a 64 KiB hier AllReduce on 2 hosts:
    // 14-16 KiB per host left out of every loop, 0.876 of the bytes at 2
    // iterations). The barrier's own few bytes count; its time does not.
    if (!Barrier(t)) return Status::kInternal;
    HostLoad after;
    if (count_net && !SampleHostLoad(true, &after)) r.failed = true;
    load1.tcp_payload = after.tcp_payload;
    double u[4] = {count_net ? load1.tcp_payload - load0.tcp_payload : 0, count_net ? 1.0 : 0,
                   sample ? load1.cpu_s - load0.cpu_s : 0, r.pg->rank() == 0 && t.tid == 0 ? elapsed : 0};
    TESTCHECK(AllReduce(t, u, 4, Reduce::kSum));
    m->hosts = static_cast<int>(u[1]);
    m->payload_per_host = u[1] > 0 && ops > 0 ? u[0] / u[1] / ops : 0;
    m->cores = u[3] > 0 ? u[2] / u[3] : 0;
  }
  double sec = (o.report_cputime ? enqueue : elapsed) / std::max(1.0, ops);

  // Combine over threads and processes as -a asks.
  double v[1];
  Reduce how = Reduce::kSum;
  if (o.average == 0) v[0] = (r.pg->rank() == 0 && t.tid == 0) ? sec : 0;
  else v[0] = sec;
  if (o.average == 2) how = Reduce::kMin;
  if (o.average == 3) how = Reduce::kMax;
  TESTCHECK(AllReduce(t, v, 1, how));
  sec = v[0];
  if (o.average == 1) sec /= static_cast<double>(o.nthreads) * r.pg->size();

  const double bytes = test.alg_bytes(c, elt, r.nranks);
  m->time_us = sec * 1e6;
  m->algbw = sec > 0 ? bytes / 1e9 / sec : 0;
  m->busbw = m->algbw * test.bus_factor(r.nranks);

  if (o.check && (!in_place || test.check_in_place)) {
    m->wrong = 0;
    for (int it = 0; it < o.check; it++) {
      spec.seed = ++t.seed_counter;
      InitData(t, c, spec, root, in_place);
      if (!Barrier(t)) return Status::kInternal;
      TESTCHECK(Issue(t, c, type, op, root, in_place, 0));
      TESTCHECK(WaitAll(t));
      double mine = 0;
      for (int g = 0; g < o.ngpus; g++) {
        const Pointers p = BufferPointers(t, g, c, elt, in_place, 0);
        mine += static_cast<double>(CountWrong(spec, p.recv, t.Rank(g).expected.data(), c.recv_count));
      }
      double sums[2] = {mine, mine > 0 ? 1.0 : 0.0};
      TESTCHECK(AllReduce(t, sums, 2, Reduce::kSum));
      if (mine > 0) t.out_of_bounds++;
      m->wrong = static_cast<int64_t>(sums[0]);
      if (m->wrong > 0) break;
    }
  } else if (o.check) {
    t.seed_counter++;  // keep every rank's seed sequence in step
  }
  return Status::kOk;
}

void Timestamp(char* buf, size_t len) {
  const time_t now = time(nullptr);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tmv);
}

Status RunSizes(Thread& t, const TypeInfo& type, Op op, int root) {
  Run& r = *t.run;
  const Options& o = r.opt;
  const CollTest& test = *r.test;

  // Warm-up: every power-of-two multiple of minBytes, out-of-place.
  if (!Barrier(t)) return Status::kInternal;
  for (size_t s = o.min_bytes; s <= o.max_bytes; s *= 2) {
    const Counts c = test.counts(s, type.size, r.nranks);
    for (int w = 0; w < o.warmup_iters; w++) TESTCHECK(Issue(t, c, type, op, root, false, 0));
    if (s == 0) break;
  }
  TESTCHECK(WaitAll(t));

  const std::vector<size_t> sizes = SweepSizes(o);
  for (int cycle = 0; o.run_cycles == 0 || cycle < o.run_cycles; cycle++) {
    for (size_t s : sizes) {
      const Counts c = test.counts(s, type.size, r.nranks);
      const size_t bytes = std::max(c.send_count, c.recv_count) * type.size;
      const char* op_name = test.blank_op ? "" : test.reduces ? OpName(op) : "none";
      const int root_col = test.rooted ? root : -1;
      std::string line = RowStart(bytes, c.param_count, type.name, op_name, root_col);
      Measurement m[2];
      for (int ip = 0; ip < 2; ip++) {
        if (ip == 1 && !test.in_place_defined) {
          line += RowBodyNotRun();
          m[ip].time_us = m[ip].algbw = m[ip].busbw = std::nan("");
          continue;
        }
        TESTCHECK(BenchTime(t, c, type, op, root, ip == 1, &m[ip]));
        line += RowBody(m[ip].time_us, m[ip].algbw, m[ip].busbw, m[ip].wrong);
        t.bw_sum += m[ip].busbw;
        t.bw_count++;
      }
      if (o.report_timestamps) {
        char stamp[64];
        Timestamp(stamp, sizeof stamp);
        line += RowTimestamp(stamp);
      }
      if (t.Printing()) {
        printf("%s\n", line.c_str());
        if (!NetDev().empty())  // a comment line: parsers of the table skip it
          printf("#netload %zu hosts %d payload_per_host %.0f %.0f cores %.3f %.3f\n", bytes, m[0].hosts,
                 m[0].payload_per_host, test.in_place_defined ? m[1].payload_per_host : 0.0, m[0].cores,
                 test.in_place_defined ? m[1].cores : 0.0);
        fflush(stdout);
        if (r.json)
          r.json->Row(bytes, c.param_count, type.name, op_name, root_col, m[0].time_us, m[0].algbw, m[0].busbw,
                      m[0].wrong, m[1].time_us, m[1].algbw, m[1].busbw, m[1].wrong, o.report_cputime != 0, o.iters,
                      test.name);
      }
    }
  }
  return Status::kOk;
}

Status InitComms(Run& r, const ncclUniqueId& id, int first, int count) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (r.opt.cta_policy >= 0) config.CTAPolicy = r.opt.cta_policy;
  config.nvlinkCentricSched = 1;
  NCCLCHECK(ncclGroupStart());
  for (int i = first; i < first + count; i++) {
    LocalRank& lr = r.ranks[i];
    ncclConfig_t c = config;
    NCCLCHECK(ncclCommInitRankConfig(&lr.comm, r.nranks, id, lr.rank, &c));
  }
  NCCLCHECK(ncclGroupEnd());
  return Status::kOk;
}

Status SetupRanks(Run& r, int first, int count) {
  const Options& o = r.opt;
  size_t max_elt = 1;
  for (const TypeInfo* t : o.types) max_elt = std::max(max_elt, t->size);
  const size_t bytes = r.alloc_bytes + static_cast<size_t>(o.unalign) * 8 + 64;
  for (int i = first; i < first + count; i++) {
    LocalRank& lr = r.ranks[i];
    void* s = nullptr;
    void* v = nullptr;
    NCCLCHECK(ncclMemAlloc(&s, bytes));
    NCCLCHECK(ncclMemAlloc(&v, bytes));
    lr.send_base = static_cast<char*>(s);
    lr.recv_base = static_cast<char*>(v);
    // Fault the pages in now so that first-touch costs stay out of the timings.
    std::memset(s, 0, bytes);
    std::memset(v, 0, bytes);
    if (o.check) lr.expected.assign(r.alloc_bytes + 64, 0);
    if (!o.stream_null) NCCLCHECK(meshcclStreamCreate(&lr.stream));
    if (o.local_register == 1) {
      NCCLCHECK(ncclCommRegister(lr.comm, s, bytes, &lr.send_handle));
      NCCLCHECK(ncclCommRegister(lr.comm, v, bytes, &lr.recv_handle));
    }
  }
  if (o.local_register == 2) {  // collective over the communicator: one group
    NCCLCHECK(ncclGroupStart());
    for (int i = first; i < first + count; i++) {
      LocalRank& lr = r.ranks[i];
      NCCLCHECK(ncclCommWindowRegister(lr.comm, lr.send_base, bytes, &lr.send_win, 0));
      NCCLCHECK(ncclCommWindowRegister(lr.comm, lr.recv_base, bytes, &lr.recv_win, 0));
    }
    NCCLCHECK(ncclGroupEnd());
  }
  return Status::kOk;
}

void TeardownRanks(Run& r, int first, int count) {
  for (int i = first; i < first + count; i++) {
    LocalRank& lr = r.ranks[i];
    if (lr.stream) meshcclStreamDestroy(lr.stream);
    if (lr.comm && lr.send_win) ncclCommWindowDeregister(lr.comm, lr.send_win);
    if (lr.comm && lr.recv_win) ncclCommWindowDeregister(lr.comm, lr.recv_win);
    if (lr.comm && lr.send_handle) ncclCommDeregister(lr.comm, lr.send_handle);
    if (lr.comm && lr.recv_handle) ncclCommDeregister(lr.comm, lr.recv_handle);
    if (lr.comm) ncclCommDestroy(lr.comm);
    if (lr.send_base) ncclMemFree(lr.send_base);
    if (lr.recv_base) ncclMemFree(lr.recv_base);
    lr = LocalRank{};
  }
}

Status ThreadBody(Thread& t, const ncclUniqueId& id) {
  Run& r = *t.run;
  const Options& o = r.opt;
  const int first = t.tid * o.ngpus;
  if (o.parallel_init) TESTCHECK(InitComms(r, id, first, o.ngpus));
  TESTCHECK(SetupRanks(r, first, o.ngpus));
  for (const TypeInfo* type : o.types) {
    const std::vector<Op> ops = r.test->reduces ? o.ops : std::vector<Op>{Op::kSum};
    for (Op op : ops) {
      const bool all_roots = r.test->rooted && o.root == -1;
      const int lo = all_roots ? 0 : o.root;
      const int hi = all_roots ? r.nranks - 1 : lo;
      for (int root = lo; root <= hi; root++) TESTCHECK(RunSizes(t, *type, op, root));
    }
  }
  return Status::kOk;
}

std::string CpuName() {
  std::string name = "host memory";
  if (FILE* f = fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (fgets(line, sizeof line, f)) {
      if (strncmp(line, "model name", 10) == 0) {
        const char* colon = strchr(line, ':');
        if (colon) {
          std::string model = colon + 1;
          while (!model.empty() && (model.front() == ' ' || model.front() == '\t')) model.erase(0, 1);
          while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
          name = "host memory, " + model;
        }
        break;
      }
    }
    fclose(f);
  }
  return name;
}

// Resident bytes of this process: -M reports host memory the way nccl-tests
// reports device memory, as growth during init, user buffers and the run.
double ResidentBytes() {
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

size_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

// Finishes the split group (if any), then the world.
struct Groups {
  std::unique_ptr<ProcGroup> world;
  std::unique_ptr<ProcGroup> split;
  ProcGroup* get() const { return split ? split.get() : world.get(); }
};

int Exit(Groups& g, Status s) {
  fflush(stdout);
  if (g.split) g.split->Finish();
  if (g.world) g.world->Finish();
  return static_cast<int>(s);
}

}  // namespace

Counts BlockToAllCounts(size_t bytes, size_t elt, int nranks) {
  Counts c;
  const size_t base = AlignedBase(bytes, elt, nranks);
  c.send_count = c.param_count = base;
  c.recv_count = base * nranks;
  c.send_inplace_offset = base;
  return c;
}

Counts AllToBlockCounts(size_t bytes, size_t elt, int nranks) {
  Counts c;
  const size_t base = AlignedBase(bytes, elt, nranks);
  c.send_count = base * nranks;
  c.recv_count = c.param_count = base;
  c.recv_inplace_offset = base;
  return c;
}

double RecvBytes(const Counts& c, size_t elt, int) { return static_cast<double>(c.recv_count * elt); }
double SendBytes(const Counts& c, size_t elt, int) { return static_cast<double>(c.send_count * elt); }
double RingBusFactor(int nranks) { return static_cast<double>(nranks - 1) / nranks; }

size_t AlignedBase(size_t bytes, size_t elt, int nranks) {
  const size_t c = bytes / elt;
  const size_t align = std::max<size_t>(1, 16 / elt);
  return (c / static_cast<size_t>(std::max(1, nranks))) & ~(align - 1);
}

int RunMain(const CollTest& test, int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  gethostname(g_host, sizeof g_host - 1);
  if (char* dot = strchr(g_host, '.')) *dot = '\0';

  Groups groups;
  groups.world = CreateProcGroup(&argc, &argv);
  if (!groups.world) return static_cast<int>(Status::kInternal);
  ProcGroup* world = groups.world.get();
  const bool printer = world->rank() == 0;
  const char* program = program_invocation_short_name;

  Run r;
  r.test = &test;
  r.printer = printer;
  r.program = program;
  std::string msgs;
  const ParseResult pr = ParseArgs(argc, argv, &r.opt, &msgs);
  if (printer) fputs(msgs.c_str(), stdout);
  if (pr == ParseResult::kExitSuccess) return Exit(groups, Status::kOk);
  if (pr == ParseResult::kExitUsage) {
    Exit(groups, Status::kOk);
    return 255;
  }
  Options& o = r.opt;
  if (o.nthreads < 1 || o.nthreads > 64 || o.ngpus < 1 || o.iters < 0 || o.agg_iters < 1 || o.warmup_iters < 0 ||
      o.check < 0 || o.average < 0 || o.average > 3 || o.blocking < 0 || o.blocking > 3 || o.unalign < 0 ||
      o.local_register < 0 || o.local_register > 2) {
    if (printer)
      printf(
          "invalid argument value: threads 1..64, gpus >= 1, agg_iters >= 1, "
          "-a 0..3, -z 0..3, -R 0..2, counts >= 0\n");
    return Exit(groups, Status::kInvalidUsage);
  }
  if (o.device_impl > 0) {
    if (printer)
      printf("device implementations (-D %d) need GPU kernels; not available on host memory\n", o.device_impl);
    return Exit(groups, Status::kNotImplemented);
  }
  if (o.per_iter_timing) {
    if (printer) printf("per-iteration timing (-I 1) needs CUDA events; not available on host streams\n");
    return Exit(groups, Status::kNotImplemented);
  }

  // NCCL_TESTS_SPLIT: independent groups of processes run the same test.
  int color = 0;
  const char* split_env = getenv("NCCL_TESTS_SPLIT");
  std::string mask_spec;
  if (!split_env && getenv("NCCL_TESTS_SPLIT_MASK")) {
    mask_spec = std::string("AND 0x") + getenv("NCCL_TESTS_SPLIT_MASK");
    split_env = mask_spec.c_str();
  }
  if (split_env && *split_env) {
    if (!SplitColor(split_env, world->rank(), &color)) {
      if (printer) printf("invalid NCCL_TESTS_SPLIT '%s': expected AND|OR|MOD|DIV <value>\n", split_env);
      return Exit(groups, Status::kInvalidUsage);
    }
    groups.split = world->Split(color);
    if (!groups.split) return Exit(groups, Status::kInternal);
  }
  ProcGroup* pg = groups.get();
  r.pg = pg;
  const int local = o.nthreads * o.ngpus;
  r.nranks = pg->size() * local;
  int version = 0;
  ncclGetVersion(&version);

  JsonWriter json;
  if (printer && !o.json_path.empty() && json.Open(o.json_path, argc, argv, version)) r.json = &json;

  PreambleInfo pi;
  pi.program = program;
  pi.nccl_headers = NCCL_VERSION_CODE;
  pi.nccl_library = version;
  pi.nthreads = o.nthreads;
  pi.ngpus = o.ngpus;
  pi.min_bytes = o.min_bytes;
  pi.max_bytes = o.max_bytes;
  pi.step_bytes = o.step_bytes;
  pi.step_factor = o.step_factor;
  pi.warmup_iters = o.warmup_iters;
  pi.iters = o.iters;
  pi.agg_iters = o.agg_iters;
  pi.check = o.check;
  pi.graph = o.graph;
  pi.unalign = o.unalign;
  pi.blocking = o.blocking;
  pi.parallel_init = o.parallel_init != 0;
  if (printer) fputs(Preamble(pi).c_str(), stdout);
  if (r.json) r.json->Config(o);

  // "# Using devices": each process describes its ranks; process 0 prints all.
  const char* dev_env = getenv("NCCL_TESTS_DEVICE");
  const int dev0 = dev_env ? atoi(dev_env) : world->local_rank() * local;
  const std::string cpu = CpuName();
  std::string lines;
  for (int i = 0; i < local; i++)
    lines +=
        DeviceLine(pg->rank() * local + i, color, static_cast<int>(getpid()), g_host, dev0 + i, 0, 0, 0, cpu.c_str());
  char block[4096];
  if (printer) printf("# Using devices\n");
  for (int p = 0; p < world->size(); p++) {
    memset(block, 0, sizeof block);
    if (p == world->rank()) snprintf(block, sizeof block, "%s", lines.c_str());
    if (!world->Broadcast(block, sizeof block, p)) return Exit(groups, Status::kInternal);
    if (printer) {
      fputs(block, stdout);
      if (r.json) r.json->Devices(block);
    }
  }
  if (r.json) r.json->EndConfig();

  // Cap the buffers to what the host's memory can hold for every local rank.
  const size_t mem = PhysicalMemory() / static_cast<size_t>(world->size() * local);
  const size_t gib = size_t{1} << 30;
  const size_t reserve = std::min((mem + 16 * gib - 1) / (16 * gib), size_t{4}) * gib;
  if (mem > reserve + gib) {
    const size_t cap = (mem - reserve - gib) / (o.check ? 3 : 2);
    if (o.max_bytes > cap) {
      o.max_bytes = cap;
      if (printer) printf("#\n# Reducing maxBytes to %ld due to memory limitation\n", static_cast<long>(cap));
    }
  }
  // Every selected type needs room for its counts at maxBytes.
  for (const TypeInfo* t : o.types) {
    const Counts c = test.counts(o.max_bytes, t->size, r.nranks);
    const size_t need = std::max({c.send_count, c.recv_count, c.recv_inplace_offset * (r.nranks - 1) + c.recv_count,
                                  c.send_inplace_offset * (r.nranks - 1) + c.send_count}) *
                        t->size;
    r.alloc_bytes = std::max({r.alloc_bytes, need, o.max_bytes});
  }

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  Status st = Status::kOk;
  if (pg->rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    printf("%s: Test NCCL failure %s:%d '%s'\n", g_host, __FILE__, __LINE__, ncclGetLastError(nullptr));
    st = Status::kNccl;
  }
  double bad = st == Status::kOk ? 0 : 1;
  if (!pg->AllReduce(&bad, 1, Reduce::kMax) || bad > 0) return Exit(groups, Status::kNccl);
  if (!pg->Broadcast(&id, sizeof id, 0)) return Exit(groups, Status::kInternal);

  r.ranks.resize(local);
  for (int i = 0; i < local; i++) r.ranks[i].rank = pg->rank() * local + i;
  r.barrier = std::make_unique<SpinBarrier>(o.nthreads);
  const double rss_start = ResidentBytes();
  if (!o.parallel_init) st = InitComms(r, id, 0, local);
  const double rss_init = ResidentBytes();

  if (printer) fputs(TableHeader(o.report_cputime != 0, o.report_timestamps != 0, false).c_str(), stdout);

  char why[256] = "";
  const bool skip = test.unsupported && test.unsupported(r.nranks, why, sizeof why);
  if (skip && printer) printf("%s\n", why);

  std::vector<Thread> threads;
  for (int i = 0; i < o.nthreads; i++) threads.push_back(Thread{&r, i});
  std::vector<Status> results(o.nthreads, Status::kOk);
  if (st == Status::kOk && !skip) {
    std::vector<std::thread> workers;
    for (int i = 1; i < o.nthreads; i++)
      workers.emplace_back([&, i] {
        results[i] = ThreadBody(threads[i], id);
        if (results[i] != Status::kOk) r.failed = true;
      });
    results[0] = ThreadBody(threads[0], id);
    if (results[0] != Status::kOk) r.failed = true;
    for (auto& w : workers) w.join();
  }
  for (Status s : results)
    if (st == Status::kOk && s != Status::kOk) st = s;

  // Footer: out-of-bounds measurements and the mean busbw over all processes.
  double totals[3] = {0, 0, 0};
  for (const Thread& t : threads) {
    totals[0] += t.out_of_bounds;
    totals[1] += t.bw_sum;
    totals[2] += t.bw_count;
  }
  double failed = st == Status::kOk ? 0 : static_cast<double>(st);
  if (!pg->AllReduce(&failed, 1, Reduce::kMax)) failed = static_cast<double>(Status::kInternal);
  const bool all_ok = failed == 0;
  if (all_ok && !pg->AllReduce(totals, 1, Reduce::kSum)) failed = static_cast<double>(Status::kInternal);
  // busbw is identical on every process; take process 0's mean.
  const double avg_bw = totals[2] > 0 ? totals[1] / totals[2] : 0;
  const char* min_env = getenv("NCCL_TESTS_MIN_BW");
  const double min_bw = min_env ? atof(min_env) : -1;
  const int oob = static_cast<int>(totals[0]);
  if (printer) {
    fputs(Footer(oob, avg_bw, min_bw, program).c_str(), stdout);
    if (o.memory_report) {
      // Buffers: send and recv per rank (ncclMemAlloc) and the expected values.
      const double per_rank = 2.0 * static_cast<double>(r.alloc_bytes + static_cast<size_t>(o.unalign) * 8 + 64) +
                              (o.check ? static_cast<double>(r.alloc_bytes + 64) : 0.0);
      const double user = per_rank * local;
      const double init = std::max(0.0, rss_init - rss_start);
      const double coll = std::max(0.0, ResidentBytes() - rss_init - user);
      fputs(MemoryLine(init, user, coll).c_str(), stdout);
    }
    printf("#\n");
    const char* err = ncclGetLastError(nullptr);
    if (err && *err) printf("# error: %s\n", err);
    else printf("\n");
  }
  if (r.json) r.json->Finish(oob, avg_bw, min_bw, ncclGetLastError(nullptr));

  if (all_ok || st == Status::kOk) TeardownRanks(r, 0, local);
  if (failed != 0) return Exit(groups, static_cast<Status>(static_cast<int>(failed)));
  if (oob > 0 || (min_bw >= 0 && avg_bw < 0.9 * min_bw)) return Exit(groups, Status::kDataError);
  return Exit(groups, Status::kOk);
}

}  // namespace perf
