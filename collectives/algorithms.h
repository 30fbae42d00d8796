// The algorithms: each turns one operation into a Plan for one rank. Pure
// functions of (operation, rank, nranks) — no I/O — so they are testable in
// isolation and every rank builds the matching half of each exchange.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/op_desc.h"
#include "collectives/rank_math.h"
#include "sched/launch.h"
#include "topo/cost_model.h"
#include "sched/plan.h"
#include "util/status.h"
#include "util/wait.h"

namespace meshccl {

class Run;
class NodeRegion;

// What a builder plans for: the cost model of the links, and the group of
// ranks the plan runs over. Builders name peers by position in the group
// (0..nranks-1) and the plan maps them to communicator ranks (PlanGroup), so
// an algorithm runs on any sub-group: the whole communicator, the ranks of one
// host, one rank per host.
struct BuildCtx {
  const TuneModel& model;
  int rank = 0;                // this rank's position in the group
  int nranks = 1;              // the group's size
  const int* ranks = nullptr;  // communicator rank of each position; null: the whole communicator
  uint32_t tag_base = 0;       // added to every step tag of the plan built

  // The whole communicator of op.
  static BuildCtx whole(const TuneModel& model, const OpDesc& op) { return BuildCtx{model, op.rank, op.nranks}; }
  PlanGroup group() const { return PlanGroup{ranks, tag_base}; }
};

// Builds op's plan for ctx's group into plan (see build_in).
using BuildFn = Status (*)(const BuildCtx&, const OpDesc&, Plan*);
// Estimated microseconds for op on ctx's group under ctx's model; +infinity
// where the algorithm does not apply. Same inputs give the same value on
// every rank.
using CostFn = double (*)(const BuildCtx&, const OpDesc&);

struct Algorithm {
  const char* name;
  OpKind kind;
  BuildFn build;
  CostFn cost;
  // At any moment each rank receives from at most one peer and sends to at
  // most one (ring, chain; hier, whose network phase has a flow per channel
  // and picks its own algorithm across hosts by the same rule): across
  // hosts no two of its TCP flows share a host's link. See prefer().
  bool one_flow_per_link = false;
};

// Across hosts, estimates within kNearTie of the cheapest count as equal,
// and an algorithm with one flow per link wins among them: the model gives
// flows that share a link their fair part of it, but TCP does worse there
// (halving-doubling on 4 hosts at 100 Mbit/s, whose overlapping steps put
// two flows into one downlink: 3-4% of its segments retransmitted, 1.36-1.6x
// the ring's time at 4 MiB; predicted 0.06% faster).
constexpr double kNearTie = 0.02;
// Whether a candidate (estimate a_us) is a better pick than the one so far
// (b_us; nullptr: none) under a model with or without network links.
bool prefer(const Algorithm& a, double a_us, const Algorithm* b, double b_us, bool network);

// Every algorithm, one entry per (name, collective).
const std::vector<Algorithm>& algorithm_table();

// One plan algorithm's prediction for an operation.
struct Candidate {
  const Algorithm* algorithm;
  double cost_us;  // estimated microseconds; +infinity where it does not apply
  bool allowed;    // by MESHCCL_ALGO / NCCL_ALGO
};
// Every plan algorithm for op.kind, in table order, with its estimate under
// tune: a pure function of the model and the operation (and the MESHCCL_ALGO
// rule, for `allowed`). choose_algorithm picks from it; so do the tuner's log
// and tools/meshccl_sim.
std::vector<Candidate> estimate_candidates(const TuneModel& tune, const OpDesc& op);
// The algorithm for op among the plans: among those MESHCCL_ALGO / NCCL_ALGO
// allows, the one with the lowest estimated cost (ties: the earlier table
// entry). *cost_us (optional) receives its estimate.
Status choose_algorithm(const TuneModel& tune, const OpDesc& op, const Algorithm** out, double* cost_us = nullptr);
// Runs build for ctx's group: the steps it adds name communicator ranks and
// carry ctx's tag base. Composed algorithms call it for each sub-group.
Status build_in(const BuildCtx& ctx, BuildFn build, const OpDesc& op, Plan* plan);
// Chooses and builds the plan.
Status make_plan(const TuneModel& tune, const OpDesc& op, std::unique_ptr<Plan>* out);
// Builds the plan of an algorithm chosen already (pick, estimated cost_us).
Status make_plan_with(const TuneModel& tune, const OpDesc& op, const Algorithm* pick, double cost_us,
                      std::unique_ptr<Plan>* out);
// A communicator's algorithms as the scheduler sees them: its make_run picks
// between the direct shared-memory algorithm (node: the communicator's shared
// region, or null) and a plan; wait: how the communicator's waits poll.
// Rank 0 logs the table of picks (TUNE).
// settings: the communicator's frozen ones (null: the process's, as they are now).
std::unique_ptr<RunMaker> make_algorithms(int rank, const TuneModel& tune, NodeRegion* node,
                                          const WaitPolicy& wait = WaitPolicy::standalone(),
                                          const PlanSettings* settings = nullptr);
// The process's plan-shaping settings as they are now (what a new
// communicator freezes).
PlanSettings plan_settings_from_params();
// op's settings: its communicator's, or (op.settings null) the process's.
const PlanSettings& settings_of(const OpDesc& op);
// MESHCCL_ALGO / NCCL_ALGO as set now: parses for every collective and leaves
// each an algorithm, else ncclInvalidArgument naming the variable set. Checked
// when a communicator is made, so a bad value fails there, not in each call.
Status check_algo_setting();
// True unless the rules (MESHCCL_ALGO / NCCL_ALGO's grammar; without them:
// the process's setting) rule `name` out for this collective.
bool algorithm_allowed(OpKind kind, const char* name, const std::string& rules);
bool algorithm_allowed(OpKind kind, const char* name);
// True when the rules name `name` for this collective explicitly.
bool algorithm_forced(OpKind kind, const char* name, const std::string& rules);
bool algorithm_forced(OpKind kind, const char* name);
// The most input bytes per rank the direct shared-memory algorithm takes for
// this collective: 0 when the rules rule it out, no limit when they name it or
// settings.direct_max_bytes is 0, else that.
size_t direct_max_bytes(OpKind kind, const PlanSettings& settings);

// Builders, one per file.
Status build_p2p(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_ring_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_ring_allgather(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_ring_reduce_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_chain_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_chain_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_pairwise_alltoall(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_direct_gather(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_direct_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
// The direct shared-memory algorithm (not a plan): a run for op over the
// shared region, or null when it does not apply (the op needs more than
// max_bytes of slot per rank, or more than one slot for a one-round kind).
std::unique_ptr<Run> make_direct_run(NodeRegion* node, const OpDesc& op, size_t max_bytes);
// Runs op on the calling thread at once when the direct algorithm takes it
// (*taken) and no earlier direct operation of the communicator is pending:
// returns when done, or after about budget_us with the rest of the work in
// *rest, to be submitted like any run. Its waits poll as `wait` says.
Status run_direct_now(NodeRegion* node, const OpDesc& op, size_t max_bytes, double budget_us, const WaitPolicy& wait,
                      bool* taken, std::unique_ptr<Run>* rest);
constexpr const char* kDirectShm = "direct_shm";
// meshcclSparseAllReduce (sparse_allreduce.cpp): a run that first exchanges
// every rank's row count and arguments, then takes the dense or the gather
// strategy (MESHCCL_SPARSE_ALGO, else the cheaper under model for the counts
// every rank sent). Both reduce in rank order, so they agree bitwise.
std::unique_ptr<Run> make_sparse_allreduce_run(const TuneModel& model, const OpDesc& op, uint64_t tag_base);
// The estimate of the cheaper strategy when every rank has op.nnz rows.
double sparse_allreduce_cost(const TuneModel& model, const OpDesc& op);
enum class SparseStrategy : uint8_t { Auto = 0, Dense = 1, Gather = 2 };
// Each strategy's estimate, microseconds, for these per-rank row counts.
double sparse_dense_cost(const TuneModel& model, const OpDesc& op);
double sparse_gather_cost(const TuneModel& model, const OpDesc& op, size_t total_nnz);
Status build_tree_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_tree_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_tree_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_halving_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_recursive_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
// Hierarchical algorithms for groups spanning hosts (hier_*.cpp).
Status build_hier_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_hier_allgather(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_hier_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan);
Status build_hier_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan);

// Cost functions, next to their builders.
double cost_p2p(const BuildCtx& ctx, const OpDesc& op);
double cost_ring_allreduce(const BuildCtx& ctx, const OpDesc& op);
double cost_ring_allgather(const BuildCtx& ctx, const OpDesc& op);
double cost_ring_reduce_scatter(const BuildCtx& ctx, const OpDesc& op);
double cost_chain_broadcast(const BuildCtx& ctx, const OpDesc& op);
double cost_chain_reduce(const BuildCtx& ctx, const OpDesc& op);
double cost_pairwise_alltoall(const BuildCtx& ctx, const OpDesc& op);
double cost_direct_gather_scatter(const BuildCtx& ctx, const OpDesc& op);
double cost_tree_allreduce(const BuildCtx& ctx, const OpDesc& op);
double cost_tree_broadcast(const BuildCtx& ctx, const OpDesc& op);
double cost_tree_reduce(const BuildCtx& ctx, const OpDesc& op);
double cost_halving_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op);
double cost_recursive_doubling_allreduce(const BuildCtx& ctx, const OpDesc& op);
// +infinity on a group within one host.
double cost_hier_allreduce(const BuildCtx& ctx, const OpDesc& op);
double cost_hier_allgather(const BuildCtx& ctx, const OpDesc& op);
double cost_hier_reduce_scatter(const BuildCtx& ctx, const OpDesc& op);
double cost_hier_broadcast(const BuildCtx& ctx, const OpDesc& op);
double cost_hier_reduce(const BuildCtx& ctx, const OpDesc& op);

// Adds the signature check to a collective's plan where it applies (every
// collective with MESHCCL_CHECKS, large ones always); see signature_check.cpp.
Status add_signature_check(const OpDesc& op, Plan* plan);

// Shared helpers for builders.
namespace detail {
// This rank's contribution to a reduction. With PreMulSum it is first scaled
// into `into` (nullptr: a scratch reservation); `scaled` is that step, which
// every step reading `data` must wait for (Plan::kNoStep without PreMulSum).
struct OwnInput {
  const void* data;
  Plan::StepId scaled;
};
OwnInput own_input(const OpDesc& op, Plan* plan, void* into, size_t count);

// [begin, end) of block b when `count` elements are cut into n balanced blocks.
inline size_t block_begin(size_t count, int n, int b) {
  return count * static_cast<size_t>(b) / static_cast<size_t>(n);
}
// Elements per chunk, large enough that a plan's step tags stay below kControlTag.
size_t chunk_elems(const OpDesc& op, size_t largest_piece, int phases);
inline char* at(void* base, size_t elems, size_t es) { return static_cast<char*>(base) + elems * es; }
inline const char* at(const void* base, size_t elems, size_t es) { return static_cast<const char*>(base) + elems * es; }
// Bytes of the first chunk of a piece: what a pipeline must carry across each
// hop before its last stage starts (the fill of the pipeline).
inline double first_chunk(const OpDesc& op, double piece) {
  return std::min(static_cast<double>(op.chunk_bytes), piece);
}
// Host-aware costs (link_cost.cpp). Positions a and b of ctx's group talk
// over the network when the model's host map puts them on different hosts
// (a model without a host map: whenever it has a network at all).
bool crosses_hosts(const BuildCtx& ctx, int a, int b);
// The class of link between positions a and b: the network, else local().
const LinkCost& link_at(const BuildCtx& ctx, int a, int b);
// One step of transfers (from, to) that run at the same time: the slowest
// link's latency, and the us per byte of the slowest transfer, where the
// transfers leaving one host share its network links (TuneModel::host_net_gbs).
struct StepCost {
  double alpha_us = 0;
  double beta = 0;  // us per byte
  double us(double bytes) const { return alpha_us + bytes * beta; }
};
StepCost step_cost(const BuildCtx& ctx, const std::vector<std::pair<int, int>>& transfers);
// Trees given as parent[] per tree (-1 at a root), all carrying a piece each
// as pipelines at once: the latency of the longest path to a root (sum of
// its links' alphas), the us per byte of piece at the busiest position
// (a piece per edge; children_only: per child) or host link, whichever is
// slower, of the slowest path from a position to its root (each hop at its
// own link's rate), and the part of a path the busiest link's time already
// covers (for tree_fill).
struct PathCost {
  double depth_alpha_us = 0;
  double busiest_beta = 0;
  double path_beta = 0;
  double covered_beta = 0;
};
PathCost tree_cost(const BuildCtx& ctx, const std::vector<std::vector<int>>& parents, bool children_only);
// What a tree's pipeline adds to busiest_beta x piece: its first chunk goes
// the whole way (`legs` times a path to a root: 2 for AllReduce, up and
// down; 1 rooted), each hop at its own link's rate, less what the busiest
// link's time covers. With every link alike (one host, or a model without
// a host map) that is one hop, so the fill is (hops - 1) chunks at the
// link's rate. Across hosts it is the busiest host link's whole time: the
// network hops of the first chunk's path are among that link's transfers,
// and the hops inside a host are nearly free. On 2 emulated hosts x 4 ranks
// at 100 and 200 Mbit/s a tree AllReduce of 64 KiB to 16 MiB took
// 0.97-1.3x its busiest host link's time, where every hop of the path at
// that link's shared rate predicted 1.1-5.6x.
double tree_fill(const PathCost& tree, const OpDesc& op, double piece, int legs);
// The chain from position root through root+1, ... to root-1: the sum of its
// hops' latencies, and the us per byte of its slowest hop (all at once).
struct ChainCost {
  double alpha_us = 0;
  double beta = 0;
};
ChainCost chain_cost(const BuildCtx& ctx, int root);
// The ring over ctx's group (position i sends to i+1): every edge at once.
StepCost ring_step(const BuildCtx& ctx);
// Microseconds per byte a ring over ctx's group moves through its busiest
// link: a host link carries every ring edge that leaves the host.
inline double ring_beta(const BuildCtx& ctx) { return ring_step(ctx).beta; }
}  // namespace detail

}  // namespace meshccl
