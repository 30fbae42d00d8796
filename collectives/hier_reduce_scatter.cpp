// Hierarchical ReduceScatter for communicators spanning hosts, in two phases:
//   1. inside each host: block b is reduced over the host's ranks by its
//      reducer there, b itself on b's host, else the local rank whose index
//      is b's local index modulo the host's size;
//   2. across hosts: each reducer sends its partial sum of b to b, which
//      reduces the partial sums of the other hosts into its output.
// Each block crosses the network once per other host, as partial sums: the
// least traffic a host's network link can carry.
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

using detail::at;

namespace {

int reducer(const HostGroups& g, int b, int on) {
  const std::vector<int>& hg = g.members[on];
  return g.host[b] == on ? b : hg[g.local[b] % static_cast<int>(hg.size())];
}

// dst = in op (every message from `from`, received into scratch first), in
// the order given; returns the last step (after `after`).
Plan::StepId reduce_from(Plan* plan, const std::vector<int>& from, uint32_t tag, const void* in, void* dst,
                         size_t count, size_t es, Plan::StepId after) {
  Plan::StepId prev = after;
  const void* acc = in;
  for (int p : from) {
    void* tmp = plan->scratch(count * es);
    Plan::StepId got = plan->recv(p, tag, tmp, count * es);
    prev = plan->reduce(dst, acc, tmp, count, {got, prev});
    acc = dst;
  }
  if (acc != dst && in != dst) prev = plan->copy(dst, in, count * es, {after});
  return prev;
}

}  // namespace

Status build_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), rc = op.count;
  plan->algorithm = "hier";
  const HostGroups g = hier::layout(ctx);
  const int me = ctx.rank, h = g.host[me], n = ctx.nranks, hosts = static_cast<int>(g.members.size());
  const detail::OwnInput own = detail::own_input(op, plan, nullptr, rc * n);
  if (rc == 0) return kOk;
  std::vector<int> locals;
  for (int m : g.members[h])
    if (m != me) locals.push_back(m);
  for (int b = 0; b < n; ++b) {
    const void* in = at(own.data, rc * static_cast<size_t>(b), es);
    const int red = reducer(g, b, h);
    if (red != me) {  // 1. to this host's reducer of b (tag b)
      plan->send(red, static_cast<uint32_t>(b), in, rc * es, {own.scaled});
      continue;
    }
    const bool mine = b == me;
    void* acc = mine ? op.recvbuff : plan->scratch(rc * es);
    Plan::StepId local = reduce_from(plan, locals, static_cast<uint32_t>(b), in, acc, rc, es, own.scaled);
    if (!mine) {  // 2. the host's partial sum to b (tag n)
      plan->send(b, static_cast<uint32_t>(n), acc, rc * es, {local});
      continue;
    }
    std::vector<int> remote;
    for (int o = 0; o < hosts; ++o)
      if (o != h) remote.push_back(reducer(g, b, o));
    Plan::StepId all = reduce_from(plan, remote, static_cast<uint32_t>(n), acc, acc, rc, es, local);
    if (op.avg) plan->divide(acc, acc, rc, {all});
  }
  return kOk;
}

// One local step reducing (k-1)/k of the input into the reducers, one network
// step carrying the partial sums of the blocks of other hosts.
double cost_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size()), n = ctx.nranks, k = g.widest;
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  const TuneModel& t = ctx.model;
  const double block = static_cast<double>(op.count * op.elem());
  int smallest = n;
  for (const auto& hg : g.members) smallest = std::min(smallest, static_cast<int>(hg.size()));
  const double net_us =
      t.net.alpha_us + (n - smallest) * block * (1e-3 / t.host_net_gbs(smallest)) + (hosts - 1) * block * t.gamma();
  const double local_us =
      k > 1 ? t.local().alpha_us + (k - 1.0) / k * n * block * (1e-3 / t.local().bw_gbs + t.gamma()) : 0;
  return net_us + local_us;
}

}  // namespace meshccl
