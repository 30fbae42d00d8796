// Ring AllReduce = ring reduce-scatter then ring all-gather, each segment cut
// into chunks that pipeline through the ring. Bandwidth-optimal: every rank
// sends and receives 2(n-1)/n of the data. Received chunks land in a small
// ring of scratch slots before being reduced into the output.
#include <algorithm>
#include <vector>

#include "collectives/algorithms.h"

namespace meshccl {

using detail::at;
using detail::block_begin;

Status build_ring_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), count = op.count;
  plan->algorithm = "ring";
  // With PreMulSum the output buffer holds the scaled input (as in place).
  const detail::OwnInput own = detail::own_input(op, plan, op.recvbuff, count);
  const void* in = own.data;
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, count * es);
    return kOk;
  }
  const size_t largest = block_begin(count, n, 1) + 1;
  const size_t ce = detail::chunk_elems(op, largest, 2 * n);
  const size_t nchunks = (largest + ce - 1) / ce;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto seg = [&](int s) { return ((s % n) + n) % n; };
  // Chunk c of segment s: [lo, hi) in elements (possibly empty).
  auto chunk = [&](int s, size_t c, size_t* lo, size_t* hi) {
    size_t b = block_begin(count, n, s), e = block_begin(count, n, s + 1);
    *lo = std::min(e, b + c * ce);
    *hi = std::min(e, b + (c + 1) * ce);
  };
  const int kSlots = 8;
  void* slots = plan->scratch(static_cast<size_t>(kSlots) * ce * es);
  // Per phase step k and chunk c: the step ids we need for dependencies.
  std::vector<Plan::StepId> rs_send((n - 1) * nchunks, Plan::kNoStep), rs_rr((n - 1) * nchunks, Plan::kNoStep),
      ag_recv((n - 1) * nchunks, Plan::kNoStep), fin(nchunks, Plan::kNoStep);
  size_t slot_use = 0;
  std::vector<Plan::StepId> slot_last(kSlots, Plan::kNoStep);

  // Reduce-scatter.
  for (int k = 0; k < n - 1; ++k) {
    for (size_t c = 0; c < nchunks; ++c) {
      size_t lo, hi;
      chunk(seg(r - k), c, &lo, &hi);
      if (hi > lo) {
        const void* src = k == 0 ? at(in, lo, es) : at(static_cast<const void*>(op.recvbuff), lo, es);
        Plan::StepId s = plan->send(next, static_cast<uint32_t>(k * nchunks + c), src, (hi - lo) * es);
        plan->add_dep(s, k == 0 ? own.scaled : rs_rr[(k - 1) * nchunks + c]);
        rs_send[k * nchunks + c] = s;
      }
      chunk(seg(r - k - 1), c, &lo, &hi);
      if (hi > lo) {
        int slot = static_cast<int>(slot_use++ % kSlots);
        void* tmp = static_cast<char*>(slots) + static_cast<size_t>(slot) * ce * es;
        Plan::StepId s = plan->recv_reduce(prev, static_cast<uint32_t>(k * nchunks + c), tmp, at(op.recvbuff, lo, es),
                                           at(in, lo, es), hi - lo);
        plan->add_dep(s, own.scaled);
        plan->add_dep(s, slot_last[slot]);
        slot_last[slot] = s;
        rs_rr[k * nchunks + c] = s;
      }
    }
  }
  // The fully reduced segment r+1: divide for ncclAvg.
  for (size_t c = 0; c < nchunks; ++c) {
    Plan::StepId last = rs_rr[(n - 2) * nchunks + c];
    fin[c] = last;
    if (op.avg && last != Plan::kNoStep) {
      size_t lo, hi;
      chunk(seg(r + 1), c, &lo, &hi);
      fin[c] =
          plan->divide(at(op.recvbuff, lo, es), at(static_cast<const void*>(op.recvbuff), lo, es), hi - lo, {last});
    }
  }
  // All-gather.
  const uint32_t base = static_cast<uint32_t>((n - 1) * nchunks);
  for (int k = 0; k < n - 1; ++k) {
    for (size_t c = 0; c < nchunks; ++c) {
      size_t lo, hi;
      chunk(seg(r + 1 - k), c, &lo, &hi);
      if (hi > lo) {
        Plan::StepId s = plan->send(next, base + static_cast<uint32_t>(k * nchunks + c),
                                    at(static_cast<const void*>(op.recvbuff), lo, es), (hi - lo) * es);
        Plan::StepId dep = k == 0 ? fin[c] : ag_recv[(k - 1) * nchunks + c];
        plan->add_dep(s, dep);
      }
      chunk(seg(r - k), c, &lo, &hi);
      if (hi > lo) {
        Plan::StepId s =
            plan->recv(prev, base + static_cast<uint32_t>(k * nchunks + c), at(op.recvbuff, lo, es), (hi - lo) * es);
        // In place, this region was sent during reduce-scatter step k: wait
        // until that send finished reading it.
        plan->add_dep(s, rs_send[k * nchunks + c]);
        plan->add_dep(s, own.scaled);
        ag_recv[k * nchunks + c] = s;
      }
    }
  }
  return kOk;
}

// 2(p-1) dependent steps, each paced by the ring's slowest edge (all edges
// run at once); every rank sends 2(p-1)/p of the data and reduces (p-1)/p of it.
double cost_ring_allreduce(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, bytes = static_cast<double>(op.count * op.elem());
  if (ctx.nranks == 1) return 0;
  const detail::StepCost ring = detail::ring_step(ctx);
  return 2 * (p - 1) * ring.alpha_us + 2 * (p - 1) / p * bytes * ring.beta + (p - 1) / p * bytes * t.gamma();
}

}  // namespace meshccl
