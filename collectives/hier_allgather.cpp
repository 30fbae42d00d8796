// Hierarchical AllGather for communicators spanning hosts. Block p (rank p's
// input) travels on channel local(p) mod K (K: hier::channels, one per
// network rail of a host unless MESHCCL_HIER_CHANNELS says otherwise); on
// every host one rank carries each channel, its gateway.
//   1. inside p's host: p sends its block to every other local rank, its
//      channel's gateway among them;
//   2. across hosts: the gateways of a channel form a ring of the hosts, and
//      each block goes around it from its own host, forwarded by the gateway
//      of every host it reaches;
//   3. inside every other host: the gateway that received the block sends it
//      to the host's other ranks.
// Every block crosses each host's link once per direction it must, with one
// flow per channel out of a host: the least traffic, without the queue
// losses of a flow per rank (docs/algorithms.md). Blocks pipeline through the
// phases one behind another.
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

using detail::at;
using hier::gateway;

Status build_hier_allgather(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), block = op.count * es;
  plan->algorithm = "hier";
  const HostGroups g = hier::layout(ctx);
  const int me = ctx.rank, h = g.host[me], n = ctx.nranks, hosts = static_cast<int>(g.members.size());
  const int k = hier::channels(ctx, op, g);
  auto slot = [&](int p) { return at(op.recvbuff, op.count * static_cast<size_t>(p), es); };
  if (slot(me) != op.sendbuff) plan->copy(slot(me), op.sendbuff, block);
  if (block == 0) return kOk;
  const int next = (h + 1) % hosts, prev = (h + hosts - 1) % hosts;
  // Tags: 1 + p across hosts, 1 + n + p inside a host.
  auto cross = [](int p) { return 1 + static_cast<uint32_t>(p); };
  auto local = [n](int p) { return 1 + static_cast<uint32_t>(n + p); };
  // 1. This host's blocks, from their ranks to the other local ranks.
  for (int m : g.members[h])
    if (m != me) plan->send(m, local(me), op.sendbuff, block);
  for (int p = 0; p < n; ++p) {
    const int on = g.host[p];
    const bool carry = gateway(g, k, p, h) == me;
    if (on == h) {
      Plan::StepId have = p == me ? Plan::kNoStep : plan->recv(p, local(p), slot(p), block);
      // 2. The ring's first hop, from the block's own host.
      if (carry && hosts > 1)
        plan->send(gateway(g, k, p, next), cross(p), p == me ? op.sendbuff : slot(p), block, {have});
      continue;
    }
    if (!carry) {  // 3. from this host's gateway
      plan->recv(gateway(g, k, p, h), local(p), slot(p), block);
      continue;
    }
    // 2. Around the ring: from the previous host, on unless the next host is
    // the block's own; 3. to the other local ranks.
    Plan::StepId have = plan->recv(gateway(g, k, p, prev), cross(p), slot(p), block);
    if (next != on) plan->send(gateway(g, k, p, next), cross(p), slot(p), block, {have});
    for (int m : g.members[h])
      if (m != me) plan->send(m, local(p), slot(p), block, {have});
  }
  return kOk;
}

// The network carries, out of the busiest host, every block but those of the
// next host on the ring, over K flows; the local phase moves every block to
// each of a host's ranks over shared memory. Blocks pipeline, so the slower
// phase carries the whole data and the other one block's worth.
double cost_hier_allgather(const BuildCtx& ctx, const OpDesc& op) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size()), n = ctx.nranks;
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  const TuneModel& t = ctx.model;
  const double block = static_cast<double>(op.count * op.elem());
  int blocks = 0;
  const double net_us = hier::gateway_ring_us(ctx, g, hier::channels(ctx, op, g), block, &blocks);
  const double local_us = g.widest > 1 ? t.local().alpha_us + (n - 1) * block * 1e-3 / t.local().bw_gbs : 0;
  return hier::overlapped(net_us, local_us, blocks);
}

}  // namespace meshccl
