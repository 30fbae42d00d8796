// Comm on meshccl: one communicator per parallel dimension, split from the
// world communicator, with a high-priority host stream for the critical path
// (tensor-parallel all-reduces, pipeline send/recv) and a low-priority one for
// data-parallel gradient buckets.
#pragma once

#include <memory>

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
};

// The communicators of one rank, split from `world` (which this takes over).
struct RankComms {
  std::unique_ptr<NcclComm> world, dp, pp, tp, embed;
  std::unique_ptr<NcclComm> cube[3];  // 3D tensor parallelism: I, W and O axes
  Comms view() const;
};
RankComms split_comms(ncclComm_t world, const Layout& layout, bool tied);

// Throws CommError with the call, the result's name and meshccl's last error.
void check_nccl(ncclResult_t r, const char* what, ncclComm_t comm = nullptr);

}  // namespace meshtrain
