// A torch.distributed process group (torch 1.13's c10d::ProcessGroup) whose
// operations run on a meshccl communicator through the public NCCL API, queued
// on a meshccl host stream so that async_op=True overlaps with the caller.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <meshccl/meshccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace meshccl_torch {

class ProcessGroupMeshccl;

// One operation handed to the stream. Completion is observed on the stream as a
// whole (it runs in order): the work is complete once everything queued up to
// it has finished. `finish_` (copies out of a staging buffer) runs once, on the
// first observation of completion.
class WorkMeshccl : public c10d::Work {
 public:
  WorkMeshccl(c10::intrusive_ptr<ProcessGroupMeshccl> pg, c10d::OpType type, uint64_t seq,
              std::vector<at::Tensor> outputs, std::function<void()> finish);
  ~WorkMeshccl() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override { wait(); }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A receive from any source: the rank it received from, once complete.
  int sourceRank() const override;

  // Keeps tensors alive until the work completes (inputs, staging buffers).
  void keep(const at::Tensor& t) { keep_.push_back(t); }
  // Waits (bounded by the group's timeout) and settles; for the thread that
  // completes futures.
  void complete_in_background();

 private:
  friend class ProcessGroupMeshccl;
  // Records the outcome once (runs finish_ on success, completes the future).
  void settle(std::exception_ptr error);

  c10::intrusive_ptr<ProcessGroupMeshccl> pg_;
  const uint64_t seq_;
  const std::chrono::steady_clock::time_point start_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> finish_;
  std::shared_ptr<int> source_;  // a receive from any source: set by the library when it completes
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // Set once settled: a staging buffer this work used may be reused.
  std::shared_ptr<std::atomic<bool>> settled_ = std::make_shared<std::atomic<bool>>(false);
};

// Work that completes outside the stream: already done (a synchronous sparse
// all_reduce, a send to this rank itself), or a receive from this rank itself
// that completes when the matching send arrives. wait() is bounded by the
// group's timeout.
class LocalWork : public c10d::Work {
 public:
  LocalWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout)
      : c10d::Work(rank, type), outputs_(std::move(outputs)), timeout_(timeout) {}
  // Marks it complete (with an error, when given).
  void done(std::exception_ptr error = nullptr) { finish(std::move(error)); }
  // A receive: copies src into its tensor and completes.
  void deliver(const at::Tensor& src);
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
};

class ProcessGroupMeshccl : public c10d::ProcessGroup {
 public:
  // Creates a communicator of `size` ranks: rank 0 makes the unique id and sets
  // it in `store`, the others get it from there.
  ProcessGroupMeshccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout);
  // Takes ownership of a communicator made by ncclCommSplit.
  ProcessGroupMeshccl(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout);
  ~ProcessGroupMeshccl() override;

  const std::string getBackendName() const override { return "meshccl"; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // ncclCommSplit of this group's communicator for a group with `timeout`;
  // every rank of this group must call it (color < 0: not a member, returns
  // nullptr).
  ncclComm_t split(int color, int key, std::chrono::milliseconds timeout);

  // At interpreter exit: waits a short while for the work queued on this
  // group, then revokes the communicator, so that no thread of the library
  // reads or writes a tensor once Python frees it. Later calls raise.
  void shutdown();

  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  friend class WorkMeshccl;

  void start();
  // all_reduce of a sparse COO tensor, as Gloo does it: every rank's indices
  // and values all-gathered (padded to the largest nnz), summed here.
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t, const c10d::AllreduceOptions& opts);
  // Point-to-point with this rank itself, matched by tag in a local mailbox
  // (nothing goes through the stream, so a send never waits for a receive
  // queued behind it).
  c10::intrusive_ptr<c10d::Work> self_send(const at::Tensor& t, int tag);
  c10::intrusive_ptr<c10d::Work> self_recv(at::Tensor& t, int tag);
  // The error for a failed stream: a timeout named as one, otherwise the
  // library's result and message.
  std::exception_ptr stream_error(ncclResult_t r);
  // Throws (a RuntimeError in Python) with the call, the result and the
  // communicator's last error.
  [[noreturn]] void fail(const char* call, ncclResult_t r);
  void check(const char* call, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) fail(call, r);
  }
  void check_usable();
  // Wraps what was just queued on the stream into a work object.
  c10::intrusive_ptr<WorkMeshccl> make_work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                            std::vector<at::Tensor> keep = {}, std::function<void()> finish = nullptr);
  // A staging tensor of `numel` elements of `like`'s dtype, carved from the
  // group's cached buffer when the work that used it last has settled (fresh
  // pages cost more than the copy); `buffer` receives the whole buffer, to be
  // handed back with the work that now uses it.
  at::Tensor take_stage(int64_t numel, const at::Tensor& like, at::Tensor* buffer);
  void return_stage(at::Tensor buffer, const c10::intrusive_ptr<WorkMeshccl>& work);

  // Waits until the stream has run everything up to work `seq`, at most until
  // `deadline` (then the communicator is revoked). Throws on error.
  void wait_for(uint64_t seq, std::chrono::steady_clock::time_point deadline);
  bool done_through(uint64_t seq);
  // The stream has run everything up to work `last`: its tensors are let go.
  void advance_locked(uint64_t last);
  void watchdog_loop();
  // The reduction op for `t`'s dtype (bool sums are ORs, as in torch's NCCL
  // group); a PreMulSum op is created here and released once the stream is idle.
  ncclRedOp_t red_op(const c10d::ReduceOp& op, const at::Tensor& t);
  void release_ops();

  ncclComm_t comm_ = nullptr;
  meshcclStream_t stream_ = nullptr;
  const std::chrono::milliseconds timeout_;
  at::Tensor barrier_buf_;
  bool coalescing_ = false;
  std::mutex ops_mu_;  // guards premul_ops_
  std::vector<ncclRedOp_t> premul_ops_;
  at::Tensor stage_;                               // cached staging buffer (bytes), guarded by mu_
  std::shared_ptr<std::atomic<bool>> stage_free_;  // its last user has settled

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  uint64_t queued_ = 0;     // works handed to the stream
  uint64_t completed_ = 0;  // works known complete
  // The tensors of works not known complete, by work: the stream reads and
  // writes them whether or not Python still holds the work or the tensors.
  std::deque<std::pair<uint64_t, std::vector<at::Tensor>>> held_;
  std::exception_ptr error_;  // the stream's failure; every later call throws it
  bool revoked_ = false;      // the watchdog revoked the communicator
  bool stop_ = false;
  std::vector<std::chrono::steady_clock::time_point> deadlines_;  // waits in progress
  std::thread watchdog_;

  std::mutex self_mu_;                                                     // guards the mailbox of sends to this rank
  std::map<int, std::deque<at::Tensor>> self_sent_;                        // by tag, oldest first
  std::map<int, std::deque<c10::intrusive_ptr<LocalWork>>> self_waiting_;  // receives posted first
};

// Registers a new group for shutdown_all; returns it.
c10::intrusive_ptr<ProcessGroupMeshccl> track(c10::intrusive_ptr<ProcessGroupMeshccl> group);
// shutdown() of every live meshccl group.
void shutdown_all();

// The config of a group's communicator: its library timeout a little past the
// group's (unless the user set MESHCCL_TIMEOUT), so that the library's own
// no-progress limit never ends a wait before the group's watchdog does.
meshcclConfig_t comm_config(std::chrono::milliseconds timeout);

}  // namespace meshccl_torch
