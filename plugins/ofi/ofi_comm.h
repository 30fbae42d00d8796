// Internal state of the libfabric (OFI) transport, libmeshccl-transport-ofi.so.
//
// One reliable-datagram (FI_EP_RDM) endpoint per context with one completion
// queue and one address vector; every connection is a pair of addresses in
// that vector plus a connection id the listener hands out. A message is a
// tagged header {user tag, size} that carries payloads of up to kInline bytes
// itself; a longer payload follows as tagged chunks of at most the provider's
// maximum message size, received straight into the user's buffer once the
// header matched a posted receive. The 64-bit libfabric tag is
//   kind (2) | connection id (22) | sequence number (24) | chunk (16)
// and every receive after the handshake names its source address
// (FI_DIRECTED_RECV), so only the sender that presented the listener's nonce
// can feed a connection. Matching by user tag (oldest posted receive, oldest
// unexpected header) is the plugin's, with the shared matcher
// (plugins/common/matcher.h). See docs/transports.md and docs/architecture.md.
#ifndef MESHCCL_PLUGINS_OFI_OFI_COMM_H_
#define MESHCCL_PLUGINS_OFI_OFI_COMM_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "meshccl/transport.h"
#include "plugins/common/matcher.h"
#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"

namespace meshccl::plugin::ofi {

constexpr uint32_t kCtxMagic = 0x4f464943;                // "OFIC"
constexpr uint32_t kSendMagic = 0x4f464953;               // "OFIS"
constexpr uint32_t kRecvMagic = 0x4f464952;               // "OFIR"
constexpr uint32_t kListenMagic = 0x4f46494c;             // "OFIL"
constexpr uint32_t kReqMagic = 0x4f464951;                // "OFIQ"
constexpr uint64_t kHandleMagic = 0x31444e4849464f4full;  // "OFIHND1"
constexpr uint64_t kHelloMagic = 0x314f4c4c4549464full;   // "OFIELLO1"

// Message kinds in the libfabric tag.
enum : uint64_t { kHello = 0, kHeader = 1, kPayload = 2, kBack = 3 };
constexpr uint32_t kConnBits = 22;
constexpr uint32_t kSeqBits = 24;
constexpr uint32_t kChunkBits = 16;
constexpr uint64_t kMaxChunks = 1ull << kChunkBits;
constexpr uint64_t ftag(uint64_t kind, uint32_t conn, uint64_t seq, uint64_t chunk) {
  return (kind << 62) | (static_cast<uint64_t>(conn & ((1u << kConnBits) - 1)) << (kSeqBits + kChunkBits)) |
         ((seq & ((1ull << kSeqBits) - 1)) << kChunkBits) | (chunk & (kMaxChunks - 1));
}

constexpr size_t kNameMax = 88;  // endpoint name bytes a handle can carry

// Plain bytes, valid in any process.
struct Handle {
  uint64_t magic;
  uint64_t nonce;
  uint64_t host_key;  // which kernel the listener runs on (pid checks)
  uint32_t conn;
  int32_t pid;
  uint16_t name_len;
  uint8_t name[kNameMax];
};
static_assert(sizeof(Handle) <= MESHCCL_TRANSPORT_HANDLE_BYTES);

// The first message on a connection: the sender proves it got the handle
// and tells the receiver where it lives.
struct Hello {
  uint64_t magic;
  uint64_t nonce;
  uint64_t host_key;
  int32_t pid;
  uint16_t name_len;
  uint8_t name[256];
};

// Header of every message. kBye: the sender closed; messages with a sequence
// number from `complete_below` on were not (fully) sent and never complete.
// The same header is the receiver's close notice on the back channel: it
// holds every message below `complete_below` whole.
enum : uint32_t { kFlagBye = 1 };
struct WireHdr {
  uint64_t tag;
  uint64_t size;
  uint32_t flags;
  uint32_t pad;
  uint64_t complete_below;
};
constexpr size_t kBufBytes = 4096;
constexpr size_t kInline = kBufBytes - sizeof(WireHdr);  // payload carried in the header
static_assert(sizeof(Hello) <= kBufBytes);
constexpr int kHdrWindow = 8;                       // header receives kept posted per connection
constexpr uint32_t kChunkWindow = 8;                // payload chunk receives posted per message at a time
constexpr uint64_t kDefaultMaxMsg = 1ull << 30;     // MESHCCL_OFI_MAX_MSG, network providers
constexpr uint64_t kDefaultShmMaxMsg = 1ull << 20;  // and shm

// One or more libfabric operations sharing a completion context.
struct Op {
  struct Request* owner;
  uint32_t posted;
  uint32_t finished;
  int err;  // first error (positive FI_* code), 0 = none
  int prov_errno;
  uint64_t bytes;  // bytes of the successful completions
};
inline bool busy(const Op& o) { return o.finished < o.posted; }

// What a pooled Request is used for; only kSend/kRecv reach the host.
enum class Kind : uint8_t { kSend, kRecv, kSlot, kCtl };
enum class State : uint8_t { kQueued, kPosted, kActive, kDone };

// Requests come from the context's pool, not the comm's, so that one whose
// operations are still in flight when its comm closes can outlive the comm
// (orphaned) until libfabric reports them.
struct Request : Linked<Request> {
  uint32_t magic;
  Kind kind;
  State state;
  bool orphan;
  meshccl_tresult_t result;
  void* comm;
  uint64_t tag;
  unsigned char* data;
  uint64_t size;    // send: message size; recv: capacity
  uint64_t nbytes;  // recv: matched message size
  uint64_t seq;
  uint64_t nchunks;  // payload chunks of this message
  uint64_t chunks_posted;
  Op hdr;   // header / hello / control operation
  Op body;  // payload chunks
  alignas(8) unsigned char buf[kBufBytes];
};
static_assert(std::is_trivially_destructible_v<Request>);

struct Unexpected : Linked<Unexpected> {
  uint64_t tag;
  uint64_t size;
  uint64_t seq;
  BufferPool::Buf buf;  // the payload when it came inline
};

// An address in the vector, by endpoint name.
struct Peer {
  std::vector<uint8_t> name;
  fi_addr_t addr;
};

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  // The completion queue's wait descriptor (wait_fd): the queue is opened
  // with FI_WAIT_FD where the provider allows; -1 until asked or without.
  bool cq_waits = false;
  int cq_fd = -1;
  std::vector<uint8_t> name;  // our endpoint's address
  std::string dev_name;       // "ofi:<provider>:<domain>"
  bool host_only = false;     // the provider reaches only this host (shm)
  uint64_t chunk = 0;         // largest payload message
  uint64_t host_key = 0;
  int32_t pid = 0;
  uint32_t next_conn = 1;
  std::vector<Peer> peers;
  Pool<Request> reqs;
  List<Request> orphans;  // requests of closed comms still known to libfabric
  // Close notices ("bye") not yet known to be sent: progress posts those
  // libfabric had no room for and lets go of those that completed; each is
  // given up at its deadline. Closing does not wait for them, finalize does.
  struct Notice {
    Request* r;
    fi_addr_t to;
    uint64_t tag;
    uint64_t deadline;
  };
  std::vector<Notice> notices;
  BufferPool bufs{1u << 20};
  // Providers set a connection up only while both ends make progress, and
  // a host may poll only the receiver's accept: while hellos wait to be
  // posted, a helper thread keeps posting them. Every entry point holds mu.
  std::mutex mu;
  std::thread helper;
  bool helper_running = false;
  bool stopping = false;
  std::vector<struct SendComm*> connecting;
  std::vector<struct RecvComm*> recvs;  // open receive comms (see may_progress)
  Freeze freeze;                 // a receive libfabric may still write was given up on: no longer progressed, kept
  bool sends_abandoned = false;  // a send libfabric may still read was given up on: no longer progressed
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  uint32_t conn = 0;
  uint64_t nonce = 0;
  Request* hello = nullptr;  // the posted hello receive
  bool accepted = false;
};

struct SendComm {
  uint32_t magic = kSendMagic;
  Ctx* ctx = nullptr;
  uint32_t conn = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  int32_t peer_pid = 0;      // checked while the peer shares our kernel, else 0
  uint64_t seq = 0;          // next header's sequence number
  List<Request> queue;       // sends in order; the front ones may wait to be posted
  Request* hello = nullptr;  // the hello, until libfabric reports it sent
  Request* back = nullptr;   // receive for the receiver's notices
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
  uint64_t delivered_below = 0;  // the receiver closed holding every message before this one
  bool receiver_closed = false;  // its notice came
  PeerWatch watch;
};

struct RecvComm {
  explicit RecvComm(Ctx* c) : ctx(c), m(&c->bufs) {}
  uint32_t magic = kRecvMagic;
  Ctx* ctx;
  uint32_t conn = 0;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  int32_t peer_pid = 0;
  uint64_t seq = 0;                 // next header to take in
  Request* slots[kHdrWindow] = {};  // slots[s % kHdrWindow] receives header s
  // Posted receives, matched ones still moving, headers that came before
  // their receive (payloads from ctx->bufs). Its gone state is the sender's
  // bye: nothing more arrives, messages from complete_below on never complete.
  Matcher<Request, Unexpected> m;
  uint64_t complete_below = UINT64_MAX;
  std::vector<unsigned char> scratch;  // payload chunks of truncated receives
  PeerWatch watch;
  uint64_t dead_ns = 0;  // when the sender's process was seen gone (0: not seen)
};

extern ArgCheck g_check;

// ofi.cpp: the fabric, progress and errors.
meshccl_tresult_t progress(Ctx* ctx);
meshccl_tresult_t fi_fail(const meshccl_transport_host_v1_t* host, const char* what, ssize_t rc);
meshccl_tresult_t op_fail(Ctx* ctx, const char* what, const Op& op);
Request* new_request(Ctx* ctx, Kind kind, void* comm);
void release(Ctx* ctx, Request* r);  // back to the pool, or orphaned while busy
bool peer_dead(const meshccl_transport_host_v1_t* host, int32_t pid, PeerWatch& watch);
// Whether a close may progress the context: not once it is frozen (Freeze,
// plugins/common/matcher.h) or gave up on a send. Once the caller gave up on an
// operation, it may free the buffers of its receives, and libfabric cannot
// cancel a receive it has matched: it goes on writing the buffer whenever the
// context progresses, whichever comm a close is for. So while any open
// receive comm of the context has a payload receive in libfabric's hands, the
// context is frozen: no close progresses it again, and finalize keeps it.
bool may_progress(Ctx* ctx);

// ofi_msg.cpp: messages.
// Post one operation. The queue may be full: with wait, progress is made and
// the post retried for a bounded time; without, kBusy says "retry later".
constexpr meshccl_tresult_t kBusy = static_cast<meshccl_tresult_t>(-1);
meshccl_tresult_t post_tsend(Ctx* ctx, const void* buf, size_t n, fi_addr_t to, uint64_t tag, Op* op, bool wait = true);
meshccl_tresult_t post_trecv(Ctx* ctx, void* buf, size_t n, fi_addr_t from, uint64_t tag, Op* op, bool wait = true);
meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t send_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found);
meshccl_tresult_t advance_sends(SendComm* c);
meshccl_tresult_t start_slots(RecvComm* c);
void close_send(SendComm* c);
void close_recv(RecvComm* c);
// Posts waiting close notices and lets go of sent ones (called by progress).
void advance_notices(Ctx* ctx);
// Gives the close notices still in flight a bounded time to leave (finalize).
void drain_notices(Ctx* ctx);

}  // namespace meshccl::plugin::ofi

#endif  // MESHCCL_PLUGINS_OFI_OFI_COMM_H_
