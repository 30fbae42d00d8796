// Hierarchical ReduceScatter for communicators spanning hosts. Block b (rank
// b's output) travels on channel local(b) mod K (K: hier::channels, one per
// network rail of a host unless MESHCCL_HIER_CHANNELS says otherwise); on
// every host one rank carries each channel, its gateway.
//   1. inside every host: the local ranks send their piece of b to the
//      host's gateway of b's channel, which reduces them;
//   2. across hosts: the gateways of a channel form a ring of the hosts, and
//      b's partial sum goes around it from the host after b's to b's own,
//      each gateway adding its host's sum before passing it on;
//   3. on b's host the gateway adds the last partial sum and sends the
//      result to b (unless it is b).
// Each block crosses each host's link once, as a partial sum, with one flow
// per channel out of a host: the least traffic, without the queue losses of
// a flow per rank (docs/algorithms.md).
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

using detail::at;
using hier::gateway;
using hier::reduce_from;

Status build_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), rc = op.count;
  plan->algorithm = "hier";
  const HostGroups g = hier::layout(ctx);
  const int me = ctx.rank, h = g.host[me], n = ctx.nranks, hosts = static_cast<int>(g.members.size());
  const int k = hier::channels(ctx, op, g);
  const detail::OwnInput own = detail::own_input(op, plan, nullptr, rc * n);
  if (rc == 0) return kOk;
  const int next = (h + 1) % hosts, prev = (h + hosts - 1) % hosts;
  // Tags: 1 + b across hosts, 1 + n + b to the gateway, 1 + 2n + b from it.
  auto cross = [](int b) { return 1 + static_cast<uint32_t>(b); };
  auto up = [n](int b) { return 1 + static_cast<uint32_t>(n + b); };
  auto down = [n](int b) { return 1 + static_cast<uint32_t>(2 * n + b); };
  std::vector<int> locals;
  for (int m : g.members[h])
    if (m != me) locals.push_back(m);
  for (int b = 0; b < n; ++b) {
    const void* in = at(own.data, rc * static_cast<size_t>(b), es);
    const int gw = gateway(g, k, b, h), on = g.host[b];
    if (gw != me) {  // 1. to this host's gateway of b; 3. the result from it
      Plan::StepId sent = plan->send(gw, up(b), in, rc * es, {own.scaled});
      if (b == me) plan->recv(gw, down(b), op.recvbuff, rc * es, {sent});  // in place: after the send read it
      continue;
    }
    const bool last = on == h;  // the ring ends on b's host
    void* acc = b == me ? op.recvbuff : plan->scratch(rc * es);
    Plan::StepId sum = reduce_from(plan, locals, up(b), in, acc, rc, es, own.scaled);
    if (prev != on)  // 2. not the ring's first host: add the partial sum so far
      sum = reduce_from(plan, {gateway(g, k, b, prev)}, cross(b), acc, acc, rc, es, sum);
    if (!last) {
      plan->send(gateway(g, k, b, next), cross(b), acc, rc * es, {sum});
      continue;
    }
    if (op.avg) sum = plan->divide(acc, acc, rc, {sum});
    if (b != me) plan->send(b, down(b), acc, rc * es, {sum});
  }
  return kOk;
}

// A host's gateways reduce (k-1)/k of its input in a local phase, and each
// partial sum from the previous host once more on arrival; the network
// carries, out of the busiest host, the partial sums of every block but its
// own host's, over K flows. Blocks pipeline, so the slower of network and
// the reductions carries the whole data and the other one block's worth
// (2x4 at 200 Mbit/s, 16 MiB: with the arrival reductions counted after the
// network, the model said 429 ms against 357-368 ms measured).
double cost_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size()), n = ctx.nranks, w = g.widest;
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  const TuneModel& t = ctx.model;
  const double block = static_cast<double>(op.count * op.elem());
  int blocks = 0;
  const double net_us = hier::gateway_ring_us(ctx, g, hier::channels(ctx, op, g), block, &blocks);
  const double local_us =
      blocks * block * t.gamma() +
      (w > 1 ? t.local().alpha_us + (w - 1.0) / w * n * block * (1e-3 / t.local().bw_gbs + t.gamma()) : 0);
  return hier::overlapped(net_us, local_us, blocks);
}

}  // namespace meshccl
