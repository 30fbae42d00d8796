// Shared memory that every rank of a single-host communicator maps: one
// region per rank, readable by all, written by its owner. The direct
// shared-memory algorithms (collectives/direct_shm.cpp) run over it: each rank
// publishes its input in its own slot, raises a flag, and reads the peers'
// slots in place — no transport, no message, no extra thread.
//
// Layout of one rank's region (an anonymous memfd, mapped by the peers through
// /proc/<pid>/fd/<fd>, so nothing is ever left in /dev/shm):
//
//   Control   flags, each on its own cache line (see below)
//   Slot 0    header (round number + operation signature), then data
//   Slot 1    the same; round k uses slot k % 2
//
// Rounds are numbered from 1 in the same order on every rank. A rank runs its
// rounds one at a time and arrives at round k by writing k into the header of
// slot k % 2 (so "rank p arrived at round r" reads as header(p, r).round >= r).
// Before it writes slot k % 2 it waits until every peer has arrived at round
// k - 1: a peer arrives at k - 1 only after it finished round k - 2, the last
// reader of that slot.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "base/signature.h"
#include "util/status.h"

namespace meshccl {

class Mesh;

class NodeRegion {
 public:
  static constexpr size_t kLine = 64;

  struct alignas(kLine) Flag {
    std::atomic<uint64_t> value{0};
  };
  struct Control {
    Flag reduced;  // last round whose slot holds this rank's reduced block
    Flag done;     // last round in which this rank read its peers' buffers
    Flag failed;   // round at which this rank found a mismatch (0: none)
  };
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
  // Bytes of input small enough to travel in the header's first line.
  static constexpr size_t kInlineBytes = 32;
  // Where a round's input lies.
  enum InputAt : uint32_t { kInSlot = 0, kInline = 1, kInBuffer = 2 };
  // The first cache line is all a peer reads for a small operation: the
  // round (written last, with release: it is the rank's arrival at that
  // round), the signature and the input itself.
  struct alignas(kLine) SlotHeader {
    std::atomic<uint64_t> round;  // last round published in this slot
    OpSignature signature;        // what the rank called
    uint32_t input_at;            // InputAt
    uint32_t pad;
    alignas(8) unsigned char inline_data[kInlineBytes];
    BufferRef input;  // second line: read only when input_at == kInBuffer
  };
  static_assert(offsetof(SlotHeader, input) == kLine, "round, signature and inline data share one line");

  ~NodeRegion();
  // Collective over the communicator. *out stays null (and no error is
  // returned) when the ranks are not all on one host over the shm transport,
  // when slot_bytes is 0, or when any rank cannot map the others' regions: then
  // no rank uses the region.
  static Status create(Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, const Mesh& mesh,
                       size_t slot_bytes, std::unique_ptr<NodeRegion>* out);

  int rank() const { return rank_; }
  int nranks() const { return static_cast<int>(bases_.size()); }
  size_t slot_bytes() const { return slot_bytes_; }

  Control& control(int r) const { return *reinterpret_cast<Control*>(bases_[r]); }
  SlotHeader& header(int r, uint64_t round) const {
    return *reinterpret_cast<SlotHeader*>(bases_[r] + slot_offset(round));
  }
  char* data(int r, uint64_t round) const { return bases_[r] + slot_offset(round) + sizeof(SlotHeader); }

  // Rounds handed out at launch, in call order (same on every rank).
  uint64_t reserve_rounds(uint64_t n) {
    uint64_t first = next_round_ + 1;
    next_round_ += n;
    return first;
  }
  // Last round this rank finished.
  std::atomic<uint64_t>& finished() { return finished_; }
  // Peer's buffer described by ref, mapped here (cached); nullptr when it
  // cannot be mapped. Called by one thread at a time.
  const char* map_peer_buffer(int peer, const BufferRef& ref);

  // No reserved round is pending: the next reservation can run at once.
  bool idle() const { return finished_.load(std::memory_order_acquire) == next_round_; }

 private:
  NodeRegion() = default;
  size_t slot_offset(uint64_t round) const { return control_bytes() + (round & 1) * slot_stride(); }
  static size_t control_bytes() { return (sizeof(Control) + kLine - 1) / kLine * kLine; }
  size_t slot_stride() const { return sizeof(SlotHeader) + slot_bytes_; }

  int rank_ = 0;
  size_t slot_bytes_ = 0;
  size_t map_bytes_ = 0;
  int fd_ = -1;                // own region, kept open so peers can attach
  std::vector<char*> bases_;   // every rank's region as mapped here
  uint64_t next_round_ = 0;
  std::atomic<uint64_t> finished_{0};
  struct Mapping {
    int peer;
    BufferRef ref;
    char* base;
  };
  std::vector<Mapping> buffers_;  // most recent last
};

}  // namespace meshccl
