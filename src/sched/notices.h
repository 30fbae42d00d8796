// Error notices between the ranks of a communicator: when an operation fails
// on one rank, it tells its peers why and which rank failed first, so they
// fail at their next stall check (100 ms without progress) with its message
// instead of at MESHCCL_TIMEOUT, and every rank names the same first failure
// (not a rank that only aborted because of it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/signature.h"
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
  std::string relay_;       // the text of the notice poll last returned
  std::vector<Notice> in_;  // per peer
  std::vector<Request> reqs_;
  std::vector<char> state_;  // 0 to post, 1 posted, 2 done or unusable, 3 received
};

// What a stalled collective is, told to every peer: its number in the
// communicator's sequence of collectives and its signature. Sent once per
// collective that stalls (100 ms without progress), compared by peers that
// stall too; costs nothing while operations move.
class Probes {
 public:
  Probes(int rank, Mesh* mesh) : rank_(rank), mesh_(mesh) {}
  // Tells the peers (once per seq) that this rank waits in collective seq.
  void announce(uint64_t seq, const OpSignature& sig);
  // Whether a peer announced collective seq under another signature.
  bool differs(uint64_t seq, const OpSignature& sig, int* peer, OpSignature* theirs);
  // Takes in every probe that has arrived, whether or not this rank is
  // stalled. A probe goes to every peer, and a peer that never stalls would
  // otherwise never receive it: it stays parked on the connection (the
  // plugin's, or UCX's unexpected queue, which warns about each one when
  // its worker is destroyed), and parked messages slow every later match.
  void collect() { poll(); }

 private:
  struct Probe {
    uint64_t seq;
    OpSignature sig;
  };
  struct Peer {
    Probe in{}, out{};
    Probe last{};  // the last one received
    bool heard = false;
    Request recv, send;
    bool recv_posted = false, send_busy = false, broken = false;
  };
  void poll();
  int rank_;
  Mesh* mesh_;
  std::vector<Peer> peers_;
  uint64_t announced_ = ~uint64_t{0};
};

}  // namespace meshccl
