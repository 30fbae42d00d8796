// ncclSend / ncclRecv: one step each. Matching across ranks comes from the tag
// (the n-th send from A to B carries the same tag as B's n-th receive from A).
// A send of up to MESHCCL_P2P_EAGER bytes is eager, as NCCL's sends that fit
// its buffers are: its data is copied aside first and the call completes
// then, without waiting for the receive to be posted (docs/errors.md, "When
// point-to-point can deadlock").
#include "collectives/algorithms.h"

namespace meshccl {

Status build_p2p(const BuildCtx& /*ctx*/, const OpDesc& op, Plan* plan) {
  plan->algorithm = "p2p";
  const size_t bytes = op.count * op.elem();
  if (op.kind == OpKind::Recv) {
    plan->recv(op.peer, 0, op.recvbuff, bytes);
    return kOk;
  }
  if (bytes == 0 || bytes > static_cast<size_t>(settings_of(op).p2p_eager)) {
    plan->send(op.peer, 0, op.sendbuff, bytes);
    return kOk;
  }
  void* aside = plan->scratch(bytes);
  plan->let_go_after = plan->copy(aside, op.sendbuff, bytes);
  plan->send(op.peer, 0, aside, bytes, {plan->let_go_after});
  return kOk;
}

double cost_p2p(const BuildCtx& ctx, const OpDesc& op) {
  const double bytes = static_cast<double>(op.count * op.elem());
  if (op.peer < 0 || op.peer >= ctx.nranks) return ctx.model.alpha() + bytes * ctx.model.beta();
  const LinkCost& l = detail::link_at(ctx, ctx.rank, op.peer);
  return l.alpha_us + bytes * 1e-3 / l.bw_gbs;
}

}  // namespace meshccl
