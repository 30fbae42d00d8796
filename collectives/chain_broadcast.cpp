// Pipelined chain broadcast: root -> root+1 -> ... -> root-1, chunk by chunk,
// so every link carries the data once and the chain fills like a pipeline.
#include <algorithm>

#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_chain_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks;
  const size_t es = op.elem(), bytes = op.count * es;
  plan->algorithm = "chain";
  const int pos = (ctx.rank - op.root + n) % n;
  const int prev = (ctx.rank + n - 1) % n, next = (ctx.rank + 1) % n;
  if (pos == 0) plan->copy(op.recvbuff, op.sendbuff, bytes);  // no-op in place
  if (n == 1 || bytes == 0) return kOk;
  const size_t ce = detail::chunk_elems(op, op.count, 1);
  const size_t nchunks = (op.count + ce - 1) / ce;
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t lo = c * ce, len = (std::min(op.count, lo + ce) - lo) * es;
    const uint32_t tag = static_cast<uint32_t>(c);
    if (pos == 0) {
      plan->send(next, tag, at(op.sendbuff, lo, es), len);
      continue;
    }
    Plan::StepId got = plan->recv(prev, tag, at(op.recvbuff, lo, es), len);
    if (pos < n - 1) plan->send(next, tag, at(static_cast<const void*>(op.recvbuff), lo, es), len, {got});
  }
  return kOk;
}

// A pipeline of p-1 links: each carries the data once, after the first chunk
// has crossed the links before it (each hop at its link's latency).
double cost_chain_broadcast(const BuildCtx& ctx, const OpDesc& op) {
  const double p = ctx.nranks, bytes = static_cast<double>(op.count * op.elem());
  if (ctx.nranks == 1) return 0;
  const detail::ChainCost chain = detail::chain_cost(ctx, op.root);
  return chain.alpha_us + (bytes + (p - 2) * detail::first_chunk(op, bytes)) * chain.beta;
}

}  // namespace meshccl
