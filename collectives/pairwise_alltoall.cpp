// Pairwise AlltoAll: every rank exchanges one block with every other rank; the
// exchanges are independent and progress concurrently. In place, the input is
// first copied aside so that arriving blocks cannot overwrite unsent ones.
#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_pairwise_alltoall(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), c = op.count, bytes = c * es;
  plan->algorithm = "pairwise";
  if (bytes == 0) return kOk;
  const void* in = op.sendbuff;
  Plan::StepId staged = Plan::kNoStep;
  if (op.sendbuff == op.recvbuff && n > 1) {
    void* copy = plan->scratch(bytes * static_cast<size_t>(n));
    staged = plan->copy(copy, op.sendbuff, bytes * static_cast<size_t>(n));
    in = copy;
  } else {
    plan->copy(at(op.recvbuff, r * c, es), at(op.sendbuff, r * c, es), bytes);
  }
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    plan->add_dep(plan->send(to, 0, at(in, to * c, es), bytes), staged);
    plan->add_dep(plan->recv(from, 0, at(op.recvbuff, from * c, es), bytes), staged);
  }
  return kOk;
}

// p-1 concurrent exchanges, each one message per direction.
double cost_pairwise_alltoall(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, block = static_cast<double>(op.count * op.elem());
  return (p - 1) * (t.alpha() + block * t.beta());
}

}  // namespace meshccl
