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

NcclComm::NcclComm(ncclComm_t comm, int priority) : comm_(comm) {
  check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank", comm_);
  check_nccl(ncclCommCount(comm_, &size_), "ncclCommCount", comm_);
  check_nccl(meshcclStreamCreateWithPriority(&critical_, priority), "meshcclStreamCreateWithPriority");
}

NcclComm::~NcclComm() {
  // Errors here have nowhere to go; the streams are drained before the comm goes.
  if (critical_) meshcclStreamDestroy(critical_);
  for (auto& lane : background_)
    for (meshcclStream_t s : lane)
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

meshcclStream_t NcclComm::stream(Urgency u, Lane lane) {
  if (!u.in_background) return critical_;
  const int level = std::clamp(-u.priority, 0, kLevels - 1);
  meshcclStream_t& s = background_[lane][level];
  if (!s) check_nccl(meshcclStreamCreateWithPriority(&s, -level), "meshcclStreamCreateWithPriority");
  return s;
}

Work NcclComm::pending(meshcclStream_t s) {
  return Work([this, s] {
    Blocked b(&wait_seconds);
    check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", comm_);
  });
}

Work NcclComm::all_reduce(float* buf, size_t n, ReduceOp op, Urgency u) {
  Blocked b(&wait_seconds);
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  const meshcclStream_t s = stream(u);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(s)), "ncclAllReduce",
             comm_);
  return pending(s);
}

Work NcclComm::sparse_all_reduce(float* buf, size_t rows, size_t row_len, ReduceOp op, Urgency u) {
  Blocked b(&wait_seconds);
  const meshcclStream_t s = stream(u, kSparse);
  SparseRows& rs = sparse_.emplace_back();
  rs.stream = s;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = buf + r * row_len;
    if (std::all_of(row, row + row_len, [](float x) { return x == 0.0f; })) continue;
    rs.index.push_back(static_cast<int64_t>(r));
    rs.values.insert(rs.values.end(), row, row + row_len);
  }
  // Counted as the all-gather of rows it is at low density: this rank's rows
  // (and their indices) to every other rank.
  bytes_sent += static_cast<double>(size_ - 1) * rs.index.size() * (row_len * sizeof(float) + sizeof(int64_t));
  check_nccl(meshcclSparseAllReduce(rs.values.data(), rs.index.data(), rs.index.size(), buf, rows, row_len, ncclFloat32,
                                    to_nccl(op), comm_, meshcclStreamAsCuda(s)),
             "meshcclSparseAllReduce", comm_);
  return Work([this, s] {
    Blocked b(&wait_seconds);
    check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", comm_);
    std::erase_if(sparse_, [s](const SparseRows& done) { return done.stream == s; });
  });
}

Work NcclComm::all_gather(const float* in, float* out, size_t n, Urgency u) {
  Blocked b(&wait_seconds);
  bytes_sent += static_cast<double>(size_ - 1) * n * sizeof(float);
  const meshcclStream_t s = stream(u);
  check_nccl(ncclAllGather(in, out, n, ncclFloat32, comm_, meshcclStreamAsCuda(s)), "ncclAllGather", comm_);
  return pending(s);
}

Work NcclComm::reduce_scatter(const float* in, float* out, size_t n, Urgency u) {
  Blocked b(&wait_seconds);
  bytes_sent += static_cast<double>(size_ - 1) * n * sizeof(float);
  const meshcclStream_t s = stream(u);
  check_nccl(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm_, meshcclStreamAsCuda(s)), "ncclReduceScatter",
             comm_);
  return pending(s);
}

Work NcclComm::exchange(const P2POp* ops, int n) {
  Blocked b(&wait_seconds);
  for (int i = 0; i < n; i++) {
    if (ops[i].send) bytes_sent += static_cast<double>(ops[i].count) * sizeof(float);
  }
  cudaStream_t s = meshcclStreamAsCuda(critical_);
  check_nccl(ncclGroupStart(), "ncclGroupStart", comm_);
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < n && r == ncclSuccess; i++) {
    const P2POp& op = ops[i];
    r = op.send ? ncclSend(op.buf, op.count, ncclFloat32, op.peer, comm_, s)
                : ncclRecv(op.buf, op.count, ncclFloat32, op.peer, comm_, s);
  }
  const ncclResult_t end = ncclGroupEnd();
  check_nccl(r, "ncclSend/ncclRecv", comm_);
  check_nccl(end, "ncclGroupEnd", comm_);
  return pending(critical_);
}

Work NcclComm::sum(float* buf, size_t n) { return all_reduce(buf, n, ReduceOp::Sum, Urgency::critical()); }

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

StagePipe::StagePipe(std::unique_ptr<NcclComm> replica, const Layout& layout, int stage, int tp_rank, size_t act_count,
                     int priority)
    : replica_(std::move(replica)), stage_(stage), pp_(layout.pp), tp_rank_(tp_rank), act_count_(act_count) {
  for (auto& s : streams_) check_nccl(meshcclStreamCreateWithPriority(&s, priority), "meshcclStreamCreateWithPriority");
  for (auto& s : ring_streams_)
    check_nccl(meshcclStreamCreateWithPriority(&s, priority), "meshcclStreamCreateWithPriority");
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

StagePipe::~StagePipe() {
  for (auto& s : ring_streams_)
    if (s) meshcclStreamDestroy(s);
  for (auto& s : streams_)
    if (s) meshcclStreamDestroy(s);
  for (auto p : act_) meshcclReshardPlanDestroy(p);
  for (auto p : grad_) meshcclReshardPlanDestroy(p);
}

Work StagePipe::sum(float* buf, size_t n) {
  Blocked b(&wait_seconds);
  // Each stage once: its tp rank 0 contributes, the others add nothing.
  if (tp_rank_ != 0) std::fill(buf, buf + n, 0.0f);
  auto w = std::make_shared<Work>(replica_->all_reduce(buf, n, ReduceOp::Sum, Urgency::critical()));
  return Work([this, w] {
    Blocked waiting(&wait_seconds);
    w->wait();
  });
}

meshcclReshardPlan_t StagePipe::plan_of(const P2POp& op) const {
  if (op.count != act_count_) throw CommError("stage pipe: a transfer of another size than the activation");
  if (op.peer == stage_ + 1) return op.send ? act_[stage_] : grad_[stage_];
  if (op.peer == stage_ - 1) return op.send ? grad_[stage_ - 1] : act_[stage_ - 1];
  throw CommError("stage pipe: peer stage " + std::to_string(op.peer) + " is not a neighbour");
}

Work StagePipe::exchange(const P2POp* ops, int n) {
  Blocked b(&wait_seconds);
  if (n > 2) throw CommError("stage pipe: more than two transfers in one group");
  for (int i = 0; i < n; i++) {
    const P2POp& op = ops[i];
    const meshcclReshardPlan_t plan = plan_of(op);
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
  return Work([this, n] {
    Blocked waiting(&wait_seconds);
    for (int i = 0; i < n; i++)
      check_nccl(meshcclStreamSynchronize(streams_[i]), "meshcclStreamSynchronize", replica_->handle());
  });
}

Work StagePipe::flush() {
  return Work([this] {
    Blocked b(&wait_seconds);
    for (auto& s : ring_streams_)
      check_nccl(meshcclStreamSynchronize(s), "meshcclStreamSynchronize", replica_->handle());
  });
}

RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied, CommSched sched, size_t act_count) {
  // The data-parallel communicator's critical calls (the loss) are small and
  // on the critical path, as the world's are; its buckets name their
  // priority per call.
  const int tensor = comm_priority(sched, CommKind::Tensor), pipeline = comm_priority(sched, CommKind::Pipeline),
            sparse = comm_priority(sched, CommKind::Sparse);
  RankComms rc;
  rc.world = std::make_unique<NcclComm>(world, tensor);
  const int rank = rc.world->rank();
  if (layout.hetero()) {
    // Per-stage tp: splits by coordinates, the pipeline through reshard plans.
    const Coords me = coords_of(rank, layout);
    int most_tp = 1;
    for (int t : layout.stage_tp) most_tp = std::max(most_tp, t);
    auto split = [&](int color, int key, int priority) -> std::unique_ptr<NcclComm> {
      ncclComm_t child = nullptr;
      check_nccl(ncclCommSplit(world, color, key, &child, nullptr), "ncclCommSplit", world);
      if (!child) return nullptr;
      auto c = std::make_unique<NcclComm>(child, priority);
      if (c->size() == 1) return nullptr;
      return c;
    };
    rc.tp = split(me.dp * layout.pp + me.pp, me.tp, tensor);
    rc.dp = split(layout.stage_offset(me.pp) + me.tp, me.dp, tensor);
    if (layout.pp > 1) {
      auto replica = split(me.dp, rank % layout.replica(), pipeline);
      if (!replica) throw CommError("a pipeline replica of one rank");
      rc.pp = std::make_unique<StagePipe>(std::move(replica), layout, me.pp, me.tp, act_count, pipeline);
    } else {
      split(me.dp, rank, pipeline);  // every rank makes every split
    }
    const bool ends = me.pp == 0 || me.pp == layout.pp - 1;
    ncclComm_t child = nullptr;
    const int ec = tied && layout.pp > 1 && ends ? me.dp * most_tp + me.tp : NCCL_SPLIT_NOCOLOR;
    check_nccl(ncclCommSplit(world, ec, me.pp, &child, nullptr), "ncclCommSplit", world);
    if (child) rc.embed = std::make_unique<NcclComm>(child, sparse);
    return rc;
  }
  const Grid grid = layout.grid();
  const Coords me = coords_of(rank, layout);
  // Every rank makes every split in the same order (each is collective over the
  // world); a group of one rank gets no communicator.
  auto split = [&](int color, int key, bool keep, int priority) -> std::unique_ptr<NcclComm> {
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(world, keep ? color : NCCL_SPLIT_NOCOLOR, key, &child, nullptr), "ncclCommSplit", world);
    if (!keep || !child) return nullptr;
    return std::make_unique<NcclComm>(child, priority);
  };
  auto group = [&](const std::vector<std::string>& dims, int priority) -> std::unique_ptr<NcclComm> {
    if (grid.group_size(dims) == 1) return nullptr;
    return split(grid.group_color(rank, dims), grid.group_key(rank, dims), true, priority);
  };
  rc.tp = group(layout.tp_dims(), tensor);
  rc.pp = group({"pp"}, pipeline);
  rc.dp = group({"dp"}, tensor);
  if (tied && layout.pp > 1) {
    const int ec = embed_color(me, layout, tied);
    rc.embed = split(ec, me.pp, ec >= 0, sparse);
  }
  if (layout.tp_mode == TpMode::ThreeD) {
    for (int a = 0; a < 3; a++) rc.cube[a] = group({cube_axis_dim(a)}, tensor);
  }
  return rc;
}

}  // namespace meshtrain
