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

#include "base/tag.h"
#include "bootstrap/bootstrap.h"
#include "kernels/reduce.h"
#include "sched/engine.h"
#include "transport/mesh.h"
#include "transport/select.h"
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
const char* const kFieldName[kFields] = {
    "shm alpha", "shm bandwidth", "cross-NUMA alpha", "cross-NUMA bandwidth", "net alpha", "net bandwidth", "reduce"};
const Param kFieldParam[kFields] = {Param::TuneShmAlphaUs, Param::TuneShmBwGbs,   Param::TuneXnumaAlphaUs,
                                    Param::TuneXnumaBwGbs, Param::TuneNetAlphaUs, Param::TuneNetBwGbs,
                                    Param::TuneReduceGbs};
// Used when no rank knows better (no link of that class, nothing measured);
// the cross-NUMA ones (0) are derived from the same-NUMA ones instead.
const double kFallback[kFields] = {kBuiltinShm.alpha_us, kBuiltinShm.bw_gbs, 0, 0, kBuiltinNet.alpha_us,
                                   kBuiltinNet.bw_gbs,   kBuiltinReduceGbs};
bool is_alpha(int f) { return f == kShmAlpha || f == kXnumaAlpha || f == kNetAlpha; }

// The class of the link between ranks a and b: the transport's scope says
// whether it is memory shared within a machine, the graph whether it crosses
// NUMA nodes.
Cls class_of(const std::vector<PeerInfo>& peers, const SystemGraph& graph, int a, int b) {
  if (!node_local(peers, a, b)) return kClsNet;
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs a plan through the engine, as collectives run, and times it.
Status timed(Engine& engine, std::unique_ptr<Plan> plan, uint64_t* tag_seq, double* us) {
  const double t0 = now_us();
  std::shared_ptr<OpHandle> h = engine.submit(make_plan_run(std::move(plan), tag::measurement((*tag_seq)++)), 0);
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

// Latency of one dependent step (us) between this rank and peer, measured
// through the engine while every pair of the class measures at once (so an
// oversubscribed host shows in the numbers): the fastest of many short
// probes of two rounds each. On a shared machine a probe can only be slowed
// down; short probes are less often hit than long ones, and many of them
// within a bounded time find the link's own latency (at least kMinProbes and
// kMinUs, at most kMaxProbes or kMaxUs).
Status measure_alpha(Engine& engine, int engine_rank, int peer, uint64_t* tag_seq, double* alpha_us) {
  constexpr int kRounds = 2, kMinProbes = 16, kMaxProbes = 400;
  constexpr double kMinUs = 2000, kMaxUs = 50000;
  std::vector<char> out(8, 0), in(8, 0);
  double us = 0;
  MC_TRY(timed(engine, exchanges(peer, 2, out.data(), in.data(), 8), tag_seq, &us));  // warm-up
  // Both ends must run the same number of plans: the lower rank decides,
  // and its messages say whether this plan is the last.
  double best_step = 0;
  const bool decides = engine_rank < peer;
  const double t0 = now_us();
  for (int i = 0;; ++i) {
    const double spent = now_us() - t0;
    if (decides) out[0] = (i + 1 >= kMinProbes && spent >= kMinUs) || i + 1 >= kMaxProbes || spent >= kMaxUs;
    MC_TRY(timed(engine, exchanges(peer, kRounds, out.data(), in.data(), 8), tag_seq, &us));
    if (i == 0 || us / kRounds < best_step) best_step = us / kRounds;
    if (decides ? out[0] != 0 : in[0] != 0) break;
  }
  *alpha_us = best_step;
  return kOk;
}

// The time until the slowest pair of a class has exchanged `bytes` both ways,
// every pair starting together after a barrier (ranks without a partner take
// part in the barriers only): the best of `reps` after one not counted, us.
// This is how a collective's step uses the links: all pairs at once, on
// whatever CPUs the host has for them. The best, not the median: on a
// shared machine the median of five moved threefold between two inits a
// minute apart, the best much less.
Status concurrent_exchange(Bootstrap& bs, Engine& engine, int peer, uint64_t* tag_seq, std::vector<char>& out,
                           std::vector<char>& in, size_t bytes, int reps, double* best_us) {
  std::vector<double> all(static_cast<size_t>(bs.nranks()), 0), slowest;
  for (int i = 0; i < 1 + reps; ++i) {
    MC_TRY(bs.barrier());
    double us = 0;
    if (peer >= 0) MC_TRY(timed(engine, exchanges(peer, 1, out.data(), in.data(), bytes), tag_seq, &us));
    all[static_cast<size_t>(bs.rank())] = us;
    MC_TRY(bs.allgather(all.data(), sizeof(double)));
    if (i > 0) slowest.push_back(*std::max_element(all.begin(), all.end()));
  }
  *best_us = *std::min_element(slowest.begin(), slowest.end());
  return kOk;
}

// Bandwidth (GB/s) of one link of a class, from concurrent_exchange: the
// slope between a medium and a large exchange (network: 256 KiB and 2 MiB,
// past the socket buffers and a shaped link's burst), so per-message costs
// and the barrier's skew do not count. On the network one pair per host
// measures (one_pair_per_host; the others, peer -1, wait in the barriers),
// so that the slowest pair's figure is one host link's.
Status measure_bandwidth(Bootstrap& bs, Engine& engine, int peer, bool network, uint64_t* tag_seq, double* bw_gbs) {
  constexpr int kReps = 3;
  const size_t medium = network ? size_t{256} << 10 : size_t{64} << 10;
  const size_t large = network ? size_t{2} << 20 : size_t{1} << 20;  // above every transport's eager limit
  std::vector<char> out(large, 0), in(large, 0);
  double t_medium = 0, t_large = 0;
  MC_TRY(concurrent_exchange(bs, engine, peer, tag_seq, out, in, medium, kReps, &t_medium));
  MC_TRY(concurrent_exchange(bs, engine, peer, tag_seq, out, in, large, kReps, &t_large));
  double transfer_us = t_large - t_medium, moved = static_cast<double>(large - medium);
  // The slope is only as good as the two times: a medium exchange slowed
  // more than the large one (one disturbed rank in every repetition) made it
  // several times the link's speed (a loopback socket measured above
  // 30 GB/s once). The large exchange alone, per-message costs included,
  // bounds it: a link is at most twice as fast as that, else the large
  // exchange's figure is taken.
  //
  // A medium exchange that ran at under half the large one's rate was
  // disturbed too: on a shaped link (2 emulated hosts at 100 Mbit/s, 4
  // pairs at once) one of the concurrent flows regularly waited out a TCP
  // retransmission timeout, 232-247 ms for what takes 87 ms, in every
  // repetition, which made the slope 1.14-1.27x the link's rate. The
  // large exchange's figure is taken then.
  const double plain_gbs = t_large > 0 ? static_cast<double>(large) / (t_large * 1e3) : 0;
  const double medium_gbs = t_medium > 0 ? static_cast<double>(medium) / (t_medium * 1e3) : 0;
  double gbs = transfer_us > 0 ? moved / (transfer_us * 1e3) : 0;
  const double slope_gbs = gbs;
  if (gbs <= 0 || gbs > 2 * plain_gbs || medium_gbs < plain_gbs / 2) gbs = plain_gbs;
  *bw_gbs = gbs;
  if (bs.rank() == 0)
    MC_INFO(kTune,
            "%s bandwidth probe, %s: %zu B both ways in %.0f us, %zu B in %.0f us (slowest pair, best of %d): slope "
            "%.3g GB/s, the large exchange alone %.3g GB/s; %.3g GB/s per link",
            network ? "network" : "shared-memory", network ? "one pair per host" : "every pair at once", medium,
            t_medium, large, t_large, kReps, slope_gbs, plain_gbs, *bw_gbs);
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
// once: each pair's latency, and the class's bandwidth from the pairs
// started together (shared memory: all; network: one per host), the same
// figure on every rank. Collective: every rank takes part in every class
// that has a pair.
Status measure_all(Bootstrap& bs, Engine& engine, const std::vector<PeerInfo>& peers, const SystemGraph& graph,
                   const std::vector<int>& host, Known* mine) {
  const int n = static_cast<int>(peers.size()), rank = bs.rank();
  uint64_t tag_seq = 0;
  for (int cls = 0; cls < kClasses && n >= 2; ++cls) {
    const std::vector<int> match = matching(peers, graph, static_cast<Cls>(cls));
    if (std::all_of(match.begin(), match.end(), [](int m) { return m < 0; })) continue;
    const int peer = match[rank];
    const bool network = cls == kClsNet;
    double alpha = 0, bw = 0;
    tag_seq = static_cast<uint64_t>(cls) << 12;  // both ends of a pair count alike
    if (peer >= 0) MC_TRY(measure_alpha(engine, rank, peer, &tag_seq, &alpha));
    const int bw_peer = network ? one_pair_per_host(match, host)[static_cast<size_t>(rank)] : peer;
    MC_TRY(measure_bandwidth(bs, engine, bw_peer, network, &tag_seq, &bw));
    const int base = kShmAlpha + 2 * cls;
    auto keep = [&](int f, double v) {
      if (v > 0 && std::isfinite(v) && mine->source[f] <= kMeasured) mine->value[f] = v, mine->source[f] = kMeasured;
    };
    keep(base, alpha);
    keep(base + 1, bw);
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
                 const SystemGraph& graph, const TuneModel* inherited, TuneModel* out) {
  const int n = static_cast<int>(peers.size());
  bool network = false, xnuma = false;
  for (int i = 0; i < n && !network; ++i)
    for (int j = i + 1; j < n; ++j) {
      const Cls c = class_of(peers, graph, i, j);
      network |= c == kClsNet;
      xnuma |= c == kClsXnuma;
    }
  std::vector<int> host = graph.nranks() == n ? host_numbers(graph) : std::vector<int>(static_cast<size_t>(n), 0);
  if (inherited != nullptr) {
    *out = with_hosts(make_tune_model(n, network, inherited->shm, inherited->net, inherited->reduce_gbs), host);
    out->cross_numa = inherited->cross_numa;
    out->cross_numa_links = xnuma;
    if (graph.nranks() == n) out->cpu_share = cpu_share_of(graph);
    if (rank == 0)
      MC_INFO(kTune,
              "cost model on %d ranks, %d host(s): the parent communicator's link constants (shm %.3g us %.3g GB/s, "
              "net %.3g us %.3g GB/s, reduce %.3g GB/s)",
              n, out->hosts(), out->shm.alpha_us, out->shm.bw_gbs, out->net.alpha_us, out->net.bw_gbs, out->reduce_gbs);
    return kOk;
  }

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
    MC_TRY(measure_all(bs, engine, peers, graph, host, &mine));
    know(kReduce, measure_reduce(), kMeasured);
  }
  for (int f = 0; f < kFields; ++f) know(f, param_double(kFieldParam[f], 0), kSet);
  MC_TRACE(
      kTune,
      "rank %d knows: shm %.3g us %.3g GB/s, cross-NUMA %.3g us %.3g GB/s, net %.3g us %.3g GB/s, reduce %.3g GB/s",
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
  if (graph.nranks() == n) out->cpu_share = cpu_share_of(graph);
  if (rank == 0 && log_enabled(LogLevel::Info, kTune)) {
    std::string consts;
    for (int f = 0; f < kFields; ++f) {
      char buf[96];
      const bool derived = source[f] == kUnknown && kFallback[f] == 0;
      std::snprintf(buf, sizeof(buf), "%s%s %.3g %s (%s)", f ? ", " : "", kFieldName[f], agreed[f],
                    is_alpha(f) ? "us" : "GB/s", derived ? "from the same-NUMA figure" : kSourceName[source[f]]);
      consts += buf;
    }
    MC_INFO(kTune, "cost model on %d ranks, %d host(s), %s links: %s; CPU share per rank %.3g (topology)", n,
            out->hosts(),
            network ? "network"
            : xnuma ? "cross-NUMA"
                    : "shared-memory",
            consts.c_str(), out->cpu_share);
  }
  return kOk;
}

}  // namespace meshccl
