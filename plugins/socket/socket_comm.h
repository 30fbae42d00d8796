// Internal state of the socket (TCP) transport. A connection is one TCP
// stream from sender to receiver carrying frames {tag, size} + payload; the
// receiver matches each frame to a posted receive as its header arrives, or
// buffers it as unexpected. See docs/transports.md.
#ifndef MESHCCL_PLUGINS_SOCKET_SOCKET_COMM_H_
#define MESHCCL_PLUGINS_SOCKET_SOCKET_COMM_H_

#include <sys/socket.h>

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

namespace meshccl::plugin::socket {

constexpr uint32_t kCtxMagic = 0x534f4b43;                // "SOKC"
constexpr uint32_t kSendMagic = 0x534f4b53;               // "SOKS"
constexpr uint32_t kRecvMagic = 0x534f4b52;               // "SOKR"
constexpr uint32_t kListenMagic = 0x534f4b4c;             // "SOKL"
constexpr uint32_t kReqMagic = 0x534f4b51;                // "SOKQ"
constexpr uint64_t kHandleMagic = 0x31444e484b434f53ull;  // "SOCKHND1"
constexpr uint64_t kHelloMagic = 0x314f4c4c454b4f53ull;   // "SOKELLO1"

// Plain bytes, valid in any process.
struct Handle {
  uint64_t magic;
  uint64_t nonce;
  uint16_t family;
  uint16_t port;  // network byte order
  uint32_t scope_id;
  uint8_t addr[16];
};
static_assert(sizeof(Handle) <= MESHCCL_TRANSPORT_HANDLE_BYTES);

// First bytes on every connection: a connecting socket proves that it got
// the handle from the listener's owner.
using Hello = GateHello;  // the first bytes a sender writes (plugins/common/tcp_gate.h)

// Little-endian on the wire, so that hosts of either byte order agree.
struct FrameHdr {
  uint64_t tag;
  uint64_t size;
};

// A connect() in progress, kept between calls of the non-blocking connect.
using Connecting = Dialing<Handle>;

struct SendComm;
struct RecvComm;

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  Iface iface;
  double bandwidth_gbs = 0;
  double latency_us = 0;
  std::vector<Connecting> connecting;
  // The wait descriptor (transport.h): an epoll set over the context's
  // connections, made at the first wait_fd; the connections it watches.
  int epfd = -1;
  std::vector<SendComm*> sends;
  std::vector<RecvComm*> recvs;
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  TcpGate gate;  // the listening socket and the connections not identified yet
  bool accepted = false;
};

enum class Kind : uint8_t { kSend, kRecv };
enum class State : uint8_t { kQueued, kPosted, kActive, kDone };

struct Request : Linked<Request> {
  uint32_t magic;
  Kind kind;
  State state;
  meshccl_tresult_t result;
  void* comm;  // SendComm* or RecvComm*, by kind
  uint64_t tag;
  unsigned char* data;
  uint64_t size;    // send: message size; recv: buffer capacity
  uint64_t nbytes;  // recv: size of the matched message
  uint64_t done;    // send: frame bytes written (header included)
  FrameHdr hdr;     // send: the frame header, as on the wire
};

// A frame that arrived (or is arriving) before its receive was posted.
struct Unexpected : Linked<Unexpected> {
  uint64_t tag;
  uint64_t size;
  bool complete;
  BufferPool::Buf buf;
};

struct SendComm {
  uint32_t magic = kSendMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  std::string peer;
  List<Request> queue;  // posting order; the front may be partly written
  Pool<Request> reqs;
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
  int64_t watched = -1;  // events in the context's epoll set; -1: not in it
  EmptyCalls calls;      // sendmsg finding the socket buffer full
};

struct RecvComm {
  static constexpr size_t kStage = 256u << 10;
  uint32_t magic = kRecvMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  std::string peer;
  Pool<Request> reqs;
  BufferPool bufs{64u << 20};
  Matcher<Request, Unexpected> m{&bufs};  // posted receives, unexpected frames, peer gone
  // Small frames are read many at a time into this buffer and copied out;
  // large payloads are read straight into their destination.
  std::unique_ptr<unsigned char[]> stage{new unsigned char[kStage]};
  bool watched = false;  // in the context's epoll set
  EmptyCalls calls;      // recv finding nothing
  size_t stage_pos = 0;
  size_t stage_len = 0;
  // The frame being read: its header is consumed, `got` of `size` payload
  // bytes are in. The payload goes to cur_req, or to cur_unex's buffer, or
  // nowhere (a receive that was too small).
  bool in_frame = false;
  uint64_t size = 0;
  uint64_t got = 0;
  unsigned char* dest = nullptr;
  Request* cur_req = nullptr;
  Unexpected* cur_unex = nullptr;
};

// socket.cpp: checks a handle received from a peer and gives the address it
// names; the reason it is refused, or nullptr.
const char* parse_handle(const void* bytes, Handle* h, sockaddr_storage* sa, socklen_t* len);

// socket_io.cpp
meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t send_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t recv_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found);

}  // namespace meshccl::plugin::socket

#endif  // MESHCCL_PLUGINS_SOCKET_SOCKET_COMM_H_
