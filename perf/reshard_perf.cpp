// reshard_perf: cross-mesh resharding (docs/resharding.md) on the paper's
// one-to-many and many-to-many cases (spec section 1.8), scaled to this
// machine: every strategy in one run, every destination tile checked against
// the reference slice, each plan's link-limited lower bound beside its time.
//
// Run with a launcher, ranks in blocks of --per-host on consecutive hosts:
//   meshrun --cluster c5 -n 10 --ranks-per-host 2 build/perf/reshard_perf --per-host 2
//   meshrun -n 10 build/perf/reshard_perf --per-host 2     (one host: "hosts" are rank blocks only)
// Meshes are (hosts, ranks per host): mesh axis 0 crosses hosts, axis 1 stays
// inside one; the source mesh takes the first hosts, the destination the next.
// Options: --per-host K (default 4) --scale S (divides the tensors' dim 0,
// default 32) --iters N (default 5) --warmup N (default 1) --cases LIST
// (one2many,1,...,9; default all) --link-gbps G (the links' measured rate, for
// a second bound).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "meshccl.h"

namespace {

struct Opts {
  int per_host = 4;
  int scale = 32;
  int iters = 5;
  int warmup = 1;
  std::string cases = "all";
  double link_gbps = 0;
};

struct Side {
  int hosts, per_host;  // mesh shape (hosts, per_host); hosts from first_host
  int first_host;
  std::vector<std::vector<int>> spec;
};

struct CaseDef {
  std::string name;
  Side src, dst;
  std::vector<size_t> shape;
};

struct Config {
  const char* name;
  meshcclReshardStrategy_t strategy;
  meshcclReshardBalance_t balance;
};

const Config kConfigs[] = {
    {"send_recv", meshcclReshardSendRecv, meshcclReshardBalanceSize},
    {"send_recv+allgather", meshcclReshardSendRecvAllGather, meshcclReshardBalanceSize},
    {"broadcast no-LB", meshcclReshardBroadcast, meshcclReshardBalanceNone},
    {"broadcast size-LB", meshcclReshardBroadcast, meshcclReshardBalanceSize},
    {"broadcast size+order", meshcclReshardBroadcast, meshcclReshardBalanceOrder},
    {"auto", meshcclReshardAuto, meshcclReshardBalanceOrder},
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

meshcclShardSpec_t to_spec(const std::vector<std::vector<int>>& dims) {
  meshcclShardSpec_t s{};
  s.ndims = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    s.dims[d].naxes = static_cast<int>(dims[d].size());
    for (size_t a = 0; a < dims[d].size(); ++a) s.dims[d].axes[a] = dims[d][a];
  }
  return s;
}

std::string spec_text(const std::vector<std::vector<int>>& dims) {
  std::string out;
  for (const auto& d : dims) {
    if (!out.empty()) out += ' ';
    if (d.empty()) out += 'R';
    else {
      out += 'S';
      for (int a : d) out += std::to_string(a);
    }
  }
  return out;
}

std::vector<int> ranks_of(const Side& s, int K) {
  std::vector<int> r;
  for (int h = 0; h < s.hosts; ++h)
    for (int j = 0; j < s.per_host; ++j) r.push_back((s.first_host + h) * K + j);
  return r;
}

std::vector<CaseDef> make_cases(const Opts& o) {
  const int K = o.per_host;
  std::vector<CaseDef> out;
  // One-to-many: a (1,1) source, a replicated destination. 2^28 int32 / scale.
  const size_t n1 = (size_t{1} << 28) / static_cast<size_t>(o.scale);
  const int dsts[][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 2}, {3, 2}, {4, 2}};
  for (const auto& d : dsts) {
    if (d[1] > K) continue;
    out.push_back({"one2many (1,1)->(" + std::to_string(d[0]) + "," + std::to_string(d[1]) + ")",
                   {1, 1, 0, {{}}},
                   {d[0], d[1], 1, {{}}},
                   {n1}});
  }
  // Many-to-many: (1024,1024,512) int32 with dim 0 / scale; case 6 (3072,1024,170).
  const size_t d0 = 1024 / static_cast<size_t>(o.scale) * 4;  // keeps 2 GiB / scale
  const std::vector<size_t> t{d0, 1024, 128};
  struct M {
    const char* name;
    std::vector<std::vector<int>> s, d;
  };
  const M mm[] = {{"1", {{0}, {}, {}}, {{0}, {}, {}}}, {"2", {{}, {}, {}}, {{0}, {}, {}}},
                  {"3", {{}, {0}, {}}, {{0}, {}, {}}}, {"4", {{}, {0, 1}, {}}, {{0, 1}, {}, {}}},
                  {"5", {{1}, {}, {}}, {{0}, {}, {}}}, {"9", {{}, {0}, {}}, {{}, {}, {0}}}};
  for (const M& m : mm) out.push_back({std::string("case ") + m.name, {2, K, 0, m.s}, {2, K, 2, m.d}, t});
  out.push_back({"case 6",
                 {2, K, 0, {{0}, {}, {}}},
                 {3, K, 2, {{0}, {}, {}}},
                 {3072 / static_cast<size_t>(o.scale) * 4, 1024, 42}});
  out.push_back({"case 7/8", {1, K, 0, {{0}, {}, {}}}, {2, K, 1, {{}, {}, {}}}, t});
  return out;
}

bool wanted(const Opts& o, const std::string& name) {
  if (o.cases == "all") return true;
  std::string key = name.rfind("one2many", 0) == 0 ? "one2many" : name.substr(5);
  if (key == "7/8") key = "7";
  std::string list = "," + o.cases + ",";
  return list.find("," + key + ",") != std::string::npos;
}

// Value of global element e: its index, kept in int32.
int32_t value(size_t e, int iter) { return static_cast<int32_t>((e * 2654435761u + iter) & 0x7fffffff); }

std::vector<int32_t> fill(const meshcclMesh_t& m, const meshcclShardSpec_t& s, const std::vector<size_t>& shape,
                          int rank, int iter, bool* member) {
  size_t off[8], ext[8];
  *member = meshcclShardTile(&m, &s, shape.data(), rank, off, ext) == ncclSuccess;
  if (!*member) return {};
  const int nd = static_cast<int>(shape.size());
  size_t n = 1;
  for (int d = 0; d < nd; ++d) n *= ext[d];
  std::vector<int32_t> out(n);
  std::vector<size_t> c(nd, 0);
  for (size_t i = 0; i < n; ++i) {
    size_t g = 0;
    for (int d = 0; d < nd; ++d) g = g * shape[d] + off[d] + c[d];
    out[i] = value(g, iter);
    for (int d = nd - 1; d >= 0; --d) {
      if (++c[d] < ext[d]) break;
      c[d] = 0;
    }
  }
  return out;
}

int die(const char* what, ncclComm_t comm) {
  std::fprintf(stderr, "reshard_perf: %s: %s\n", what, ncclGetLastError(comm));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "reshard_perf: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--per-host") o.per_host = std::atoi(next());
    else if (a == "--scale") o.scale = std::atoi(next());
    else if (a == "--iters") o.iters = std::atoi(next());
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--cases") o.cases = next();
    else if (a == "--link-gbps") o.link_gbps = std::atof(next());
    else {
      std::fprintf(stderr, "reshard_perf: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (o.per_host < 1 || o.per_host > 8 || o.scale < 1 || o.scale > 1024 || o.iters < 1 || o.iters > 1000 ||
      o.warmup < 0 || o.warmup > 100) {
    std::fprintf(stderr, "reshard_perf: --per-host 1..8, --scale 1..1024, --iters 1..1000, --warmup 0..100\n");
    return 2;
  }
  ncclComm_t comm = nullptr;
  if (meshcclCommInitFromEnv(&comm, nullptr) != ncclSuccess) return die("init", comm);
  int rank = 0, n = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  const int hosts = n / o.per_host;
  if (rank == 0)
    std::printf(
        "# reshard_perf: %d ranks, %d per host (%d hosts), tensors scaled 1/%d, int32, %d iterations after "
        "%d warm-up; time = slowest rank, mean of the iterations\n"
        "# %-28s %-22s %-20s %10s %8s %10s %9s %9s %8s %s\n",
        n, o.per_host, hosts, o.scale, o.iters, o.warmup, "case", "specs", "config", "MiB", "ms", "vs s/r", "bound ms",
        "x bound", "pred ms", "check");
  int failures = 0;
  for (const CaseDef& c : make_cases(o)) {
    if (!wanted(o, c.name)) continue;
    const int need = std::max(c.src.first_host + c.src.hosts, c.dst.first_host + c.dst.hosts);
    if (need > hosts) {
      if (rank == 0) std::printf("  %-28s skipped: needs %d hosts of %d ranks\n", c.name.c_str(), need, o.per_host);
      continue;
    }
    const std::vector<int> sr = ranks_of(c.src, o.per_host), dr = ranks_of(c.dst, o.per_host);
    meshcclMesh_t sm{}, dm{};
    sm.ndims = dm.ndims = 2;
    sm.shape[0] = c.src.hosts, sm.shape[1] = c.src.per_host, sm.ranks = sr.data();
    dm.shape[0] = c.dst.hosts, dm.shape[1] = c.dst.per_host, dm.ranks = dr.data();
    std::vector<std::vector<int>> ssd = c.src.spec, dsd = c.dst.spec;
    ssd.resize(c.shape.size()), dsd.resize(c.shape.size());
    const meshcclShardSpec_t ss = to_spec(ssd), ds = to_spec(dsd);
    size_t bytes = 4;
    for (size_t x : c.shape) bytes *= x;
    double sendrecv_ms = 0;
    for (const Config& cfg : kConfigs) {
      meshcclReshardConfig_t rc{cfg.strategy, cfg.balance};
      meshcclReshardPlan_t plan = nullptr;
      if (meshcclReshardPlanCreate(&sm, &ss, &dm, &ds, c.shape.data(), ncclInt32, comm, &rc, &plan) != ncclSuccess)
        return die("plan", comm);
      meshcclReshardInfo_t info{};
      meshcclReshardPlanGetInfo(plan, &info);
      bool in_src = false, in_dst = false;
      std::vector<int32_t> send = fill(sm, ss, c.shape, rank, 0, &in_src);
      std::vector<int32_t> want = fill(dm, ds, c.shape, rank, 0, &in_dst);
      std::vector<int32_t> got(want.size(), -1);
      double total = 0;
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        float zero = 0;
        if (ncclAllReduce(&zero, &zero, 1, ncclFloat32, ncclSum, comm, nullptr) != ncclSuccess)
          return die("barrier", comm);
        const double t0 = now();
        if (meshcclReshard(plan, send.data(), got.data(), nullptr) != ncclSuccess) return die("reshard", comm);
        double dt = now() - t0;
        if (ncclAllReduce(&dt, &dt, 1, ncclFloat64, ncclMax, comm, nullptr) != ncclSuccess) return die("max", comm);
        if (it >= o.warmup) total += dt;
      }
      int bad = in_dst && got != want ? 1 : 0;
      if (ncclAllReduce(&bad, &bad, 1, ncclInt32, ncclSum, comm, nullptr) != ncclSuccess) return die("check", comm);
      failures += bad;
      const double ms = total / o.iters * 1e3;
      if (cfg.strategy == meshcclReshardSendRecv) sendrecv_ms = ms;
      // The bound at the links' measured rate, when given.
      double bound_ms = info.lowerBoundUs * 1e-3;
      if (o.link_gbps > 0 && info.netGBs > 0) bound_ms *= info.netGBs * 8 / o.link_gbps;
      if (rank == 0) {
        const char* chosen = info.strategy == meshcclReshardSendRecv            ? "send_recv"
                             : info.strategy == meshcclReshardSendRecvAllGather ? "send_recv+allgather"
                                                                                : "broadcast";
        std::string name = cfg.name;
        if (cfg.strategy == meshcclReshardAuto) name += std::string("=") + chosen;
        std::printf("  %-28s %-22s %-20s %10.1f %8.2f %10.2f %9.2f %9.2f %8.2f %s\n", c.name.c_str(),
                    (spec_text(ssd) + "->" + spec_text(dsd)).c_str(), name.c_str(), bytes / 1048576.0, ms,
                    sendrecv_ms / ms, bound_ms, bound_ms > 0 ? ms / bound_ms : 0.0,
                    info.predictedUs * 1e-3 * (o.link_gbps > 0 && info.netGBs > 0 ? info.netGBs * 8 / o.link_gbps : 1),
                    bad ? "WRONG" : "ok");
        std::fflush(stdout);
      }
      meshcclReshardPlanDestroy(plan);
    }
  }
  if (rank == 0)
    std::printf("# bound: the plan's link-limited lower bound%s; pred: the plan's prediction\n",
                o.link_gbps > 0 ? " at --link-gbps" : " at the communicator's measured link rate");
  ncclCommDestroy(comm);
  return failures == 0 ? 0 : 1;
}
