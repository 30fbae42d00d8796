// ncclSend / ncclRecv: one step each. Matching across ranks comes from the tag
// (the n-th send from A to B carries the same tag as B's n-th receive from A).
#include "collectives/algorithms.h"

namespace meshccl {

Status build_p2p(const BuildCtx& /*ctx*/, const OpDesc& op, Plan* plan) {
  plan->algorithm = "p2p";
  const size_t bytes = op.count * op.elem();
  if (op.kind == OpKind::Send) plan->send(op.peer, 0, op.sendbuff, bytes);
  else plan->recv(op.peer, 0, op.recvbuff, bytes);
  return kOk;
}

double cost_p2p(const BuildCtx& ctx, const OpDesc& op) {
  const double bytes = static_cast<double>(op.count * op.elem());
  if (op.peer < 0 || op.peer >= ctx.nranks) return ctx.model.alpha() + bytes * ctx.model.beta();
  const LinkCost& l = detail::link_at(ctx, ctx.rank, op.peer);
  return l.alpha_us + bytes * 1e-3 / l.bw_gbs;
}

}  // namespace meshccl
