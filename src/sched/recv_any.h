// A receive from any of several peers (meshcclRecvAnySource): the engine
// asks each peer's connection in turn whether the next message that peer
// sends this rank (its number from P2PSeq) has arrived, takes the first one
// there, and receives it as a receive from that peer would. A message is
// only ever taken under P2PSeq's guard, so no two receives take the same one
// and none is skipped; messages from one peer are taken in the order sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "sched/p2p_seq.h"

namespace meshccl {

class Run;

struct RecvAnyArgs {
  void* dst = nullptr;
  size_t bytes = 0;
  std::vector<int> peers;  // the ranks it may take a message from, not this one
  bool tagged = false;     // meshcclSendTagged's messages with user_tag, else ncclSend's
  uint32_t user_tag = 0;
  int* source = nullptr;  // set to the sender when a message is taken
  P2PSeq* seq = nullptr;  // the communicator's
};

std::unique_ptr<Run> make_recv_any_run(RecvAnyArgs args);

}  // namespace meshccl
