// Gather and Scatter straight between the root and every rank.
#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_direct_gather(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), c = op.count, bytes = c * es;
  plan->algorithm = "direct";
  if (ctx.rank != op.root) {
    if (bytes > 0) plan->send(op.root, 0, op.sendbuff, bytes);
    return kOk;
  }
  plan->copy(at(op.recvbuff, op.root * c, es), op.sendbuff, bytes);
  if (bytes == 0) return kOk;
  for (int p = 0; p < ctx.nranks; ++p)
    if (p != op.root) plan->recv(p, 0, at(op.recvbuff, p * c, es), bytes);
  return kOk;
}

Status build_direct_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const size_t es = op.elem(), c = op.count, bytes = c * es;
  plan->algorithm = "direct";
  if (ctx.rank != op.root) {
    if (bytes > 0) plan->recv(op.root, 0, op.recvbuff, bytes);
    return kOk;
  }
  plan->copy(op.recvbuff, at(op.sendbuff, op.root * c, es), bytes);
  if (bytes == 0) return kOk;
  for (int p = 0; p < ctx.nranks; ++p)
    if (p != op.root) plan->send(p, 0, at(op.sendbuff, p * c, es), bytes);
  return kOk;
}

// The root handles p-1 messages of one block each, each at its link's rates.
double cost_direct_gather_scatter(const BuildCtx& ctx, const OpDesc& op) {
  const double block = static_cast<double>(op.count * op.elem());
  double us = 0;
  for (int i = 0; i < ctx.nranks; ++i) {
    if (i == op.root) continue;
    const LinkCost& l = detail::link_at(ctx, op.root, i);  // one message at a time at the root
    us += l.alpha_us + block * 1e-3 / l.bw_gbs;
  }
  return us;
}

}  // namespace meshccl
