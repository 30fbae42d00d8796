// Pairwise AlltoAll: every rank exchanges one block with every other rank; the
// exchanges are independent and progress concurrently. In place, the input is
// first copied aside so that arriving blocks cannot overwrite unsent ones.
#include <algorithm>
#include <vector>

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

// p-1 concurrent exchanges, each one message per direction, paced by the
// slowest link's latency; the bytes by the busier of a rank's own sends (each
// block at its link's rate) and its host's network links, which carry every
// block from the host's k ranks to the other p-k.
double cost_pairwise_alltoall(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  const double p = ctx.nranks, block = static_cast<double>(op.count * op.elem());
  if (!t.network || t.host.empty() || ctx.nranks < 2) return (p - 1) * (t.alpha() + block * t.beta());
  const HostGroups g = [&] {
    std::vector<int> id(static_cast<size_t>(ctx.nranks));
    for (int i = 0; i < ctx.nranks; ++i) id[i] = t.host_of(ctx.ranks != nullptr ? ctx.ranks[i] : i);
    return host_groups(id);
  }();
  const bool net = g.members.size() > 1;
  double bytes_us = 0;
  for (const std::vector<int>& m : g.members) {
    const double k = static_cast<double>(m.size());
    const double own = (k - 1) * 1e-3 / t.local().bw_gbs + (p - k) * 1e-3 / t.net.bw_gbs;
    const double host_link = k * (p - k) * 1e-3 / t.host_net_gbs(static_cast<int>(m.size()));
    bytes_us = std::max(bytes_us, block * std::max(own, host_link));
  }
  return (p - 1) * (net ? t.net.alpha_us : t.local().alpha_us) + bytes_us;
}

}  // namespace meshccl
