// Pipelined chain reduce toward the root: the rank farthest from the root
// sends its input, each rank on the way folds in its own and passes it on.
// Non-root receive buffers are never touched.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_chain_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks;
  const size_t es = op.elem(), count = op.count;
  plan->algorithm = "chain";
  const int pos = (ctx.rank - op.root + n) % n;
  const int toward = (ctx.rank + n - 1) % n, from = (ctx.rank + 1) % n;
  // The root scales its input straight into its output buffer.
  const detail::OwnInput own = detail::own_input(op, plan, pos == 0 ? op.recvbuff : nullptr, count);
  const void* in = own.data;
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, count * es);
    return kOk;
  }
  if (count == 0) return kOk;
  const size_t ce = detail::chunk_elems(op, count, 1);
  const size_t nchunks = (count + ce - 1) / ce;
  const int kSlots = 8;
  void* tmp = pos < n - 1 ? plan->scratch(kSlots * ce * es) : nullptr;
  void* acc = (pos > 0 && pos < n - 1) ? plan->scratch(kSlots * ce * es) : nullptr;
  std::vector<Plan::StepId> sends(nchunks, Plan::kNoStep), rrs(nchunks, Plan::kNoStep);
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t lo = c * ce, len = std::min(count, lo + ce) - lo;
    const uint32_t tag = static_cast<uint32_t>(c);
    const size_t slot = c % kSlots;
    if (pos == n - 1) {  // farthest: just send
      plan->add_dep(plan->send(toward, tag, at(in, lo, es), len * es), own.scaled);
      continue;
    }
    void* t = static_cast<char*>(tmp) + slot * ce * es;
    void* dst = pos == 0 ? at(op.recvbuff, lo, es) : static_cast<char*>(acc) + slot * ce * es;
    Plan::StepId rr = plan->recv_reduce(from, tag, t, dst, at(in, lo, es), len);
    plan->add_dep(rr, own.scaled);
    if (c >= static_cast<size_t>(kSlots)) {
      plan->add_dep(rr, rrs[c - kSlots]);
      if (pos > 0) plan->add_dep(rr, sends[c - kSlots]);  // acc slot still being sent
    }
    rrs[c] = rr;
    if (pos > 0) sends[c] = plan->send(toward, tag, dst, len * es, {rr});
    else if (op.avg) plan->divide(dst, dst, len, {rr});
  }
  return kOk;
}

// The broadcast's pipeline in reverse, reducing at every hop.
double cost_chain_reduce(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, bytes = static_cast<double>(op.count * op.elem());
  if (ctx.nranks == 1) return 0;
  const detail::ChainCost chain = detail::chain_cost(ctx, op.root);
  return chain.alpha_us + (bytes + (p - 2) * detail::first_chunk(op, bytes)) * (chain.beta + t.gamma());
}

}  // namespace meshccl
