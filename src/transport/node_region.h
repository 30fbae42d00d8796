// Shared memory that every rank of a single-host communicator maps: one
// region per rank, readable by all, written by its owner. The direct
// shared-memory algorithms (collectives/direct_shm.cpp) run over it: each rank
// publishes its input in its own slot, raises a flag, and reads the peers'
// slots in place — no transport, no message, no extra thread.
//
// Layout of one rank's region (an anonymous memfd, mapped by the peers through
// /proc/<pid>/fd/<fd>, so nothing is ever left in /dev/shm):
//
//   Control   flags, each on its own cache line (see below), one set per lane
//   Lane 0    kRing headers (round number, operation signature, inputs of up
//             to kInlineBytes), round k of the lane in header k % kRing; then
//             data slots 0 and 1, round k in data slot k % 2
//   Lane 1..  the same (priority scheduling only)
//
// A lane is a sequence of rounds. With FIFO scheduling there is one lane and
// every direct operation's rounds follow call order. With priority scheduling
// (MESHCCL_PRIORITY=1) there is one lane per stream priority level, each with
// its own rounds, slots and flags, so operations of different levels never
// wait for each other's rounds; within a lane, call order (the same on every
// rank) still numbers the rounds.
//
// Rounds of a lane are numbered from 1 in the same order on every rank. A rank
// runs a lane's rounds one at a time and arrives at round k by writing k into
// header k % kRing (so "rank p arrived at round r" reads as
// header(p, lane, r).round >= r). Before it writes round k it waits until
// every peer has arrived at round k - 1 when the round uses its data slot (a
// peer arrives at k - 1 only after it finished round k - 2, the last reader of
// that slot), or at round k - kRunAhead when its input travels in the header:
// then a rank that waits for no peer's input (a Broadcast or Scatter root)
// runs up to kRunAhead rounds ahead of the slowest peer, and a header is
// rewritten only after every peer arrived kRunAhead rounds past it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "base/signature.h"
#include "util/status.h"

namespace meshccl {

class NodeRegion {
 public:
  static constexpr size_t kLine = 64;

  struct alignas(kLine) Flag {
    std::atomic<uint64_t> value{0};
  };
  // Flags of one lane.
  struct Control {
    Flag reduced;    // last round whose slot holds this rank's reduced block
    Flag done;       // last round in which this rank read its peers' buffers
    Flag announced;  // priority scheduling: every round up to this one is being run here (see activate)
  };
  // Priority scheduling: one lane per stream priority level (0 to -7).
  static constexpr int kPriorityLanes = 8;
  // Where a rank's input lies when peers read it from the rank's own buffer
  // (ncclMemAlloc memory) instead of its slot.
  struct BufferRef {
    int32_t reserved;
    int32_t pid;
    int32_t fd;
    int32_t pad;
    uint64_t ino;
    uint64_t dev;
    uint64_t offset;  // of the operation's sendbuff in the file
    uint64_t file_size;
  };
  // Headers per lane, and how many rounds a rank may publish beyond the
  // last round every peer has arrived at (inline rounds, see above). With
  // more ranks than cores a root of small Broadcasts waits for its peers to
  // be scheduled once per kRunAhead calls: 128 halved the 4-rank time per
  // call on 2 cores against 32 (docs/performance.md, 2026-11-29); a lane's
  // headers take 288 KiB.
  static constexpr uint64_t kRing = 256;
  static constexpr uint64_t kRunAhead = kRing / 2;
  // Bytes of input small enough to travel in the header (the first 32 share
  // the header's first line with the round and signature).
  static constexpr size_t kInlineBytes = 1024;
  // Where a round's input lies.
  enum InputAt : uint32_t { kInSlot = 0, kInline = 1, kInBuffer = 2 };
  // The first cache line is all a peer reads for the smallest operations:
  // the round (written last, with release: it is the rank's arrival at that
  // round), the signature and the first 32 bytes of input.
  struct alignas(kLine) SlotHeader {
    std::atomic<uint64_t> round;  // last round published in this slot
    OpSignature signature;        // what the rank called
    uint32_t input_at;            // InputAt
    uint32_t call;                // the rank's direct call number (low bits), priority scheduling
    alignas(8) unsigned char inline_data[kInlineBytes];
    BufferRef input;  // read only when input_at == kInBuffer
  };
  static_assert(offsetof(SlotHeader, inline_data) + 32 == kLine, "round, signature and 32 input bytes share a line");

  ~NodeRegion();
  // Collective over the communicator. *out stays null (and no error is
  // returned) when the ranks are not all on one host, every pair over a
  // node-scope transport (node_local, transport/select.h), when slot_bytes is
  // 0, or when any rank cannot map the others' regions: then no rank uses the
  // region. lanes: 1 (FIFO) or kPriorityLanes, the same on every rank (agreed
  // by the caller); slot_bytes and lanes that differ across ranks leave every
  // rank without a region.
  static Status create(Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, size_t slot_bytes, int lanes,
                       std::unique_ptr<NodeRegion>* out);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  size_t slot_bytes() const { return slot_bytes_; }
  int lanes() const { return lanes_; }
  // The lane of an operation at a stream priority (0 least urgent, negative
  // more urgent); a higher lane is more urgent.
  int lane_for(int priority) const { return lanes_ == 1 ? 0 : std::clamp(-priority, 0, lanes_ - 1); }

  // Round at which rank r found a mismatch (0: none), any lane; kLeft once
  // it left the communicator without having found one.
  Flag& failed(int r) const { return *reinterpret_cast<Flag*>(bases_[r]); }
  static constexpr uint64_t kLeft = UINT64_MAX;
  // Rank r aborted or destroyed the communicator: it takes no further part in
  // any round (a peer still mapping its region sees this after it unmapped).
  bool left(int r) const { return failed(r).value.load(std::memory_order_acquire) == kLeft; }
  Control& control(int r, int lane) const {
    return *reinterpret_cast<Control*>(bases_[r] + kLine + static_cast<size_t>(lane) * sizeof(Control));
  }
  SlotHeader& header(int r, int lane, uint64_t round) const {
    return *reinterpret_cast<SlotHeader*>(bases_[r] + header_offset(lane, round));
  }
  char* data(int r, int lane, uint64_t round) const { return bases_[r] + data_offset(lane, round); }

  // Rounds of a lane handed out at launch, in call order (same on every rank).
  uint64_t reserve_rounds(int lane, uint64_t n) {
    Lane& l = lane_[lane];
    const uint64_t first = l.next_round + 1;
    l.next_round += n;
    return first;
  }
  // Priority scheduling: rounds [first, last] of the lane belong to an
  // operation that is now being driven here (polled until it ends, whatever
  // else waits). The lane's `announced` flag rises to the last round up to
  // which every round is in that state: peers may wait for those rounds
  // without waiting for anything that could wait for them.
  void activate(int lane, uint64_t first, uint64_t last);
  // Operations of lanes above 0 this rank activated and has not finished:
  // while none runs, this rank has finished every round it announced, so a
  // less urgent operation has none to let go first (see direct_shm.cpp).
  // Never too low; an operation abandoned on a failure leaves it high, which
  // only costs the exact check.
  std::atomic<int>& urgent_running() { return urgent_running_; }
  // The next direct call's number (every lane), for the header's `call`.
  uint32_t take_call() { return ++calls_; }
  // Last round of the lane this rank finished.
  std::atomic<uint64_t>& finished(int lane) { return lane_[lane].finished; }
  // Rounds of the lane this rank finished without comparing its peers'
  // signatures (a Broadcast or Scatter root), oldest first (direct_shm.cpp).
  std::vector<uint64_t>& unchecked(int lane) { return lane_[lane].unchecked; }
  // Peer's buffer described by ref, mapped here (cached per lane); nullptr
  // when it cannot be mapped. Called by one thread at a time per lane.
  const char* map_peer_buffer(int lane, int peer, const BufferRef& ref);

  // No reserved round of the lane is pending: its next reservation can run at once.
  bool idle(int lane) const { return lane_[lane].finished.load(std::memory_order_acquire) == lane_[lane].next_round; }

 private:
  struct Mapping {
    int peer;
    BufferRef ref;
    char* base;
  };
  struct Lane {
    uint64_t next_round = 0;
    std::atomic<uint64_t> finished{0};
    std::vector<Mapping> buffers;                             // most recent last
    std::mutex active_mu;                                     // activate() may run on an engine's thread or a caller's
    uint64_t active_upto = 0;                                 // what `announced` says
    std::vector<std::pair<uint64_t, uint64_t>> active_later;  // driven, past a gap
    std::vector<uint64_t> unchecked;
  };

  NodeRegion() = default;
  size_t control_bytes() const { return kLine + static_cast<size_t>(lanes_) * sizeof(Control); }
  size_t lane_bytes() const { return kRing * sizeof(SlotHeader) + 2 * slot_bytes_; }
  size_t lane_offset(int lane) const { return control_bytes() + static_cast<size_t>(lane) * lane_bytes(); }
  // Every call reads headers: lane offsets are worked out once (lane_offsets_).
  size_t header_offset(int lane, uint64_t round) const {
    return lane_offsets_[lane] + (round % kRing) * sizeof(SlotHeader);
  }
  size_t data_offset(int lane, uint64_t round) const {
    return lane_offsets_[lane] + kRing * sizeof(SlotHeader) + (round & 1) * slot_bytes_;
  }

  int rank_ = 0;
  int lanes_ = 1;
  size_t slot_bytes_ = 0;
  size_t map_bytes_ = 0;
  int fd_ = -1;               // own region, kept open so peers can attach
  std::vector<char*> bases_;  // every rank's region as mapped here
  int nranks_ = 0;            // bases_.size()
  size_t lane_offsets_[kPriorityLanes] = {};
  std::unique_ptr<Lane[]> lane_;
  uint32_t calls_ = 0;
  std::atomic<int> urgent_running_{0};
};

}  // namespace meshccl
