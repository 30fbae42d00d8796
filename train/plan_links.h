// Link measurement for the planner, on meshccl: alpha-beta fits of all-reduce
// for every group size that divides the world, and of one point-to-point
// message, each measured with one thread per rank in this process.
#pragma once

#include "planner.h"

namespace meshtrain {

LinkModel measure_links(int world, int reps);

}  // namespace meshtrain
