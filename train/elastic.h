// meshtrain --elastic: when a rank dies, the survivors find it, drop its
// data-parallel replica (every rank of that replica), shrink the world
// communicator with ncclCommShrink, split it again for the smaller layout and
// resume from the last checkpoint. See docs/training.md.
#pragma once

#include <string>
#include <vector>

#include "engine.h"
#include "nccl_comm.h"

namespace meshtrain {

// Leaves DIR/elastic/rank_<orig>.pid ("<boot id> <pid>") so survivors can
// tell a dead rank from a slow one. Throws CheckpointError when it cannot.
void elastic_register(const std::string& ckpt_dir, int orig_rank);

// A live rank that leaves (its replica lost a rank) says so, so that the
// others do not count it among the dead.
void elastic_leave(const std::string& ckpt_dir, int orig_rank);

struct ElasticPlan {
  std::vector<int> dead;      // current world ranks whose process is gone
  std::vector<int> excluded;  // every rank of each replica that lost one (sorted)
  int lost_replicas = 0;
};
// orig[r]: the job's original rank of current world rank r. Polls the pid
// files (every 50 ms, at most wait_s) until a member of this machine is
// found dead; an empty plan means none was (not a death: a timeout, a link).
ElasticPlan elastic_find_dead(const std::string& ckpt_dir, const std::vector<int>& orig, const Layout& layout,
                              double wait_s);

// Aborts and frees every communicator of rc except the world.
void elastic_abandon(RankComms* rc);

// Abandons every communicator of `old` except the world, which it shrinks
// (NCCL_SHRINK_ABORT) without `excluded`; returns the new world's handle.
// Throws CommError when the shrink fails.
ncclComm_t elastic_shrink(RankComms* old, const std::vector<int>& excluded);

}  // namespace meshtrain
