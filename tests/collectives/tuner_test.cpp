// The tuner: which algorithm the cost model picks in clear-cut regimes, that
// estimates behave, and MESHCCL_ALGO / NCCL_ALGO forcing.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>
#include <cstdlib>
#include <string>

#include "collectives/algorithms.h"
#include "topo/topology.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {
namespace {

// Sets an environment variable for one scope (settings are read again at
// once, as a new communicator would).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
    param_refresh();
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
    param_refresh();
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

OpDesc op_of(OpKind kind, int nranks, size_t bytes) {
  OpDesc op;
  op.kind = kind;
  op.dtype = ncclFloat32;
  op.count = bytes / 4;
  op.nranks = nranks;
  op.chunk_bytes = 512 * 1024;
  return op;
}

std::string pick(const TuneModel& t, OpKind kind, int nranks, size_t bytes) {
  const Algorithm* a = nullptr;
  EXPECT_TRUE(choose_algorithm(t, op_of(kind, nranks, bytes), &a).ok());
  return a ? a->name : "";
}

// Shared memory with a cheap step, or one where a step costs a context switch.
TuneModel fast(int n) { return make_tune_model(n, false, {1.0, 10.0}, {20.0, 1.25}, 10.0); }
// n ranks on `hosts` hosts, blocked (ranks 0..n/hosts-1 on host 0, ...) or
// round-robin, with a network between them.
TuneModel across_hosts(int n, int hosts, bool blocked) {
  std::vector<int> host(static_cast<size_t>(n));
  const int per = (n + hosts - 1) / hosts;
  for (int r = 0; r < n; ++r) host[r] = blocked ? r / per : r % hosts;
  return with_hosts(make_tune_model(n, hosts > 1 && n > 1, {1.0, 10.0}, {20.0, 1.25}, 10.0), host);
}
TuneModel slow_steps(int n) { return make_tune_model(n, false, {200.0, 2.0}, {20.0, 1.25}, 10.0); }

TEST(Tuner, EveryEstimateIsFiniteAndGrowsWithSize) {
  for (int n : {1, 2, 3, 5, 8, 64}) {
    for (const Algorithm& a : algorithm_table()) {
      if (a.cost == nullptr) continue;  // not chosen by cost (direct_shm)
      // The hierarchical algorithms need hosts: ranks on 2 (n = 1: one).
      const bool hier = std::string(a.name) == "hier";
      const TuneModel m = hier ? across_hosts(n, 2, true) : fast(n);
      double prev = -1;
      for (size_t bytes = 4; bytes <= (size_t{1} << 30); bytes *= 4) {
        const OpDesc op = op_of(a.kind, n, bytes);
        const double c = a.cost(BuildCtx::whole(m, op), op);
        if (hier && n == 1) {
          EXPECT_TRUE(std::isinf(c)) << "hier on one host";
          continue;
        }
        EXPECT_TRUE(std::isfinite(c) && c >= 0) << a.name << " n=" << n;
        EXPECT_GE(c, prev) << a.name << " n=" << n << " bytes=" << bytes;
        prev = c;
      }
    }
  }
}

TEST(Tuner, FewStepsWinSmallMessages) {
  EXPECT_NE(pick(fast(4), OpKind::AllReduce, 4, 8), "ring");
  for (int n : {8, 16}) {
    EXPECT_NE(pick(fast(n), OpKind::AllReduce, n, 8), "ring") << n;
    EXPECT_EQ(pick(fast(n), OpKind::Broadcast, n, 8), "tree") << n;
    EXPECT_EQ(pick(fast(n), OpKind::Reduce, n, 8), "tree") << n;
  }
  // A power of two: halving-doubling moves what the ring moves in fewer steps.
  EXPECT_EQ(pick(fast(8), OpKind::AllReduce, 8, 64 << 20), "halving_doubling");
}

// Recursive doubling's log2(p) exchanges of the whole data win where the
// steps' latency decides: on 2 ranks one exchange against the ring's two for
// the same bytes, on more the fewest steps of all for small messages. Large
// messages go to algorithms that send each rank's share, not the whole data
// log2(p) times.
TEST(Tuner, RecursiveDoublingWinsLatencyBoundAllReduce) {
  for (int n : {2, 4, 8}) {
    EXPECT_EQ(pick(fast(n), OpKind::AllReduce, n, 8), "recursive_doubling") << n;
    // A rank per host: the cheapest flat plan (hier runs it between the hosts).
    const TuneModel t = across_hosts(n, n, true);
    const OpDesc op = op_of(OpKind::AllReduce, n, 8);
    const BuildCtx ctx = BuildCtx::whole(t, op);
    const double rd = cost_recursive_doubling_allreduce(ctx, op);
    EXPECT_LT(rd, cost_ring_allreduce(ctx, op)) << n;
    EXPECT_LT(rd, cost_tree_allreduce(ctx, op)) << n;
    EXPECT_LT(rd, cost_halving_doubling_allreduce(ctx, op)) << n;
    EXPECT_NEAR(cost_hier_allreduce(ctx, op), rd, 0.05 * rd) << n;
  }
  EXPECT_NE(pick(fast(8), OpKind::AllReduce, 8, 64 << 20), "recursive_doubling");
  EXPECT_NE(pick(across_hosts(4, 4, true), OpKind::AllReduce, 4, 64 << 20), "recursive_doubling");
  // 2 ranks, one exchange of 8 bytes against the ring's two.
  const TuneModel t = fast(2);
  const OpDesc op = op_of(OpKind::AllReduce, 2, 8);
  EXPECT_LT(cost_recursive_doubling_allreduce(BuildCtx::whole(t, op), op),
            0.6 * cost_ring_allreduce(BuildCtx::whole(t, op), op));
  // Not a power of two: the fold and its return are two more steps.
  const OpDesc op5 = op_of(OpKind::AllReduce, 5, 8), op4 = op_of(OpKind::AllReduce, 4, 8);
  EXPECT_GT(cost_recursive_doubling_allreduce(BuildCtx::whole(fast(5), op5), op5),
            cost_recursive_doubling_allreduce(BuildCtx::whole(fast(4), op4), op4));
}

TEST(Tuner, BandwidthWinsLargeMessages) {
  // Not a power of two: halving-doubling's fold moves the data once more, and
  // the tree moves about twice what the ring does.
  EXPECT_EQ(pick(fast(5), OpKind::AllReduce, 5, 256 << 20), "ring");
  EXPECT_EQ(pick(fast(7), OpKind::AllReduce, 7, 256 << 20), "ring");
  EXPECT_EQ(pick(fast(3), OpKind::Broadcast, 3, 256 << 20), "chain");
  // The crossover moves up when steps are expensive.
  size_t cross_fast = 0, cross_slow = 0;
  for (size_t b = 8; b <= (size_t{1} << 30) && (!cross_fast || !cross_slow); b *= 2) {
    if (!cross_fast && pick(fast(5), OpKind::AllReduce, 5, b) == "ring") cross_fast = b;
    if (!cross_slow && pick(slow_steps(5), OpKind::AllReduce, 5, b) == "ring") cross_slow = b;
  }
  EXPECT_GT(cross_fast, 8u);
  EXPECT_GT(cross_slow, cross_fast);
}

TEST(Tuner, NetworkLinksPaceTheModel) {
  TuneModel shm = make_tune_model(8, false, {1.0, 10.0}, {30.0, 1.0}, 10.0);
  TuneModel net = make_tune_model(8, true, {1.0, 10.0}, {30.0, 1.0}, 10.0);
  EXPECT_EQ(shm.alpha(), 1.0);
  EXPECT_EQ(net.alpha(), 30.0);
  const OpDesc op = op_of(OpKind::AllReduce, 8, 1 << 20);
  EXPECT_GT(cost_ring_allreduce(BuildCtx::whole(net, op), op), cost_ring_allreduce(BuildCtx::whole(shm, op), op));
}

TEST(Tuner, ForcedByEnvironment) {
  const TuneModel t = fast(8);
  {
    ScopedEnv e("MESHCCL_ALGO", "ring");
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, 8), "ring");
    // No ring for Broadcast: the list leaves it to the tuner.
    EXPECT_EQ(pick(t, OpKind::Broadcast, 8, 8), "tree");
  }
  {
    ScopedEnv e("NCCL_ALGO", "Tree");  // the NCCL name, any case
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, 64 << 20), "tree");
    EXPECT_EQ(pick(t, OpKind::AllGather, 8, 8), "ring");
    ScopedEnv m("MESHCCL_ALGO", "halving_doubling");  // wins over the alias
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, 64 << 20), "halving_doubling");
  }
  {
    ScopedEnv e("MESHCCL_ALGO", "^halving_doubling,recursive_doubling,tree");
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, 8), "ring");
    EXPECT_EQ(pick(t, OpKind::Broadcast, 8, 8), "chain");
  }
  {
    ScopedEnv e("MESHCCL_ALGO", "ring;broadcast:chain;reduce:tree");
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, 8), "ring");
    EXPECT_EQ(pick(t, OpKind::Broadcast, 8, 8), "chain");
    EXPECT_EQ(pick(t, OpKind::Reduce, 8, 1 << 30), "tree");
  }
}

// A refused value is a refused setting (ncclInvalidArgument), found when the
// communicator is made (check_algo_setting) and by any call that still sees it.
TEST(Tuner, BadForcingIsInvalidArgument) {
  const TuneModel t = fast(4);
  const Algorithm* a = nullptr;
  for (const char* spec :
       {"allgather:tree", "nosuchalgo", "allreduce:ring;tree", "broadcast:^chain,tree,direct_shm,hier"}) {
    ScopedEnv e("MESHCCL_ALGO", spec);
    OpKind kind = std::string(spec).rfind("broadcast", 0) == 0   ? OpKind::Broadcast
                  : std::string(spec).rfind("allgather", 0) == 0 ? OpKind::AllGather
                                                                 : OpKind::AllReduce;
    EXPECT_EQ(choose_algorithm(t, op_of(kind, 4, 64), &a).code(), ncclInvalidArgument) << spec;
    EXPECT_EQ(check_algo_setting().code(), ncclInvalidArgument) << spec;
    EXPECT_NE(thread_last_error().find("MESHCCL_ALGO=\"" + std::string(spec) + "\""), std::string::npos)
        << thread_last_error();
  }
  ScopedEnv alias("NCCL_ALGO", "nosuchalgo");
  EXPECT_EQ(check_algo_setting().code(), ncclInvalidArgument);
  EXPECT_NE(thread_last_error().find("NCCL_ALGO=\"nosuchalgo\""), std::string::npos) << thread_last_error();
}

TEST(Tuner, HierarchicalAcrossHostsOnly) {
  // One host: never hierarchical, even when forced (the cheapest plan runs).
  for (OpKind kind : {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter, OpKind::Broadcast, OpKind::Reduce})
    EXPECT_NE(pick(fast(4), kind, 4, 64 << 20), "hier") << op_kind_name(kind);
  {
    ScopedEnv e("MESHCCL_ALGO", "allreduce:hier");
    EXPECT_NE(pick(fast(4), OpKind::AllReduce, 4, 64 << 20), "hier");
  }
  // 2 hosts x 4 ranks, shared memory 8x faster than the network: large
  // operations go hierarchical (each byte crosses the network once).
  const TuneModel t = across_hosts(8, 2, true);
  for (OpKind kind : {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter})
    EXPECT_EQ(pick(t, kind, 8, 64 << 20), "hier") << op_kind_name(kind);
}

TEST(Tuner, RingPaysEveryEdgeThatLeavesAHost) {
  // 2x2: blocked, one ring edge leaves each host; round-robin, two.
  const OpDesc op = op_of(OpKind::AllReduce, 4, 64 << 20);
  const TuneModel blocked = across_hosts(4, 2, true), rr = across_hosts(4, 2, false);
  EXPECT_DOUBLE_EQ(detail::ring_beta(BuildCtx::whole(rr, op)), 2 * detail::ring_beta(BuildCtx::whole(blocked, op)));
  EXPECT_GT(cost_ring_allreduce(BuildCtx::whole(rr, op), op),
            1.9 * cost_ring_allreduce(BuildCtx::whole(blocked, op), op) - 1000);
}

// Host-aware costs: each step at the rates of the links its pairs cross.
// 2 hosts x 4 ranks, blocked: halving-doubling's first step (partners 4
// apart) crosses the network with all 4 ranks of a host on its link at once;
// the other two stay inside the hosts.
TEST(Tuner, HalvingDoublingCostsEachStepAtItsLinks) {
  const TuneModel t = across_hosts(8, 2, true);  // shm 1 us 10 GB/s, net 20 us 1.25 GB/s, reduce 10 GB/s
  const double bytes = 64 << 20;
  const OpDesc op = op_of(OpKind::AllReduce, 8, 64 << 20);
  const double net = 20 + bytes / 2 * 4 * 1e-3 / 1.25;  // 4 streams share the host's link
  const double local = (1 + bytes / 4 * 1e-3 / 10) + (1 + bytes / 8 * 1e-3 / 10);
  const double gamma = bytes * 7 / 8 * 1e-3 / 10;
  EXPECT_NEAR(cost_halving_doubling_allreduce(BuildCtx::whole(t, op), op), 2 * (net + local) + gamma, 1e-6 * bytes);
  // Round-robin placement: the step that crosses is the last, smallest one.
  const TuneModel rr = across_hosts(8, 2, false);
  EXPECT_LT(cost_halving_doubling_allreduce(BuildCtx::whole(rr, op), op),
            0.5 * cost_halving_doubling_allreduce(BuildCtx::whole(t, op), op));
  // Without a host map the model stays flat: every step at the network's rates.
  const TuneModel flat = make_tune_model(8, true, {1.0, 10.0}, {20.0, 1.25}, 10.0);
  EXPECT_NEAR(cost_halving_doubling_allreduce(BuildCtx::whole(flat, op), op),
              6 * 20 + 2 * 7.0 / 8 * bytes * 1e-3 / 1.25 + gamma, 1e-6 * bytes);
}

TEST(Tuner, ChainAndTreePayTheNetworkOnlyWhereTheyCrossIt) {
  const TuneModel t = across_hosts(8, 2, true);
  OpDesc op = op_of(OpKind::Broadcast, 8, 8);
  // 0 -> 1 -> ... -> 7: one hop of seven crosses between the hosts.
  EXPECT_DOUBLE_EQ(detail::chain_cost(BuildCtx::whole(t, op), 0).alpha_us, 6 * 1.0 + 20);
  EXPECT_DOUBLE_EQ(detail::chain_cost(BuildCtx::whole(t, op), 0).beta, 1e-3 / 1.25);
  // A tree's latency is that of its longest path, somewhere between all
  // local and all network hops.
  const double tree = cost_tree_broadcast(BuildCtx::whole(t, op), op);
  const int depth = rooted_tree_depth(8);
  EXPECT_GT(tree, 20.0);
  EXPECT_LT(tree, depth * 20.0);
  // A ring over the ranks of one host, in a model with a network: all local.
  const int host0[] = {0, 1, 2, 3};
  const BuildCtx sub{t, 0, 4, host0};
  EXPECT_DOUBLE_EQ(detail::ring_step(sub).alpha_us, 1.0);
  EXPECT_DOUBLE_EQ(detail::ring_step(sub).beta, 1e-3 / 10);
}

// A tree's pipeline fill: the first chunk's hops each at its own link's
// rate, less what the busiest link's time covers. With all links alike
// that is (hops - 1) chunks at the link's rate; across hosts the busiest
// host link's time covers the path's network hops, so a one-chunk tree
// AllReduce on 2 hosts x 4 ranks costs about that link's bytes (measured:
// 0.97-1.06 of it), not every hop at the link's shared rate (3.8-5.6x).
TEST(Tuner, TreeFillCountsEachHopAtItsOwnLink) {
  const OpDesc op = op_of(OpKind::AllReduce, 8, 64 << 10);  // 32 KiB per tree: one chunk
  const double half = 32 << 10;
  std::vector<std::vector<int>> parents(2, std::vector<int>(8, -1));
  int depth = 0;
  for (int k = 0; k < 2; ++k)
    for (int r = 0; r < 8; ++r) {
      parents[k][r] = double_tree(8, r, k).parent;
      int d = 0;
      for (int x = r; x >= 0; x = double_tree(8, x, k).parent) ++d;
      depth = std::max(depth, d - 1);
    }
  // Flat: every hop alike, the fill is 2 depth - 1 chunks.
  const TuneModel flat = make_tune_model(8, true, {1.0, 10.0}, {20.0, 1.25}, 10.0);
  const detail::PathCost pf = detail::tree_cost(BuildCtx::whole(flat, op), parents, false);
  EXPECT_NEAR(detail::tree_fill(pf, op, half, 2), (2 * depth - 1) * half * 1e-3 / 1.25, 1e-9);
  // 2 hosts x 4 ranks, 100 Mbit/s between them and shared memory inside.
  const TuneModel t = with_hosts(make_tune_model(8, true, {10.0, 1.5}, {50.0, 0.0119}, 30.0), {0, 0, 0, 0, 1, 1, 1, 1});
  const detail::PathCost ph = detail::tree_cost(BuildCtx::whole(t, op), parents, false);
  const double net = 1e-3 / 0.0119, local = 1e-3 / 1.5;
  EXPECT_GE(ph.busiest_beta, 2 * net);  // a host sends on 2 or more tree edges at once
  EXPECT_GE(ph.path_beta, net);         // and some path crosses between the hosts
  EXPECT_LE(ph.path_beta, depth * net);
  // The path's network hops are within the busiest link's time: only local hops remain.
  EXPECT_LE(detail::tree_fill(ph, op, half, 2), 2 * depth * half * local);
  const double est = cost_tree_allreduce(BuildCtx::whole(t, op), op);
  EXPECT_GT(est, ph.busiest_beta * half);
  EXPECT_LT(est, 1.1 * ph.busiest_beta * half);
}

// The defect host-aware costs fix: on 2 hosts x 4 ranks with one shared
// link (constants an emulated cluster agreed on), the flat model costed
// halving-doubling as if its steps all had a link to themselves at network
// rates and picked it for large AllReduce; every step at its link, with the
// host's 4 ranks sharing the link in the step that crosses, the
// hierarchical algorithm (each byte across the network once) wins.
TEST(Tuner, HierarchicalWinsLargeAllReduceOnSharedLinks) {
  std::vector<int> host = {0, 0, 0, 0, 1, 1, 1, 1};
  const TuneModel flat = make_tune_model(8, true, {67.9, 0.582}, {905, 0.539}, 25.2);
  const TuneModel t = with_hosts(flat, host);
  for (size_t bytes = size_t{4} << 20; bytes <= size_t{64} << 20; bytes *= 4) {
    EXPECT_EQ(pick(t, OpKind::AllReduce, 8, bytes), "hier") << bytes;
    EXPECT_EQ(pick(flat, OpKind::AllReduce, 8, bytes), "halving_doubling") << bytes;
  }
}

// Across hosts a near tie (within kNearTie) goes to the algorithm with one
// flow per link; a clear difference, or one host, still goes to the cheaper.
TEST(Tuner, NearTiesAcrossHostsGoToOneFlowPerLink) {
  const Algorithm* ring = nullptr;
  const Algorithm* hd = nullptr;
  for (const Algorithm& a : algorithm_table())
    if (a.kind == OpKind::AllReduce) {
      if (std::string(a.name) == "ring") ring = &a;
      if (std::string(a.name) == "halving_doubling") hd = &a;
    }
  ASSERT_NE(ring, nullptr);
  ASSERT_NE(hd, nullptr);
  EXPECT_TRUE(ring->one_flow_per_link);
  EXPECT_FALSE(hd->one_flow_per_link);
  EXPECT_TRUE(prefer(*ring, 101.0, hd, 100.0, true));
  EXPECT_FALSE(prefer(*hd, 100.0, ring, 101.0, true));
  EXPECT_FALSE(prefer(*ring, 103.0, hd, 100.0, true));
  EXPECT_TRUE(prefer(*hd, 100.0, ring, 103.0, true));
  EXPECT_FALSE(prefer(*ring, 101.0, hd, 100.0, false));
  EXPECT_TRUE(prefer(*hd, 100.0, ring, 101.0, false));
  // 4 hosts, a rank each, the constants of 100 Mbit/s links: halving-
  // doubling's two fewer steps decide small messages, the ring takes large
  // ones (its estimate 0.06% above at 4 MiB).
  const TuneModel t = with_hosts(make_tune_model(4, true, {50.0, 1.5}, {150.0, 0.0119}, 15.0), {0, 1, 2, 3});
  // (hier, a rank per host, is its algorithm between the hosts: halving-doubling.)
  EXPECT_NE(pick(t, OpKind::AllReduce, 4, 8), "ring");
  for (size_t bytes = size_t{1} << 20; bytes <= size_t{64} << 20; bytes *= 4)
    EXPECT_EQ(pick(t, OpKind::AllReduce, 4, bytes), "ring") << bytes;
}

TEST(Tuner, ReductionsShareTheHostsCpus) {
  SystemGraph g;
  g.hosts.resize(2);
  for (HostTopo& h : g.hosts) {
    h.numa.resize(1);
    h.numa[0].cpus.set(0);
    h.numa[0].cpus.set(1);
  }
  for (int r = 0; r < 6; ++r) {
    RankPlace p;
    p.host = r < 4 ? 0 : 1;  // 4 ranks on 2 CPUs, 2 on 2
    g.ranks.push_back(p);
  }
  EXPECT_DOUBLE_EQ(cpu_share_of(g), 0.5);
  const TuneModel t = tune_model_for(g, {1, 10}, {30, 2}, 8);
  EXPECT_DOUBLE_EQ(t.cpu_share, 0.5);
  EXPECT_DOUBLE_EQ(t.gamma(), 1e-3 / 4);
  g.hosts[0].numa.clear();  // CPUs not known: no share assumed for that host
  EXPECT_DOUBLE_EQ(cpu_share_of(g), 1.0);
}

TEST(Tuner, PlanWhenOnlyDirectIsAllowed) {
  // direct_shm is not a plan: when it cannot take an operation (no shared
  // region, or too large), the cheapest plan runs it.
  ScopedEnv e("MESHCCL_ALGO", "broadcast:direct_shm");
  EXPECT_EQ(pick(fast(8), OpKind::Broadcast, 8, 8), "tree");
}

TEST(Tuner, SendAndRecvIgnoreForcing) {
  ScopedEnv e("MESHCCL_ALGO", "tree");
  EXPECT_EQ(pick(fast(2), OpKind::Send, 2, 64), "p2p");
}

// The one estimate: what estimate_candidates reports (and meshccl_sim prints)
// is each algorithm's own cost function, choose_algorithm takes its cheapest
// allowed entry (the earlier on a tie; across hosts, prefer()'s near ties),
// and a communicator's estimate (what the scheduler sees) is that pick's cost.
void expect_choice_agrees(const TuneModel& t, const OpDesc& op) {
  const std::vector<Candidate> all = estimate_candidates(t, op);
  const Candidate* best = nullptr;
  for (const Candidate& c : all) {
    EXPECT_EQ(c.algorithm->kind, op.kind);
    EXPECT_EQ(c.cost_us, c.algorithm->cost(BuildCtx::whole(t, op), op)) << c.algorithm->name;
    if (c.allowed && std::isfinite(c.cost_us) &&
        (best == nullptr || prefer(*c.algorithm, c.cost_us, best->algorithm, best->cost_us, t.network)))
      best = &c;
  }
  ASSERT_NE(best, nullptr) << op_kind_name(op.kind);
  const Algorithm* pick = nullptr;
  double cost = -1;
  ASSERT_TRUE(choose_algorithm(t, op, &pick, &cost).ok());
  EXPECT_EQ(pick, best->algorithm) << op_kind_name(op.kind) << " n=" << op.nranks << " count=" << op.count;
  EXPECT_EQ(cost, best->cost_us);
  double us = -1;
  ASSERT_TRUE(make_algorithms(1, t, nullptr)->estimate(op, &us).ok());
  EXPECT_EQ(us, best->cost_us);
}

TEST(Tuner, ChoiceIsTheCheapestCandidate) {
  const TuneModel net = make_tune_model(0, true, {2.0, 5.0}, {20.0, 1.25}, 5.0);
  for (int n : {2, 3, 7, 8, 64, 1000, 16384}) {
    for (TuneModel t : {fast(n), slow_steps(n), net}) {
      t.nranks = n;
      for (OpKind kind : {OpKind::AllReduce, OpKind::Broadcast, OpKind::Reduce, OpKind::AllGather,
                          OpKind::ReduceScatter, OpKind::AlltoAll, OpKind::Gather, OpKind::Send})
        for (size_t bytes = 4; bytes <= (size_t{1} << 30); bytes *= 8) expect_choice_agrees(t, op_of(kind, n, bytes));
    }
  }
}

TEST(Tuner, CandidatesFollowForcing) {
  ScopedEnv e("MESHCCL_ALGO", "allreduce:ring");
  const OpDesc op = op_of(OpKind::AllReduce, 8, 8);
  int allowed = 0;
  for (const Candidate& c : estimate_candidates(fast(8), op)) {
    EXPECT_EQ(c.allowed, std::string(c.algorithm->name) == "ring") << c.algorithm->name;
    allowed += c.allowed;
  }
  EXPECT_EQ(allowed, 1);
  expect_choice_agrees(fast(8), op);
}

// A described cluster's model: its rank count, and network links as soon as
// two ranks are on different hosts.
TEST(Tuner, ModelOfAGraph) {
  SystemGraph g;
  g.hosts.resize(2);
  g.ranks.resize(4);
  TuneModel t = tune_model_for(g, {1, 10}, {30, 2}, 7);
  EXPECT_EQ(t.nranks, 4);
  EXPECT_FALSE(t.network);
  EXPECT_EQ(t.link().bw_gbs, 10);
  g.ranks[3].host = 1;
  t = tune_model_for(g, {1, 10}, {30, 2}, 7);
  EXPECT_TRUE(t.network);
  EXPECT_EQ(t.link().alpha_us, 30);
  EXPECT_EQ(t.reduce_gbs, 7);
}

// Nodes of 8 ranks with a NIC each (rail-optimized GPU nodes, meshccl_sim's
// dgx-h100 preset) against the same nodes with one shared NIC (the emulated
// clusters): the hierarchical AllReduce's channels each get a NIC when there
// are as many NICs as local ranks, so no channel runs faster than one NIC
// (NVLink-class local links here, far faster than the network, so that the
// network phase is what bounds the whole)
// and the host's NICs together bound the whole; with one NIC the channels
// share it.
SystemGraph nodes_of_8(int hosts, bool nic_per_rank) {
  SystemGraph g;
  g.hosts.resize(static_cast<size_t>(hosts));
  for (int r = 0; r < 8 * hosts; ++r) {
    RankPlace p;
    p.host = r / 8;
    p.ifname = nic_per_rank ? "mlx5_" + std::to_string(r % 8) : "eth0";
    p.net_gbs = 50;
    g.ranks.push_back(p);
  }
  return g;
}

double predicted_us(const TuneModel& t, const char* algorithm, size_t bytes) {
  for (const Candidate& c : estimate_candidates(t, op_of(OpKind::AllReduce, t.nranks, bytes)))
    if (std::string(c.algorithm->name) == algorithm) return c.cost_us;
  ADD_FAILURE() << "no candidate " << algorithm;
  return 0;
}

TEST(Tuner, RailsBoundTheHierarchicalAllReduce) {
  const size_t bytes = size_t{256} << 20;
  for (int hosts : {2, 4}) {
    const TuneModel rails = tune_model_for(nodes_of_8(hosts, true), {1, 4500}, {5, 50}, 11000);
    const TuneModel shared = tune_model_for(nodes_of_8(hosts, false), {1, 4500}, {5, 50}, 11000);
    EXPECT_EQ(rails.rails, 8);
    EXPECT_EQ(shared.rails, 1);
    EXPECT_EQ(rails.host_net_gbs(8), 400);
    EXPECT_EQ(rails.host_net_gbs(3), 150);
    EXPECT_EQ(shared.host_net_gbs(8), 50);
    // Link limits of the algorithm bandwidth: B H / (2 (H - 1)) with B one
    // host's network bandwidth (GB/s = bytes per ns).
    const double h = hosts, per_host = h / (2 * (h - 1));
    const double algbw_rails = bytes * 1e-3 / predicted_us(rails, "hier", bytes);
    const double algbw_shared = bytes * 1e-3 / predicted_us(shared, "hier", bytes);
    EXPECT_LE(algbw_rails, 400 * per_host) << hosts;
    EXPECT_GE(algbw_rails, 0.5 * 400 * per_host) << hosts;  // the rails are used, not one NIC
    EXPECT_LE(algbw_shared, 50 * per_host) << hosts;
    EXPECT_GE(algbw_shared, 0.5 * 50 * per_host) << hosts;
    // The inter-host phase of each channel (one rank per host, 1/8 of the
    // data) is bounded by one NIC: its bus bandwidth stays at or below 50.
    const double channel_bytes = bytes / 8.0;
    const double inter_busbw =
        channel_bytes * 1e-3 /
        predicted_us(with_hosts(make_tune_model(hosts, true, {1, 450}, {5, rails.host_net_gbs(8) / 8}, 1100),
                                [&] {
                                  std::vector<int> v(static_cast<size_t>(hosts));
                                  for (int i = 0; i < hosts; ++i) v[i] = i;
                                  return v;
                                }()),
                     "ring", bytes / 8) *
        2 * (h - 1) / h;
    EXPECT_LE(inter_busbw, 50.0) << hosts;
    // The flat ring, host-major, leaves each host through one rank's NIC
    // either way: its bus bandwidth stays at or below one NIC's.
    for (const TuneModel* t : {&rails, &shared}) {
      const double n = t->nranks;
      const double ring_busbw = bytes * 1e-3 / predicted_us(*t, "ring", bytes) * 2 * (n - 1) / n;
      EXPECT_LE(ring_busbw, 50.0) << hosts;
    }
  }
}

}  // namespace
}  // namespace meshccl
