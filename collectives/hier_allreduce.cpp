// Hierarchical AllReduce for communicators spanning hosts. The data is cut
// into S segments of K shares each (K channels: one per network rail of a
// host unless MESHCCL_HIER_CHANNELS says otherwise, at most the most ranks on
// one host); on every host, share j belongs to local rank share_owner(k, K, j)
// (a host of k > K ranks leaves some ranks without a share, k < K gives some
// several). Per share:
//   1. reduce inside the host: the other local ranks send their piece to the
//      owner, which reduces them into its output;
//   2. all-reduce across hosts among the owners of the share, one per host
//      (ring, tree, halving-doubling or recursive doubling, whichever the
//      model prefers for H ranks on links shared by K channels), built with
//      build_in;
//   3. the owner sends the result to the other local ranks.
// Every byte crosses the network once per direction of the inter-host
// all-reduce, one flow per channel, and the phases of successive segments
// overlap. Why not a flow per local rank: with 4 flows sharing one 200 Mbit/s
// link, packets lost at the link's queue left TCP waiting out retransmission
// timeouts, and 4 MiB took 0.27-0.30 s against 0.18-0.19 s with one flow
// (docs/algorithms.md).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

using detail::at;
using detail::block_begin;

namespace {

// The AllReduces the hosts' owners of a share may run among themselves.
constexpr std::initializer_list<const char*> kInter = {"ring", "tree", "halving_doubling", "recursive_doubling"};

struct Layout {
  HostGroups g;
  int hosts = 0, shares = 0, segs = 0;
  hier::Tags tags;
  const Algorithm* inter = nullptr;
};

Layout make_layout(const BuildCtx& ctx, const OpDesc& op) {
  Layout l;
  l.g = hier::layout(ctx);
  l.hosts = static_cast<int>(l.g.members.size());
  l.shares = hier::channels(ctx, op, l.g);
  const size_t bytes = op.count * op.elem();
  l.segs = hier::segments(op, bytes, l.shares);
  l.tags = hier::tag_ranges(1 + l.segs * l.shares);
  OpDesc channel = op;
  channel.count = op.count / static_cast<size_t>(l.shares);
  l.inter = hier::cheapest(hier::net_model(ctx.model, l.hosts, l.shares), l.hosts, channel, OpKind::AllReduce, kInter)
                .algorithm;
  return l;
}

}  // namespace

Status build_hier_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), count = op.count;
  const detail::OwnInput own = detail::own_input(op, plan, op.recvbuff, count);
  const Layout l = make_layout(ctx, op);
  const int h = l.g.host[ctx.rank], me = ctx.rank;
  const std::vector<int>& host = l.g.members[h];
  const int k = static_cast<int>(host.size()), pieces = l.segs * l.shares;
  std::vector<int> locals;
  for (int m : host)
    if (m != me) locals.push_back(m);
  if (l.inter == nullptr) return MC_ERROR(ncclInternalError, "hier: no algorithm across hosts");
  for (int q = 0; q < pieces; ++q) {
    const size_t lo = block_begin(count, pieces, q), len = block_begin(count, pieces, q + 1) - lo;
    if (len == 0) continue;
    const int j = q % l.shares, owner = host[share_owner(k, l.shares, j)];
    const uint32_t up = static_cast<uint32_t>(q), down = static_cast<uint32_t>(pieces + q);
    void* out = at(op.recvbuff, lo, es);
    if (me != owner) {
      Plan::StepId sent = plan->send(owner, up, at(own.data, lo, es), len * es, {own.scaled});
      plan->recv(owner, down, out, len * es, {sent});  // in place: after the send read it
      continue;
    }
    // 1. The other local ranks' pieces, reduced into out.
    Plan::StepId ready = hier::reduce_from(plan, locals, up, at(own.data, lo, es), out, len, es, own.scaled);
    // The owners of share j on every host, this one at index h.
    std::vector<int> channel(static_cast<size_t>(l.hosts));
    for (int g = 0; g < l.hosts; ++g) {
      const std::vector<int>& hg = l.g.members[g];
      channel[g] = hg[share_owner(static_cast<int>(hg.size()), l.shares, j)];
    }
    const OpDesc sub = hier::sub_op(op, OpKind::AllReduce, out, out, len, l.hosts, 1 + pieces);
    Plan::StepId done = Plan::kNoStep;
    MC_TRY(hier::build_sub(ctx, l.inter->build, channel, h, l.tags.base(1 + q), sub, ready, plan, &done));
    if (op.avg) done = plan->divide(out, out, len, {done});
    for (int m : host)
      if (m != me) plan->send(m, down, out, len * es, {done});
  }
  plan->algorithm = "hier";
  return kOk;
}

// Phases 1 and 3 move (k-1)/k of the data over shared memory (k ranks on the
// host; see below for K channels), phase 2 is the inter-host algorithm's
// cost for H ranks with each host link shared by K channels. Successive
// segments overlap, so the slower of the two carries the whole data and the
// other one segment's worth.
double cost_hier_allreduce(const BuildCtx& ctx, const OpDesc& op) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size()), widest = g.widest;
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  const int k = hier::channels(ctx, op, g);
  const TuneModel& t = ctx.model;
  const double bytes = static_cast<double>(op.count * op.elem());
  OpDesc channel = op;
  channel.count = op.count / static_cast<size_t>(k);
  const hier::Choice inter = hier::cheapest(hier::net_model(t, hosts, k), hosts, channel, OpKind::AllReduce, kInter);
  const LinkCost& local = t.local();
  // The host's reductions cost the same in all whatever the channels: fewer
  // channels put more of them on each owner, but the host's other ranks run
  // meanwhile on the same cores (2x4 at 10 Gbit/s, bound by 2 cores: 16 MiB
  // in 37-43 ms with one channel, 42-49 ms with four). Not yet modelled: a
  // host with a core per rank, where one owner's share would take longer.
  const double share = (widest - 1.0) / widest;
  const double local_us = share * bytes * (2e-3 / local.bw_gbs + t.gamma());
  const double segs = hier::segments(op, op.count * op.elem(), k);
  const double alphas = widest > 1 ? 2 * local.alpha_us : 0;
  return alphas + std::max(inter.us, local_us) + std::min(inter.us, local_us) / segs;
}

}  // namespace meshccl
