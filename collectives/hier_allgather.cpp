// Hierarchical AllGather for communicators spanning hosts, in two phases:
//   1. across hosts: every rank sends its block once to each other host, to
//      the rank there whose local index is its own modulo that host's size;
//   2. inside each host: every rank forwards the blocks it holds (its own and
//      those it received) to the other local ranks.
// Each block crosses every host link once, and a host's ranks share the
// sending: the least traffic a host's network link can carry.
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

using detail::at;

namespace {

// The rank of host `to` that receives (and forwards there) the block of position p.
int receiver(const HostGroups& g, int p, int to) {
  const std::vector<int>& hg = g.members[to];
  return g.host[p] == to ? p : hg[g.local[p] % static_cast<int>(hg.size())];
}

}  // namespace

Status build_hier_allgather(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), block = op.count * es;
  plan->algorithm = "hier";
  const HostGroups g = hier::layout(ctx);
  const int me = ctx.rank, h = g.host[me], n = ctx.nranks, hosts = static_cast<int>(g.members.size());
  void* mine = at(op.recvbuff, op.count * static_cast<size_t>(me), es);
  Plan::StepId own = mine != op.sendbuff ? plan->copy(mine, op.sendbuff, block) : Plan::kNoStep;
  if (block == 0) return kOk;
  std::vector<Plan::StepId> have(static_cast<size_t>(n), Plan::kNoStep);
  have[me] = own;
  // 1. Across hosts (tag 0: one message per pair).
  for (int to = 0; to < hosts; ++to)
    if (to != h) plan->send(receiver(g, me, to), 0, op.sendbuff, block);
  for (int p = 0; p < n; ++p)
    if (g.host[p] != h && receiver(g, p, h) == me)
      have[p] = plan->recv(p, 0, at(op.recvbuff, op.count * static_cast<size_t>(p), es), block);
  // 2. Inside the host (tag 1 + block).
  for (int p = 0; p < n; ++p) {
    const int holder = receiver(g, p, h);
    void* dst = at(op.recvbuff, op.count * static_cast<size_t>(p), es);
    const uint32_t tag = 1 + static_cast<uint32_t>(p);
    if (holder == me) {
      for (int m : g.members[h])
        if (m != me) plan->send(m, tag, dst, block, {have[p]});
    } else if (p != me) {
      plan->recv(holder, tag, dst, block);
    }
  }
  return kOk;
}

// One network step moving the blocks of the other hosts into the busiest
// host, then one local step forwarding to each local rank what it lacks.
double cost_hier_allgather(const BuildCtx& ctx, const OpDesc& op) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size()), n = ctx.nranks;
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  const TuneModel& t = ctx.model;
  const double block = static_cast<double>(op.count * op.elem());
  int smallest = n;
  for (const auto& hg : g.members) smallest = std::min(smallest, static_cast<int>(hg.size()));
  const double net_us = t.net.alpha_us + (n - smallest) * block * 1e-3 / t.host_net_gbs(smallest);
  const double local_us = g.widest > 1 ? t.local().alpha_us + (n - 1) * block * 1e-3 / t.local().bw_gbs : 0;
  return net_us + local_us;
}

}  // namespace meshccl
