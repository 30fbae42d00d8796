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

// The root handles p-1 messages of one block each.
double cost_direct_gather_scatter(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, block = static_cast<double>(op.count * op.elem());
  return (p - 1) * (t.alpha() + block * t.beta());
}

}  // namespace meshccl
