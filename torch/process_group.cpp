// ProcessGroupMeshccl: torch 1.13's process-group operations mapped onto the
// NCCL API of meshccl, queued on one host stream per group.
#include "process_group.h"

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>

namespace meshccl_torch {

namespace {

using Clock = std::chrono::steady_clock;

const char* const kUniqueIdKey = "meshccl_unique_id";

// Datatype of a tensor that is reduced; NCCL has no other numeric types.
ncclDataType_t reduce_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kHalf: return ncclFloat16;
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    default:
      TORCH_CHECK(false, "meshccl: cannot reduce ", t.scalar_type(),
                  " tensors (NCCL reduces int8, uint8, bool, int32, int64, float16, bfloat16, float32, float64)");
  }
}

// Checks a tensor that a call reads or writes. `elementwise` calls (reductions,
// broadcast, send/recv) accept any dense layout all ranks share, as torch's
// NCCL group does; calls that split or concatenate need row-major order.
void check_tensor(const at::Tensor& t, const char* what, bool elementwise) {
  TORCH_CHECK(t.defined(), "meshccl: ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "meshccl: ", what, " must be a CPU tensor (got ", t.device(), ")");
  TORCH_CHECK(t.layout() == at::kStrided, "meshccl: ", what, " must be a dense tensor (got ", t.layout(), ")");
  bool ok = elementwise ? t.is_contiguous(t.suggest_memory_format()) : t.is_contiguous();
  TORCH_CHECK(ok, "meshccl: Tensors must be contiguous (", what, ")");
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "meshccl: ", call, " takes one tensor per call on CPU (got ", tensors.size(), ")");
  return tensors[0];
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "meshccl: ", what, ": dtype ", b.scalar_type(),
              " differs from the input's ", a.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), "meshccl: ", what, ": ", b.numel(), " elements where the input has ", a.numel());
}

size_t bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

char* ptr(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// The start of `ts` when they lie back to back in memory, in order, each
// contiguous (chunks of one tensor); nullptr otherwise.
char* back_to_back(const std::vector<at::Tensor>& ts) {
  char* base = ptr(ts[0]);
  size_t off = 0;
  for (const auto& t : ts) {
    if (!t.is_contiguous() || ptr(t) != base + off) return nullptr;
    off += bytes(t);
  }
  return base;
}

cudaStream_t as_cuda(meshcclStream_t s) { return meshcclStreamAsCuda(s); }

// Closes a group opened by ncclGroupStart when a check throws half-way.
class GroupGuard {
 public:
  GroupGuard() { open_ = ncclGroupStart() == ncclSuccess; }
  ncclResult_t end() {
    open_ = false;
    return ncclGroupEnd();
  }
  ~GroupGuard() {
    if (open_) (void)ncclGroupEnd();
  }

 private:
  bool open_;
};

// Every group made, for shutdown_all (weak: a group lives as long as torch holds it).
std::mutex g_groups_mu;
std::vector<c10::weak_intrusive_ptr<ProcessGroupMeshccl>> g_groups;

}  // namespace

meshcclConfig_t comm_config(std::chrono::milliseconds timeout) {
  meshcclConfig_t c;
  meshcclConfigInit(&c);
  if (std::getenv("MESHCCL_TIMEOUT") != nullptr) return c;  // the user's choice
  const double s = std::ceil(static_cast<double>(timeout.count()) / 1000.0) + 1;
  c.timeoutSeconds = static_cast<int>(std::min(std::max(s, 1.0), 31536000.0));
  return c;
}

// ---------------------------------------------------------------- WorkMeshccl

// Completes the futures handed out by getFuture (DistributedDataParallel waits
// on them), in the order they were asked for. One thread for the process,
// never stopped: a work it drops may hold the last reference to its group, so
// the group's destructor may run on it, and it must not belong to any group.
class Completer {
 public:
  void push(c10::intrusive_ptr<WorkMeshccl> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      if (!started_) {
        started_ = true;
        std::thread([this] { loop(); }).detach();
      }
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      c10::intrusive_ptr<WorkMeshccl> work;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work->complete_in_background();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkMeshccl>> queue_;
  bool started_ = false;
};

Completer& completer() {
  static Completer* c = new Completer();  // never destroyed: its thread outlives static destructors
  return *c;
}

// ------------------------------------------------------------- LocalWork

void LocalWork::deliver(const at::Tensor& src) {
  std::exception_ptr error;
  try {
    at::Tensor& dst = outputs_.at(0);
    TORCH_CHECK(src.numel() == dst.numel() && src.scalar_type() == dst.scalar_type(),
                "meshccl: a send to this rank "
                "itself of ",
                src.numel(), " ", src.scalar_type(), " elements met a receive of ", dst.numel(), " ", dst.scalar_type(),
                " elements");
    dst.copy_(src.reshape(dst.sizes()));
  } catch (...) { error = std::current_exception(); }
  done(error);
}

bool LocalWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  TORCH_CHECK(cv_.wait_for(lock, limit, [&] { return completed_; }), "meshccl: timed out: rank ", rank_,
              ": a receive from this rank itself found no matching send within ", limit.count(), " ms");
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void WorkMeshccl::complete_in_background() {
  std::exception_ptr error;
  try {
    pg_->wait_for(seq_, start_ + pg_->timeout());
  } catch (...) { error = std::current_exception(); }
  settle(error);
}

WorkMeshccl::WorkMeshccl(c10::intrusive_ptr<ProcessGroupMeshccl> pg, c10d::OpType type, uint64_t seq,
                         std::vector<at::Tensor> outputs, std::function<void()> finish)
    : c10d::Work(pg->getRank(), type),
      pg_(std::move(pg)),
      seq_(seq),
      start_(Clock::now()),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)) {}

WorkMeshccl::~WorkMeshccl() = default;

void WorkMeshccl::settle(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    if (!error && finish_) {
      try {
        finish_();
      } catch (...) { error = std::current_exception(); }
    }
    finish_ = nullptr;
    keep_.clear();
    settled_->store(true);
    completed_ = true;
    exception_ = error;
    fut = future_;
  }
  cv_.notify_all();
  if (fut) {
    if (error) fut->setError(error);
    else fut->markCompleted(at::IValue(outputs_));
  }
}

bool WorkMeshccl::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  try {
    if (!pg_->done_through(seq_)) return false;
    settle(nullptr);
  } catch (...) { settle(std::current_exception()); }
  return true;
}

bool WorkMeshccl::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkMeshccl::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

bool WorkMeshccl::wait(std::chrono::milliseconds timeout) {
  bool done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = completed_;
  }
  if (!done) {
    auto deadline = timeout == kNoTimeout ? start_ + pg_->timeout() : Clock::now() + timeout;
    try {
      pg_->wait_for(seq_, deadline);
      settle(nullptr);
    } catch (...) { settle(std::current_exception()); }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

int WorkMeshccl::sourceRank() const {
  TORCH_CHECK(source_ != nullptr, "meshccl: sourceRank() is for a receive from any source only");
  return *source_;
}

c10::intrusive_ptr<c10::ivalue::Future> WorkMeshccl::getFuture() {
  (void)isCompleted();  // most small operations are done by now: no hand-off to the completing thread
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  bool done;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) return future_;
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut = future_;
    done = completed_;
    error = exception_;
  }
  if (done) {
    if (error) fut->setError(error);
    else fut->markCompleted(at::IValue(outputs_));
  } else {
    completer().push(c10::intrusive_ptr<WorkMeshccl>::reclaim_copy(this));
  }
  return fut;
}

// -------------------------------------------------------- ProcessGroupMeshccl

ProcessGroupMeshccl::ProcessGroupMeshccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                         std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    check("ncclGetUniqueId", ncclGetUniqueId(&id));
    const auto* b = reinterpret_cast<const uint8_t*>(&id);
    store->set(kUniqueIdKey, std::vector<uint8_t>(b, b + sizeof(id)));
  } else {
    std::vector<uint8_t> v = store->get(kUniqueIdKey);
    TORCH_CHECK(v.size() == sizeof(id), "meshccl: the store holds a unique id of ", v.size(), " bytes, not ",
                sizeof(id));
    std::memcpy(&id, v.data(), sizeof(id));
  }
  meshcclConfig_t config = comm_config(timeout);
  check("ncclCommInitRankConfig", ncclCommInitRankConfig(&comm_, size, id, rank, &config.nccl));
  start();
}

ProcessGroupMeshccl::ProcessGroupMeshccl(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), comm_(comm), timeout_(timeout) {
  start();
}

void ProcessGroupMeshccl::start() {
  init();
  if (ncclResult_t r = meshcclStreamCreate(&stream_); r != ncclSuccess) {
    (void)ncclCommDestroy(comm_);
    comm_ = nullptr;
    TORCH_CHECK(false, "meshccl: meshcclStreamCreate failed: ", ncclGetErrorString(r));
  }
  barrier_buf_ = at::zeros({1}, at::kByte);
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

c10::intrusive_ptr<ProcessGroupMeshccl> track(c10::intrusive_ptr<ProcessGroupMeshccl> group) {
  std::lock_guard<std::mutex> lock(g_groups_mu);
  g_groups.erase(std::remove_if(g_groups.begin(), g_groups.end(), [](const auto& w) { return w.expired(); }),
                 g_groups.end());
  g_groups.emplace_back(group);
  return group;
}

void ProcessGroupMeshccl::shutdown() {
  constexpr auto kExitWait = std::chrono::seconds(5);
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = queued_;
  }
  try {
    wait_for(last, Clock::now() + std::min<Clock::duration>(timeout_, kExitWait));
  } catch (...) {
    // Failed or revoked: what ran is over either way.
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_) error_ = std::make_exception_ptr(std::runtime_error("meshccl: the process group was shut down at exit"));
}

void shutdown_all() {
  std::vector<c10::intrusive_ptr<ProcessGroupMeshccl>> groups;
  {
    std::lock_guard<std::mutex> lock(g_groups_mu);
    for (auto& w : g_groups)
      if (auto g = w.lock()) groups.push_back(std::move(g));
  }
  for (auto& g : groups) g->shutdown();
}

ProcessGroupMeshccl::~ProcessGroupMeshccl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  bool failed = error_ != nullptr || revoked_;
  if (stream_ != nullptr && meshcclStreamDestroy(stream_) != ncclSuccess) failed = true;
  for (ncclRedOp_t op : premul_ops_) (void)ncclRedOpDestroy(op, comm_);
  if (comm_ != nullptr) (void)(failed ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
}

void ProcessGroupMeshccl::fail(const char* call, ncclResult_t r) {
  const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
  TORCH_CHECK(false, "meshccl: ", call, " failed: ", ncclGetErrorString(r), (last && *last) ? ": " : "",
              last ? last : "");
}

void ProcessGroupMeshccl::check_usable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

ncclComm_t ProcessGroupMeshccl::split(int color, int key, std::chrono::milliseconds timeout) {
  check_usable();
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = queued_;
  }
  wait_for(last, Clock::now() + timeout_);
  ncclComm_t child = nullptr;
  meshcclConfig_t config = comm_config(timeout);
  check("ncclCommSplit", ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config.nccl));
  return child;
}

c10::intrusive_ptr<WorkMeshccl> ProcessGroupMeshccl::make_work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                               std::vector<at::Tensor> keep,
                                                               std::function<void()> finish) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++queued_;
    std::vector<at::Tensor> held = outputs;
    held.insert(held.end(), keep.begin(), keep.end());
    held_.emplace_back(seq, std::move(held));
  }
  // Earlier work that finished meanwhile lets go of its tensors (not while
  // coalescing: the group's calls are recorded, not yet on the stream).
  bool coalescing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    coalescing = coalescing_;
  }
  if (!coalescing && meshcclStreamQuery(stream_) == ncclSuccess) {
    std::lock_guard<std::mutex> lock(mu_);
    advance_locked(seq);
  }
  auto work = c10::make_intrusive<WorkMeshccl>(c10::intrusive_ptr<ProcessGroupMeshccl>::reclaim_copy(this), type, seq,
                                               std::move(outputs), std::move(finish));
  for (auto& t : keep) work->keep(t);
  return work;
}

at::Tensor ProcessGroupMeshccl::take_stage(int64_t numel, const at::Tensor& like, at::Tensor* buffer) {
  const int64_t nbytes = std::max<int64_t>(numel * static_cast<int64_t>(like.element_size()), 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stage_.defined() && stage_.numel() >= nbytes && stage_free_ && stage_free_->load()) {
      *buffer = std::move(stage_);
      stage_ = at::Tensor();
    }
  }
  if (!buffer->defined()) *buffer = at::empty({nbytes}, at::kByte);
  return buffer->narrow(0, 0, numel * static_cast<int64_t>(like.element_size())).view(like.scalar_type());
}

void ProcessGroupMeshccl::return_stage(at::Tensor buffer, const c10::intrusive_ptr<WorkMeshccl>& work) {
  constexpr int64_t kMaxCached = int64_t{1} << 30;
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer.numel() > kMaxCached) return;
  if (!stage_.defined() || buffer.numel() >= stage_.numel()) {
    stage_ = std::move(buffer);
    stage_free_ = work->settled_;
  }
}

void ProcessGroupMeshccl::advance_locked(uint64_t last) {
  completed_ = std::max(completed_, last);
  while (!held_.empty() && held_.front().first <= completed_) held_.pop_front();
}

bool ProcessGroupMeshccl::done_through(uint64_t seq) {
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (completed_ >= seq) return true;
    if (coalescing_) return false;  // recorded, not yet launched
    last = queued_;
  }
  ncclResult_t r = meshcclStreamQuery(stream_);
  if (r == ncclInProgress) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (r != ncclSuccess) {
    if (!error_) error_ = stream_error(r);
    std::rethrow_exception(error_);
  }
  advance_locked(last);
  return completed_ >= seq;
}

void ProcessGroupMeshccl::wait_for(uint64_t seq, Clock::time_point deadline) {
  if (done_through(seq)) return;
  uint64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = queued_;
    deadlines_.push_back(deadline);
  }
  cv_.notify_all();
  ncclResult_t r = meshcclStreamSynchronize(stream_);
  std::lock_guard<std::mutex> lock(mu_);
  deadlines_.erase(std::find(deadlines_.begin(), deadlines_.end(), deadline));
  cv_.notify_all();
  if (r == ncclSuccess) {
    advance_locked(last);
    return;
  }
  if (!error_) {
    error_ = revoked_ ? std::make_exception_ptr(std::runtime_error(
                            "meshccl: an operation did not complete within the process group's timeout (" +
                            std::to_string(timeout_.count()) + " ms); the communicator was aborted"))
                      : stream_error(r);
  }
  std::rethrow_exception(error_);
}

std::exception_ptr ProcessGroupMeshccl::stream_error(ncclResult_t r) {
  // meshcclStreamSynchronize/Query just made the failed operation's own text
  // this thread's last error, wherever it failed (often on the stream's
  // worker thread); the communicator's holds its last failed call.
  const char* last = ncclGetLastError(nullptr);
  if (last == nullptr || *last == '\0') last = ncclGetLastError(comm_);
  const std::string detail = last != nullptr ? last : "";
  // The library names a wait that ran out of MESHCCL_TIMEOUT "timed out: rank
  // R: <operation> made no progress for N s"; its result code is the one for
  // a lost peer, whose text would mislead.
  if (detail.rfind("timed out: ", 0) == 0)
    return std::make_exception_ptr(std::runtime_error("meshccl: operation " + detail));
  return std::make_exception_ptr(std::runtime_error(std::string("meshccl: operation failed: ") + ncclGetErrorString(r) +
                                                    (detail.empty() ? "" : ": ") + detail));
}

// Revokes the communicator when a wait outlives its deadline: the waiting
// call then returns with an error instead of hanging.
void ProcessGroupMeshccl::watchdog_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (deadlines_.empty() || revoked_) {
      cv_.wait(lock);
      continue;
    }
    auto earliest = *std::min_element(deadlines_.begin(), deadlines_.end());
    if (Clock::now() < earliest) {
      cv_.wait_until(lock, earliest);
      continue;
    }
    revoked_ = true;
    lock.unlock();
    (void)ncclCommRevoke(comm_, NCCL_REVOKE_DEFAULT);
    lock.lock();
  }
}

ncclRedOp_t ProcessGroupMeshccl::red_op(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool is_bool = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return is_bool ? ncclMax : ncclSum;
    case c10d::ReduceOp::PRODUCT: return is_bool ? ncclMin : ncclProd;
    case c10d::ReduceOp::MIN: return ncclMin;
    case c10d::ReduceOp::MAX: return ncclMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!is_bool, "meshccl: ReduceOp.AVG is not defined for bool tensors");
      return ncclAvg;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(sup != nullptr, "meshccl: PREMUL_SUM without a factor (make it with _make_nccl_premul_sum)");
      TORCH_CHECK(at::isFloatingType(t.scalar_type()), "meshccl: PREMUL_SUM needs a floating-point tensor (got ",
                  t.scalar_type(), ")");
      at::Tensor scalar = sup->tensor_factors.empty()
                              ? at::scalar_tensor(sup->double_factor, at::TensorOptions().dtype(t.scalar_type()))
                              : sup->tensor_factors[0].to(at::kCPU, t.scalar_type()).contiguous();
      TORCH_CHECK(scalar.numel() == 1, "meshccl: a PREMUL_SUM factor tensor must have one element");
      std::lock_guard<std::mutex> lock(ops_mu_);
      release_ops();
      ncclRedOp_t r;
      check("ncclRedOpCreatePreMulSum",
            ncclRedOpCreatePreMulSum(&r, scalar.data_ptr(), reduce_type(t), ncclScalarHostImmediate, comm_));
      premul_ops_.push_back(r);
      return r;
    }
    default:
      TORCH_CHECK(false, "meshccl: reduction op ", static_cast<int>(op.op_),
                  " is not supported (NCCL has SUM, PRODUCT, MIN, MAX, AVG and PREMUL_SUM)");
  }
}

// PreMulSum ops stay alive until the stream has run every call that uses them.
// Called with ops_mu_ held.
void ProcessGroupMeshccl::release_ops() {
  if (premul_ops_.empty() || coalescing_ || meshcclStreamQuery(stream_) != ncclSuccess) return;
  for (ncclRedOp_t op : premul_ops_) (void)ncclRedOpDestroy(op, comm_);
  premul_ops_.clear();
}

// ----------------------------------------------------------------- operations

void ProcessGroupMeshccl::startCoalescing() {
  check_usable();
  check("ncclGroupStart", ncclGroupStart());
  std::lock_guard<std::mutex> lock(mu_);
  coalescing_ = true;
}

void ProcessGroupMeshccl::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*reqs*/) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    coalescing_ = false;
  }
  check("ncclGroupEnd", ncclGroupEnd());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  check_usable();
  at::Tensor& t = single(tensors, "broadcast");
  check_tensor(t, "broadcast tensor", true);
  check("ncclBroadcast", ncclBroadcast(t.data_ptr(), t.data_ptr(), bytes(t), ncclUint8, static_cast<int>(opts.rootRank),
                                       comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::BROADCAST, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  check_usable();
  at::Tensor& t = single(tensors, "allreduce");
  if (t.defined() && t.layout() == at::kSparse) return sparse_allreduce(t, opts);
  check_tensor(t, "allreduce tensor", true);
  ncclDataType_t dt = reduce_type(t);
  ncclRedOp_t op = red_op(opts.reduceOp, t);
  check("ncclAllReduce", ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::ALLREDUCE, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::sparse_allreduce(at::Tensor& t,
                                                                     const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "meshccl: a sparse all_reduce sums (ReduceOp.SUM), as Gloo's does");
  TORCH_CHECK(t.device().is_cpu(), "meshccl: allreduce tensor must be a CPU tensor (got ", t.device(), ")");
  const at::Tensor in = t.coalesce();
  const int64_t nnz = in._nnz();
  at::Tensor counts = at::empty({size_}, at::kLong);
  at::Tensor mine = at::full({1}, nnz, at::kLong);
  check("ncclAllGather",
        ncclAllGather(mine.data_ptr(), counts.data_ptr(), sizeof(int64_t), ncclUint8, comm_, as_cuda(stream_)));
  make_work(c10d::OpType::ALLGATHER, {counts}, {mine})->wait();
  const int64_t most = counts.max().item<int64_t>();
  // Every rank's indices (sparse_dim x nnz) and values (nnz x dense dims),
  // padded to the largest nnz so that one all-gather moves each.
  at::Tensor idx = at::zeros({in.sparse_dim(), most}, at::kLong);
  std::vector<int64_t> val_shape = in._values().sizes().vec();
  val_shape[0] = most;
  at::Tensor val = at::zeros(val_shape, in._values().options());
  idx.narrow(1, 0, nnz).copy_(in._indices());
  val.narrow(0, 0, nnz).copy_(in._values());
  std::vector<int64_t> all_shape{size_};
  all_shape.insert(all_shape.end(), val_shape.begin(), val_shape.end());
  at::Tensor idx_all = at::empty({size_, in.sparse_dim(), most}, at::kLong);
  at::Tensor val_all = at::empty(all_shape, val.options());
  if (most > 0) {
    {
      GroupGuard group;
      check("ncclAllGather",
            ncclAllGather(idx.data_ptr(), idx_all.data_ptr(), bytes(idx), ncclUint8, comm_, as_cuda(stream_)));
      check("ncclAllGather",
            ncclAllGather(val.data_ptr(), val_all.data_ptr(), bytes(val), ncclUint8, comm_, as_cuda(stream_)));
      check("ncclGroupEnd", group.end());
    }
    make_work(c10d::OpType::ALLGATHER, {idx_all, val_all}, {idx, val})->wait();
  }
  std::vector<at::Tensor> idx_parts, val_parts;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = counts[r].item<int64_t>();
    idx_parts.push_back(idx_all[r].narrow(1, 0, n));
    val_parts.push_back(val_all[r].narrow(0, 0, n));
  }
  at::Tensor sum = at::sparse_coo_tensor(at::cat(idx_parts, 1), at::cat(val_parts, 0), in.sizes(), in.options());
  t.copy_(sum.coalesce());
  auto work = c10::make_intrusive<LocalWork>(rank_, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{t}, timeout_);
  work->done();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  check_usable();
  TORCH_CHECK(!tensors.empty(), "meshccl: allreduce_coalesced needs at least one tensor");
  std::vector<at::Tensor> flat_parts;
  for (auto& t : tensors) {
    check_tensor(t, "allreduce_coalesced tensor", true);
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "meshccl: allreduce_coalesced tensors must share one dtype");
    flat_parts.push_back(t.reshape({-1}));
  }
  int64_t total = 0;
  for (auto& t : flat_parts) total += t.numel();
  at::Tensor buffer;
  at::Tensor flat = take_stage(total, tensors[0], &buffer);
  at::cat_out(flat, flat_parts);
  ncclRedOp_t op = red_op(opts.reduceOp, flat);
  check("ncclAllReduce",
        ncclAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(), reduce_type(flat), op, comm_, as_cuda(stream_)));
  std::vector<at::Tensor> outs = tensors;
  auto work = make_work(c10d::OpType::ALLREDUCE_COALESCED, outs, {buffer}, [outs, flat]() {
    int64_t off = 0;
    for (const auto& t : outs) {
      t.view({-1}).copy_(flat.narrow(0, off, t.numel()));
      off += t.numel();
    }
  });
  return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  check_usable();
  at::Tensor& t = single(tensors, "reduce");
  check_tensor(t, "reduce tensor", true);
  ncclDataType_t dt = reduce_type(t);
  ncclRedOp_t op = red_op(opts.reduceOp, t);
  check("ncclReduce", ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, op, static_cast<int>(opts.rootRank), comm_,
                                 as_cuda(stream_)));
  return make_work(c10d::OpType::REDUCE, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions& /*opts*/) {
  check_usable();
  check_tensor(input, "all_gather input", false);
  check_tensor(output, "all_gather output", false);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "meshccl: all_gather output dtype ", output.scalar_type(),
              " differs from the input's ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * size_, "meshccl: all_gather output has ", output.numel(),
              " elements; it needs world size x input = ", input.numel() * size_);
  check("ncclAllGather",
        ncclAllGather(input.data_ptr(), output.data_ptr(), bytes(input), ncclUint8, comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::_ALLGATHER_BASE, {output}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions& /*opts*/) {
  check_usable();
  at::Tensor& in = single(inputs, "allgather");
  check_tensor(in, "all_gather input", false);
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
              "meshccl: all_gather needs one output list of world size (", size_, ") tensors");
  for (auto& o : outputs[0]) {
    check_tensor(o, "all_gather output", true);
    check_same(in, o, "all_gather output");
  }
  if (char* direct = back_to_back(outputs[0])) {  // chunks of one tensor: no staging
    check("ncclAllGather", ncclAllGather(in.data_ptr(), direct, bytes(in), ncclUint8, comm_, as_cuda(stream_)));
    return make_work(c10d::OpType::ALLGATHER, outputs[0], {in});
  }
  at::Tensor buffer;
  at::Tensor flat = take_stage(size_ * in.numel(), in, &buffer);
  check("ncclAllGather", ncclAllGather(in.data_ptr(), flat.data_ptr(), bytes(in), ncclUint8, comm_, as_cuda(stream_)));
  std::vector<at::Tensor> outs = outputs[0];
  const int64_t n = in.numel();
  auto work = make_work(c10d::OpType::ALLGATHER, outs, {in, buffer}, [outs, flat, n]() {
    for (size_t i = 0; i < outs.size(); ++i) outs[i].copy_(flat.narrow(0, i * n, n).view(outs[i].sizes()));
  });
  return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                        std::vector<at::Tensor>& inputs,
                                                                        const c10d::AllgatherOptions& /*opts*/) {
  check_usable();
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "meshccl: allgather_coalesced needs world size (", size_,
              ") output lists, got ", outputs.size());
  size_t total = 0;  // bytes of this rank's inputs, packed
  for (auto& in : inputs) {
    check_tensor(in, "allgather_coalesced input", false);
    total += bytes(in);
  }
  for (auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "meshccl: allgather_coalesced: an output list has ", list.size(),
                " tensors for ", inputs.size(), " inputs");
    for (size_t k = 0; k < list.size(); ++k) {
      check_tensor(list[k], "allgather_coalesced output", true);
      check_same(inputs[k], list[k], "allgather_coalesced output");
    }
  }
  // One staging buffer: this rank's inputs packed, then every rank's packs.
  at::Tensor buffer;
  at::Tensor flat = take_stage(static_cast<int64_t>((size_ + 1) * total), at::empty({0}, at::kByte), &buffer);
  char* base = ptr(flat);
  size_t off = 0;
  for (auto& in : inputs) {
    if (bytes(in) > 0) std::memcpy(base + off, in.data_ptr(), bytes(in));
    off += bytes(in);
  }
  check("ncclAllGather", ncclAllGather(base, base + total, total, ncclUint8, comm_, as_cuda(stream_)));
  std::vector<at::Tensor> outs;
  for (auto& list : outputs) outs.insert(outs.end(), list.begin(), list.end());
  auto work = make_work(c10d::OpType::ALLGATHER_COALESCED, outs, {buffer}, [outs, base, total]() {
    size_t at = total;
    for (const at::Tensor& o : outs) {
      at::Tensor dst = o.is_contiguous() ? o : at::empty(o.sizes(), o.options());
      if (bytes(o) > 0) std::memcpy(dst.data_ptr(), base + at, bytes(o));
      if (!o.is_contiguous()) const_cast<at::Tensor&>(o).copy_(dst);
      at += bytes(o);
    }
  });
  return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::GatherOptions& opts) {
  check_usable();
  at::Tensor& in = single(inputs, "gather");
  check_tensor(in, "gather input", false);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "meshccl: gather root ", root, " is not a rank of this group");
  at::Tensor flat, buffer;
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "meshccl: gather needs one output list of world size (", size_, ") tensors on the root");
    for (auto& o : outputs[0]) {
      check_tensor(o, "gather output", true);
      check_same(in, o, "gather output");
    }
    outs = outputs[0];
    if (char* direct = back_to_back(outs)) {  // chunks of one tensor: no staging
      check("ncclGather", ncclGather(in.data_ptr(), direct, bytes(in), ncclUint8, root, comm_, as_cuda(stream_)));
      return make_work(c10d::OpType::GATHER, outs, {in});
    }
    flat = take_stage(size_ * in.numel(), in, &buffer);
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "meshccl: gather outputs are given on the root only");
  }
  check("ncclGather", ncclGather(in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, bytes(in), ncclUint8, root,
                                 comm_, as_cuda(stream_)));
  const int64_t n = in.numel();
  std::function<void()> finish;
  if (flat.defined()) {
    finish = [outs, flat, n]() {
      for (size_t i = 0; i < outs.size(); ++i) outs[i].copy_(flat.narrow(0, i * n, n).view(outs[i].sizes()));
    };
  }
  auto work = make_work(c10d::OpType::GATHER, outs, {in, flat.defined() ? buffer : in}, finish);
  if (buffer.defined()) return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ScatterOptions& opts) {
  check_usable();
  at::Tensor& out = single(outputs, "scatter");
  check_tensor(out, "scatter output", false);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "meshccl: scatter root ", root, " is not a rank of this group");
  at::Tensor flat, buffer;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "meshccl: scatter needs one input list of world size (", size_, ") tensors on the root");
    flat = take_stage(size_ * out.numel(), out, &buffer);
    for (int i = 0; i < size_; ++i) {
      const at::Tensor& t = inputs[0][i];
      TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided,
                  "meshccl: scatter inputs must be dense CPU tensors");
      check_same(out, t, "scatter input");
      flat.narrow(0, i * out.numel(), out.numel()).copy_(t.reshape({-1}));
    }
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "meshccl: scatter inputs are given on the root only");
  }
  check("ncclScatter", ncclScatter(flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(), bytes(out), ncclUint8,
                                   root, comm_, as_cuda(stream_)));
  auto work = make_work(c10d::OpType::SCATTER, {out}, {flat.defined() ? buffer : out});
  if (buffer.defined()) return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  check_usable();
  check_tensor(input, "reduce_scatter input", false);
  check_tensor(output, "reduce_scatter output", false);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "meshccl: reduce_scatter output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * size_, "meshccl: reduce_scatter input has ", input.numel(),
              " elements; it needs world size x output = ", output.numel() * size_);
  ncclRedOp_t op = red_op(opts.reduceOp, input);
  check("ncclReduceScatter", ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(), reduce_type(input),
                                               op, comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  check_usable();
  at::Tensor& out = single(outputs, "reduce_scatter");
  check_tensor(out, "reduce_scatter output", false);
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
              "meshccl: reduce_scatter needs one input list of world size (", size_, ") tensors");
  const int64_t n = out.numel();
  at::Tensor buffer;
  at::Tensor flat = take_stage(size_ * n, out, &buffer);
  for (int i = 0; i < size_; ++i) {
    const at::Tensor& t = inputs[0][i];
    TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided,
                "meshccl: reduce_scatter inputs must be dense CPU tensors");
    check_same(out, t, "reduce_scatter input");
    flat.narrow(0, i * n, n).copy_(t.reshape({-1}));
  }
  ncclRedOp_t op = red_op(opts.reduceOp, out);
  check("ncclReduceScatter",
        ncclReduceScatter(flat.data_ptr(), out.data_ptr(), n, reduce_type(out), op, comm_, as_cuda(stream_)));
  auto work = make_work(c10d::OpType::REDUCE_SCATTER, {out}, {buffer});
  return_stage(buffer, work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                  std::vector<int64_t>& outputSplits,
                                                                  std::vector<int64_t>& inputSplits,
                                                                  const c10d::AllToAllOptions& /*opts*/) {
  check_usable();
  check_tensor(input, "all_to_all input", false);
  check_tensor(output, "all_to_all output", false);
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "meshccl: all_to_all output dtype ", output.scalar_type(),
              " differs from the input's ", input.scalar_type());
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % size_ == 0, "meshccl: all_to_all_single of ",
                input.numel(), " elements into ", output.numel(), ": both must be equal and divisible by ", size_);
    check("ncclAlltoAll",
          ncclAlltoAll(input.data_ptr(), output.data_ptr(), bytes(input) / size_, ncclUint8, comm_, as_cuda(stream_)));
    return make_work(c10d::OpType::ALLTOALL_BASE, {output}, {input});
  }
  // Uneven splits along dimension 0: one send and one receive per peer.
  auto offsets = [&](const at::Tensor& t, std::vector<int64_t>& splits, const char* what) {
    TORCH_CHECK(t.dim() > 0, "meshccl: all_to_all_single ", what, " with splits must have a dimension 0");
    const int64_t rows = t.size(0);
    const size_t row_bytes = rows > 0 ? bytes(t) / rows : 0;
    std::vector<std::pair<size_t, size_t>> v(size_);  // byte offset, byte count
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "meshccl: all_to_all_single ", what, " of ", rows,
                  " rows without splits must divide by ", size_);
      for (int p = 0; p < size_; ++p) v[p] = {p * (rows / size_) * row_bytes, (rows / size_) * row_bytes};
      return v;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, "meshccl: all_to_all_single ", what, " splits have ",
                splits.size(), " entries for ", size_, " ranks");
    int64_t off = 0;
    for (int p = 0; p < size_; ++p) {
      TORCH_CHECK(splits[p] >= 0, "meshccl: all_to_all_single ", what, " split ", splits[p], " is negative");
      v[p] = {off * row_bytes, splits[p] * row_bytes};
      off += splits[p];
    }
    TORCH_CHECK(off == rows, "meshccl: all_to_all_single ", what, " splits add up to ", off, " rows of ", rows);
    return v;
  };
  auto in_off = offsets(input, inputSplits, "input");
  auto out_off = offsets(output, outputSplits, "output");
  {
    GroupGuard group;
    for (int p = 0; p < size_; ++p) {
      if (in_off[p].second > 0)
        check("ncclSend",
              ncclSend(ptr(input) + in_off[p].first, in_off[p].second, ncclUint8, p, comm_, as_cuda(stream_)));
      if (out_off[p].second > 0)
        check("ncclRecv",
              ncclRecv(ptr(output) + out_off[p].first, out_off[p].second, ncclUint8, p, comm_, as_cuda(stream_)));
    }
    check("ncclGroupEnd", group.end());
  }
  return make_work(c10d::OpType::ALLTOALL_BASE, {output}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& /*opts*/) {
  check_usable();
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "meshccl: all_to_all needs world size (", size_, ") input and output tensors");
  for (int p = 0; p < size_; ++p) {
    check_tensor(inputs[p], "all_to_all input", false);
    check_tensor(outputs[p], "all_to_all output", false);
    TORCH_CHECK(inputs[p].scalar_type() == outputs[p].scalar_type(), "meshccl: all_to_all tensors differ in dtype");
  }
  {
    GroupGuard group;
    for (int p = 0; p < size_; ++p) {
      if (bytes(inputs[p]) > 0)
        check("ncclSend", ncclSend(inputs[p].data_ptr(), bytes(inputs[p]), ncclUint8, p, comm_, as_cuda(stream_)));
      if (bytes(outputs[p]) > 0)
        check("ncclRecv", ncclRecv(outputs[p].data_ptr(), bytes(outputs[p]), ncclUint8, p, comm_, as_cuda(stream_)));
    }
    check("ncclGroupEnd", group.end());
  }
  return make_work(c10d::OpType::ALLTOALL, outputs, inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  check_usable();
  at::Tensor& t = single(tensors, "send");
  check_tensor(t, "send tensor", true);
  if (dst == rank_) return self_send(t, tag);
  // Tag 0 (torch's default) keeps NCCL's order; another tag matches the
  // peer's receive with that tag, in any order, as Gloo's do.
  if (tag == 0) check("ncclSend", ncclSend(t.data_ptr(), bytes(t), ncclUint8, dst, comm_, as_cuda(stream_)));
  else
    check("meshcclSendTagged", meshcclSendTagged(t.data_ptr(), bytes(t), ncclUint8, dst, tag, comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::SEND, {}, {t});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  check_usable();
  at::Tensor& t = single(tensors, "recv");
  check_tensor(t, "recv tensor", true);
  if (src == rank_) return self_recv(t, tag);
  if (tag == 0) check("ncclRecv", ncclRecv(t.data_ptr(), bytes(t), ncclUint8, src, comm_, as_cuda(stream_)));
  else
    check("meshcclRecvTagged", meshcclRecvTagged(t.data_ptr(), bytes(t), ncclUint8, src, tag, comm_, as_cuda(stream_)));
  return make_work(c10d::OpType::RECV, {t});
}

// From any other rank (meshcclRecvAnySource): tag 0 takes what ncclSend
// sent, another tag what meshcclSendTagged sent with it, as send() does.
c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_usable();
  at::Tensor& t = single(tensors, "recv");
  check_tensor(t, "recv tensor", true);
  auto source = std::make_shared<int>(-1);  // written when the receive completes, on the stream
  if (tag == 0)
    check("meshcclRecvAnySource",
          meshcclRecvAnySource(t.data_ptr(), bytes(t), ncclUint8, source.get(), comm_, as_cuda(stream_)));
  else
    check("meshcclRecvTaggedAnySource",
          meshcclRecvTaggedAnySource(t.data_ptr(), bytes(t), ncclUint8, tag, source.get(), comm_, as_cuda(stream_)));
  auto work = make_work(c10d::OpType::RECVANYSOURCE, {t});
  work->source_ = std::move(source);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::self_send(const at::Tensor& t, int tag) {
  c10::intrusive_ptr<LocalWork> waiting;
  {
    std::lock_guard<std::mutex> lock(self_mu_);
    auto it = self_waiting_.find(tag);
    if (it != self_waiting_.end() && !it->second.empty()) {
      waiting = std::move(it->second.front());
      it->second.pop_front();
    } else {
      self_sent_[tag].push_back(t.clone());  // read now: the caller may reuse t once the send is complete
    }
  }
  if (waiting) waiting->deliver(t);
  auto work = c10::make_intrusive<LocalWork>(rank_, c10d::OpType::SEND, std::vector<at::Tensor>{}, timeout_);
  work->done();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::self_recv(at::Tensor& t, int tag) {
  auto work = c10::make_intrusive<LocalWork>(rank_, c10d::OpType::RECV, std::vector<at::Tensor>{t}, timeout_);
  at::Tensor sent;
  {
    std::lock_guard<std::mutex> lock(self_mu_);
    auto it = self_sent_.find(tag);
    if (it != self_sent_.end() && !it->second.empty()) {
      sent = std::move(it->second.front());
      it->second.pop_front();
    } else {
      self_waiting_[tag].push_back(work);
    }
  }
  if (sent.defined()) work->deliver(sent);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMeshccl::barrier(const c10d::BarrierOptions& /*opts*/) {
  check_usable();
  check("ncclAllReduce", ncclAllReduce(barrier_buf_.data_ptr(), barrier_buf_.data_ptr(), 1, ncclUint8, ncclMax, comm_,
                                       as_cuda(stream_)));
  return make_work(c10d::OpType::BARRIER, {});
}

}  // namespace meshccl_torch
