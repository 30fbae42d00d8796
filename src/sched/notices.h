// Error notices between the ranks of a communicator: when an operation fails
// on one rank, it tells its peers why and which rank failed first, so they
// fail at their next stall check (100 ms without progress) with its message
// instead of at MESHCCL_TIMEOUT, and every rank names the same first failure
// (not a rank that only aborted because of it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/mesh.h"
#include "util/status.h"

namespace meshccl {

class Notices {
 public:
  Notices(int rank, Mesh* mesh) : rank_(rank), mesh_(mesh) {}
  // Best effort, at most once, bounded by about a second. `first`: the rank
  // whose failure came first as this rank knows it; `suspect`: this rank
  // only timed out waiting for `first`, which may itself wait for another.
  void send(Status s, int first, bool suspect);
  // The error a peer reported, or kOk; receives are posted at the first call.
  // *first: the rank that failed first, following the peers' notices;
  // *known: whether a rank said so, rather than only suspected it.
  Status poll(int* first, bool* known);
  // The rank that failed first as seen from rank `start`: follows the
  // suspects of the notices received to a rank that names the first failure,
  // or to one that sent none (stopped or unreachable; *known false).
  int resolve(int start, bool* known) const;

 private:
  struct Notice {
    int32_t code;     // the ncclResult_t it failed with
    int32_t first;    // the rank that failed first, as the sender knew it
    int32_t suspect;  // 1: the sender only timed out waiting for `first`
    char text[500];   // its message
  };
  void post_receives();
  int rank_;
  Mesh* mesh_;
  bool sent_ = false;
  Notice out_{};
  std::string relay_;  // the text of the notice poll last returned
  std::vector<Notice> in_;  // per peer
  std::vector<Request> reqs_;
  std::vector<char> state_;  // 0 to post, 1 posted, 2 done or unusable, 3 received
};

}  // namespace meshccl
