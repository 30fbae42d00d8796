// Comm on meshccl: one communicator per parallel dimension, split from the
// world communicator, with a high-priority host stream for the critical path
// (tensor-parallel all-reduces, pipeline send/recv) and a low-priority one for
// data-parallel gradient buckets.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm.h"
#include "engine.h"
#include "meshccl.h"

namespace meshtrain {

class NcclComm final : public Comm {
 public:
  // Takes ownership of comm (destroyed with this object).
  explicit NcclComm(ncclComm_t comm);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* buf, size_t n, ReduceOp op) override;
  void all_reduce_start(float* buf, size_t n, ReduceOp op) override;
  void all_reduce_finish() override;
  void all_reduce_async(float* buf, size_t n, ReduceOp op) override;
  void wait_async() override;
  void all_reduce_async_at(float* buf, size_t n, ReduceOp op, int priority) override;
  void set_priority(int priority) override;
  void sparse_all_reduce_async(float* buf, size_t rows, size_t row_len, ReduceOp op) override;
  void all_gather(const float* in, float* out, size_t n) override;
  void reduce_scatter(const float* in, float* out, size_t n) override;
  void exchange(const P2POp* ops, int n) override;
  ncclComm_t handle() const { return comm_; }
  // After a failure: aborts the communicator (ending any wait) and forgets
  // it; the object then only frees its streams.
  void abandon();
  // Hands the communicator over (for ncclCommShrink) and forgets it.
  ncclComm_t release();

 private:
  ncclComm_t comm_;
  int rank_ = 0, size_ = 1;
  meshcclStream_t fast_ = nullptr, slow_ = nullptr;
  // all_reduce_async_at's streams, by -priority (made when first used).
  static constexpr int kLevels = 8;
  meshcclStream_t at_[kLevels] = {};
  // The non-zero rows of sparse reductions in flight (kept until wait_async).
  struct SparseRows {
    std::vector<int64_t> index;
    std::vector<float> values;
  };
  std::deque<SparseRows> sparse_;
};

// The pipeline "communicator" of a layout with per-stage tensor-parallel
// degrees: exchange moves activations (to the next stage) and gradients (to
// the previous one) through meshccl reshard plans between the two stages'
// meshes (replicated on each): activations leave asynchronously from a copy,
// the other transfers of a group run on their own streams and are waited for;
// all_reduce sums over the stages, counting each stage once (its tp rank 0's
// value), over the ranks of this data-parallel replica. Peers are stages.
class StagePipe final : public Comm {
 public:
  // replica: the ranks of this data-parallel replica (taken over); act_count:
  // floats per activation; collective over the replica.
  StagePipe(std::unique_ptr<NcclComm> replica, const Layout& layout, int stage, int tp_rank, size_t act_count);
  ~StagePipe() override;
  StagePipe(const StagePipe&) = delete;
  StagePipe& operator=(const StagePipe&) = delete;

  int rank() const override { return stage_; }
  int size() const override { return pp_; }
  void all_reduce(float* buf, size_t n, ReduceOp op) override;
  void all_reduce_start(float* buf, size_t n, ReduceOp op) override;
  void all_reduce_finish() override;
  void all_reduce_async(float* buf, size_t n, ReduceOp op) override;
  void wait_async() override;
  void set_priority(int priority) override;
  void all_gather(const float* in, float* out, size_t n) override;
  void reduce_scatter(const float* in, float* out, size_t n) override;
  void exchange(const P2POp* ops, int n) override;

 private:
  std::unique_ptr<NcclComm> replica_;
  int stage_ = 0, pp_ = 1, tp_rank_ = 0;
  size_t act_count_ = 0;
  std::vector<meshcclReshardPlan_t> act_, grad_;  // act_[s]: stage s -> s+1; grad_[s]: s+1 -> s
  meshcclStream_t streams_[2] = {nullptr, nullptr};
  // Activations go out asynchronously from a copy (a ring of staging
  // buffers, one stream each), so the stage computes while they travel.
  static constexpr int kRing = 4;
  std::vector<float> ring_[kRing];
  meshcclStream_t ring_streams_[kRing] = {};
  int next_ = 0;
};

// The communicators of one rank, split from `world` (which this takes over).
struct RankComms {
  std::unique_ptr<NcclComm> world, dp, tp, embed;
  std::unique_ptr<Comm> pp;
  std::unique_ptr<NcclComm> cube[3];  // 3D tensor parallelism: I, W and O axes
  Comms view() const;
};
// act_count (floats per activation between stages) is needed only by layouts
// with per-stage tensor-parallel degrees.
RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied, size_t act_count = 0);
// Gives every communicator of rc its stream priority under sched (comm.h):
// pipeline, tensor-parallel (and the world's small blocking calls),
// data-parallel (its buckets get theirs per call), embedding gradients.
void set_comm_sched(RankComms& rc, CommSched sched);

// Throws CommError with the call, the result's name and meshccl's last error.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace meshtrain
