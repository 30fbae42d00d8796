// The UCX transport: libmeshccl-transport-ucx.so, loaded by the runtime.
//
// One UCP worker per context with one UCP listener on an IP address
// (MESHCCL_SOCKET_IFNAME picks the interface, as for socket); a listener's
// handle carries that address, a connection id the worker hands out and a
// nonce. UCX's connection manager then exchanges the full worker addresses
// (too large for a handle) and picks the lanes: shared memory between
// processes of one host, TCP or RDMA otherwise, as UCX_TLS allows. UCX matches tags
// per worker, not per connection, and the contract's tags use all 64 bits,
// so a message travels as two UCX tagged messages whose UCX tags carry
// {connection id, kind, per-connection sequence number}:
//   header  {user tag, size}   received in order, one at a time, by the plugin
//   payload                    received straight into the user's buffer once
//                              the header matched a posted receive
// Matching by user tag (oldest posted receive, oldest unexpected header) is
// the plugin's, with the shared lists; an unexpected payload waits in UCX's
// own unexpected queue until its receive is posted. Progress happens only in
// isend, irecv and test. Endpoints use UCP_ERR_HANDLING_MODE_PEER so that a
// dead peer fails requests with REMOTE_ERROR instead of hanging.
//
// Settings: UCX's own (UCX_TLS, UCX_NET_DEVICES, ...) from the environment.
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "meshccl/transport.h"
#include "plugins/common/entry.h"
#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"
#include "plugins/common/socket_iface.h"

namespace meshccl::plugin::ucx {
namespace {

constexpr uint32_t kCtxMagic = 0x55435843;     // "UCXC"
constexpr uint32_t kSendMagic = 0x55435853;    // "UCXS"
constexpr uint32_t kRecvMagic = 0x55435852;    // "UCXR"
constexpr uint32_t kListenMagic = 0x5543584c;  // "UCXL"
constexpr uint32_t kReqMagic = 0x55435851;     // "UCXQ"
constexpr uint64_t kHandleMagic = 0x31444e4858435555ull;  // "UUCXHND1"

// UCX tag layout: connection id (32) | kind (2) | sequence (30).
enum : uint64_t { kHello = 0, kHeader = 1, kPayload = 2 };
constexpr uint64_t kSeqMask = (1ull << 30) - 1;
constexpr uint64_t kFullMask = ~0ull;
uint64_t utag(uint32_t conn, uint64_t kind, uint64_t seq) {
  return (static_cast<uint64_t>(conn) << 32) | (kind << 30) | (seq & kSeqMask);
}

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

struct WireHdr {
  uint64_t tag;
  uint64_t size;
};

struct Ctx {
  uint32_t magic = kCtxMagic;
  const meshccl_transport_host_v1_t* host = nullptr;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  sockaddr_storage laddr{};  // where the listener listens
  std::vector<ucp_ep_h> server_eps;  // endpoints of senders that connected to us
  uint32_t next_conn = 1;
  std::vector<void*> closing;  // endpoint close requests still in flight
  std::vector<struct SendComm*> connecting;  // hello not yet delivered
};

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  uint32_t conn = 0;
  uint64_t nonce = 0;
  uint64_t hello = 0;       // what the sender's hello carries
  void* hello_req = nullptr;
  bool accepted = false;
};

enum class Kind : uint8_t { kSend, kRecv };
enum class State : uint8_t { kPosted, kActive, kDone };

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
  WireHdr hdr;      // send: the header on the wire (must outlive its send)
  void* hdr_req;
  void* data_req;
};
static_assert(std::is_trivially_destructible_v<Request>);

struct Unexpected : Linked<Unexpected> {
  uint64_t tag;
  uint64_t size;
  uint64_t seq;
};

struct SendComm {
  uint32_t magic = kSendMagic;
  Ctx* ctx = nullptr;
  Handle handle{};
  ucp_ep_h ep = nullptr;
  uint32_t conn = 0;
  uint64_t seq = 0;
  uint64_t hello = 0;
  void* hello_req = nullptr;
  Pool<Request> reqs;
  List<Request> active;
  meshccl_tresult_t broken = MESHCCL_T_SUCCESS;
};

struct RecvComm {
  uint32_t magic = kRecvMagic;
  Ctx* ctx = nullptr;
  uint32_t conn = 0;
  uint64_t seq = 0;  // next header expected
  WireHdr hdr{};
  void* hdr_req = nullptr;
  List<Request> posted;
  List<Request> active;
  List<Unexpected> unexpected;
  Pool<Request> reqs;
  Pool<Unexpected> unex;
  std::vector<unsigned char> scratch;  // payloads of truncated receives
};

ArgCheck g_check("ucx");

meshccl_tresult_t status_result(ucs_status_t s) {
  switch (s) {
    case UCS_OK: return MESHCCL_T_SUCCESS;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_TIMED_OUT: return MESHCCL_T_REMOTE_ERROR;
    case UCS_ERR_MESSAGE_TRUNCATED: return MESHCCL_T_INVALID_USAGE;
    default: return MESHCCL_T_SYSTEM_ERROR;
  }
}

meshccl_tresult_t fail(const meshccl_transport_host_v1_t* host, const char* what, ucs_status_t s) {
  MPLUG_WARN(host, "ucx: %s failed: %s (UCX status %d)", what, ucs_status_string(s), static_cast<int>(s));
  return status_result(s);
}

// A request pointer from a *_nbx call: NULL = done at once, an error pointer
// = failed at once, else in flight. Returns the status now.
ucs_status_t check(void* req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  return ucp_request_check_status(req);
}
void drop(ucp_worker_h w, void*& req) {
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    if (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_request_cancel(w, req);
    ucp_request_free(req);
  }
  req = nullptr;
}

void* send_tagged(SendComm* c, const void* buf, size_t n, uint64_t tag) {
  ucp_request_param_t p{};
  return ucp_tag_send_nbx(c->ep, buf, n, tag, &p);
}
void* recv_tagged(Ctx* ctx, void* buf, size_t n, uint64_t tag) {
  ucp_request_param_t p{};
  return ucp_tag_recv_nbx(ctx->worker, buf, n, tag, kFullMask, &p);
}

void server_ep_error(void* arg, ucp_ep_h ep, ucs_status_t s) {
  (void)arg;
  (void)ep;
  (void)s;  // the sender's side reports; receives fail through the host's timeout
}

// Inside ucp_worker_progress: a sender connects; keep its endpoint so the
// connection stays up (messages come in through the worker's tag matching).
void on_conn_request(ucp_conn_request_h req, void* arg) {
  auto* ctx = static_cast<Ctx*>(arg);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = server_ep_error;
  ep.err_handler.arg = ctx;
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(ctx->worker, &ep, &h);
  if (s != UCS_OK) {
    MPLUG_WARN(ctx->host, "ucx: accepting a connection failed: %s", ucs_status_string(s));
    return;
  }
  ctx->server_eps.push_back(h);
}

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK) return fail(host, "reading the UCX configuration (UCX_* variables)", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  s = ucp_init(&params, cfg, &ctx->context);
  ucp_config_release(cfg);
  if (s != UCS_OK) return fail(host, "ucp_init", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(ctx->context, &wp, &ctx->worker);
  if (s != UCS_OK) {
    ucp_cleanup(ctx->context);
    return fail(host, "ucp_worker_create", s);
  }
  const char* spec = param_str(host, "MESHCCL_SOCKET_IFNAME");
  std::vector<socket::Iface> all = socket::list_ifaces();
  int i = socket::pick_iface(all, spec);
  if (i < 0) {
    MPLUG_WARN(host, "ucx: no interface that is up matches MESHCCL_SOCKET_IFNAME=%s", spec != nullptr ? spec : "(unset)");
    ucp_worker_destroy(ctx->worker);
    ucp_cleanup(ctx->context);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  const socket::Iface& ifc = all[static_cast<size_t>(i)];
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ifc.addr);
  lp.sockaddr.addrlen = ifc.addr_len;
  lp.conn_handler.cb = on_conn_request;
  lp.conn_handler.arg = ctx.get();
  s = ucp_listener_create(ctx->worker, &lp, &ctx->listener);
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (s == UCS_OK) s = ucp_listener_query(ctx->listener, &la);
  if (s != UCS_OK) {
    if (ctx->listener != nullptr) ucp_listener_destroy(ctx->listener);
    ucp_worker_destroy(ctx->worker);
    ucp_cleanup(ctx->context);
    return fail(host, ("listening on " + socket::describe(ifc)).c_str(), s);
  }
  ctx->laddr = la.sockaddr;
  MPLUG_INFO(host, "ucx: worker listening on %s",
             socket::addr_to_string(reinterpret_cast<const sockaddr*>(&ctx->laddr)).c_str());
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

void props(Ctx* c, meshccl_transport_props_v1_t* p) {
  (void)c;
  *p = meshccl_transport_props_v1_t{
      .name = "ucx",
      .bandwidth_gbs = 1.25,
      .latency_us = 20.0,
      .scope = MESHCCL_SCOPE_NETWORK,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** out) {
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->conn = ctx->next_conn++;
  lc->nonce = random_u64();
  lc->hello_req = recv_tagged(ctx, &lc->hello, sizeof(lc->hello), utag(lc->conn, kHello, 0));
  if (UCS_PTR_IS_ERR(lc->hello_req)) return fail(ctx->host, "posting the hello receive", UCS_PTR_STATUS(lc->hello_req));
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = lc->nonce;
  h.conn = lc->conn;
  h.family = ctx->laddr.ss_family;
  if (ctx->laddr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ctx->laddr);
    h.port = in->sin_port;
    std::memcpy(h.addr, &in->sin_addr, sizeof(in->sin_addr));
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ctx->laddr);
    h.port = in6->sin6_port;
    h.scope_id = in6->sin6_scope_id;
    std::memcpy(h.addr, &in6->sin6_addr, sizeof(in6->sin6_addr));
  }
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *out = lc.release();
  return MESHCCL_T_SUCCESS;
}

void close_send(SendComm* c);

void ep_error(void* arg, ucp_ep_h ep, ucs_status_t s) {
  (void)ep;
  auto* c = static_cast<SendComm*>(arg);
  if (c->broken == MESHCCL_T_SUCCESS) {
    MPLUG_WARN(c->ctx->host, "ucx: connection to the receiver failed: %s", ucs_status_string(s));
    c->broken = MESHCCL_T_REMOTE_ERROR;
  }
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** out) {
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || (h.family != AF_INET && h.family != AF_INET6))
    return g_check.misuse(ctx->host, "connect", "the handle is not a ucx handle");
  sockaddr_storage sa{};
  socklen_t len;
  if (h.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    in->sin_family = AF_INET;
    in->sin_port = h.port;
    std::memcpy(&in->sin_addr, h.addr, sizeof(in->sin_addr));
    len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = h.port;
    in6->sin6_scope_id = h.scope_id;
    std::memcpy(&in6->sin6_addr, h.addr, sizeof(in6->sin6_addr));
    len = sizeof(sockaddr_in6);
  }
  for (size_t k = 0; k < ctx->connecting.size(); ++k) {
    SendComm* p = ctx->connecting[k];
    if (std::memcmp(&p->handle, &h, sizeof(h)) != 0) continue;
    // The connection is usable once the hello went out: that is when the
    // connection manager finished wiring up.
    ucp_worker_progress(ctx->worker);
    ucs_status_t st = check(p->hello_req);
    if (st == UCS_INPROGRESS && p->broken == MESHCCL_T_SUCCESS) return MESHCCL_T_SUCCESS;  // not yet
    ctx->connecting.erase(ctx->connecting.begin() + static_cast<long>(k));
    if (st == UCS_OK && p->broken == MESHCCL_T_SUCCESS) {
      drop(ctx->worker, p->hello_req);
      *out = p;
      return MESHCCL_T_SUCCESS;
    }
    meshccl_tresult_t r = st != UCS_OK && st != UCS_INPROGRESS ? fail(ctx->host, "connecting", st) : p->broken;
    close_send(p);
    p->magic = 0;
    delete p;
    return r;
  }
  auto c = std::make_unique<SendComm>();
  c->handle = h;
  c->ctx = ctx;
  c->conn = h.conn;
  c->hello = h.nonce;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = len;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = ep_error;
  ep.err_handler.arg = c.get();
  ucs_status_t s = ucp_ep_create(ctx->worker, &ep, &c->ep);
  if (s != UCS_OK) return fail(ctx->host, "connecting (ucp_ep_create)", s);
  c->hello_req = send_tagged(c.get(), &c->hello, sizeof(c->hello), utag(c->conn, kHello, 0));
  if (UCS_PTR_IS_ERR(c->hello_req)) {
    meshccl_tresult_t r = fail(ctx->host, "sending the hello", UCS_PTR_STATUS(c->hello_req));
    c->hello_req = nullptr;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* cr = ucp_ep_close_nbx(c->ep, &p);
    if (cr != nullptr && !UCS_PTR_IS_ERR(cr)) ctx->closing.push_back(cr);
    return r;
  }
  ctx->connecting.push_back(c.release());
  return do_connect(ctx, handle, out);
}

meshccl_tresult_t do_accept(ListenComm* lc, void** out) {
  Ctx* ctx = lc->ctx;
  if (lc->accepted) return g_check.misuse(ctx->host, "accept", "the listener already accepted its sender");
  ucp_worker_progress(ctx->worker);
  ucs_status_t s = check(lc->hello_req);
  if (s == UCS_INPROGRESS) return MESHCCL_T_SUCCESS;  // not yet
  if (lc->hello_req != nullptr && !UCS_PTR_IS_ERR(lc->hello_req)) ucp_request_free(lc->hello_req);
  lc->hello_req = nullptr;
  if (s != UCS_OK) return fail(ctx->host, "receiving the hello", s);
  if (lc->hello != lc->nonce) {
    MPLUG_WARN(ctx->host, "ucx: a sender presented the wrong nonce for connection %u", lc->conn);
    return MESHCCL_T_INTERNAL_ERROR;
  }
  auto c = std::make_unique<RecvComm>();
  c->ctx = ctx;
  c->conn = lc->conn;
  lc->accepted = true;
  *out = c.release();
  return MESHCCL_T_SUCCESS;
}

// ---- sending ---------------------------------------------------------------

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  ucp_worker_progress(c->ctx->worker);
  if (c->broken != MESHCCL_T_SUCCESS) return c->broken;
  Request* r = c->reqs.get();
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->magic = kReqMagic;
  r->kind = Kind::kSend;
  r->state = State::kActive;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(const_cast<void*>(data));
  r->size = size;
  r->hdr = WireHdr{tag, size};
  uint64_t seq = c->seq++;
  r->hdr_req = send_tagged(c, &r->hdr, sizeof(r->hdr), utag(c->conn, kHeader, seq));
  r->data_req = send_tagged(c, data, size, utag(c->conn, kPayload, seq));
  c->active.push_back(r);
  *request = r;
  return MESHCCL_T_SUCCESS;
}

void release_send(SendComm* c, Request* r) {
  c->active.remove(r);
  r->magic = 0;
  c->reqs.put(r);
}

meshccl_tresult_t send_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<SendComm*>(r->comm);
  ucp_worker_progress(c->ctx->worker);
  *done = 0;
  ucs_status_t a = check(r->hdr_req), b = check(r->data_req);
  ucs_status_t bad = a != UCS_OK && a != UCS_INPROGRESS ? a : b != UCS_OK && b != UCS_INPROGRESS ? b : UCS_OK;
  if (bad == UCS_OK && (a == UCS_INPROGRESS || b == UCS_INPROGRESS)) {
    if (c->broken == MESHCCL_T_SUCCESS) return MESHCCL_T_SUCCESS;
    bad = UCS_ERR_CONNECTION_RESET;
  }
  drop(c->ctx->worker, r->hdr_req);
  drop(c->ctx->worker, r->data_req);
  *done = 1;
  meshccl_tresult_t res = bad == UCS_OK ? MESHCCL_T_SUCCESS : fail(c->ctx->host, "sending a message", bad);
  if (size != nullptr) *size = res == MESHCCL_T_SUCCESS ? r->size : 0;
  release_send(c, r);
  return res;
}

// ---- receiving -------------------------------------------------------------

// Starts the payload receive of message `seq` for r (matched, size known).
void start_payload(RecvComm* c, Request* r, uint64_t size, uint64_t seq) {
  r->nbytes = size;
  r->state = State::kActive;
  void* dst = r->data;
  if (size > r->size) {
    // Too long: still drain the payload so the next messages flow.
    MPLUG_WARN(c->ctx->host, "ucx: a %" PRIu64 "-byte message (tag %" PRIu64 ") does not fit a %" PRIu64
                             "-byte receive", size, r->tag, r->size);
    r->result = MESHCCL_T_INVALID_USAGE;
    if (c->scratch.size() < size) c->scratch.resize(size);
    dst = c->scratch.data();
  }
  r->data_req = recv_tagged(c->ctx, dst, size, utag(c->conn, kPayload, seq));
  c->active.push_back(r);
}

// Takes in every header that arrived, in order, matching each to a posted
// receive or keeping it as unexpected.
meshccl_tresult_t pump(RecvComm* c) {
  ucp_worker_progress(c->ctx->worker);
  for (;;) {
    if (c->hdr_req == nullptr) {
      c->hdr_req = recv_tagged(c->ctx, &c->hdr, sizeof(c->hdr), utag(c->conn, kHeader, c->seq));
      if (c->hdr_req == nullptr) c->hdr_req = reinterpret_cast<void*>(1);  // done at once
    }
    ucs_status_t s = c->hdr_req == reinterpret_cast<void*>(1) ? UCS_OK : check(c->hdr_req);
    if (s == UCS_INPROGRESS) return MESHCCL_T_SUCCESS;
    if (c->hdr_req != reinterpret_cast<void*>(1) && !UCS_PTR_IS_ERR(c->hdr_req)) ucp_request_free(c->hdr_req);
    c->hdr_req = nullptr;
    if (s != UCS_OK) return fail(c->ctx->host, "receiving a message header", s);
    uint64_t seq = c->seq++;
    if (Request* r = c->posted.take_tag(c->hdr.tag)) {
      start_payload(c, r, c->hdr.size, seq);
    } else {
      Unexpected* u = c->unex.get();
      if (u == nullptr) return MESHCCL_T_SYSTEM_ERROR;
      u->tag = c->hdr.tag;
      u->size = c->hdr.size;
      u->seq = seq;
      c->unexpected.push_back(u);
    }
  }
}

meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request) {
  Request* r = c->reqs.get();
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->magic = kReqMagic;
  r->kind = Kind::kRecv;
  r->state = State::kPosted;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(data);
  r->size = size;
  r->nbytes = 0;
  r->hdr_req = r->data_req = nullptr;
  if (Unexpected* u = c->unexpected.take_tag(tag)) {
    start_payload(c, r, u->size, u->seq);
    c->unex.put(u);
  } else {
    c->posted.push_back(r);
  }
  *request = r;
  return pump(c);
}

meshccl_tresult_t recv_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<RecvComm*>(r->comm);
  *done = 0;
  meshccl_tresult_t pr = pump(c);
  ucs_status_t s = UCS_INPROGRESS;
  if (r->state == State::kActive) s = check(r->data_req);
  if (s == UCS_INPROGRESS && pr == MESHCCL_T_SUCCESS) return MESHCCL_T_SUCCESS;
  meshccl_tresult_t res = r->result;
  if (s == UCS_INPROGRESS) {
    res = pr;  // the stream of headers broke: this receive cannot complete
  } else if (s != UCS_OK) {
    res = fail(c->ctx->host, "receiving a message", s);
  }
  drop(c->ctx->worker, r->data_req);
  if (r->state == State::kActive) c->active.remove(r); else c->posted.remove(r);
  *done = 1;
  if (size != nullptr) *size = res == MESHCCL_T_SUCCESS ? r->nbytes : 0;
  r->magic = 0;
  c->reqs.put(r);
  return res;
}

// ---- closing ---------------------------------------------------------------

void close_send(SendComm* c) {
  ucp_worker_h w = c->ctx->worker;
  c->active.for_each([&](Request* r) {
    drop(w, r->hdr_req);
    drop(w, r->data_req);
    r->magic = 0;
  });
  drop(w, c->hello_req);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* cr = ucp_ep_close_nbx(c->ep, &p);
  if (cr != nullptr && !UCS_PTR_IS_ERR(cr)) c->ctx->closing.push_back(cr);
}

void close_recv(RecvComm* c) {
  ucp_worker_h w = c->ctx->worker;
  c->active.for_each([&](Request* r) {
    drop(w, r->data_req);
    r->magic = 0;
  });
  c->posted.for_each([&](Request* r) { r->magic = 0; });
  if (c->hdr_req != reinterpret_cast<void*>(1)) drop(w, c->hdr_req);
  // Payloads that arrived unexpected stay in UCX's queue: drain them.
  c->unexpected.for_each([&](Unexpected* u) {
    for (;;) {
      ucp_tag_recv_info_t info;
      ucp_tag_message_h m = ucp_tag_probe_nb(w, utag(c->conn, kPayload, u->seq), kFullMask, 1, &info);
      if (m == nullptr) break;
      std::vector<unsigned char> sink(info.length);
      ucp_request_param_t p{};
      void* rq = ucp_tag_msg_recv_nbx(w, sink.data(), sink.size(), m, &p);
      for (int i = 0; i < 1000 && check(rq) == UCS_INPROGRESS; ++i) ucp_worker_progress(w);
      void* tmp = rq;
      drop(w, tmp);
      break;
    }
  });
}

void close_listen(ListenComm* lc) { drop(lc->ctx->worker, lc->hello_req); }

void finalize(Ctx* c) {
  for (SendComm* p : c->connecting) {  // connects the host gave up on
    close_send(p);
    p->magic = 0;
    delete p;
  }
  c->connecting.clear();
  // Endpoint closes in flight: bounded wait, then the worker goes anyway.
  for (int i = 0; i < 100000 && !c->closing.empty(); ++i) {
    ucp_worker_progress(c->worker);
    for (size_t k = 0; k < c->closing.size();) {
      if (ucp_request_check_status(c->closing[k]) != UCS_INPROGRESS) {
        ucp_request_free(c->closing[k]);
        c->closing.erase(c->closing.begin() + static_cast<long>(k));
      } else {
        ++k;
      }
    }
  }
  for (void* r : c->closing) ucp_request_free(r);
  ucp_listener_destroy(c->listener);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (ucp_ep_h ep : c->server_eps) {
    void* r = ucp_ep_close_nbx(ep, &p);
    for (int i = 0; i < 100000 && r != nullptr && !UCS_PTR_IS_ERR(r) && ucp_request_check_status(r) == UCS_INPROGRESS; ++i)
      ucp_worker_progress(c->worker);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
  }
  ucp_worker_destroy(c->worker);
  ucp_cleanup(c->context);
}

struct Traits {
  static constexpr const char* kName = "ucx";
  using Ctx = ucx::Ctx;
  using ListenComm = ucx::ListenComm;
  using SendComm = ucx::SendComm;
  using RecvComm = ucx::RecvComm;
  using Request = ucx::Request;
  static constexpr uint32_t kCtxMagic = ucx::kCtxMagic;
  static constexpr uint32_t kListenMagic = ucx::kListenMagic;
  static constexpr uint32_t kSendMagic = ucx::kSendMagic;
  static constexpr uint32_t kRecvMagic = ucx::kRecvMagic;
  static constexpr uint32_t kReqMagic = ucx::kReqMagic;
  static ArgCheck& check() { return g_check; }
  static meshccl_tresult_t init(const meshccl_transport_host_v1_t* h, void** c) { return do_init(h, c); }
  static void props(Ctx* c, meshccl_transport_props_v1_t* p) { ucx::props(c, p); }
  static meshccl_tresult_t listen(Ctx* c, void* h, void** l) { return do_listen(c, h, l); }
  static meshccl_tresult_t connect(Ctx* c, const void* h, void** s) { return do_connect(c, h, s); }
  static meshccl_tresult_t accept(ListenComm* l, void** r) { return do_accept(l, r); }
  static meshccl_tresult_t send_post(SendComm* c, const void* d, size_t n, uint64_t t, void** r) {
    return ucx::send_post(c, d, n, t, r);
  }
  static meshccl_tresult_t recv_post(RecvComm* c, void* d, size_t n, uint64_t t, void** r) {
    return ucx::recv_post(c, d, n, t, r);
  }
  static meshccl_tresult_t send_test(Request* r, int* d, size_t* n) { return ucx::send_test(r, d, n); }
  static meshccl_tresult_t recv_test(Request* r, int* d, size_t* n) { return ucx::recv_test(r, d, n); }
  static void close_send(SendComm* c) { ucx::close_send(c); }
  static void close_recv(RecvComm* c) { ucx::close_recv(c); }
  static void close_listen(ListenComm* l) { ucx::close_listen(l); }
  static void finalize(Ctx* c) { ucx::finalize(c); }
};

}  // namespace
}  // namespace meshccl::plugin::ucx

extern "C" __attribute__((visibility("default"))) const meshccl_transport_v1_t meshccl_transport_v1 =
    meshccl::plugin::Entry<meshccl::plugin::ucx::Traits>::table();
