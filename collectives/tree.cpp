// Double binary tree (NCCL's "tree"): the data is cut in two halves, each
// carried by one of two complementary binary trees, chunk by chunk so the
// levels of a tree work as a pipeline. Latency grows with log2(nranks), not
// nranks, and since most ranks are a leaf in one of the two trees no rank
// sends much more than the data size.
//   AllReduce: reduce up each tree to its root, then broadcast back down.
//   Reduce / Broadcast: the two trees hang below the root (rooted_double_tree),
//   so the root sends (or receives) each half once.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/rank_math.h"

namespace meshccl {

using detail::at;

namespace {

constexpr int kSlots = 8;  // receive slots per child, reused round-robin

// The elements [lo, lo+len) of one tree, cut into chunks of ce.
struct Span {
  size_t lo = 0, len = 0, ce = 1;
  size_t chunks() const { return (len + ce - 1) / ce; }
  size_t begin(size_t c) const { return lo + c * ce; }
  size_t size(size_t c) const { return std::min(len, (c + 1) * ce) - c * ce; }
};

// Reduces `in` up the tree, chunk by chunk. Partial sums go to acc (indexed
// like the data) or, when acc is null, to a ring of scratch slots that is
// reused once a chunk has gone to the parent. Returns per chunk the step after
// which this rank is done with it: at the root the last reduction (the result
// is then in acc), elsewhere the send to the parent.
std::vector<Plan::StepId> reduce_up(const OpDesc& op, Plan* plan, const TreeLinks& t, const detail::OwnInput& own,
                                    void* acc, const Span& sp, uint32_t tag0) {
  const size_t es = op.elem(), nch = sp.chunks();
  std::vector<Plan::StepId> done(nch, Plan::kNoStep);
  const int kids = t.nchildren();
  if (kids == 0) {
    for (size_t c = 0; c < nch; ++c)
      done[c] = plan->send(t.parent, tag0 + static_cast<uint32_t>(c), at(own.data, sp.begin(c), es), sp.size(c) * es);
    for (Plan::StepId s : done) plan->add_dep(s, own.scaled);
    return done;
  }
  void* tmp[2] = {plan->scratch(kSlots * sp.ce * es), kids > 1 ? plan->scratch(kSlots * sp.ce * es) : nullptr};
  void* ring = acc == nullptr ? plan->scratch(kSlots * sp.ce * es) : nullptr;
  std::vector<Plan::StepId> first(nch), last(nch);
  for (size_t c = 0; c < nch; ++c) {
    const size_t off = sp.begin(c), len = sp.size(c), slot = (c % kSlots) * sp.ce * es;
    const uint32_t tag = tag0 + static_cast<uint32_t>(c);
    void* dst = acc != nullptr ? at(acc, off, es) : static_cast<char*>(ring) + slot;
    // dst = own + first child's partial sum; then + the second child's, which
    // is received meanwhile into its own slot.
    Plan::StepId s =
        plan->recv_reduce(t.child[0], tag, static_cast<char*>(tmp[0]) + slot, dst, at(own.data, off, es), len);
    plan->add_dep(s, own.scaled);
    first[c] = s;
    if (kids > 1) {
      Plan::StepId r = plan->recv(t.child[1], tag, static_cast<char*>(tmp[1]) + slot, len * es);
      s = plan->reduce(dst, dst, static_cast<char*>(tmp[1]) + slot, len, {s, r});
      if (c >= kSlots) plan->add_dep(r, last[c - kSlots]);  // slot read by that reduction
    }
    last[c] = s;
    if (c >= kSlots) {
      plan->add_dep(first[c], first[c - kSlots]);
      if (acc == nullptr) plan->add_dep(first[c], done[c - kSlots]);  // ring slot still being sent
    }
    done[c] = t.parent >= 0 ? plan->send(t.parent, tag, dst, len * es, {s}) : s;
  }
  return done;
}

// Sends buf down the tree, chunk by chunk (the root reads src instead).
// Chunk c starts once ready[c] has completed (kNoStep: at once).
void broadcast_down(const OpDesc& op, Plan* plan, const TreeLinks& t, void* buf, const void* src, const Span& sp,
                    uint32_t tag0, const std::vector<Plan::StepId>& ready) {
  const size_t es = op.elem();
  for (size_t c = 0; c < sp.chunks(); ++c) {
    const size_t off = sp.begin(c), bytes = sp.size(c) * es;
    const uint32_t tag = tag0 + static_cast<uint32_t>(c);
    Plan::StepId have = ready.empty() ? Plan::kNoStep : ready[c];
    const void* from = at(src, off, es);
    if (t.parent >= 0) {
      Plan::StepId got = plan->recv(t.parent, tag, at(buf, off, es), bytes);
      plan->add_dep(got, have);
      have = got;
      from = at(static_cast<const void*>(buf), off, es);
    }
    for (int child : t.child) {
      if (child < 0) continue;
      plan->add_dep(plan->send(child, tag, from, bytes), have);
    }
  }
}

// The halves of the data carried by tree 0 and tree 1, with a chunk size that
// keeps every tag below 2^24 (phases = tag ranges needed per tree).
void halves(const OpDesc& op, int phases, Span sp[2]) {
  const size_t h = op.count / 2;
  const size_t ce = detail::chunk_elems(op, op.count - h, 2 * phases);
  sp[0] = Span{0, h, ce};
  sp[1] = Span{h, op.count - h, ce};
}

uint32_t tag_base(const Span sp[2], int tree, int phase, int phases) {
  const size_t per = std::max(sp[0].chunks(), sp[1].chunks());
  return static_cast<uint32_t>(static_cast<size_t>(tree * phases + phase) * per);
}

}  // namespace

Status build_tree_allreduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks;
  const size_t es = op.elem();
  plan->algorithm = "tree";
  // With PreMulSum the output buffer holds the scaled input (as in place).
  const detail::OwnInput own = detail::own_input(op, plan, op.recvbuff, op.count);
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, op.count * es);
    return kOk;
  }
  Span sp[2];
  halves(op, 2, sp);
  for (int tr = 0; tr < 2; ++tr) {
    if (sp[tr].len == 0) continue;
    const TreeLinks t = double_tree(n, ctx.rank, tr);
    std::vector<Plan::StepId> up = reduce_up(op, plan, t, own, op.recvbuff, sp[tr], tag_base(sp, tr, 0, 2));
    // The root finishes the result (ncclAvg divides once, here); every other
    // rank overwrites its partial sums only after sending them up.
    if (t.parent < 0 && op.avg)
      for (size_t c = 0; c < sp[tr].chunks(); ++c) {
        void* d = at(op.recvbuff, sp[tr].begin(c), es);
        up[c] = plan->divide(d, d, sp[tr].size(c), {up[c]});
      }
    broadcast_down(op, plan, t, op.recvbuff, op.recvbuff, sp[tr], tag_base(sp, tr, 1, 2), up);
  }
  return kOk;
}

Status build_tree_reduce(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks;
  const size_t es = op.elem();
  plan->algorithm = "tree";
  const bool is_root = ctx.rank == op.root;
  // The root scales its input straight into its output buffer; other ranks
  // never touch their receive buffer.
  const detail::OwnInput own = detail::own_input(op, plan, is_root ? op.recvbuff : nullptr, op.count);
  if (n == 1) {
    if (!op.premul) plan->copy(op.recvbuff, op.sendbuff, op.count * es);
    return kOk;
  }
  Span sp[2];
  halves(op, 1, sp);
  for (int tr = 0; tr < 2; ++tr) {
    if (sp[tr].len == 0) continue;
    const TreeLinks t = rooted_double_tree(n, op.root, ctx.rank, tr);
    std::vector<Plan::StepId> up =
        reduce_up(op, plan, t, own, is_root ? op.recvbuff : nullptr, sp[tr], tag_base(sp, tr, 0, 1));
    if (is_root && op.avg)
      for (size_t c = 0; c < sp[tr].chunks(); ++c) {
        void* d = at(op.recvbuff, sp[tr].begin(c), es);
        plan->divide(d, d, sp[tr].size(c), {up[c]});
      }
  }
  return kOk;
}

Status build_tree_broadcast(const BuildCtx& ctx, const OpDesc& op, Plan* plan) {
  const int n = ctx.nranks;
  const size_t es = op.elem();
  plan->algorithm = "tree";
  if (ctx.rank == op.root) plan->copy(op.recvbuff, op.sendbuff, op.count * es);  // no-op in place
  if (n == 1) return kOk;
  Span sp[2];
  halves(op, 1, sp);
  for (int tr = 0; tr < 2; ++tr) {
    if (sp[tr].len == 0) continue;
    const TreeLinks t = rooted_double_tree(n, op.root, ctx.rank, tr);
    broadcast_down(op, plan, t, op.recvbuff, op.sendbuff, sp[tr], tag_base(sp, tr, 0, 1), {});
  }
  return kOk;
}

namespace {
// The busiest rank's load depends on the rank count alone; costs are asked
// for at every launch, so each count is worked out once.
const TreeLoad& load_for(int n, bool rooted) {
  static std::mutex mu;
  static std::map<std::pair<int, bool>, TreeLoad> memo;
  std::lock_guard<std::mutex> lock(mu);
  auto it = memo.find({n, rooted});
  if (it == memo.end())
    it = memo.emplace(std::make_pair(n, rooted), rooted ? rooted_double_tree_load(n) : double_tree_load(n)).first;
  return it->second;
}

// Parent of every position in each of the two trees; the last one asked for
// is kept per thread (a cost is asked for at every launch, mostly of the
// same trees).
const std::vector<std::vector<int>>& parents_of(int n, bool rooted, int root) {
  thread_local struct {
    int n = -1, root = -1;
    bool rooted = false;
    std::vector<std::vector<int>> parents;
  } last;
  if (last.n == n && last.rooted == rooted && last.root == root) return last.parents;
  last.parents.assign(2, std::vector<int>(static_cast<size_t>(n), -1));
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < n; ++r)
      last.parents[t][r] = (rooted ? rooted_double_tree(n, root, r, t) : double_tree(n, r, t)).parent;
  last.n = n, last.rooted = rooted, last.root = root;
  return last.parents;
}
}  // namespace

// Each tree carries half the data as a pipeline of chunks that crosses the
// depth of the tree (twice for AllReduce: up, then down), each hop at its
// link's latency; the busiest rank (or host link) moves a half per tree edge
// it has (AllReduce) or per child (Broadcast, Reduce), per direction, and the
// first chunk crosses the hops of the slowest path (detail::tree_fill).
double cost_tree_allreduce(const BuildCtx& ctx, const OpDesc& op) {
  const TuneModel& t = ctx.model;
  if (ctx.nranks == 1) return 0;
  const detail::PathCost tree = detail::tree_cost(ctx, parents_of(ctx.nranks, false, 0), false);
  const double half = static_cast<double>(op.count * op.elem()) / 2;
  const int children = load_for(ctx.nranks, false).children;
  return 2 * tree.depth_alpha_us + tree.busiest_beta * half + detail::tree_fill(tree, op, half, 2) +
         children * half * t.gamma();
}

namespace {
double rooted_cost(const BuildCtx& ctx, const OpDesc& op, bool reduce) {
  const TuneModel& t = ctx.model;
  if (ctx.nranks == 1) return 0;
  const int root = op.root >= 0 && op.root < ctx.nranks ? op.root : 0;
  const detail::PathCost tree = detail::tree_cost(ctx, parents_of(ctx.nranks, true, root), true);
  const double half = static_cast<double>(op.count * op.elem()) / 2;
  const int children = reduce ? load_for(ctx.nranks, true).children : 0;
  return tree.depth_alpha_us + tree.busiest_beta * half + detail::tree_fill(tree, op, half, 1) +
         children * half * t.gamma();
}
}  // namespace

double cost_tree_broadcast(const BuildCtx& ctx, const OpDesc& op) { return rooted_cost(ctx, op, false); }

double cost_tree_reduce(const BuildCtx& ctx, const OpDesc& op) { return rooted_cost(ctx, op, true); }

}  // namespace meshccl
