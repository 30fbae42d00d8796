// Link measurement for the planner, on meshccl: alpha-beta fits of all-reduce
// for every group size that divides the world, and of one point-to-point
// message.
#pragma once

#include <cstddef>
#include <vector>

#include "meshccl.h"
#include "planner.h"

namespace meshtrain {

// Measured with one thread per rank in this process (stride 0: any placement;
// `meshtrain plan`, which has no job to measure on).
LinkModel measure_links(int world, int reps);

// Measured on the job's own ranks (every rank of `world` calls it; each fit
// is the slowest rank's lower quartiles, returned on every rank): for every group size n and
// stride s with n x s dividing the world, all groups of n ranks s apart reduce
// at once, as a layout's data- or tensor-parallel groups do; for every stride s
// with 2s dividing the world, all pairs s apart exchange a message at once (both
// ways), as pipeline neighbours do. Across hosts this is what tells the
// planner which groups cross the network. Besides 1 KiB and 1 MiB, each fit
// is measured at the sizes of `at_floats` between them (the layouts'
// activations), which its curve then passes through.
LinkModel measure_links_on(ncclComm_t world, int reps, const std::vector<size_t>& at_floats = {});

}  // namespace meshtrain
