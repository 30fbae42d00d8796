// Hierarchical Broadcast for communicators spanning hosts: the root sends to
// one leader per other host (its first rank) with a chain or tree across the
// hosts, then each leader (the root on its own host) broadcasts inside its
// host with a chain or tree. The data crosses each host link once.
#include <algorithm>
#include <limits>
#include <vector>

#include "collectives/hier.h"

namespace meshccl {

namespace {

struct Leaders {
  HostGroups g;
  std::vector<int> leader;  // per host
  int root_host = 0;
};

Leaders leaders(const BuildCtx& ctx, int root) {
  Leaders l;
  l.g = hier::layout(ctx);
  l.root_host = l.g.host[root];
  for (size_t h = 0; h < l.g.members.size(); ++h)
    l.leader.push_back(static_cast<int>(h) == l.root_host ? root : l.g.members[h][0]);
  return l;
}

int index_of(const std::vector<int>& v, int x) {
  return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
}

// Phase costs of a rooted collective: across hosts among the leaders, then
// inside the largest host, each by the cheaper of chain and tree.
double rooted_cost(const BuildCtx& ctx, const OpDesc& op, OpKind kind) {
  const HostGroups g = hier::layout(ctx);
  const int hosts = static_cast<int>(g.members.size());
  if (hosts < 2) return std::numeric_limits<double>::infinity();
  // Across hosts rooted at the root's host; inside a host at its leader.
  OpDesc across = op, inside = op;
  across.root = op.root >= 0 && op.root < ctx.nranks ? g.host[op.root] : 0;
  inside.root = 0;
  const double inter = hier::cheapest(hier::net_model(ctx.model, hosts, 1), hosts, across, kind, {"chain", "tree"}).us;
  const double local =
      g.widest > 1
          ? hier::cheapest(hier::local_model(ctx.model, g.widest), g.widest, inside, kind, {"chain", "tree"}).us
          : 0;
  return inter + local;
}

}  // namespace

Status build_hier_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t bytes = op.count * op.elem();
  const Leaders l = leaders(ctx, op.root);
  const int me = ctx.rank, h = l.g.host[me], hosts = static_cast<int>(l.leader.size());
  const std::vector<int>& host = l.g.members[h];
  const int k = static_cast<int>(host.size());
  // Both phases run in place on the output; the root copies its input there first.
  Plan::StepId start =
      me == op.root && op.sendbuff != op.recvbuff ? plan->copy(op.recvbuff, op.sendbuff, bytes) : Plan::kNoStep;
  const hier::Tags tags = hier::tag_ranges(3);
  Plan::StepId across = start;
  if (me == l.leader[h]) {
    OpDesc sub = hier::sub_op(op, OpKind::Broadcast, op.recvbuff, op.recvbuff, op.count, hosts, 3);
    sub.root = l.root_host;
    const auto pick =
        hier::cheapest(hier::net_model(ctx.model, hosts, 1), hosts, sub, OpKind::Broadcast, {"chain", "tree"});
    MC_TRY(hier::build_sub(ctx, pick.algorithm->build, l.leader, h, tags.base(1), sub, start, plan, &across));
  }
  if (k > 1) {
    OpDesc sub = hier::sub_op(op, OpKind::Broadcast, op.recvbuff, op.recvbuff, op.count, k, 3);
    sub.root = index_of(host, l.leader[h]);
    const auto pick = hier::cheapest(hier::local_model(ctx.model, k), k, sub, OpKind::Broadcast, {"chain", "tree"});
    // The root's host need not wait for the sends across hosts.
    const Plan::StepId after = me == op.root ? start : across;
    Plan::StepId done = Plan::kNoStep;
    MC_TRY(
        hier::build_sub(ctx, pick.algorithm->build, host, index_of(host, me), tags.base(2), sub, after, plan, &done));
  }
  plan->algorithm = "hier";
  return kOk;
}

double cost_hier_broadcast(const BuildCtx& ctx, const OpDesc& op) { return rooted_cost(ctx, op, OpKind::Broadcast); }
double cost_hier_reduce(const BuildCtx& ctx, const OpDesc& op) { return rooted_cost(ctx, op, OpKind::Reduce); }

}  // namespace meshccl
