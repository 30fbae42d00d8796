// Comm and Pipe on meshccl: one communicator per parallel dimension, split
// from the world communicator. Critical operations run on the communicator's
// own host stream, at the priority of its kind; background ones on a stream
// per priority level (dense and sparse reductions apart). Over the stages it
// is also the pipeline's channel: exchange groups sends and receives on the
// critical stream, sum is a critical all-reduce.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm.h"
#include "engine.h"
#include "meshccl.h"
#include "pipe.h"

namespace meshtrain {

class NcclComm final : public Comm, public Pipe {
 public:
  // Takes ownership of comm (destroyed with this object). priority: the
  // critical stream's (comm_priority of the communicator's kind).
  NcclComm(ncclComm_t comm, int priority);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Work all_reduce(float* buf, size_t n, ReduceOp op, Urgency u) override;
  Work sparse_all_reduce(float* buf, size_t rows, size_t row_len, ReduceOp op, Urgency u) override;
  Work all_gather(const float* in, float* out, size_t n, Urgency u) override;
  Work reduce_scatter(const float* in, float* out, size_t n, Urgency u) override;
  // Peers are ranks of this communicator.
  Work exchange(const P2POp* ops, int n) override;
  Work sum(float* buf, size_t n) override;
  Work flush() override { return Work(); }  // every send completes within its group
  ncclComm_t handle() const { return comm_; }
  // After a failure: aborts the communicator (ending any wait) and forgets
  // it; the object then only frees its streams.
  void abandon();
  // Hands the communicator over (for ncclCommShrink) and forgets it.
  ncclComm_t release();

 private:
  enum Lane { kDense, kSparse };
  // The stream for u (background streams are made when first used).
  meshcclStream_t stream(Urgency u, Lane lane = kDense);
  // The handle of what was started on s: waiting synchronizes s.
  Work pending(meshcclStream_t s);

  ncclComm_t comm_;
  int rank_ = 0, size_ = 1;
  meshcclStream_t critical_ = nullptr;
  // Background streams, by lane and -priority.
  static constexpr int kLevels = 8;
  meshcclStream_t background_[2][kLevels] = {};
  // The non-zero rows of sparse reductions in flight, kept until one on the
  // same stream has been waited for (the stream has then finished them all).
  struct SparseRows {
    meshcclStream_t stream = nullptr;
    std::vector<int64_t> index;
    std::vector<float> values;
  };
  std::deque<SparseRows> sparse_;
};

// The pipeline of a layout with per-stage tensor-parallel degrees: exchange
// moves activations (to the next stage) and gradients (to the previous one)
// through meshccl reshard plans between the two stages' meshes (replicated on
// each): activations leave asynchronously from a copy, the other transfers of
// a group run on their own streams; sum adds over the stages, counting each
// stage once (its tp rank 0's value), over the ranks of this data-parallel
// replica.
class StagePipe final : public Pipe {
 public:
  // replica: the ranks of this data-parallel replica (taken over); act_count:
  // floats per activation; priority: the pipeline's stream priority;
  // collective over the replica.
  StagePipe(std::unique_ptr<NcclComm> replica, const Layout& layout, int stage, int tp_rank, size_t act_count,
            int priority);
  ~StagePipe() override;
  StagePipe(const StagePipe&) = delete;
  StagePipe& operator=(const StagePipe&) = delete;

  Work exchange(const P2POp* ops, int n) override;
  Work sum(float* buf, size_t n) override;
  Work flush() override;

 private:
  // The reshard plan that carries op between this stage and its neighbour.
  meshcclReshardPlan_t plan_of(const P2POp& op) const;

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
  std::unique_ptr<Pipe> pp;
  std::unique_ptr<NcclComm> cube[3];  // 3D tensor parallelism: I, W and O axes
  Comms view() const;
};
// Every communicator's critical stream gets the priority of its kind under
// sched (comm_priority): pipeline; tensor-parallel, and the world's and the
// data-parallel one's small blocking calls (its buckets name theirs per
// call); embedding gradients. act_count (floats per activation between
// stages) is needed only by layouts with per-stage tensor-parallel degrees.
RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied, CommSched sched, size_t act_count = 0);

// Throws CommError with the call, the result's name and meshccl's last error.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace meshtrain
