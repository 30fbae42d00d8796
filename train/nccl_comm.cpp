#include "nccl_comm.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace meshtrain {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Avg: return ncclAvg;
  }
  return ncclSum;
}

// Measures how long the caller is blocked in a scope.
struct Blocked {
  explicit Blocked(double* acc) : acc_(acc), t0_(now()) {}
  ~Blocked() { *acc_ += now() - t0_; }
  double* acc_;
  double t0_;
};

}  // namespace

void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw CommError(msg);
}

NcclComm::NcclComm(ncclComm_t comm) : comm_(comm) {
  check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank", comm_);
  check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount", comm_);
  int least = 0, greatest = 0;
  check_nccl(meshcclStreamGetPriorityRange(&least, &greatest), "meshcclStreamGetPriorityRange");
  check_nccl(meshcclStreamCreateWithPriority(&fast_, greatest), "meshcclStreamCreateWithPriority");
  check_nccl(meshcclStreamCreateWithPriority(&slow_, least), "meshcclStreamCreateWithPriority");
}

NcclComm::~NcclComm() {
  // Errors here have nowhere to go; the streams are drained before the comm goes.
  if (fast_) meshcclStreamDestroy(fast_);
  if (slow_) meshcclStreamDestroy(slow_);
  for (meshcclStream_t s : at_)
    if (s) meshcclStreamDestroy(s);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::abandon() {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

ncclComm_t NcclComm::release() {
  ncclComm_t c = comm_;
  comm_ = nullptr;
  return c;
}

void NcclComm::all_reduce(float* buf, size_t n, ReduceOp op) {
  Blocked b(&wait_seconds);
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(fast_)), "ncclAllReduce",
             comm_);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::all_reduce_start(float* buf, size_t n, ReduceOp op) {
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(fast_)), "ncclAllReduce",
             comm_);
}

void NcclComm::all_reduce_finish() {
  Blocked b(&wait_seconds);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::all_reduce_async(float* buf, size_t n, ReduceOp op) {
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(slow_)), "ncclAllReduce",
             comm_);
}

void NcclComm::wait_async() {
  Blocked b(&wait_seconds);
  check_nccl(meshcclStreamSynchronize(slow_), "meshcclStreamSynchronize", comm_);
  for (meshcclStream_t s : at_)
    if (s) check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", comm_);
  sparse_.clear();
}

void NcclComm::all_reduce_async_at(float* buf, size_t n, ReduceOp op, int priority) {
  const int level = std::clamp(-priority, 0, kLevels - 1);
  if (!at_[level]) check_nccl(meshcclStreamCreateWithPriority(&at_[level], -level), "meshcclStreamCreateWithPriority");
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(at_[level])),
             "ncclAllReduce", comm_);
}

void NcclComm::set_priority(int priority) {
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
  meshcclStreamDestroy(fast_);
  fast_ = nullptr;
  check_nccl(meshcclStreamCreateWithPriority(&fast_, priority), "meshcclStreamCreateWithPriority");
}

void NcclComm::sparse_all_reduce_async(float* buf, size_t rows, size_t row_len, ReduceOp op) {
  SparseRows& s = sparse_.emplace_back();
  for (size_t r = 0; r < rows; ++r) {
    const float* row = buf + r * row_len;
    if (std::all_of(row, row + row_len, [](float x) { return x == 0.0f; })) continue;
    s.index.push_back(static_cast<int64_t>(r));
    s.values.insert(s.values.end(), row, row + row_len);
  }
  // Counted as the all-gather of rows it is at low density: this rank's rows
  // (and their indices) to every other rank.
  bytes_sent += static_cast<double>(size_ - 1) * s.index.size() * (row_len * sizeof(float) + sizeof(int64_t));
  check_nccl(meshcclSparseAllReduce(s.values.data(), s.index.data(), s.index.size(), buf, rows, row_len, ncclFloat32,
                                    to_nccl(op), comm_, meshcclStreamAsCuda(slow_)),
             "meshcclSparseAllReduce", comm_);
}

void NcclComm::all_gather(const float* in, float* out, size_t n) {
  Blocked b(&wait_seconds);
  bytes_sent += static_cast<double>(size_ - 1) * n * sizeof(float);
  check_nccl(ncclAllGather(in, out, n, ncclFloat32, comm_, meshcclStreamAsCuda(fast_)), "ncclAllGather", comm_);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::reduce_scatter(const float* in, float* out, size_t n) {
  Blocked b(&wait_seconds);
  bytes_sent += static_cast<double>(size_ - 1) * n * sizeof(float);
  check_nccl(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm_, meshcclStreamAsCuda(fast_)),
             "ncclReduceScatter", comm_);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::exchange(const P2POp* ops, int n) {
  Blocked b(&wait_seconds);
  for (int i = 0; i < n; i++) {
    if (ops[i].send) bytes_sent += static_cast<double>(ops[i].count) * sizeof(float);
  }
  check_nccl(ncclGroupStart(), "ncclGroupStart", comm_);
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n && r == ncclSuccess; i++) {
    const P2POp& op = ops[i];
    r = op.send ? ncclSend(op.buf, op.count, ncclFloat32, op.peer, comm_, meshcclStreamAsCuda(fast_))
                : ncclRecv(op.buf, op.count, ncclFloat32, op.peer, comm_, meshcclStreamAsCuda(fast_));
  }
  const ncclResult_t end = ncclGroupEnd();
  check_nccl(r, "ncclSend/ncclRecv", comm_);
  check_nccl(end, "ncclGroupEnd", comm_);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

Comms RankComms::view() const {
  Comms c;
  c.world = world.get();
  c.dp = dp.get();
  c.pp = pp.get();
  c.tp = tp.get();
  c.embed = embed.get();
  for (int a = 0; a < 3; a++) c.cube[a] = cube[a].get();
  return c;
}

StagePipe::StagePipe(std::unique_ptr<NcclComm> replica, const Layout& layout, int stage, int tp_rank, size_t act_count)
    : replica_(std::move(replica)), stage_(stage), pp_(layout.pp), tp_rank_(tp_rank), act_count_(act_count) {
  for (auto& s : streams_) check_nccl(meshcclStreamCreate(&s), "meshcclStreamCreate");
  for (auto& s : ring_streams_) check_nccl(meshcclStreamCreate(&s), "meshcclStreamCreate");
  // Every rank of the replica creates every plan, in stage order.
  auto mesh_of = [&](int s, std::vector<int>* ranks) {
    ranks->clear();
    for (int t = 0; t < layout.tp_of(s); t++) ranks->push_back(layout.stage_offset(s) + t);
    meshcclMesh_t m{};
    m.ndims = 1;
    m.shape[0] = layout.tp_of(s);
    m.ranks = ranks->data();
    return m;
  };
  meshcclShardSpec_t rep{};
  rep.ndims = 1;  // R: the activation whole on every rank of a stage
  const size_t shape[1] = {act_count};
  std::vector<int> a, b;
  for (int s = 0; s + 1 < pp_; s++) {
    const meshcclMesh_t ms = mesh_of(s, &a), md = mesh_of(s + 1, &b);
    meshcclReshardPlan_t fwd = nullptr, bwd = nullptr;
    check_nccl(meshcclReshardPlanCreate(&ms, &rep, &md, &rep, shape, ncclFloat32, replica_->handle(), nullptr, &fwd),
               "meshcclReshardPlanCreate", replica_->handle());
    act_.push_back(fwd);
    check_nccl(meshcclReshardPlanCreate(&md, &rep, &ms, &rep, shape, ncclFloat32, replica_->handle(), nullptr, &bwd),
               "meshcclReshardPlanCreate", replica_->handle());
    grad_.push_back(bwd);
  }
}

void StagePipe::set_priority(int priority) {
  replica_->set_priority(priority);
  auto remake = [&](meshcclStream_t& s) {
    check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", replica_->handle());
    meshcclStreamDestroy(s);
    s = nullptr;
    check_nccl(meshcclStreamCreateWithPriority(&s, priority), "meshcclStreamCreateWithPriority");
  };
  for (auto& s : streams_) remake(s);
  for (auto& s : ring_streams_) remake(s);
}

StagePipe::~StagePipe() {
  for (auto& s : ring_streams_)
    if (s) meshcclStreamDestroy(s);
  for (auto& s : streams_)
    if (s) meshcclStreamDestroy(s);
  for (auto p : act_) meshcclReshardPlanDestroy(p);
  for (auto p : grad_) meshcclReshardPlanDestroy(p);
}

void StagePipe::all_reduce(float* buf, size_t n, ReduceOp op) {
  if (op != ReduceOp::Sum) throw CommError("the stage pipe sums only");
  // Each stage once: its tp rank 0 contributes, the others add nothing.
  if (tp_rank_ != 0) std::fill(buf, buf + n, 0.0f);
  replica_->all_reduce(buf, n, ReduceOp::Sum);
  wait_seconds = replica_->wait_seconds;
}
void StagePipe::all_reduce_start(float*, size_t, ReduceOp) { throw CommError("stage pipe: no split all-reduce"); }
void StagePipe::all_reduce_finish() {}
void StagePipe::all_reduce_async(float*, size_t, ReduceOp) { throw CommError("stage pipe: no async all-reduce"); }
void StagePipe::all_gather(const float*, float*, size_t) { throw CommError("stage pipe: no all-gather"); }
void StagePipe::reduce_scatter(const float*, float*, size_t) { throw CommError("stage pipe: no reduce-scatter"); }

void StagePipe::exchange(const P2POp* ops, int n) {
  Blocked b(&wait_seconds);
  if (n > 2) throw CommError("stage pipe: more than two transfers in one group");
  for (int i = 0; i < n; i++) {
    const P2POp& op = ops[i];
    if (op.count != act_count_) throw CommError("stage pipe: a transfer of another size than the activation");
    meshcclReshardPlan_t plan = nullptr;
    if (op.peer == stage_ + 1) plan = op.send ? act_[stage_] : grad_[stage_];
    else if (op.peer == stage_ - 1) plan = op.send ? grad_[stage_ - 1] : act_[stage_ - 1];
    else throw CommError("stage pipe: peer stage " + std::to_string(op.peer) + " is not a neighbour");
    if (op.send) bytes_sent += static_cast<double>(op.count) * sizeof(float);
    if (op.send && op.peer == stage_ + 1) {
      // The activation: copied to a free staging buffer and sent in the
      // background (eager-1F1B's overlap); the buffer is reused once its
      // stream has drained.
      const int k = next_++ % kRing;
      check_nccl(meshcclStreamSynchronize(ring_streams_[k]), "meshcclStreamSynchronize", replica_->handle());
      ring_[k].assign(op.buf, op.buf + op.count);
      check_nccl(meshcclReshard(plan, ring_[k].data(), nullptr, meshcclStreamAsCuda(ring_streams_[k])),
                 "meshcclReshard", replica_->handle());
      continue;
    }
    // Both of a group's transfers in flight at once, so that two neighbours
    // posting them in different orders never wait on each other.
    check_nccl(
        meshcclReshard(plan, op.send ? op.buf : nullptr, op.send ? nullptr : op.buf, meshcclStreamAsCuda(streams_[i])),
        "meshcclReshard", replica_->handle());
  }
  for (int i = 0; i < n; i++)
    check_nccl(meshcclStreamSynchronize(streams_[i]), "meshcclStreamSynchronize", replica_->handle());
}

void StagePipe::wait_async() {
  Blocked b(&wait_seconds);
  for (auto& s : ring_streams_) check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", replica_->handle());
}

RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied, size_t act_count) {
  RankComms rc;
  rc.world = std::make_unique<NcclComm>(world);
  const int rank = rc.world->rank();
  if (layout.hetero()) {
    // Per-stage tp: splits by coordinates, the pipeline through reshard plans.
    const Coords me = coords_of(rank, layout);
    int most_tp = 1;
    for (int t : layout.stage_tp) most_tp = std::max(most_tp, t);
    auto split = [&](int color, int key) -> std::unique_ptr<NcclComm> {
      ncclComm_t child = nullptr;
      check_nccl(ncclCommSplit(world, color, key, &child, nullptr), "ncclCommSplit", world);
      if (!child) return nullptr;
      auto c = std::make_unique<NcclComm>(child);
      if (c->size() == 1) return nullptr;
      return c;
    };
    rc.tp = split(me.dp * layout.pp + me.pp, me.tp);
    rc.dp = split(layout.stage_offset(me.pp) + me.tp, me.dp);
    if (layout.pp > 1) {
      auto replica = split(me.dp, rank % layout.replica());
      if (!replica) throw CommError("a pipeline replica of one rank");
      rc.pp = std::make_unique<StagePipe>(std::move(replica), layout, me.pp, me.tp, act_count);
    } else {
      split(me.dp, rank);  // every rank makes every split
    }
    const bool ends = me.pp == 0 || me.pp == layout.pp - 1;
    ncclComm_t child = nullptr;
    const int ec = tied && layout.pp > 1 && ends ? me.dp * most_tp + me.tp : NCCL_SPLIT_NOCOLOR;
    check_nccl(ncclCommSplit(world, ec, me.pp, &child, nullptr), "ncclCommSplit", world);
    if (child) rc.embed = std::make_unique<NcclComm>(child);
    return rc;
  }
  const Grid grid = layout.grid();
  const Coords me = coords_of(rank, layout);
  // Every rank makes every split in the same order (each is collective over the
  // world); a group of one rank gets no communicator.
  auto split = [&](int color, int key, bool keep) -> std::unique_ptr<NcclComm> {
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(world, keep ? color : NCCL_SPLIT_NOCOLOR, key, &child, nullptr), "ncclCommSplit", world);
    if (!keep || !child) return nullptr;
    return std::make_unique<NcclComm>(child);
  };
  auto group = [&](const std::vector<std::string>& dims) -> std::unique_ptr<NcclComm> {
    if (grid.group_size(dims) == 1) return nullptr;
    return split(grid.group_color(rank, dims), grid.group_key(rank, dims), true);
  };
  rc.tp = group(layout.tp_dims());
  rc.pp = group({"pp"});
  rc.dp = group({"dp"});
  if (tied && layout.pp > 1) {
    const int ec = embed_color(me, layout, tied);
    rc.embed = split(ec, me.pp, ec >= 0);
  }
  if (layout.tp_mode == TpMode::ThreeD) {
    for (int a = 0; a < 3; a++) rc.cube[a] = group({cube_axis_dim(a)});
  }
  return rc;
}

void set_comm_sched(RankComms& rc, CommSched sched) {
  const int tensor = comm_priority(sched, CommKind::Tensor);
  for (NcclComm* c : {rc.world.get(), rc.tp.get(), rc.cube[0].get(), rc.cube[1].get(), rc.cube[2].get()})
    if (c) c->set_priority(tensor);
  // The data-parallel communicator's blocking calls (the loss) are small and
  // on the critical path; its buckets name their priority per call.
  if (rc.dp) rc.dp->set_priority(tensor);
  if (rc.pp) rc.pp->set_priority(comm_priority(sched, CommKind::Pipeline));
  if (rc.embed) rc.embed->set_priority(comm_priority(sched, CommKind::Sparse));
}

}  // namespace meshtrain
