// Error notices between the ranks of a communicator: when an operation fails
// on one rank for a reason its peers cannot see (a mismatch, a bad buffer),
// it tells them, so they fail at their next stall check (100 ms without
// progress) with its message instead of at MESHCCL_TIMEOUT.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/mesh.h"
#include "util/status.h"

namespace meshccl {

class Notices {
 public:
  Notices(int rank, Mesh* mesh) : rank_(rank), mesh_(mesh) {}
  // Best effort, at most once, bounded by about a second.
  void send(Status s);
  // The error a peer reported, or kOk; receives are posted at the first call.
  Status poll();

 private:
  struct Notice {
    int32_t code;     // the ncclResult_t it failed with
    char text[508];   // its message
  };
  int rank_;
  Mesh* mesh_;
  bool sent_ = false;
  Notice out_{};
  std::vector<Notice> in_;  // per peer
  std::vector<Request> reqs_;
  std::vector<char> state_;  // 0 to post, 1 posted, 2 done or unusable
};

}  // namespace meshccl
