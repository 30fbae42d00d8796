// Host-aware costs of message steps (see algorithms.h, detail): each transfer
// at the rates of the link class it crosses, a host's network links shared by
// every transfer that leaves the host at the same time. A model without a
// host map (make_tune_model alone) keeps the flat view: every link at
// TuneModel::link(), nothing shared.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl::detail {

namespace {

int rank_at(const BuildCtx& ctx, int pos) { return ctx.ranks != nullptr ? ctx.ranks[pos] : pos; }

bool host_aware(const TuneModel& t) { return t.network && !t.host.empty(); }

// us per byte of one transfer that leaves a host along with `streams` others
// (itself included) at once: the host's links divided among them.
double shared_net_beta(const TuneModel& t, int streams) { return 1e-3 * streams / t.host_net_gbs(streams); }

}  // namespace

bool crosses_hosts(const BuildCtx& ctx, int a, int b) {
  const TuneModel& t = ctx.model;
  if (!t.network) return false;
  if (t.host.empty()) return true;  // flat: every pair as if across the network
  return t.host_of(rank_at(ctx, a)) != t.host_of(rank_at(ctx, b));
}

const LinkCost& link_at(const BuildCtx& ctx, int a, int b) {
  return crosses_hosts(ctx, a, b) ? ctx.model.net : ctx.model.local();
}

StepCost step_cost(const BuildCtx& ctx, const std::vector<std::pair<int, int>>& transfers) {
  const TuneModel& t = ctx.model;
  StepCost c;
  if (transfers.empty()) return c;
  // Transfers leaving each host at once.
  std::vector<int> leaving(static_cast<size_t>(host_aware(t) ? t.hosts() : 1), 0);
  if (host_aware(t))
    for (const auto& [a, b] : transfers)
      if (crosses_hosts(ctx, a, b)) ++leaving[static_cast<size_t>(t.host_of(rank_at(ctx, a)))];
  for (const auto& [a, b] : transfers) {
    const LinkCost& l = link_at(ctx, a, b);
    double beta = 1e-3 / l.bw_gbs;
    if (host_aware(t) && crosses_hosts(ctx, a, b))
      beta = shared_net_beta(t, leaving[static_cast<size_t>(t.host_of(rank_at(ctx, a)))]);
    c.alpha_us = std::max(c.alpha_us, l.alpha_us);
    c.beta = std::max(c.beta, beta);
  }
  return c;
}

ChainCost chain_cost(const BuildCtx& ctx, int root) {
  const int n = ctx.nranks;
  ChainCost c;
  if (root < 0 || root >= n) root = 0;
  std::vector<std::pair<int, int>> hops;
  for (int k = 0; k + 1 < n; ++k) {
    const int a = ((root + k) % n + n) % n, b = (a + 1) % n;
    hops.emplace_back(a, b);
    c.alpha_us += link_at(ctx, a, b).alpha_us;
  }
  c.beta = step_cost(ctx, hops).beta;
  return c;
}

PathCost tree_cost(const BuildCtx& ctx, const std::vector<std::vector<int>>& parents, bool children_only) {
  const TuneModel& t = ctx.model;
  const int n = ctx.nranks;
  PathCost out;
  std::vector<std::pair<int, int>> edges;  // child -> parent, every tree
  for (const std::vector<int>& parent : parents) {
    // The sum of hop(child) over the path from each position up to its root:
    // memoized walk, each tree is acyclic.
    auto walk_up = [&](auto hop) {
      std::vector<double> up(static_cast<size_t>(n), -1);
      for (int s = 0; s < n; ++s) {
        std::vector<int> path;
        int r = s;
        while (r >= 0 && up[r] < 0 && parent[r] >= 0) path.push_back(r), r = parent[r];
        double acc = r >= 0 && up[r] >= 0 ? up[r] : 0;
        for (auto it = path.rbegin(); it != path.rend(); ++it) up[*it] = acc += hop(*it);
        if (r >= 0 && up[r] < 0) up[r] = 0;  // a root
      }
      return up;
    };
    // Latency up to the root, and the per-byte time of the path, each hop at its link's rate.
    const std::vector<double> up = walk_up([&](int c) { return link_at(ctx, c, parent[c]).alpha_us; });
    const std::vector<double> up_beta = walk_up([&](int c) { return 1e-3 / link_at(ctx, c, parent[c]).bw_gbs; });
    for (int r = 0; r < n; ++r) {
      out.depth_alpha_us = std::max(out.depth_alpha_us, up[r]);
      out.path_beta = std::max(out.path_beta, up_beta[r]);
      if (parent[r] >= 0) edges.emplace_back(r, parent[r]);
    }
  }
  // The busiest position moves one piece over each of its edges (children
  // only: one per child), each at its link's rate; a host's network links
  // carry one piece per edge leaving the host, all at once (children only:
  // one direction per edge, counted at the parent's host).
  std::vector<double> per_rank(static_cast<size_t>(n), 0);
  double edge_beta = 0;
  std::vector<int> leaving(static_cast<size_t>(host_aware(t) ? t.hosts() : 1), 0);
  for (const auto& [c, p] : edges) {
    const bool net = host_aware(t) && crosses_hosts(ctx, c, p);
    const double beta = 1e-3 / link_at(ctx, c, p).bw_gbs;
    per_rank[p] += beta;
    if (!children_only) per_rank[c] += beta;
    edge_beta = std::max(edge_beta, beta);
    if (net) {  // down from the parent's host; up from the child's, unless one direction only
      ++leaving[static_cast<size_t>(t.host_of(rank_at(ctx, p)))];
      if (!children_only) ++leaving[static_cast<size_t>(t.host_of(rank_at(ctx, c)))];
    }
  }
  out.busiest_beta = *std::max_element(per_rank.begin(), per_rank.end());
  if (host_aware(t))
    for (int x : leaving)
      if (x > 0) out.busiest_beta = std::max(out.busiest_beta, 1e-3 * x / t.host_net_gbs(x));
  out.covered_beta = host_aware(t) && t.hosts() > 1 ? out.busiest_beta : edge_beta;
  return out;
}

double tree_fill(const PathCost& tree, const OpDesc& op, double piece, int legs) {
  return first_chunk(op, piece) * std::max(0.0, legs * tree.path_beta - tree.covered_beta);
}

}  // namespace meshccl::detail
