// Runs one training job with every rank a thread of this process, and gathers
// per-step losses and the full logical parameters for comparison.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"

namespace meshtrain::testing {

struct RunResult {
  std::vector<float> losses;                         // per step, from rank 0
  std::vector<float> val;                            // validation after the last step
  std::string sample;                                // greedy text after training (rank 0)
  std::map<std::string, std::vector<float>> params;  // logical tensors
  double comm_wait = 0, seconds = 0;                 // summed over ranks
  std::string error;                                 // first rank's exception, if any
};

// Builds the Comms of `rank` and keeps them alive; called on the rank's thread.
using CommFactory = std::function<std::shared_ptr<void>(int rank, Comms* out)>;

inline RunResult run_threads(const TrainConfig& cfg, const Corpus& corpus, const CommFactory& make, int start_step = 0,
                             int stop_step = -1, const std::function<void(Engine&)>& before = {},
                             const std::function<void(Engine&, int)>& after_step = {}) {
  const int n = cfg.layout.world();
  const int stop = stop_step < 0 ? cfg.steps : stop_step;
  RunResult res;
  res.losses.assign(stop - start_step, 0.0f);
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++) {
    threads.emplace_back([&, r] {
      try {
        Comms comms;
        auto keep = make ? make(r, &comms) : nullptr;
        Engine e(cfg, r, comms, corpus);
        if (before) before(e);
        double wait = 0, secs = 0;
        for (int s = start_step; s < stop; s++) {
          const StepStats st = e.train_step(s);
          if (r == 0) res.losses[s - start_step] = st.loss;
          wait += st.comm_wait;
          secs += st.seconds;
          if (after_step) after_step(e, s);
        }
        const float val = e.validate();
        const std::string text = e.sample("And God said", 24, 0.0f, 1);
        std::lock_guard<std::mutex> lock(mu);
        if (r == 0) res.val.push_back(val), res.sample = text;
        res.comm_wait += wait;
        res.seconds += secs;
        const Stage& st = e.stage();
        for (const auto& spec : st.specs()) {
          auto& full = res.params[spec.name];
          full.resize(static_cast<size_t>(spec.rows) * spec.cols);
          for (size_t i = 0; i < spec.size; i++) {
            full[global_index(spec, i, e.coords().tp, cfg.layout.tp_of(e.coords().pp))] = st.params[spec.offset + i];
          }
        }
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(mu);
        if (res.error.empty()) res.error = "rank " + std::to_string(r) + ": " + ex.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return res;
}

}  // namespace meshtrain::testing
