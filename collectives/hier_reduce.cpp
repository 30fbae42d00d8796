// Hierarchical Reduce for communicators spanning hosts: each host reduces to
// its leader (the root on the root's host, else its first rank) with a chain
// or tree, then the leaders reduce across hosts to the root. The data
// crosses each host link once. Its cost is next to Broadcast's
// (hier_broadcast.cpp): the same two phases.
#include <algorithm>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

Status build_hier_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem();
  const HostGroups g = hier::layout(ctx);
  const int me = ctx.rank, h = g.host[me], root_host = g.host[op.root], hosts = static_cast<int>(g.members.size());
  std::vector<int> leader;
  for (int o = 0; o < hosts; ++o) leader.push_back(o == root_host ? op.root : g.members[o][0]);
  const std::vector<int>& host = g.members[h];
  const int k = static_cast<int>(host.size());
  const int li = static_cast<int>(std::find(host.begin(), host.end(), leader[h]) - host.begin());
  const int mi = static_cast<int>(std::find(host.begin(), host.end(), me) - host.begin());
  const bool lead = me == leader[h], is_root = me == op.root;
  // The host's sum lands in the root's output, in scratch at other leaders.
  void* partial = is_root ? op.recvbuff : lead ? plan->scratch(op.count * es) : nullptr;
  const hier::Tags tags = hier::tag_ranges(3);
  // 1. Inside the host, each rank's input scaled once for PreMulSum.
  OpDesc local = hier::sub_op(op, OpKind::Reduce, op.sendbuff, partial, op.count, k, 3);
  local.premul = op.premul;
  local.root = li;
  const auto lpick = hier::cheapest(hier::local_model(ctx.model, k), k, local, OpKind::Reduce, {"chain", "tree"});
  Plan::StepId reduced = Plan::kNoStep;
  MC_TRY(hier::build_sub(ctx, lpick.algorithm->build, host, mi, tags.base(2), local, Plan::kNoStep, plan, &reduced));
  // 2. Across hosts among the leaders, in place at the root.
  if (lead) {
    OpDesc across = hier::sub_op(op, OpKind::Reduce, partial, is_root ? op.recvbuff : partial, op.count, hosts, 3);
    across.root = root_host;
    const auto pick =
        hier::cheapest(hier::net_model(ctx.model, hosts, 1), hosts, across, OpKind::Reduce, {"chain", "tree"});
    Plan::StepId done = Plan::kNoStep;
    MC_TRY(hier::build_sub(ctx, pick.algorithm->build, leader, h, tags.base(1), across, reduced, plan, &done));
    if (is_root && op.avg) plan->divide(op.recvbuff, op.recvbuff, op.count, {done});
  }
  plan->algorithm = "hier";
  return kOk;
}

}  // namespace meshccl
