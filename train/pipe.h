// The pipeline's channel between neighbouring stages: what the engine's
// schedule needs from it, and nothing more. nccl_comm.cpp implements it on
// meshccl (a communicator over the stages, or StagePipe for stages with
// different tensor-parallel degrees).
#pragma once

#include <cstddef>

#include "comm.h"

namespace meshtrain {

struct P2POp {
  bool send = false;
  float* buf = nullptr;
  size_t count = 0;
  int peer = 0;  // stage
};

class Pipe : public virtual CommCounters {
 public:
  virtual ~Pipe() = default;
  // All sends and receives of one step of the schedule as one group (so that
  // matching pairs on two stages never wait on each other), at the pipeline's
  // priority. wait() returns once every receive has landed and every send's
  // buffer may be reused; a send may still be travelling then, from a copy.
  virtual Work exchange(const P2POp* ops, int n) = 0;
  // In place: buf = the sum of buf over the stages, each stage counted once
  // (loss, gradient norm, sampled token).
  virtual Work sum(float* buf, size_t n) = 0;
  // Starts nothing; wait() returns once every send exchanged so far has left.
  virtual Work flush() = 0;
};

}  // namespace meshtrain
