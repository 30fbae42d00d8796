// What the hierarchical algorithms share (hier_*.cpp): the group's ranks by
// host, tag ranges for the sub-plans they compose, sub-plans built over a
// sub-group after a step of their own, and the costs of their local and
// network phases. Internal to collectives/.
#pragma once

#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl::hier {

// The ranks of ctx's group by host (TuneModel::host of each position's rank).
HostGroups layout(const BuildCtx& ctx);

// A plan's tags cut into `ranges` equal ranges: range 0 for the algorithm's
// own messages, the others one per sub-plan.
struct Tags {
  uint32_t width = 0;
  uint32_t base(int range) const { return width * static_cast<uint32_t>(range); }
};
Tags tag_ranges(int ranges);

// op as a sub-plan's operation: `count` elements from `in` to `out`, no
// averaging and no PreMulSum scaling (set premul again where it applies), chunks large enough for the sub-plan's tags to fit one range
// (group_size ranks; ranges as in tag_ranges).
OpDesc sub_op(const OpDesc& op, OpKind kind, const void* in, void* out, size_t count, int group_size, int ranges);

// Builds `build` for the sub-group `members` (positions in ctx's group; this
// rank at index `me`) with tags from `tag_base` on, every step of it after
// `after` (Plan::kNoStep: none). *done: a step that completes once all of
// them have.
Status build_sub(const BuildCtx& ctx, BuildFn build, const std::vector<int>& members, int me, uint32_t tag_base,
                 const OpDesc& sub, Plan::StepId after, Plan* plan, Plan::StepId* done);

// The model a sub-plan across hosts runs under: one rank per host, the
// host's links (TuneModel::rails) shared by `channels` sub-plans running at
// once: a link each while there are as many rails as channels.
TuneModel net_model(const TuneModel& model, int hosts, int channels);
// The model of the ranks of one host: shared memory only.
TuneModel local_model(const TuneModel& model, int ranks);

// The cheapest of `candidates` for op on `nranks` ranks under model.
struct Choice {
  const Algorithm* algorithm = nullptr;
  double us = 0;
};
Choice cheapest(const TuneModel& model, int nranks, const OpDesc& op, OpKind kind,
                std::initializer_list<const char*> candidates);

// How many ranks of a host carry the data of a hierarchical AllReduce,
// AllGather or ReduceScatter across hosts, one flow each:
// MESHCCL_HIER_CHANNELS (the op's settings), else one per rail of a host, at
// most the widest host's ranks.
int channels(const BuildCtx& ctx, const OpDesc& op, const HostGroups& g);

// The rank of host `on` that carries block p (the block of position p) of
// a hierarchical AllGather or ReduceScatter across hosts: the gateway of
// p's channel, local(p) mod `channels`, on that host.
int gateway(const HostGroups& g, int channels, int p, int on);

// dst = in op (every message from `from`, received into scratch first), in
// the order given; returns the last step (after `after`).
Plan::StepId reduce_from(Plan* plan, const std::vector<int>& from, uint32_t tag, const void* in, void* dst,
                         size_t count, size_t es, Plan::StepId after);

// The cost of gateways in a ring of the hosts moving, out of the busiest
// host, the blocks of every rank but the smallest host's, `block` bytes
// each, over `channels` flows; *blocks: how many.
double gateway_ring_us(const BuildCtx& ctx, const HostGroups& g, int channels, double block, int* blocks);

// Two phases that pipeline over `blocks` blocks: the slower one carries the
// whole data and the other one block's worth.
inline double overlapped(double a_us, double b_us, int blocks) {
  return std::max(a_us, b_us) + std::min(a_us, b_us) / std::max(blocks, 1);
}

// Segments a large operation is cut into so that its phases overlap.
int segments(const OpDesc& op, size_t bytes, int shares);

}  // namespace meshccl::hier
