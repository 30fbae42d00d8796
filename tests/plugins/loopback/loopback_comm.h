// Internal state of the loopback transport, a plugin built only for the
// tests: the example of a transport added without touching the runtime
// (docs/transports.md, "Adding a transport: the loopback plugin").
//
// A connection is a Unix SOCK_SEQPACKET socket in the abstract namespace
// (processes of one machine and network namespace; nothing is left in the
// file system). The kernel keeps each record whole, so the wire needs no
// stream parsing: a message is one header record {tag, size} followed by its
// payload in records of at most kChunk bytes. The receiver matches the
// header to a posted receive (plugins/common/matcher.h) and reads each
// payload record straight into its buffer, or into a parked buffer when no
// receive waits yet. The listener hands its name and a nonce to the sender;
// the first record a sender writes is {magic, nonce}, and a connection that
// presents anything else is refused.
//
// Its name and the scope its properties declare are compile-time choices
// (LOOPBACK_NAME, LOOPBACK_SCOPE), so the tests build it twice: "loopback"
// (network scope) and "loopback-node" (node scope), and see the runtime
// honour each scope without knowing either name.
#ifndef MESHCCL_TESTS_PLUGINS_LOOPBACK_LOOPBACK_COMM_H_
#define MESHCCL_TESTS_PLUGINS_LOOPBACK_LOOPBACK_COMM_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshccl/transport.h"
#include "plugins/common/matcher.h"
#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"

#ifndef LOOPBACK_NAME
#define LOOPBACK_NAME "loopback"
#endif
#ifndef LOOPBACK_SCOPE
#define LOOPBACK_SCOPE MESHCCL_SCOPE_NETWORK
#endif

namespace meshccl::plugin::loopback {

constexpr const char* kName = LOOPBACK_NAME;
constexpr uint32_t kCtxMagic = 0x4c50424b;                // "LPBK"
constexpr uint32_t kSendMagic = 0x4c504253;               // "LPBS"
constexpr uint32_t kRecvMagic = 0x4c504252;               // "LPBR"
constexpr uint32_t kListenMagic = 0x4c50424c;             // "LPBL"
constexpr uint32_t kReqMagic = 0x4c504251;                // "LPBQ"
constexpr uint64_t kHandleMagic = 0x31444e484b42504cull;  // "LPBKHND1"
constexpr uint64_t kHelloMagic = 0x314f4c4c454b424cull;   // "LBKELLO1"
// Payload bytes per record: well below the default socket buffer (the
// kernel refuses a record larger than the sender's buffer).
constexpr uint64_t kChunk = 64u << 10;

// Plain bytes, valid in any process of the machine.
struct Handle {
  uint64_t magic;
  uint64_t nonce;
  char path[64];  // the listener's abstract name, after its leading NUL; NUL-terminated
};
static_assert(sizeof(Handle) <= MESHCCL_TRANSPORT_HANDLE_BYTES);

// The first record of a connection.
struct Hello {
  uint64_t magic;
  uint64_t nonce;
};

// The record in front of every message's payload records.
struct Header {
  uint64_t tag;
  uint64_t size;
};

// A connect() in progress, kept between the calls of the non-blocking connect.
struct Dialing {
  Handle handle;
  int fd = -1;  // connected, hello not written yet
};

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  std::vector<Dialing> dialing;
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  uint64_t nonce = 0;
  std::vector<int> pending;  // accepted, not identified yet
  bool accepted = false;
};

enum class Kind : uint8_t { kSend, kRecv };
enum class State : uint8_t { kQueued, kPosted, kActive, kDone };

struct Request : Linked<Request> {
  uint32_t magic;
  Kind kind;
  State state;
  bool header_sent;  // send
  meshccl_tresult_t result;
  void* comm;  // SendComm* or RecvComm*, by kind
  uint64_t tag;
  unsigned char* data;
  uint64_t size;    // send: message size; recv: buffer capacity
  uint64_t nbytes;  // recv: size of the matched message
  uint64_t done;    // send: payload bytes handed to the kernel
};

// A message that arrived (or is arriving) before its receive was posted.
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
  List<Request> queue;  // posting order; the front may be partly sent
  Pool<Request> reqs;
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
};

struct RecvComm {
  uint32_t magic = kRecvMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  Pool<Request> reqs;
  BufferPool bufs{64u << 20};
  Matcher<Request, Unexpected> m{&bufs};
  // The message being read: its header is in, `got` of `size` payload bytes
  // too. They go to cur_req, to cur_unex's buffer, or nowhere (dest null: a
  // receive that was too small).
  bool in_frame = false;
  uint64_t size = 0;
  uint64_t got = 0;
  unsigned char* dest = nullptr;
  Request* cur_req = nullptr;
  Unexpected* cur_unex = nullptr;
};

// loopback_io.cpp
meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t send_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request);
meshccl_tresult_t recv_test(Request* r, int* done, size_t* size);
meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found);

}  // namespace meshccl::plugin::loopback

#endif  // MESHCCL_TESTS_PLUGINS_LOOPBACK_LOOPBACK_COMM_H_
