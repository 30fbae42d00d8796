// Internal state of the shm transport: context, the two ends of a
// connection, requests. See shm_segment.h for what the ends share and
// docs/transports.md for the protocol.
#ifndef MESHCCL_PLUGINS_SHM_SHM_COMM_H_
#define MESHCCL_PLUGINS_SHM_SHM_COMM_H_

#include <cstddef>
#include <cstdint>

#include "meshccl/transport.h"
#include "plugins/common/matcher.h"
#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"
#include "plugins/shm/shm_segment.h"

namespace meshccl::plugin::shm {

// Magic values tell live objects from garbage (or from a different kind of
// comm) when the host hands a pointer back.
constexpr uint32_t kCtxMagic = 0x53484d43;     // "SHMC"
constexpr uint32_t kSendMagic = 0x53484d53;    // "SHMS"
constexpr uint32_t kRecvMagic = 0x53484d52;    // "SHMR"
constexpr uint32_t kListenMagic = 0x53484d4c;  // "SHML"
constexpr uint32_t kReqMagic = 0x53484d51;     // "SHMQ"

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  uint64_t ring_bytes = 0;  // MESHCCL_SHM_BUFFSIZE
  uint64_t eager = 0;       // MESHCCL_SHM_EAGER: largest message sent through the ring
  uint64_t copy_chunk = 0;  // rendezvous bytes copied per test() of a receive
  bool cma = true;          // MESHCCL_SHM_CMA: may read peers' memory with process_vm_readv
  int32_t pid = 0;
};

enum class Kind : uint8_t { kSend, kRecv };
enum class State : uint8_t {
  kQueued,   // send: not yet in the ring (ring full or no free slot)
  kPosted,   // recv: waiting for a matching message
  kWaitRdv,  // send: RTS in the ring, waiting for the receiver (or streaming)
  kCopy,     // recv: matched a rendezvous, copying from the sender's memory
  kStream,   // recv: matched a rendezvous, sender streams it through the ring
  kDone,     // finished, `result` says how
};
enum class Copy : uint8_t { kMemcpy, kRegion, kCma };

struct Region;

struct Request : Linked<Request> {
  uint32_t magic;
  Kind kind;
  State state;
  Copy how;
  meshccl_tresult_t result;
  void* comm;  // SendComm* or RecvComm*, by kind
  uint64_t tag;
  unsigned char* data;
  uint64_t size;    // send: message size; recv: buffer capacity
  uint64_t nbytes;  // recv: size of the matched message
  uint64_t offset;  // rendezvous: bytes copied (recv) or streamed (send)
  uint32_t slot;
  const unsigned char* src;  // kMemcpy / kRegion: where the payload starts
  Region* region;            // kRegion: mapping in use
  RdvDesc desc;
};

// A message that arrived before its receive was posted.
struct Unexpected : Linked<Unexpected> {
  uint64_t tag;
  uint64_t size;
  bool rdv;  // payload still with the sender (slot, desc), else in buf
  uint32_t slot;
  RdvDesc desc;
  BufferPool::Buf buf;
};

// A sender's shareable buffer mapped into the receiver, kept across messages.
struct Region {
  int32_t pid;
  int32_t fd;
  uint64_t ino;
  uint64_t dev;
  unsigned char* base;  // nullptr: entry unused
  uint64_t len;
  uint32_t users;  // requests copying from it right now
  uint64_t last_use;
};

struct SendComm {
  uint32_t magic = kSendMagic;
  Ctx* ctx = nullptr;
  Segment* seg = nullptr;
  size_t map_bytes = 0;
  uint64_t nonce = 0;  // the segment's, from the handle
  unsigned char* ring = nullptr;
  uint64_t cap = 0;
  // Our eager limit, capped by the receiver's ring (its size is the
  // receiver's setting, which may differ from ours).
  uint64_t eager = 0;
  uint64_t head = 0;        // our write position (published to seg->head)
  uint64_t tail_cache = 0;  // last seen seg->tail
  // seg->slot_changes at the last scan of `active`, and whether that scan
  // found a transfer to stream: without either, the scan has nothing to do.
  uint64_t changes_seen = ~uint64_t{0};
  bool streaming = false;
  bool bad_tail = false;  // seg->tail went backwards or past head: a corrupt segment
  int32_t peer_pid = 0;
  List<Request> queue;   // posting order, not yet in the ring
  List<Request> active;  // rendezvous in flight
  uint32_t free_slots[kSlots];
  uint32_t nfree = 0;
  Pool<Request> reqs;
  PeerWatch watch;
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
};

struct RecvComm {
  static constexpr int kRegions = 32;
  uint32_t magic = kRecvMagic;
  Ctx* ctx = nullptr;
  Segment* seg = nullptr;
  size_t map_bytes = 0;
  uint64_t nonce = 0;  // the segment's, as created
  unsigned char* ring = nullptr;
  uint64_t cap = 0;
  uint64_t tail = 0;        // our read position (published to seg->tail)
  uint64_t head_cache = 0;  // last seen seg->head
  int32_t peer_pid = 0;
  Request* by_slot[kSlots] = {};  // kStream receives by rendezvous slot
  Pool<Request> reqs;
  BufferPool bufs{8u << 20};
  // Posted receives, matched rendezvous (kCopy, kStream) in active(),
  // unexpected messages, and REMOTE_ERROR once the sender closed or died
  // (what is already here can still be received, anything else fails).
  Matcher<Request, Unexpected> m{&bufs};
  Region regions[kRegions] = {};
  uint64_t region_clock = 0;
  bool regions_refused = false;  // mapping a peer's region was denied once
  bool cma_refused = false;      // process_vm_readv was denied once
  bool streaming = false;        // a rendezvous was streamed (logged once)
  PeerWatch watch;
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;  // the ring is unusable
};

// shm.cpp: checks a handle received from a peer; the reason it is refused,
// or nullptr.
const char* check_handle(const void* bytes, Handle* h);

// Rendezvous payloads posted by this process's senders, by (segment nonce,
// slot). A receiver copies with memcpy only a payload registered here: a
// record that names this process with any other address is refused, never
// dereferenced (the ring is written by the peer).
void local_rdv_add(uint64_t nonce, uint32_t slot, uint64_t addr, uint64_t size);
void local_rdv_remove(uint64_t nonce, uint32_t slot);
bool local_rdv_check(uint64_t nonce, uint32_t slot, uint64_t addr, uint64_t size);

// Sender side (shm_send.cpp).
meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t send_test(Request* r, int* done, size_t* size);
void send_close(SendComm* c);  // the caller frees c

// Receiver side (shm_recv.cpp).
meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t recv_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found);
void recv_close(RecvComm* c);  // the caller frees c

}  // namespace meshccl::plugin::shm

#endif  // MESHCCL_PLUGINS_SHM_SHM_COMM_H_
