// Measurements the planner needs: per-layer compute time on this machine
// (single process, one BLAS thread), and reading/writing a saved profile.
#pragma once

#include <string>
#include <vector>

#include "grid.h"
#include "planner.h"

namespace meshtrain {

// Times forward and backward of one layer, the embedding and the head for
// each micro-batch size (thread CPU time, best of `reps`), and AdamW per
// parameter. `cores` is recorded for the oversubscription factor.
Profile profile_compute(const ModelConfig& m, const std::vector<int>& micro_batches, int reps, int cores);

// A profile as text (one "key value..." line per item) and back; load throws
// std::runtime_error naming the file and line on anything malformed.
void save_profile(const std::string& path, const Profile& p, const LinkModel& links);
void load_profile(const std::string& path, Profile* p, LinkModel* links);

}  // namespace meshtrain
