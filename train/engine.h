// The training loop of one rank: pipeline schedule over micro-batches,
// data-parallel gradient buckets overlapped with backward, clipping, AdamW,
// validation and sharded checkpoints. With dp = pp = tp = 1 every Comm pointer
// is null and the engine never calls meshccl.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "comm.h"
#include "data.h"
#include "grid.h"
#include "model.h"
#include "optim.h"
#include "pipe.h"
#include "schedule.h"

namespace meshtrain {

struct TrainConfig {
  ModelConfig model;
  Layout layout;
  OptimConfig optim;
  int micro_batch = 4;  // sequences per micro-batch
  int grad_accum = 1;   // micro-batches per data-parallel rank per step
  int steps = 10;
  PipeSchedule schedule = PipeSchedule::OneFOneB;
  size_t bucket_elems = size_t(1) << 18;       // data-parallel all-reduce bucket (floats)
  CommSched comm_sched = CommSched::Priority;  // --comm-sched (comm.h)
  // --overlap-update: step s's AdamW update runs tensor by tensor as its
  // data-parallel buckets land, during step s + 1's forward (needs --clip 0
  // and 1D; see docs/training.md).
  bool overlap_update = false;
  uint64_t data_seed = 1234;
  int val_every = 0;       // 0: never
  int val_sequences = 16;  // global, split over data-parallel ranks
  std::string ckpt_dir;    // empty: no checkpoints
  int ckpt_every = 0;
  int ckpt_keep = 0;  // keep this many newest checkpoints (0: all)

  int global_batch() const { return layout.dp * micro_batch * grad_accum; }
};

// Communicators of one rank, null where the dimension has size 1 (world is
// null only for a single-rank job, embed only without a tied split embedding).
struct Comms {
  Comm* world = nullptr;
  Comm* dp = nullptr;
  Pipe* pp = nullptr;
  Comm* tp = nullptr;  // the whole tensor-parallel group
  Comm* embed = nullptr;
  Comm* cube[3] = {nullptr, nullptr, nullptr};  // 3D: along the I, W and O axes (CubeAxis)
};

struct StepStats {
  int step = 0;
  float loss = 0;  // mean over the global batch (known on every rank)
  float lr = 0;
  float grad_norm = 0;  // before clipping
  int norm_step = 0;    // the step grad_norm belongs to (--overlap-update: the previous one, -1: none yet)
  double seconds = 0;
  double comm_wait = 0;  // seconds this rank was blocked on communication
  double tokens_per_s = 0;
};

class Engine {
 public:
  Engine(const TrainConfig& cfg, int rank, const Comms& comms, const Corpus& corpus);

  // Runs 0-based step `step` (its data and learning rate depend only on it).
  // With overlap_update its update is left pending (see settle()).
  StepStats train_step(int step);
  // Completes a pending update: waits for every bucket, updates what is left
  // and checks the step's gradient norm (throws on every rank when it is not
  // finite). Collective; validate, save_checkpoint and sample call it first.
  // Returns that norm (NaN when nothing was pending).
  double settle();
  // Mean validation loss over cfg.val_sequences held-out sequences.
  float validate();
  // Checks that every rank can write to the checkpoint directory (creating
  // it) and removes temporary files a killed save left. Collective.
  void prepare_checkpoints();
  // Writes the checkpoint after 0-based step `step`, named step_<step + 1>
  // as the progress lines count: every rank its shard (temporary name, then
  // rename), then rank 0 points `latest` at it once all shards exist and
  // removes checkpoints beyond ckpt_keep. Collective; a failure on any rank
  // throws on every rank.
  void save_checkpoint(int step);
  // Loads the checkpoint `latest` names and returns the number of steps done.
  // Throws (on every rank) when there is none, `latest` is not a checkpoint
  // name, the directory, the step's directory, `latest` or a shard is not
  // this user's or open to writes by others (or not a regular file), or a
  // shard does not fit this run (model, layout), is damaged (size, checksum)
  // or holds non-finite values; the engine is unchanged then. The saved
  // learning-rate schedule replaces this run's when they differ
  // (schedule_note() then says so).
  int load_checkpoint();
  // The same from a checkpoint saved under another layout with the same
  // pipeline and tensor split (meshtrain --elastic after a data-parallel
  // replica was lost): this rank reads the shard of the rank of replica 0
  // that held its stage and tensor slice (replicas hold identical state).
  int load_checkpoint(const Layout& saved);
  // Generates `length` tokens after `prompt` (greedy when temperature <= 0),
  // as text.
  // Collective: every rank calls it; all ranks return the same text.
  std::string sample(const std::string& prompt, int length, float temperature, uint64_t seed);

  // With overlap_update the last step's update may still be pending: call
  // settle() before reading parameters or moments.
  Stage& stage() { return *stage_; }
  const AdamW& optimizer() const { return opt_; }
  const Coords& coords() const { return me_; }
  // After load_checkpoint: what it changed in this run's learning-rate
  // schedule to keep the checkpoint's ("" when nothing).
  const std::string& schedule_note() const { return schedule_note_; }
  int rank() const { return rank_; }

 private:
  double comm_seconds() const;
  void run_schedule(PipeSchedule sched, int m, bool train, int step, double* loss_sum);
  void launch_bucket(size_t lo);
  StepStats finish_overlapped(int step, double t0, double c0, double loss_sum);
  // --overlap-update: updates the pending step's tensors below `hi`, waiting
  // for the buckets they lie in; once all are done, zeroes the gradients.
  void update_until(size_t hi);
  void wait_range(size_t lo, size_t hi);
  // Sums the pending step's squared norm over tp and pp (collective) and
  // checks it: the norm.
  double reduce_pending_norm();
  void load_micro(bool train, int step, int micro, int m, int32_t* tokens, int32_t* targets);
  // Throws on every rank if `error` is non-empty on any rank.
  void agree(const std::string& error);
  void keep_schedule(const LrSchedule& saved);

  TrainConfig cfg_;
  int rank_;
  Coords me_;
  Comms comms_;
  const Corpus& corpus_;
  std::unique_ptr<Stage> stage_;
  AdamW opt_;
  int slots_ = 1;
  std::vector<int32_t> tokens_, targets_;
  size_t launched_lo_ = 0;
  struct Bucket {
    size_t lo, hi;  // gradient range
    Work work;
    bool done = false;
  };
  std::vector<Bucket> buckets_;  // the step's data-parallel reductions in flight
  // --overlap-update: the step whose update is pending and how far it got.
  bool pending_ = false;       // tensors of the step are not all updated yet
  bool norm_pending_ = false;  // its norm is not reduced yet
  bool poisoned_ = false;      // a non-finite gradient was seen: no further updates
  int pending_step_ = -1;
  size_t next_spec_ = 0;      // specs (arena order) below it are updated
  std::vector<float> parts_;  // spec_grad_sq of each updated tensor
  // The token embedding when its gradient is reduced row-sparse (words, data
  // parallel, first stage, not shared with the head): it lies at the start of
  // the gradient arena, below the dense buckets.
  const ParamSpec* sparse_spec_ = nullptr;
  std::string schedule_note_;
  size_t dense_lo() const { return sparse_spec_ != nullptr ? sparse_spec_->offset + sparse_spec_->size : 0; }
};

}  // namespace meshtrain
