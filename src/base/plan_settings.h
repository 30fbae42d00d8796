// The settings that shape an operation's plan, frozen into a communicator when
// it is created: a live communicator's choices never change under it, and
// its ranks agree on them at init (rank 0's apply; a split or shrink child
// keeps its parent's). An OpDesc without them (tools, tests) takes the
// process's settings as they are (collectives/algorithms.h: settings_of).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshccl {

struct PlanSettings {
  std::string algo;                      // MESHCCL_ALGO (NCCL_ALGO): the algorithm rules
  size_t chunk_bytes = 512 * 1024;       // MESHCCL_CHUNKSIZE
  int64_t direct_max_bytes = 0;          // MESHCCL_DIRECT_MAX_BYTES; 0: no limit
  int hier_channels = 0;                 // MESHCCL_HIER_CHANNELS; 0: one per rail
  std::string sparse_algo = "auto";      // MESHCCL_SPARSE_ALGO
  int64_t p2p_eager = int64_t{4} << 20;  // MESHCCL_P2P_EAGER: a sender's own choice, not agreed
};

}  // namespace meshccl
