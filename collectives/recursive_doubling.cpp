// Recursive-doubling AllReduce: at step j each rank swaps everything it holds
// with the partner whose new rank differs in bit j and reduces the two, so
// after log2(p) steps every rank holds the whole result. The fewest steps of
// any AllReduce here (the ring takes 2(p-1), halving-doubling 2 log2(p)) for
// log2(p) times the data per rank (the ring sends 2(p-1)/p of it): the
// algorithm for messages whose time is the steps' latency. On 2 ranks it is
// one exchange where the others take two, for the same bytes.
//
// Every rank reduces the same pairs in the same order up to commutation
// (a op b on one side, b op a on the other), which is exact for every
// operation and type, so every rank ends with the same bits.
//
// With p not a power of two the first 2(p - p2) ranks pair up as in
// halving_doubling.cpp: the even rank folds its input into the odd one and
// gets the result back at the end. Every exchange is cut into chunks, each
// waiting only for the chunks it reads and overwrites.
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

Status build_recursive_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks, r = ctx.rank;
  const size_t es = op.elem(), count = op.count;
  plan->algorithm = "recursive_doubling";
  // With PreMulSum the output buffer holds the scaled input (as in place).
  const detail::OwnInput own = detail::own_input(op, plan, op.recvbuff, count);
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, count * es);
    return kOk;
  }
  const int p2 = hd_pof2(n), rem = n - p2, steps = std::countr_zero(static_cast<unsigned>(p2));
  const int fold_phase = 0, last_phase = steps + 1;
  Exchanges x(op, plan, own.scaled, last_phase + 1);
  const void* base = own.data;  // this rank's partial sums before step 0
  Pieces partial;               // the latest sums written to the output
  if (detail::fold_in(x, op, r, rem, own.data, fold_phase, last_phase, &partial, &base)) return kOk;
  const int nr = hd_newrank(n, r);
  for (int j = 0; j < steps; ++j) {
    const int peer = hd_rank_of(n, nr ^ (1 << j));
    const void* src = j == 0 ? base : op.recvbuff;
    Pieces sent = x.send(peer, 1 + j, src, 0, count, {&partial});
    // Reducing into the output overwrites what this step sends from it (after
    // the first step, in place, or with PreMulSum): each chunk's reduction
    // waits for its send.
    if (src == op.recvbuff) partial = x.recv_then_reduce(peer, 1 + j, src, 0, count, {&partial, &sent});
    else partial = x.recv_reduce(peer, 1 + j, src, 0, count, {&partial});
  }
  // Every rank holds the whole sum; ncclAvg divides it here, once.
  if (op.avg)
    for (Piece& p : partial)
      p.id = plan->divide(at(op.recvbuff, p.lo, es), at(op.recvbuff, p.lo, es), p.hi - p.lo, {p.id});
  if (r < 2 * rem) x.send(r - 1, last_phase, op.recvbuff, 0, count, {&partial});
  return kOk;
}

// log2(p2) steps of the whole data between partners bit apart in new ranks,
// each at the rates of the links its pairs cross, plus the fold and its
// return where p is not a power of two; every step reduces the whole data.
double cost_recursive_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const int n = ctx.nranks;
  if (n == 1) return 0;
  const int p2 = hd_pof2(n), rem = n - p2;
  const double bytes = static_cast<double>(op.count * op.elem());
  double us = detail::fold_cost(ctx, rem, bytes);
  int reductions = rem > 0 ? 1 : 0;
  std::vector<std::pair<int, int>> pairs;
  for (int bit = 1; bit < p2; bit *= 2) {
    pairs.clear();
    for (int nr = 0; nr < p2; ++nr) pairs.emplace_back(hd_rank_of(n, nr), hd_rank_of(n, nr ^ bit));
    us += detail::step_cost(ctx, pairs).us(bytes);
    ++reductions;
  }
  return us + reductions * bytes * t.gamma();
}

}  // namespace meshccl
