// Internal state of the UCX transport. A connection has two paths:
//
//   control: a TCP socket from sender to receiver (the listener's address is
//            in the handle). The sender presents the handle's nonce; the
//            receiver refuses anything else, then answers with its UCP worker
//            address. Later the sender writes a goodbye {messages sent} when
//            it closes; EOF without one means the sender died. The kernel
//            completes this handshake, so connect and accept finish whatever
//            order the two sides poll them in.
//   data:    a UCP endpoint from the sender's worker to the receiver's, made
//            from that address once it arrives (sends posted before wait in
//            order). Each message is a UCX tagged message tagged
//            {connection, kind, sequence}: a header {user tag, size} that
//            carries the payload when it is small, else a header followed by
//            a separate payload message that UCX places straight into the
//            matched receive buffer (rendezvous for large sizes).
//
// UCX matches tags per worker, the contract per connection with 64-bit user
// tags, so the plugin matches user tags itself with the shared matcher
// (plugins/common/matcher.h). See docs/transports.md.
#ifndef MESHCCL_PLUGINS_UCX_UCX_COMM_H_
#define MESHCCL_PLUGINS_UCX_UCX_COMM_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshccl/transport.h"
#include "plugins/common/matcher.h"
#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"
#include "plugins/common/socket_iface.h"
#include "plugins/common/tcp_gate.h"

namespace meshccl::plugin::ucx {

constexpr uint32_t kCtxMagic = 0x55435843;                // "UCXC"
constexpr uint32_t kSendMagic = 0x55435853;               // "UCXS"
constexpr uint32_t kRecvMagic = 0x55435852;               // "UCXR"
constexpr uint32_t kListenMagic = 0x5543584c;             // "UCXL"
constexpr uint32_t kReqMagic = 0x55435851;                // "UCXQ"
constexpr uint64_t kHandleMagic = 0x32444e4858435555ull;  // "UUCXHND2"
constexpr uint64_t kHelloMagic = 0x314f4c4c45584355ull;   // "UCXELLO1"
constexpr uint64_t kAddrMagic = 0x3152444441584355ull;    // "UCXADDR1"
constexpr uint64_t kByeMagic = 0x3145594258435555ull;     // "UUCXBYE1"

// Payloads up to this size travel inside their header message: one UCX
// message instead of two (a header, then the payload once the receive is
// matched). 2 KiB send/recv between two emulated hosts, best of 10 runs:
// 22.8 us as two messages, 12.7 us as one at 1 Gbit/s (socket: 10.3 us);
// unshaped 8 KiB 16.1 and 12.6 us (socket 10.4 us). Larger ones gain
// nothing from it (64 KiB: no faster at 32 KiB, slower at 64 KiB).
constexpr size_t kInline = 8192;
// Largest worker address accepted from a peer.
constexpr uint32_t kMaxAddr = 64u << 10;
// After the control socket closed, receives still incomplete this long fail.
constexpr uint64_t kGraceNs = 1'000'000'000;

// UCX tag layout: connection id (32) | kind (2) | sequence (30).
enum : uint64_t { kHeader = 1, kPayload = 2 };
constexpr uint64_t kSeqMask = (1ull << 30) - 1;
constexpr uint64_t kFullMask = ~0ull;
constexpr uint64_t utag(uint32_t conn, uint64_t kind, uint64_t seq) {
  return (static_cast<uint64_t>(conn) << 32) | (kind << 30) | (seq & kSeqMask);
}

// Plain bytes, valid in any process.
struct Handle {
  uint64_t magic;
  uint64_t nonce;
  uint32_t conn;
  uint16_t family;
  uint16_t port;  // network byte order
  uint32_t scope_id;
  uint8_t addr[16];
};
static_assert(sizeof(Handle) <= MESHCCL_TRANSPORT_HANDLE_BYTES);

// Control messages (host byte order: both ends run the same plugin build on
// hosts that exchange UCX worker addresses, which are not portable either).
using Hello = GateHello;  // the first bytes a sender writes (plugins/common/tcp_gate.h)
struct AddrMsg {
  uint64_t magic;
  uint64_t host;  // host_key() of the receiver
  uint64_t len;   // worker address bytes that follow
};
struct Bye {
  uint64_t magic;
  uint64_t sent;  // messages the sender posted on this connection
};

struct WireHdr {
  uint64_t tag;
  uint64_t size;
};

// A connect() in progress, kept between calls of the non-blocking connect.
using Connecting = Dialing<Handle>;

struct SendComm;
struct RecvComm;
// What an endpoint's error handler reaches: the send comm while it is open.
// UCX may report an endpoint's failure after the comm closed it (a force
// close still in flight), so the handler gets this and not the comm, and
// it outlives the comm until the worker is gone.
struct EpLink {
  SendComm* comm = nullptr;
};

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<unsigned char> address;  // this worker's, sent to senders
  uint64_t host_id = 0;                // host_key()
  socket::Iface iface;                 // where listeners listen
  uint32_t next_conn = 0;
  std::vector<Connecting> connecting;
  std::vector<void*> closing;                         // endpoint close requests still in flight
  std::vector<std::unique_ptr<EpLink>> closed_links;  // of closed endpoints (freed with the worker)
  std::vector<RecvComm*> recvs;                       // open receive comms (see may_progress)
  std::vector<std::vector<unsigned char>> sinks;      // drain buffers UCX may still write, until the worker goes
  bool peer_failed = false;                           // an endpoint failed: the worker is not destroyed (see finalize)
  bool abandoned = false;  // a send or flush to another host was given up on in flight: kept as well
  Freeze freeze;           // a matched receive was given up on: never progressed again, kept
  // The worker's event descriptor; -1 until asked, or when the context was
  // made without UCP_FEATURE_WAKEUP or UCX gives none. The wait descriptor
  // (wait_fd) is an epoll set over it and the receive comms' control sockets,
  // on which a sender's goodbye or end arrives (UCX itself may not wake).
  int efd = -1;
  int epfd = -1;
  bool wakeup = false;                    // the context has UCP_FEATURE_WAKEUP
  EmptyCalls progress_calls{2000, 2000};  // a test's progress calls (progress() in ucx_io.cpp)
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  TcpGate gate;  // the control socket's listener and the connections not identified yet
  uint32_t conn = 0;
  bool accepted = false;
};

enum class Kind : uint8_t { kSend, kRecv };
// send: kWaiting (no endpoint yet) -> kActive; recv: kPosted -> kActive.
enum class State : uint8_t { kWaiting, kPosted, kActive };

struct Request : Linked<Request> {
  uint32_t magic;
  Kind kind;
  State state;
  meshccl_tresult_t result;
  void* comm;
  uint64_t tag;
  unsigned char* data;
  uint64_t size;    // send: message size; recv: capacity
  uint64_t nbytes;  // recv: matched message size
  uint64_t seq;     // send: sequence number on the connection
  void* hdr_req;
  void* data_req;
  // send: the header message as on the wire ({tag, size} then the payload
  // when it is inline).
  alignas(8) unsigned char wire[sizeof(WireHdr) + kInline];
};
static_assert(std::is_trivially_destructible_v<Request>);

struct Unexpected : Linked<Unexpected> {
  uint64_t tag;
  uint64_t size;
  uint64_t seq;
  BufferPool::Buf buf;  // the payload when it came inline
};

struct SendComm {
  uint32_t magic = kSendMagic;
  Ctx* ctx = nullptr;
  int fd = -1;  // control socket
  std::string peer;
  uint32_t conn = 0;
  ucp_ep_h ep = nullptr;
  EpLink* link = nullptr;  // the endpoint's error handler's (owned by ctx once closed)
  // The endpoint's failure as its handler got it (UCS_OK: none), told as a
  // warning when a send of this comm meets it (broken_result), not when
  // UCX reports it: at teardown a peer that closes or exits first fails the
  // endpoints that point at it, and no send needs them any more.
  ucs_status_t ep_status = UCS_OK;
  bool ep_warned = false;
  // The receiver's worker address as it arrives on the control socket.
  AddrMsg amsg{};
  uint32_t agot = 0;
  std::vector<unsigned char> addr;
  uint64_t seq = 0;
  List<Request> waiting;  // posted before the endpoint existed, in order
  List<Request> active;
  Pool<Request> reqs;
  PeerWatch watch;
  uint64_t closed_ns = 0;  // when the control socket was seen closed
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
};

struct RecvComm {
  uint32_t magic = kRecvMagic;
  bool watched = false;  // its control socket is in the context's epoll set
  Ctx* ctx = nullptr;
  int fd = -1;  // control socket
  std::string peer;
  uint32_t conn = 0;
  uint64_t seq = 0;  // next header expected
  unsigned char hdr_buf[sizeof(WireHdr) + kInline];
  void* hdr_req = nullptr;
  bool hdr_posted = false;
  Pool<Request> reqs;
  BufferPool bufs{4u << 20};
  // Posted receives, matched ones whose payload is still moving, headers
  // that came before their receive. The sender's departure is decided by
  // sender_gone (ucx_io.cpp), not by the matcher's gone state.
  Matcher<Request, Unexpected> m{&bufs};
  std::vector<unsigned char> scratch;  // payloads of truncated receives
  PeerWatch watch;
  // Control socket state: EOF time (0 while open) and the goodbye.
  uint64_t closed_ns = 0;
  Bye bye{};
  uint32_t bye_got = 0;
};

// Identifies this host and network namespace (boot id, namespace inode):
// peers with the same key reach each other through UCX's shared-memory
// transports, which UCX 1.13 offers only without peer error handling.
uint64_t host_key();

meshccl_tresult_t status_result(ucs_status_t s);
meshccl_tresult_t fail(const meshccl_transport_host_v1_t* host, const char* what, ucs_status_t s);
// Status of a request pointer from a *_nbx call: NULL = done, error pointer
// = failed, else the request's state.
ucs_status_t check(void* req);
// Cancels (if still running) and frees a UCX request; clears the pointer.
// True when the request was still in flight.
bool drop(ucp_worker_h w, void*& req);
// The receiver is on another host (from the address it sent): peer error
// handling, and requests given up on make the worker unsafe to destroy.
inline bool to_other_host(const SendComm* c) { return c->amsg.host != c->ctx->host_id; }
// Whether a close may progress the worker: not once the context is frozen
// (Freeze, plugins/common/matcher.h). Once the caller gave up on an
// operation, it may free the buffers of its receives; a payload UCX has
// matched into one of them cannot be cancelled and lands whenever the worker
// progresses, on any comm of the context. So while any open receive comm of
// the context has such a payload running, or one was given up on, the
// context is frozen: no close progresses it again, and it is kept.
bool may_progress(Ctx* ctx);
// Creates the UCP endpoint once the receiver's address arrived on the
// control socket; posts the sends that waited for it.
meshccl_tresult_t advance_setup(SendComm* c);
// c->broken, after a warning naming the endpoint's failure the first time a
// send meets it.
meshccl_tresult_t broken_result(SendComm* c);

// ucx_io.cpp
meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t send_test(Request* r, int* done, size_t* size);
void start_send(SendComm* c, Request* r);
meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t recv_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found);
void close_send(SendComm* c);
void close_recv(RecvComm* c);

}  // namespace meshccl::plugin::ucx

#endif  // MESHCCL_PLUGINS_UCX_UCX_COMM_H_
