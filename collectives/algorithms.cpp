#include "collectives/algorithms.h"

#include <algorithm>
#include <cmath>

namespace meshccl {

// The tuner takes the cheapest entry the user allows (across hosts with
// prefer()'s near ties); on equal estimates the earlier one. A new algorithm
// adds its builder and its cost function here.
const std::vector<Algorithm>& algorithm_table() {
  static const std::vector<Algorithm> table = {
      {"ring", OpKind::AllReduce, build_ring_allreduce, cost_ring_allreduce, true},
      {"tree", OpKind::AllReduce, build_tree_allreduce, cost_tree_allreduce},
      {"halving_doubling", OpKind::AllReduce, build_halving_doubling_allreduce, cost_halving_doubling_allreduce},
      {"recursive_doubling", OpKind::AllReduce, build_recursive_doubling_allreduce, cost_recursive_doubling_allreduce},
      {"ring", OpKind::AllGather, build_ring_allgather, cost_ring_allgather, true},
      {"ring", OpKind::ReduceScatter, build_ring_reduce_scatter, cost_ring_reduce_scatter, true},
      {"chain", OpKind::Broadcast, build_chain_broadcast, cost_chain_broadcast, true},
      {"tree", OpKind::Broadcast, build_tree_broadcast, cost_tree_broadcast},
      {"chain", OpKind::Reduce, build_chain_reduce, cost_chain_reduce, true},
      {"tree", OpKind::Reduce, build_tree_reduce, cost_tree_reduce},
      {"pairwise", OpKind::AlltoAll, build_pairwise_alltoall, cost_pairwise_alltoall},
      {"direct", OpKind::Gather, build_direct_gather, cost_direct_gather_scatter},
      {"direct", OpKind::Scatter, build_direct_scatter, cost_direct_gather_scatter},
      {"hier", OpKind::AllReduce, build_hier_allreduce, cost_hier_allreduce, true},
      {"hier", OpKind::AllGather, build_hier_allgather, cost_hier_allgather, true},
      {"hier", OpKind::ReduceScatter, build_hier_reduce_scatter, cost_hier_reduce_scatter, true},
      {"hier", OpKind::Broadcast, build_hier_broadcast, cost_hier_broadcast, true},
      {"hier", OpKind::Reduce, build_hier_reduce, cost_hier_reduce, true},
      {"p2p", OpKind::Send, build_p2p, cost_p2p},
      {"p2p", OpKind::Recv, build_p2p, cost_p2p},
      // Not plans: make_run starts them (direct_shm.cpp).
      {kDirectShm, OpKind::AllReduce, nullptr, nullptr},
      {kDirectShm, OpKind::Broadcast, nullptr, nullptr},
      {kDirectShm, OpKind::Reduce, nullptr, nullptr},
      {kDirectShm, OpKind::AllGather, nullptr, nullptr},
      {kDirectShm, OpKind::ReduceScatter, nullptr, nullptr},
      {kDirectShm, OpKind::AlltoAll, nullptr, nullptr},
      {kDirectShm, OpKind::Gather, nullptr, nullptr},
      {kDirectShm, OpKind::Scatter, nullptr, nullptr},
  };
  return table;
}

bool prefer(const Algorithm& a, double a_us, const Algorithm* b, double b_us, bool network) {
  if (b == nullptr) return true;
  if (!network || a.one_flow_per_link == b->one_flow_per_link) return a_us < b_us;
  const double tie = std::min(a_us, b_us) * kNearTie;
  if (std::abs(a_us - b_us) <= tie) return a.one_flow_per_link;
  return a_us < b_us;
}

namespace detail {
OwnInput own_input(const OpDesc& op, Plan* plan, void* into, size_t count) {
  if (!op.premul) return {op.sendbuff, Plan::kNoStep};
  if (into == nullptr) into = plan->scratch(count * op.elem());
  return {into, plan->scale(into, op.sendbuff, count)};
}

size_t chunk_elems(const OpDesc& op, size_t largest_piece, int phases) {
  size_t es = op.elem();
  size_t ce = op.chunk_bytes / es;
  if (ce == 0) ce = 1;
  // Step tags of data stay below kControlTag: phases * chunks must too.
  const size_t max_chunks = size_t{kControlTag} / static_cast<size_t>(phases > 0 ? phases : 1);
  if (largest_piece / ce >= max_chunks) ce = largest_piece / max_chunks + 1;
  return ce;
}

StepCost ring_step(const BuildCtx& ctx) {
  std::vector<std::pair<int, int>> edges;
  for (int i = 0; i < ctx.nranks && ctx.nranks > 1; ++i) edges.emplace_back(i, (i + 1) % ctx.nranks);
  return step_cost(ctx, edges);
}

}  // namespace detail

}  // namespace meshccl
