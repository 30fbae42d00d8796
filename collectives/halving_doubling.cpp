// Recursive halving-doubling AllReduce (Rabenseifner): a reduce-scatter by
// recursive halving — at step k each rank swaps half of what it still holds
// with the partner whose new rank differs in one bit, keeping and reducing the
// other half — then an all-gather by recursive doubling that retraces the
// steps. 2 log2(p) steps instead of the ring's 2(p-1), with the ring's
// bandwidth: each rank sends 2(p-1)/p of the data.
//
// With p not a power of two, the first 2(p - p2) ranks pair up (p2 = largest
// power of two <= p): the even rank of each pair sends its input to the odd
// one, which folds it in, and gets the result back at the end.
// Every exchange is cut into chunks, each chunk waiting only for the chunks it
// reads, so consecutive steps overlap.
#include <algorithm>
#include <bit>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/exchanges.h"
#include "collectives/rank_math.h"

namespace meshccl {

using detail::at;
using detail::Exchanges;
using detail::Piece;
using detail::Pieces;

Status build_halving_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), count = op.count;
  plan->algorithm = "halving_doubling";
  // With PreMulSum the output buffer holds the scaled input (as in place).
  const detail::OwnInput own = detail::own_input(op, plan, op.recvbuff, count);
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, count * es);
    return kOk;
  }
  const int p2 = hd_pof2(n), rem = n - p2, steps = std::countr_zero(static_cast<unsigned>(p2));
  const int fold_phase = 0, last_phase = 2 * steps + 1;
  Exchanges x(op, plan, own.scaled, last_phase + 1);
  const void* base = own.data;  // where this rank's partial sums are before step 0
  Pieces folded;
  if (detail::fold_in(x, op, r, rem, own.data, fold_phase, last_phase, &folded, &base)) return kOk;
  const int nr = hd_newrank(n, r);
  auto edge = [&](int b) { return detail::block_begin(count, p2, b); };

  // Reduce-scatter by recursive halving over blocks [lo, hi) of p2 blocks.
  int lo = 0, hi = p2;
  Pieces partial = std::move(folded);  // the latest sums written to the output
  std::vector<Pieces> given(steps);    // what step k sent away (read from the output)
  for (int k = 0; k < steps; ++k) {
    const int bit = p2 >> (k + 1), peer = hd_rank_of(n, nr ^ bit), half = (hi - lo) / 2;
    const bool upper = (nr & bit) != 0;
    const int keep_lo = upper ? lo + half : lo, give_lo = upper ? lo : lo + half;
    const void* src = k == 0 ? base : op.recvbuff;
    given[k] = x.send(peer, 1 + k, src, edge(give_lo), edge(give_lo + half), {&partial});
    partial = x.recv_reduce(peer, 1 + k, src, edge(keep_lo), edge(keep_lo + half), {&partial});
    lo = keep_lo;
    hi = keep_lo + half;
  }
  // Block nr is complete here; ncclAvg divides it, once.
  if (op.avg)
    for (Piece& p : partial)
      p.id = plan->divide(at(op.recvbuff, p.lo, es), at(op.recvbuff, p.lo, es), p.hi - p.lo, {p.id});

  // All-gather by recursive doubling: step j swaps aligned groups of 2^j blocks.
  std::vector<Pieces> got(steps);
  std::vector<const Pieces*> have = {&partial};
  for (int j = 0; j < steps; ++j) {
    const int bit = 1 << j, peer = hd_rank_of(n, nr ^ bit);
    const int mine = nr & ~(bit - 1), theirs = (nr ^ bit) & ~(bit - 1);
    x.send(peer, 1 + steps + j, op.recvbuff, edge(mine), edge(mine + bit), have);
    // That range was sent away at the mirror step of the reduce-scatter.
    got[j] = x.recv(peer, 1 + steps + j, edge(theirs), edge(theirs + bit), given[steps - 1 - j]);
    have.push_back(&got[j]);
  }
  if (r < 2 * rem) x.send(r - 1, last_phase, op.recvbuff, 0, count, have);
  return kOk;
}

// 2 log2(p2) steps plus two for the fold; a rank that folds a partner in also
// receives, reduces and sends back the whole data once more. Step k of the
// reduce-scatter and its mirror in the all-gather move bytes * bit / p2 per
// rank between partners bit apart in new ranks, each at the rates of the
// links its pairs cross (on hosts of several ranks, the steps between
// near partners stay inside a host, and the far ones share the host's link).
double cost_halving_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const int n = ctx.nranks;
  if (n == 1) return 0;
  const int p2 = hd_pof2(n), rem = n - p2;
  const double bytes = static_cast<double>(op.count * op.elem()), share = (p2 - 1.0) / p2;
  double us = detail::fold_cost(ctx, rem, bytes);
  std::vector<std::pair<int, int>> pairs;
  for (int bit = p2 / 2; bit >= 1; bit /= 2) {
    pairs.clear();
    for (int nr = 0; nr < p2; ++nr) pairs.emplace_back(hd_rank_of(n, nr), hd_rank_of(n, nr ^ bit));
    us += 2 * detail::step_cost(ctx, pairs).us(bytes * bit / p2);
  }
  return us + (share + (rem > 0 ? 1 : 0)) * bytes * t.gamma();
}

}  // namespace meshccl
