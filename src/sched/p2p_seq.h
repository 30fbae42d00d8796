// The sequence numbers that pair point-to-point messages (base/tag.h): the
// n-th send from A to B carries the tag of B's n-th receive from A, counted
// per peer for ncclSend/ncclRecv and per (peer, user tag) for
// meshcclSendTagged/meshcclRecvTagged. A send or a receive from one peer
// takes its number when it is enqueued, on the caller's thread; a receive
// from any source takes the number of the message it finds, when it finds
// it, on whichever thread drives the engine (RecvAnyRun). So the receive
// numbers are guarded, and a message is taken by exactly one receive.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/tag.h"

namespace meshccl {

class P2PSeq {
 public:
  // Before the first operation.
  void init(int nranks) {
    send_.assign(static_cast<size_t>(nranks), 0);
    recv_.assign(static_cast<size_t>(nranks), 0);
  }
  // The tag of the next message to peer (the caller's thread only).
  uint64_t send_tag(int peer, bool tagged, uint32_t user) {
    if (!tagged) return tag::p2p(send_[static_cast<size_t>(peer)]++);
    return tag::p2p_tagged(user, send_tagged_[key(peer, user)]++);
  }
  // The tag of the next message from peer, taken.
  uint64_t recv_tag(int peer, bool tagged, uint32_t user) {
    std::lock_guard<std::mutex> lock(recv_mu_);
    return take(peer, tagged, user);
  }
  // The tag of the next message from peer, taken only when present(tag)
  // (which must not block) sets its argument: true then, with *tag set.
  // A failure of present is returned as it is.
  template <typename Present>
  auto claim_if(int peer, bool tagged, uint32_t user, Present&& present, bool* claimed, uint64_t* tag) {
    std::lock_guard<std::mutex> lock(recv_mu_);
    uint64_t& n = tagged ? recv_tagged_[key(peer, user)] : recv_[static_cast<size_t>(peer)];
    *tag = tagged ? tag::p2p_tagged(user, n) : tag::p2p(n);
    *claimed = false;
    auto s = present(*tag, claimed);
    if (s.ok() && *claimed) ++n;
    return s;
  }

 private:
  static uint64_t key(int peer, uint32_t user) { return uint64_t(uint32_t(peer)) << 32 | user; }
  uint64_t take(int peer, bool tagged, uint32_t user) {
    if (!tagged) return tag::p2p(recv_[static_cast<size_t>(peer)]++);
    return tag::p2p_tagged(user, recv_tagged_[key(peer, user)]++);
  }
  std::vector<uint64_t> send_;
  std::unordered_map<uint64_t, uint64_t> send_tagged_;
  std::mutex recv_mu_;
  std::vector<uint64_t> recv_;
  std::unordered_map<uint64_t, uint64_t> recv_tagged_;
};

}  // namespace meshccl
