#include "peer_common.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace peer {

namespace {

const char* const kNames[] = {"allreduce", "broadcast", "allgather", "reducescatter", "alltoall"};

bool Size(const char* s, size_t* out) {
  char* end = nullptr;
  const double v = strtod(s, &end);
  if (end == s || v < 0) return false;
  double m = 1;
  if (*end == 'K' || *end == 'k') m = 1024.0, end++;
  else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024 * 1024, end++;
  if (*end) return false;
  *out = static_cast<size_t>(v * m);
  return true;
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

float Value(int rank, size_t idx) { return static_cast<float>((idx * 7 + rank * 13) % 1021); }

float* Alloc(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(2);
  }
  memset(p, 0, bytes);  // fault in now, outside the timings
  return static_cast<float*>(p);
}

}  // namespace

const char* CollName(Coll c) { return kNames[static_cast<int>(c)]; }

bool FindColl(const std::string& name, Coll* c) {
  for (int i = 0; i < 5; i++)
    if (name == kNames[i]) {
      *c = static_cast<Coll>(i);
      return true;
    }
  return false;
}

bool ParseOptions(int argc, char** argv, Options* o, std::string* err) {
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--no-header") {
      o->header = false;
      continue;
    }
    if (a == "-h" || a == "--help") {
      *err = "usage: " + std::string(argv[0]) +
             " -C allreduce,broadcast,allgather,reducescatter,alltoall|all"
             " [-b 8] [-e 256M] [-f 2] [-n 20] [-w 2] [-c 1] [--no-header] [--store DIR]";
      return false;
    }
    if (!(v = next())) {
      *err = "missing value after " + a;
      return false;
    }
    if (a == "-C") {
      std::string list = v;
      if (list == "all") list = "allreduce,broadcast,allgather,reducescatter,alltoall";
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        Coll c;
        if (!FindColl(list.substr(pos, comma - pos), &c)) {
          *err = "unknown collective '" + list.substr(pos, comma - pos) + "'";
          return false;
        }
        o->colls.push_back(c);
        pos = comma + 1;
      }
    } else if (a == "-b") {
      if (!Size(v, &o->min_bytes)) {
        *err = "bad -b";
        return false;
      }
    } else if (a == "-e") {
      if (!Size(v, &o->max_bytes)) {
        *err = "bad -e";
        return false;
      }
    } else if (a == "-f") o->step_factor = strtoul(v, nullptr, 0);
    else if (a == "-n") o->iters = atoi(v);
    else if (a == "-w") o->warmup = atoi(v);
    else if (a == "-c") o->check = atoi(v);
    else if (a == "--store") o->store = v;
    else {
      *err = "unknown option " + a;
      return false;
    }
  }
  if (o->colls.empty()) {
    *err = "no collective given (-C)";
    return false;
  }
  if (o->min_bytes > o->max_bytes || o->step_factor < 2 || o->iters < 1 || o->min_bytes == 0) {
    *err = "need 0 < -b <= -e, -f >= 2, -n >= 1";
    return false;
  }
  return true;
}

Sizes SizesFor(Coll c, size_t bytes, int n) {
  Sizes s;
  const size_t elems = bytes / sizeof(float);
  const size_t base = (elems / n) & ~size_t{3};  // 16-byte multiple per rank
  switch (c) {
    case Coll::kAllReduce:
      s.send_count = s.recv_count = s.count = elems;
      s.alg_bytes = elems * 4.0;
      s.bus_factor = 2.0 * (n - 1) / n;
      break;
    case Coll::kBroadcast:
      s.send_count = s.recv_count = s.count = elems;
      s.alg_bytes = elems * 4.0;
      s.bus_factor = 1;
      break;
    case Coll::kAllGather:
      s.send_count = s.count = base;
      s.recv_count = base * n;
      s.alg_bytes = base * n * 4.0;
      s.bus_factor = static_cast<double>(n - 1) / n;
      break;
    case Coll::kReduceScatter:
      s.send_count = base * n;
      s.recv_count = s.count = base;
      s.alg_bytes = base * n * 4.0;
      s.bus_factor = static_cast<double>(n - 1) / n;
      break;
    case Coll::kAlltoAll:
      s.send_count = s.recv_count = base * n;
      s.count = base;
      s.alg_bytes = base * n * 4.0;
      s.bus_factor = static_cast<double>(n - 1) / n;
      break;
  }
  s.bytes = std::max(s.send_count, s.recv_count) * sizeof(float);
  return s;
}

void FillInput(Coll c, const Sizes& s, int rank, int n, float* send) {
  switch (c) {
    case Coll::kAllGather:
      for (size_t i = 0; i < s.send_count; i++) send[i] = Value(0, rank * s.count + i);
      break;
    default:
      for (size_t i = 0; i < s.send_count; i++) send[i] = Value(rank, i);
  }
  (void)n;
}

void FillExpected(Coll c, const Sizes& s, int rank, int n, float* e) {
  switch (c) {
    case Coll::kAllReduce:
      for (size_t i = 0; i < s.recv_count; i++) {
        float acc = 0;
        for (int r = 0; r < n; r++) acc += Value(r, i);
        e[i] = acc;
      }
      break;
    case Coll::kBroadcast:
      for (size_t i = 0; i < s.recv_count; i++) e[i] = Value(0, i);
      break;
    case Coll::kAllGather:
      for (size_t i = 0; i < s.recv_count; i++) e[i] = Value(0, i);
      break;
    case Coll::kReduceScatter:
      for (size_t i = 0; i < s.recv_count; i++) {
        float acc = 0;
        for (int r = 0; r < n; r++) acc += Value(r, rank * s.count + i);
        e[i] = acc;
      }
      break;
    case Coll::kAlltoAll:
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < s.count; i++) e[q * s.count + i] = Value(q, rank * s.count + i);
      break;
  }
}

size_t CountWrong(const float* got, const float* expected, size_t n) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) wrong += std::memcmp(&got[i], &expected[i], 4) != 0;
  return wrong;
}

int RunSweep(Backend& b, const Options& o) {
  const int n = b.size();
  size_t alloc = o.max_bytes + 64;
  for (Coll c : o.colls) alloc = std::max(alloc, SizesFor(c, o.max_bytes, n).bytes + 64);
  float* send = Alloc(alloc);
  float* recv = Alloc(alloc);
  std::vector<float> expected(o.check ? alloc / sizeof(float) : 0);
  if (b.rank() == 0 && o.header) printf("library,collective,nranks,bytes,count,time_us,algbw_gbs,busbw_gbs,wrong\n");
  bool failed = false;
  for (Coll c : o.colls) {
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
      const Sizes s = SizesFor(c, bytes, n);
      const size_t total = s.bytes;
      const size_t steps = total ? std::max<size_t>(1, o.max_bytes / total) : 1;
      b.Prepare(c, s, send, recv);
      // Every rank has prepared the size before anyone sends.
      b.Barrier();
      if (c == Coll::kBroadcast && b.rank() == 0) FillInput(c, s, 0, n, recv);
      else FillInput(c, s, b.rank(), n, send);
      for (int w = 0; w < o.warmup; w++) b.Run(c, s, send, recv);
      b.Barrier();
      const double t0 = Now();
      for (int it = 0; it < o.iters; it++) {
        const size_t shift = total * (static_cast<size_t>(it) % std::min<size_t>(steps, o.iters));
        b.Run(c, s, reinterpret_cast<float*>(reinterpret_cast<char*>(send) + shift),
              reinterpret_cast<float*>(reinterpret_cast<char*>(recv) + shift));
      }
      double t[2] = {(Now() - t0) / o.iters, 0};
      double wrong = 0;
      if (o.check && s.count > 0) {
        // Nobody refills buffers a slower rank's last timed call may still use.
        b.Barrier();
        memset(recv, 0, s.recv_count * sizeof(float));
        if (c == Coll::kBroadcast && b.rank() == 0) FillInput(c, s, 0, n, recv);
        else FillInput(c, s, b.rank(), n, send);
        b.Run(c, s, send, recv);
        FillExpected(c, s, b.rank(), n, expected.data());
        wrong = static_cast<double>(CountWrong(recv, expected.data(), s.recv_count));
      }
      t[1] = wrong;
      b.SumDoubles(t, 2);
      const double sec = t[0] / n;
      const double algbw = sec > 0 ? s.alg_bytes / 1e9 / sec : 0;
      if (t[1] > 0) failed = true;
      if (b.rank() == 0) {
        printf("%s,%s,%d,%zu,%zu,%.3f,%.4f,%.4f,%.0f\n", b.name(), CollName(c), n, s.bytes, s.count, sec * 1e6, algbw,
               algbw * s.bus_factor, o.check ? t[1] : -1.0);
        fflush(stdout);
      }
    }
  }
  munmap(send, alloc);
  munmap(recv, alloc);
  return failed ? 1 : 0;
}

}  // namespace peer
