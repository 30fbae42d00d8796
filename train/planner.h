// The layout planner (DAPPLE, PPoPP 2021; section 6 of the algorithms notes):
// from a per-layer profile and a link model it predicts the step time and
// memory of every dp x pp x tp layout (1D or 3D), stage split and micro-batch
// size, and ranks them. Pure: profiling and link measurement live in
// plan_profile.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "grid.h"

namespace meshtrain {

// Times in seconds for one micro-batch of `micro_batch` sequences on one rank
// (one BLAS thread), bytes in bytes.
struct MicroProfile {
  int micro_batch = 0;
  double layer_fwd = 0, layer_bwd = 0;  // one transformer layer
  double embed_fb = 0;                  // embedding forward + backward
  double head_fb = 0;                   // final LayerNorm, head and loss, forward + backward
};

struct Profile {
  std::vector<MicroProfile> micro;  // one per profiled micro-batch size
  double update_per_param = 0;      // AdamW and gradient zeroing, per parameter
  int cores = 1;                    // cores the ranks share
  const MicroProfile* find(int micro_batch) const;
};

// Alpha-beta costs per rank count: t = alpha + bytes * beta, where bytes is
// what one rank sends (ring volume, as Comm::bytes_sent counts it).
//
// A fit with a stride was measured on the job's own ranks for groups of ranks
// `stride` apart in the world (ranks r, r + stride, ...), every such group at
// once, as a layout's groups run: across emulated or real hosts, a stride
// decides which links a group crosses and how many groups share them. A fit
// with stride 0 was measured with threads of one process and stands for any
// placement.
struct LinkModel {
  struct Fit {
    int ranks = 0;
    double alpha = 0, beta = 0;
    int stride = 0;
    // Pairs only: 0 for the pairs of ranks r, r + stride with r / stride even,
    // 1 with r / stride odd (pipeline stages s, s + 1 for even and odd s).
    int phase = 0;
    // Cores one rank kept busy while the transfer ran (1: all the time, as
    // when spinning on shared memory; across a slow network a waiting rank
    // leaves most of its core to the others).
    double cpu = 1;
    // Measured points (bytes one rank sends, seconds), by bytes: between two
    // of them time() interpolates, since a link's cost is not linear in the
    // bytes (a shaper's burst, TCP's window opening); none: alpha-beta.
    std::vector<double> at_bytes, at_seconds;
    // Seconds for `bytes`: the measured points' curve (extended by its first
    // and last segments), else alpha + bytes x beta.
    double time(double bytes) const;
  };
  std::vector<Fit> collective;   // all-reduce / all-gather / reduce-scatter
  Fit p2p;                       // one pipeline message (stride 0, or stride 1 phase 0)
  std::vector<Fit> p2p_strided;  // one pipeline message between ranks `stride` apart
  // The fit for n ranks `stride` apart: the one measured for exactly that, else
  // among the others the nearest measured count at or above n, else the largest.
  const Fit& coll(int n, int stride = 0) const;
  // The pipeline message between ranks `stride` apart, in pairs of `phase`
  // (the other phase's when that one was not measured, p2p when neither was).
  const Fit& pair(int stride = 0, int phase = 0) const;
};

struct Candidate {
  Layout layout;        // dp, pp, tp, tp_mode, stages
  int micro_batch = 0;  // sequences per micro-batch
  int grad_accum = 0;   // micro-batches per data-parallel rank
  double step_s = 0;    // predicted step time
  double compute_s = 0, tp_comm_s = 0, pp_comm_s = 0, dp_exposed_s = 0, bubble_s = 0;
  double cpu_bound_s = 0;  // every rank's compute and communication shared among the cores
  double mem_bytes = 0;    // predicted peak memory of the busiest rank
  std::string describe() const;
};

struct PlanRequest {
  ModelConfig model;
  int world = 1;
  std::string order = "tp-pp-dp";  // how ranks are numbered over the grid (Layout::order)
  int global_batch = 1;
  double mem_limit = 0;  // bytes per rank; 0: no limit
  bool allow_3d = true;
};

// Predicted peak memory (bytes) of the busiest rank of a layout: parameters,
// gradients, AdamW moments and the activations of the micro-batches in flight.
double memory_bytes(const ModelConfig& m, const Layout& l, int micro_batch, int grad_accum);

// Predicted step time and memory of one candidate (fills its fields).
void predict(const PlanRequest& r, const Profile& p, const LinkModel& links, Candidate* c);

// The best stage split of `layers` layers into `pp` stages for per-layer time
// `layer` and the extra time of the first and last stage (DAPPLE's dynamic
// programming over contiguous splits, minimising the slowest stage).
std::vector<int> best_split(int layers, int pp, double layer, double first_extra, double last_extra);

// Every feasible candidate (check_layout passes, memory fits), best first.
std::vector<Candidate> search(const PlanRequest& r, const Profile& p, const LinkModel& links);

// How far a plan's measured step time is from its prediction before the end
// of a --plan auto run says so.
constexpr double kPlanWarnRatio = 0.25;
// The end-of-run line of --plan auto: predicted against measured ms/step,
// with a warning when they differ by more than kPlanWarnRatio.
std::string plan_check(double predicted_s, double measured_s);

}  // namespace meshtrain
