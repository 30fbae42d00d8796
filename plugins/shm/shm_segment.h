// Layout of the shared segment behind one shm connection, and of its handle.
//
// The receiver creates the segment (an anonymous memfd, so nothing can be left
// behind in /dev/shm) and maps it; the sender maps the same file through
// /proc/<receiver pid>/fd/<fd>. After that neither side needs the fd.
//
//   SegHeader   identity (magic, nonce), pids, closed flags
//   head        sender -> receiver ring write position   (own cache line)
//   tail        receiver -> sender ring read position    (own cache line)
//   slots[]     rendezvous completion states, written by the receiver for
//               the sender (one cache line each)
//   ring        single-producer single-consumer ring of 64-byte aligned
//               records: eager messages, rendezvous descriptors (RTS), and
//               streamed chunks of a rendezvous when the receiver cannot
//               read the sender's memory directly.
#ifndef MESHCCL_PLUGINS_SHM_SHM_SEGMENT_H_
#define MESHCCL_PLUGINS_SHM_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "meshccl/transport.h"

namespace meshccl::plugin::shm {

constexpr uint64_t kSegMagic = 0x314d47534c434d53ull;     // "SMCLSGM1"
constexpr uint64_t kHandleMagic = 0x31444e484d485353ull;  // "SSHMHND1"
constexpr uint32_t kSegVersion = 2;
constexpr uint32_t kSlots = 256;  // rendezvous transfers in flight per connection
constexpr size_t kLine = 64;
constexpr uint64_t kMinRing = 64u << 10;  // MESHCCL_SHM_BUFFSIZE's range
constexpr uint64_t kMaxRing = 1u << 30;

enum RecType : uint32_t {
  kRecPad = 1,    // filler up to the end of the ring
  kRecEager = 2,  // tag, size, payload follows
  kRecRts = 3,    // tag, size, slot, RdvDesc follows
  kRecData = 4,   // slot, offset, size, payload follows (streamed rendezvous)
};

struct RecHdr {
  uint32_t type;
  uint32_t slot;
  uint64_t tag;
  uint64_t size;
  uint64_t offset;
};
static_assert(sizeof(RecHdr) == 32);

// Where the receiver finds a rendezvous payload.
struct RdvDesc {
  int32_t pid;          // sender process: memcpy when equal to ours, else CMA
  uint32_t has_region;  // the buffer lies in a memfd region the receiver may map
  uint64_t addr;        // sender's virtual address of the payload
  int32_t region_pid;
  int32_t region_fd;
  uint64_t region_offset;  // payload offset in the region's file
  uint64_t region_ino;     // file identity: fds are reused after close
  uint64_t region_dev;
};

enum SlotState : uint32_t {
  kSlotFree = 0,
  kSlotPosted = 1,     // RTS written, receiver has not finished
  kSlotStream = 2,     // receiver asks the sender to stream the payload
  kSlotDone = 3,       // receiver has the whole payload
  kSlotTrunc = 4,      // receiver's buffer was too small; payload dropped
  kSlotFailed = 5,     // receiver could not read the payload
  kSlotReading = 6,    // receiver is copying a chunk from the sender's memory
  kSlotCancelled = 7,  // the sender withdrew the payload (it closed)
};

struct alignas(kLine) SegHeader {
  uint64_t magic;
  uint64_t nonce;
  uint32_t version;
  uint32_t nslots;
  uint64_t ring_bytes;
  uint64_t total_bytes;
  int32_t receiver_pid;
  std::atomic<int32_t> sender_pid;  // 0 until a sender attached
  std::atomic<uint32_t> sender_closed;
  std::atomic<uint32_t> receiver_closed;
};

struct alignas(kLine) LineU64 {
  std::atomic<uint64_t> v;
};
struct alignas(kLine) LineU32 {
  std::atomic<uint32_t> v;
};

struct Segment {
  SegHeader hdr;
  LineU64 head;
  LineU64 tail;
  LineU64 slot_changes;  // raised by the receiver after each slot it sets
  LineU32 slots[kSlots];
  unsigned char* ring() { return reinterpret_cast<unsigned char*>(this + 1); }
};
static_assert(sizeof(Segment) % kLine == 0);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "shared-memory atomics must be address-free");

// Plain bytes so that they mean the same in another process.
struct Handle {
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t size;
  uint64_t nonce;
};
static_assert(sizeof(Handle) <= MESHCCL_TRANSPORT_HANDLE_BYTES);

// ThreadSanitizer cannot tell that two mappings of one segment in one
// process (ranks as threads) are the same memory, so it misses the ordering
// the segment's atomics give and reports the payloads they guard. These tell
// it: a release before each store to the segment, an acquire after each load.
// Nothing in other builds.
#if defined(__SANITIZE_THREAD__)
#define MESHCCL_SHM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MESHCCL_SHM_TSAN 1
#endif
#endif
#ifdef MESHCCL_SHM_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
inline void* tsan_key(uint64_t nonce) {
  static char keys[256];
  return &keys[nonce % sizeof keys];
}
inline void seg_release(const Segment* s) { __tsan_release(tsan_key(s->hdr.nonce)); }
inline void seg_acquire(const Segment* s) { __tsan_acquire(tsan_key(s->hdr.nonce)); }
#else
inline void seg_release(const Segment*) {}
inline void seg_acquire(const Segment*) {}
#endif

// Bytes a record takes in the ring.
constexpr uint64_t record_bytes(uint64_t payload) { return (sizeof(RecHdr) + payload + kLine - 1) / kLine * kLine; }

}  // namespace meshccl::plugin::shm

#endif  // MESHCCL_PLUGINS_SHM_SHM_SEGMENT_H_
