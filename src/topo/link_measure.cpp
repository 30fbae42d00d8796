// The cost model's constants. Each rank knows some of them: from the transports'
// declared properties, from what it measured (exchanges with a partner over
// one link of each class, run as plans through the engine; a 256 KiB
// reduction), from MESHCCL_TUNE_* settings. All ranks
// allgather what they know and combine, field by field, the best kind of
// knowledge any rank has (set > measured > declared > built-in): the same
// numbers everywhere, so every rank picks the same algorithm.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "kernels/reduce.h"
#include "sched/engine.h"
#include "transport/mesh.h"
#include "util/log.h"
#include "util/param.h"
#include "topo/cost_model.h"
#include "topo/topology.h"
#include "util/wait.h"

namespace meshccl {

namespace {

enum Field { kShmAlpha, kShmBw, kXnumaAlpha, kXnumaBw, kNetAlpha, kNetBw, kReduce, kFields };
// The link classes measured, in the order of their fields.
enum Cls { kClsShm, kClsXnuma, kClsNet, kClasses };
// How a rank knows a value, weakest first.
enum Source : int { kUnknown, kDeclared, kMeasured, kSet };
const char* const kSourceName[] = {"built-in", "declared by the transport", "measured", "set"};
const char* const kFieldName[kFields] = {"shm alpha", "shm bandwidth", "cross-NUMA alpha", "cross-NUMA bandwidth",
                                         "net alpha", "net bandwidth", "reduce"};
const Param kFieldParam[kFields] = {Param::TuneShmAlphaUs, Param::TuneShmBwGbs, Param::TuneXnumaAlphaUs,
                                    Param::TuneXnumaBwGbs, Param::TuneNetAlphaUs, Param::TuneNetBwGbs,
                                    Param::TuneReduceGbs};
// Used when no rank knows better (no link of that class, nothing measured);
// the cross-NUMA ones (0) are derived from the same-NUMA ones instead.
const double kFallback[kFields] = {kBuiltinShm.alpha_us, kBuiltinShm.bw_gbs, 0, 0, kBuiltinNet.alpha_us,
                                   kBuiltinNet.bw_gbs, kBuiltinReduceGbs};
bool is_alpha(int f) { return f == kShmAlpha || f == kXnumaAlpha || f == kNetAlpha; }

// Tag bases of the measuring plans: bit 62 set, bit 63 clear — a
// collective's tag base would need 2^38 earlier collectives to reach it (see
// api/enqueue: seq << 24).
constexpr uint64_t kPingTag = uint64_t{1} << 62;

bool is_shm(const std::string& transport) { return transport == "shm"; }

// The class of the link between ranks a and b: the transport says whether it
// is shared memory, the graph whether it crosses NUMA nodes.
Cls class_of(const std::vector<PeerInfo>& peers, const SystemGraph& graph, int a, int b) {
  if (!is_shm(Mesh::transport_for(peers, a, b))) return kClsNet;
  const bool graphed = graph.nranks() == static_cast<int>(peers.size());
  return graphed && graph.link(a, b).cls == LinkClass::kCrossNuma ? kClsXnuma : kClsShm;
}

// A deterministic matching of ranks whose link is of the given class
// (greedy, partners searched among the next 16 ranks); -1 when unmatched.
std::vector<int> matching(const std::vector<PeerInfo>& peers, const SystemGraph& graph, Cls cls) {
  const int n = static_cast<int>(peers.size());
  std::vector<int> match(n, -1);
  for (int i = 0; i < n; ++i) {
    if (match[i] >= 0) continue;
    for (int j = i + 1; j < n && j <= i + 16; ++j) {
      if (match[j] >= 0 || class_of(peers, graph, i, j) != cls) continue;
      match[i] = j;
      match[j] = i;
      break;
    }
  }
  return match;
}

// Pairs of a network matching that measure at once through one host's link:
// the most on any host (so that a pair's figure times this is the link's).
int pairs_per_host(const std::vector<int>& match, const std::vector<int>& host) {
  std::vector<int> per(host.size() + 1, 0);
  int most = 1;
  for (size_t r = 0; r < match.size(); ++r)
    if (match[r] >= 0) most = std::max(most, ++per[static_cast<size_t>(host[r])]);
  return most;
}


double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs a plan through the engine, as collectives run, and times it.
Status timed(Engine& engine, std::unique_ptr<Plan> plan, uint64_t* tag_seq, double* us) {
  const double t0 = now_us();
  std::shared_ptr<OpHandle> h = engine.submit(make_plan_run(std::move(plan), kPingTag | ((*tag_seq)++ << 24)), 0);
  MC_TRY(engine.wait(*h));
  *us = now_us() - t0;
  return kOk;
}

// `rounds` exchanges of `bytes` with peer, each round after the previous one
// arrived: the dependent steps every algorithm is made of.
std::unique_ptr<Plan> exchanges(int peer, int rounds, char* out, char* in, size_t bytes) {
  auto plan = std::make_unique<Plan>();
  plan->algorithm = "tune";
  Plan::StepId prev = Plan::kNoStep;
  for (int i = 0; i < rounds; ++i) {
    const uint32_t tag = static_cast<uint32_t>(i);
    plan->add_dep(plan->send(peer, tag, out, bytes), prev);
    Plan::StepId r = plan->recv(peer, tag, in, bytes);
    plan->add_dep(r, prev);
    prev = r;
  }
  return plan;
}

// Fastest of `reps` exchanges of `bytes` (after one not counted), in us.
Status best_exchange(Engine& engine, int peer, uint64_t* tag_seq, std::vector<char>& out, std::vector<char>& in,
                     size_t bytes, int reps, double* best_us) {
  double us = 0;
  *best_us = 0;
  for (int i = 0; i < 1 + reps; ++i) {
    MC_TRY(timed(engine, exchanges(peer, 1, out.data(), in.data(), bytes), tag_seq, &us));
    if (i > 0 && (*best_us == 0 || us < *best_us)) *best_us = us;
  }
  return kOk;
}

// Latency of one dependent step (us) and bandwidth (GB/s) between this rank
// and peer, both measured through the engine while every pair of the class
// measures at once (so an oversubscribed host shows in the numbers). Each
// figure is the best of several short probes: on a shared machine a probe
// can only be slowed down, and the fastest ones agree from one init to the
// next where medians moved by 10x. The bandwidth is the slope between a
// medium and a large exchange (network: 256 KiB and 2 MiB, past the socket
// buffers and a shaped link's burst), so per-message costs do not count.
Status measure_link(Engine& engine, int engine_rank, int peer, bool network, uint64_t* tag_seq, double* alpha_us,
                    double* bw_gbs) {
  // At least 5 repetitions and 1 ms, so that on a host with more ranks than
  // cores the pairs measure while the others run, as collectives will.
  constexpr int kRounds = 8, kMinReps = 5, kMaxReps = 200, kLargeReps = 3;
  constexpr double kMinUs = 1000;
  constexpr size_t kMedium = size_t{64} << 10, kNetMedium = size_t{256} << 10;
  const size_t medium = network ? kNetMedium : kMedium;
  const size_t large = network ? size_t{2} << 20 : size_t{256} << 10;  // above every transport's eager limit
  std::vector<char> out(large, 0), in(large, 0);
  double us = 0;
  MC_TRY(timed(engine, exchanges(peer, 2, out.data(), in.data(), 8), tag_seq, &us));  // warm-up
  // Both ends must run the same number of plans: the lower rank decides,
  // and its messages say whether this plan is the last.
  double best_step = 0;
  const bool decides = engine_rank < peer;
  const double t0 = now_us();
  for (int i = 0;; ++i) {
    if (decides) out[0] = (i + 1 >= kMinReps && now_us() - t0 >= kMinUs) || i + 1 >= kMaxReps;
    MC_TRY(timed(engine, exchanges(peer, kRounds, out.data(), in.data(), 8), tag_seq, &us));
    if (i == 0 || us / kRounds < best_step) best_step = us / kRounds;
    if (decides ? out[0] != 0 : in[0] != 0) break;
  }
  out[0] = in[0] = 0;
  double t_medium = 0, t_large = 0;
  MC_TRY(best_exchange(engine, peer, tag_seq, out, in, medium, kLargeReps, &t_medium));
  MC_TRY(best_exchange(engine, peer, tag_seq, out, in, large, kLargeReps, &t_large));
  *alpha_us = best_step;
  double transfer_us = t_large - t_medium, moved = static_cast<double>(large - medium);
  if (transfer_us <= 0) transfer_us = t_large - best_step, moved = static_cast<double>(large);
  *bw_gbs = transfer_us > 0 ? moved / (transfer_us * 1e3) : 0;
  return kOk;
}

// GB/s of output of a float32 sum of 256 KiB: best of two after a warm-up.
// (Larger buffers would be closer to big collectives but cost page faults
// at every communicator creation; gamma is the smallest of the three terms.)
double measure_reduce() {
  constexpr size_t kCount = 64 * 1024;
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f), d(kCount);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const double t0 = now_us();
    kernels::reduce2(ncclFloat32, ReduceOp::Sum, d.data(), a.data(), b.data(), kCount);
    const double us = now_us() - t0;
    if (i > 0 && us > 0) best = std::max(best, kCount * sizeof(float) / (us * 1e3));
  }
  return best;
}

}  // namespace

namespace {

// This rank's view: value and source of each field.
struct Known {
  double value[kFields];
  int32_t source[kFields];
};

// Measures one link of each class with a partner, all pairs of a class at
// once; a network pair's bandwidth counts for the pairs sharing its host's link.
Status measure_all(int rank, Engine& engine, const std::vector<PeerInfo>& peers, const SystemGraph& graph,
                   const std::vector<int>& host, Known* mine) {
  const int n = static_cast<int>(peers.size());
  uint64_t tag_seq = 0;
  for (int cls = 0; cls < kClasses; ++cls) {
    const std::vector<int> match = matching(peers, graph, static_cast<Cls>(cls));
    const int peer = match[rank];
    if (n < 2 || peer < 0) continue;
    double alpha = 0, bw = 0;
    tag_seq = static_cast<uint64_t>(cls) << 12;  // both ends of a pair count alike
    MC_TRY(measure_link(engine, rank, peer, cls == kClsNet, &tag_seq, &alpha, &bw));
    if (cls == kClsNet) bw *= pairs_per_host(match, host);
    const int base = kShmAlpha + 2 * cls;
    for (int f : {base, base + 1}) {
      const double v = f == base ? alpha : bw;
      if (v > 0 && std::isfinite(v) && mine->source[f] <= kMeasured) mine->value[f] = v, mine->source[f] = kMeasured;
    }
  }
  return kOk;
}

// Per field, over the ranks with the best source. A step waits for its
// slowest pair, so of measured latencies the largest counts (on a host with
// more ranks than cores, most pairs see the others' share of the cores);
// other values, bandwidths included, by their median, which a single
// disturbed measurement cannot move.
void agree(const std::vector<Known>& all, double agreed[kFields], int source[kFields]) {
  for (int f = 0; f < kFields; ++f) {
    source[f] = kUnknown;
    for (const Known& k : all) source[f] = std::max(source[f], static_cast<int>(k.source[f]));
    std::vector<double> known;
    for (const Known& k : all)
      if (k.source[f] == source[f] && source[f] != kUnknown) known.push_back(k.value[f]);
    if (known.empty()) agreed[f] = kFallback[f];
    else if (source[f] == kMeasured && is_alpha(f)) agreed[f] = *std::max_element(known.begin(), known.end());
    else agreed[f] = median(known);
  }
}

}  // namespace

Status tune_init(int rank, Bootstrap& bs, Mesh& mesh, Engine& engine, const std::vector<PeerInfo>& peers,
                 const SystemGraph& graph, TuneModel* out) {
  const int n = static_cast<int>(peers.size());
  bool network = false, xnuma = false;
  for (int i = 0; i < n && !network; ++i)
    for (int j = i + 1; j < n; ++j) {
      const Cls c = class_of(peers, graph, i, j);
      network |= c == kClsNet;
      xnuma |= c == kClsXnuma;
    }
  std::vector<int> host = graph.nranks() == n ? host_numbers(graph) : std::vector<int>(static_cast<size_t>(n), 0);

  Known mine{};
  auto know = [&](int f, double v, Source s) {
    if (v > 0 && std::isfinite(v) && s >= mine.source[f]) mine.value[f] = v, mine.source[f] = s;
  };
  for (int p = 0; p < n; ++p) {
    const meshccl_transport_props_v1_t* pr = p == rank ? nullptr : mesh.props(p);
    if (pr == nullptr) continue;
    const int base = kShmAlpha + 2 * class_of(peers, graph, rank, p);
    know(base, pr->latency_us, kDeclared);
    know(base + 1, pr->bandwidth_gbs, kDeclared);
  }
  // Measuring is collective: only when every rank wants it (also a barrier,
  // so that the pairs start measuring together).
  std::vector<uint8_t> want(n, 0);
  want[rank] = param_int(Param::TuneMeasure) != 0;
  MC_TRY(bs.allgather(want.data(), 1));
  if (std::all_of(want.begin(), want.end(), [](uint8_t w) { return w != 0; })) {
    MC_TRY(measure_all(rank, engine, peers, graph, host, &mine));
    know(kReduce, measure_reduce(), kMeasured);
  }
  for (int f = 0; f < kFields; ++f) know(f, param_double(kFieldParam[f], 0), kSet);
  MC_TRACE(kTune, "rank %d knows: shm %.3g us %.3g GB/s, cross-NUMA %.3g us %.3g GB/s, net %.3g us %.3g GB/s, reduce %.3g GB/s",
           rank, mine.value[kShmAlpha], mine.value[kShmBw], mine.value[kXnumaAlpha], mine.value[kXnumaBw],
           mine.value[kNetAlpha], mine.value[kNetBw], mine.value[kReduce]);

  std::vector<Known> all(n);
  all[rank] = mine;
  MC_TRY(bs.allgather(all.data(), sizeof(Known)));
  double agreed[kFields];
  int source[kFields];
  agree(all, agreed, source);
  // Cross-NUMA links nobody measured: the same-NUMA figures, the bandwidth
  // scaled by the topology's ratio (first host's description).
  if (agreed[kXnumaAlpha] <= 0) agreed[kXnumaAlpha] = agreed[kShmAlpha];
  if (agreed[kXnumaBw] <= 0) {
    double ratio = 1;
    if (!graph.hosts.empty() && graph.hosts[0].numa_gbs > 0)
      ratio = std::min(1.0, graph.hosts[0].cross_numa_gbs / graph.hosts[0].numa_gbs);
    agreed[kXnumaBw] = agreed[kShmBw] * ratio;
  }
  *out = with_hosts(make_tune_model(n, network, LinkCost{agreed[kShmAlpha], agreed[kShmBw]},
                                    LinkCost{agreed[kNetAlpha], agreed[kNetBw]}, agreed[kReduce]),
                    host);
  out->cross_numa = LinkCost{agreed[kXnumaAlpha], agreed[kXnumaBw]};
  out->cross_numa_links = xnuma;
  if (rank == 0 && log_enabled(LogLevel::Info, kTune)) {
    std::string consts;
    for (int f = 0; f < kFields; ++f) {
      char buf[96];
      const bool derived = source[f] == kUnknown && kFallback[f] == 0;
      std::snprintf(buf, sizeof(buf), "%s%s %.3g %s (%s)", f ? ", " : "", kFieldName[f], agreed[f],
                    is_alpha(f) ? "us" : "GB/s", derived ? "from the same-NUMA figure" : kSourceName[source[f]]);
      consts += buf;
    }
    MC_INFO(kTune, "cost model on %d ranks, %d host(s), %s links: %s", n, out->hosts(),
            network ? "network" : xnuma ? "cross-NUMA" : "shared-memory", consts.c_str());
  }
  return kOk;
}

}  // namespace meshccl
