#include "nccl_comm.h"

#include <chrono>
#include <string>

namespace meshtrain {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(fast_)),
             "ncclAllReduce", comm_);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::all_reduce_start(float* buf, size_t n, ReduceOp op) {
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(fast_)),
             "ncclAllReduce", comm_);
}

void NcclComm::all_reduce_finish() {
  Blocked b(&wait_seconds);
  check_nccl(meshcclStreamSynchronize(fast_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::all_reduce_async(float* buf, size_t n, ReduceOp op) {
  bytes_sent += 2.0 * (size_ - 1) / size_ * n * sizeof(float);
  check_nccl(ncclAllReduce(buf, buf, n, ncclFloat32, to_nccl(op), comm_, meshcclStreamAsCuda(slow_)),
             "ncclAllReduce", comm_);
}

void NcclComm::wait_async() {
  Blocked b(&wait_seconds);
  check_nccl(meshcclStreamSynchronize(slow_), "meshcclStreamSynchronize", comm_);
}

void NcclComm::all_gather(const float* in, float* out, size_t n) {
  Blocked b(&wait_seconds);
  bytes_sent += static_cast<double>(size_ - 1) * n * sizeof(float);
  check_nccl(ncclAllGather(in, out, n, ncclFloat32, comm_, meshcclStreamAsCuda(fast_)),
             "ncclAllGather", comm_);
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

RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied) {
  RankComms rc;
  rc.world = std::make_unique<NcclComm>(world);
  const int rank = rc.world->rank();
  const Grid grid = layout.grid();
  const Coords me = coords_of(rank, layout);
  // Every rank makes every split in the same order (each is collective over the
  // world); a group of one rank gets no communicator.
  auto split = [&](int color, int key, bool keep) -> std::unique_ptr<NcclComm> {
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(world, keep ? color : NCCL_SPLIT_NOCOLOR, key, &child, nullptr),
               "ncclCommSplit", world);
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

}  // namespace meshtrain
