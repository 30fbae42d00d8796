// Command line of meshtrain.
#pragma once

#include <string>

#include "engine.h"

namespace meshtrain {

struct CliOptions {
  TrainConfig train;
  std::string data;  // empty: see corpus_path() in main.cpp
  bool resume = false;
  bool elastic = false;  // --elastic: survive a lost data-parallel replica (needs checkpoints)
  int blas_threads = 0;  // 0: all cores for one rank, 1 per rank otherwise
  int sample_chars = 0;  // generate this much text after training (pp = tp = 1)
  std::string prompt = "And God said";
  float temperature = 0.8f;
  int log_every = 1;
  bool help = false;
  bool version = false;
  // Planner: `meshtrain plan ...` only prints; --plan auto plans, then trains.
  bool plan_only = false, plan_auto = false;
  int plan_ranks = 0;     // ranks to plan for (plan only; default: the launcher's)
  int global_batch = 0;   // sequences per step to plan for (default: dp x micro-batch x grad-accum)
  int mem_limit_mib = 0;  // per rank; 0: no limit
  int plan_top = 5;       // alternatives printed
  std::string profile;    // read the profile from here if it exists, else measure and save it here
};

// Parses argv into opts; returns an empty string on success, else the error.
std::string parse_cli(int argc, char** argv, CliOptions* opts);
const char* cli_usage();

}  // namespace meshtrain
