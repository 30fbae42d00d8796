// Ring ReduceScatter: n-1 steps; at step k a rank forwards the partial sum of
// block r-k-1 and folds its own input into block r-k-2, so after n-1 steps it
// holds block r fully reduced. Partial sums live in two scratch blocks used
// alternately by step parity.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_ring_reduce_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), rc = op.count;
  plan->algorithm = "ring";
  const detail::OwnInput own = detail::own_input(op, plan, nullptr, rc * n);
  const void* in = own.data;
  if (n == 1) {
    plan->add_dep(plan->copy(op.recvbuff, in, rc * es), own.scaled);
    return kOk;
  }
  if (rc == 0) return kOk;
  const size_t ce = detail::chunk_elems(op, rc, 2 * n);
  const size_t nchunks = (rc + ce - 1) / ce;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto seg = [&](int s) { return static_cast<size_t>(((s % n) + n) % n); };
  const int kSlots = 8;
  void* slots = plan->scratch(static_cast<size_t>(kSlots) * ce * es);
  void* acc[2] = {plan->scratch(rc * es), plan->scratch(rc * es)};
  std::vector<Plan::StepId> sends((n - 1) * nchunks, Plan::kNoStep), rrs((n - 1) * nchunks, Plan::kNoStep);
  std::vector<Plan::StepId> slot_last(kSlots, Plan::kNoStep);
  size_t slot_use = 0;
  for (int k = 0; k < n - 1; ++k) {
    for (size_t c = 0; c < nchunks; ++c) {
      const size_t lo = c * ce, len = std::min(rc, lo + ce) - lo;
      const uint32_t tag = static_cast<uint32_t>(k * nchunks + c);
      // Forward block r-k-1: own input at step 0, else the partial sum from step k-1.
      const void* src =
          k == 0 ? at(in, seg(r - 1) * rc + lo, es) : at(static_cast<const void*>(acc[(k - 1) % 2]), lo, es);
      Plan::StepId s = plan->send(next, tag, src, len * es);
      plan->add_dep(s, k == 0 ? own.scaled : rrs[(k - 1) * nchunks + c]);
      sends[k * nchunks + c] = s;
      // Fold own input into block r-k-2; the last step writes the output.
      const bool last = k == n - 2;
      void* dst = last ? at(op.recvbuff, lo, es) : at(acc[k % 2], lo, es);
      int slot = static_cast<int>(slot_use++ % kSlots);
      void* tmp = static_cast<char*>(slots) + static_cast<size_t>(slot) * ce * es;
      Plan::StepId rr = plan->recv_reduce(prev, tag, tmp, dst, at(in, seg(r - k - 2) * rc + lo, es), len);
      plan->add_dep(rr, own.scaled);
      plan->add_dep(rr, slot_last[slot]);
      slot_last[slot] = rr;
      if (k >= 2) plan->add_dep(rr, sends[(k - 1) * nchunks + c]);  // acc[k%2] was read by send k-1
      rrs[k * nchunks + c] = rr;
      if (last && op.avg) plan->divide(dst, dst, len, {rr});
    }
  }
  return kOk;
}

// p-1 steps; every rank sends and reduces (p-1)/p of the input.
double cost_ring_reduce_scatter(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, block = static_cast<double>(op.count * op.elem());
  if (ctx.nranks == 1) return 0;
  const detail::StepCost ring = detail::ring_step(ctx);
  return (p - 1) * ring.alpha_us + (p - 1) * block * (ring.beta + t.gamma());
}

}  // namespace meshccl
