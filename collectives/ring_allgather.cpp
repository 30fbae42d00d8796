// Ring AllGather: each block travels n-1 hops around the ring, chunked so the
// hops pipeline.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;

Status build_ring_allgather(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), sc = op.count;
  plan->algorithm = "ring";
  plan->copy(at(op.recvbuff, r * sc, es), op.sendbuff, sc * es);  // no-op in place
  if (n == 1 || sc == 0) return kOk;
  const size_t ce = detail::chunk_elems(op, sc, n);
  const size_t nchunks = (sc + ce - 1) / ce;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto blk = [&](int b) { return static_cast<size_t>(((b % n) + n) % n); };
  std::vector<Plan::StepId> recvs((n - 1) * nchunks);
  for (int k = 0; k < n - 1; ++k) {
    for (size_t c = 0; c < nchunks; ++c) {
      const size_t lo = c * ce, len = std::min(sc, lo + ce) - lo;
      const uint32_t tag = static_cast<uint32_t>(k * nchunks + c);
      const void* src =
          k == 0 ? at(op.sendbuff, lo, es) : at(static_cast<const void*>(op.recvbuff), blk(r - k) * sc + lo, es);
      Plan::StepId s = plan->send(next, tag, src, len * es);
      if (k > 0) plan->add_dep(s, recvs[(k - 1) * nchunks + c]);
      recvs[k * nchunks + c] = plan->recv(prev, tag, at(op.recvbuff, blk(r - k - 1) * sc + lo, es), len * es);
    }
  }
  return kOk;
}

// p-1 steps; every rank sends (p-1)/p of the gathered output.
double cost_ring_allgather(const BuildCtx& ctx, const OpDesc& op) {
  const double p = ctx.nranks, block = static_cast<double>(op.count * op.elem());
  if (ctx.nranks == 1) return 0;
  return (p - 1) * detail::ring_step(ctx).us(block);
}

}  // namespace meshccl
