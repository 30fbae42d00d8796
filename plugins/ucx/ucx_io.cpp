// The UCX transport's data path: posting and testing sends and receives,
// matching user tags, noticing a peer that went away, and closing.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <vector>

#include "plugins/ucx/ucx_comm.h"

namespace meshccl::plugin::ucx {

namespace {

// Every buffer is host memory (the plugin declares host pointers only):
// saying so spares UCX detecting each buffer's memory type, which costs a
// lookup per operation where UCX has GPU transports.
ucp_request_param_t host_memory() {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  p.memory_type = UCS_MEMORY_TYPE_HOST;
  return p;
}

void* send_tagged(SendComm* c, const void* buf, size_t n, uint64_t tag) {
  ucp_request_param_t p = host_memory();
  return ucp_tag_send_nbx(c->ep, buf, n, tag, &p);
}

// Reads what the peer wrote on the control socket without blocking: the
// goodbye when `bye` is given, else nothing is expected. True once the
// stream ended (closed, reset, or the peer process is gone).
bool control_closed(int fd, Bye* bye, uint32_t* got) {
  for (;;) {
    char sink[sizeof(Bye)];
    char* dst = bye != nullptr && *got < sizeof(Bye) ? reinterpret_cast<char*>(bye) + *got : sink;
    size_t want = bye != nullptr && *got < sizeof(Bye) ? sizeof(Bye) - *got : sizeof(sink);
    ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n <= 0) return true;
    if (bye != nullptr && dst != sink) *got += static_cast<uint32_t>(n);
  }
}

}  // namespace

// ---- sending ---------------------------------------------------------------

void start_send(SendComm* c, Request* r) {
  r->state = State::kActive;
  uint64_t seq = r->seq;
  if (r->size <= kInline) {
    if (r->size != 0) std::memcpy(r->wire + sizeof(WireHdr), r->data, r->size);
    r->hdr_req = send_tagged(c, r->wire, sizeof(WireHdr) + r->size, utag(c->conn, kHeader, seq));
  } else {
    r->hdr_req = send_tagged(c, r->wire, sizeof(WireHdr), utag(c->conn, kHeader, seq));
    r->data_req = send_tagged(c, r->data, r->size, utag(c->conn, kPayload, seq));
  }
  c->active.push_back(r);
}

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  MPLUG_CHECK(advance_setup(c));
  Request* r = c->reqs.get();
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->magic = kReqMagic;
  r->kind = Kind::kSend;
  r->state = State::kWaiting;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(const_cast<void*>(data));
  r->size = size;
  r->nbytes = 0;
  r->seq = c->seq++;
  r->hdr_req = r->data_req = nullptr;
  WireHdr h{tag, size};
  std::memcpy(r->wire, &h, sizeof(h));
  if (c->ep != nullptr) start_send(c, r);
  else c->waiting.push_back(r);
  *request = r;
  return MESHCCL_T_SUCCESS;
}

namespace {

// Drops a send's UCX requests. To another host (peer error handling), one
// given up on in flight makes the worker unsafe to destroy (see finalize);
// on one host UCX destroys such endpoints cleanly. True when one was in flight.
bool drop_send(SendComm* c, Request* r) {
  bool gave_up = drop(c->ctx->worker, r->hdr_req);
  gave_up |= drop(c->ctx->worker, r->data_req);
  if (gave_up && c->ep != nullptr && to_other_host(c)) c->ctx->abandoned = true;
  return gave_up;
}

void release_send(SendComm* c, Request* r) {
  if (r->state == State::kWaiting) c->waiting.remove(r);
  else c->active.remove(r);
  drop_send(c, r);
  r->magic = 0;
  c->reqs.put(r);
}

// Not finished: is the receiver still there? The control socket carries
// nothing after the address, so EOF means it closed or exited.
meshccl_tresult_t send_liveness(SendComm* c) {
  if (c->broken != MESHCCL_T_SUCCESS) return broken_result(c);
  if (!c->watch.due()) return MESHCCL_T_SUCCESS;
  if (!control_closed(c->fd, nullptr, nullptr)) return MESHCCL_T_SUCCESS;
  // UCX may still be finishing what the receiver already has: one grace
  // period, then the send fails.
  uint64_t now = now_ns();
  if (c->closed_ns == 0) c->closed_ns = now;
  if (now - c->closed_ns < kGraceNs) return MESHCCL_T_SUCCESS;
  MPLUG_WARN(c->ctx->host, "ucx: the receiver at %s closed the connection or exited", c->peer.c_str());
  return c->broken = MESHCCL_T_REMOTE_ERROR;
}

// A test's progress call. With UCX's TCP transport ucp_worker_progress is a
// system call (epoll_wait over its sockets), and an engine's pass tests
// every transfer in flight, each test asking for progress: with priority
// scheduling's chunks a stream's thread made some 300,000 such calls a
// second (meshtrain, 2 hosts at 100 Mbit/s). A call begins at least 2 us
// after the previous one began, and later after a stretch of calls that
// found nothing (EmptyCalls). One clock read per test: the clock was 1-2%
// of a rank's samples there, two or three reads per test.
void progress(Ctx* ctx) {
  const uint64_t now = now_ns();
  if (!ctx->progress_calls.due(now)) return;
  const unsigned events = ucp_worker_progress(ctx->worker);
  if (events != 0) ctx->progress_calls.moved(now);
  else ctx->progress_calls.empty(now);
}

}  // namespace

meshccl_tresult_t send_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<SendComm*>(r->comm);
  *done = 0;
  // Small sends usually complete inside ucp_tag_send_nbx: report that
  // without a progress call (a system call with UCX's TCP transport).
  if (r->state != State::kActive || check(r->hdr_req) != UCS_OK || check(r->data_req) != UCS_OK) progress(c->ctx);
  meshccl_tresult_t res = MESHCCL_T_SUCCESS;
  if (r->state == State::kWaiting) {
    res = advance_setup(c);
    if (res == MESHCCL_T_SUCCESS && r->state == State::kWaiting) return MESHCCL_T_SUCCESS;
  }
  if (res == MESHCCL_T_SUCCESS) {
    ucs_status_t a = check(r->hdr_req), b = check(r->data_req);
    ucs_status_t bad = a != UCS_OK && a != UCS_INPROGRESS ? a : b != UCS_OK && b != UCS_INPROGRESS ? b : UCS_OK;
    if (bad != UCS_OK) {
      res = c->broken != MESHCCL_T_SUCCESS ? broken_result(c)
                                           : fail(c->ctx->host, ("sending to " + c->peer).c_str(), bad);
    } else if (a == UCS_INPROGRESS || b == UCS_INPROGRESS) {
      res = send_liveness(c);
      if (res == MESHCCL_T_SUCCESS) return MESHCCL_T_SUCCESS;  // not yet
    }
  }
  *done = 1;
  if (size != nullptr) *size = res == MESHCCL_T_SUCCESS ? r->size : 0;
  release_send(c, r);
  return res;
}

// ---- receiving -------------------------------------------------------------

namespace {

// Header receives always return a request (UCP_OP_ATTR_FLAG_NO_IMM_CMPL):
// the received length comes from ucp_tag_recv_request_test, which UCX 1.13
// fills reliably, unlike recv_info on immediate completion.
void* recv_tagged(RecvComm* c, void* buf, size_t n, uint64_t tag, bool header) {
  ucp_request_param_t p = host_memory();
  if (header) p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  return ucp_tag_recv_nbx(c->ctx->worker, buf, n, tag, kFullMask, &p);
}

// Copies an inline payload into r (or fails r when it does not fit).
void finish_inline(RecvComm* c, Request* r, const unsigned char* src, uint64_t size) {
  r->nbytes = size;
  r->state = State::kActive;
  r->data_req = nullptr;  // complete: recv_test reports it
  if (size > r->size) {
    MPLUG_WARN(c->ctx->host,
               "ucx: a %" PRIu64 "-byte message (tag %" PRIu64 ") does not fit a %" PRIu64 "-byte receive", size,
               r->tag, r->size);
    r->result = MESHCCL_T_INVALID_USAGE;
  } else if (size != 0) {
    std::memcpy(r->data, src, size);
  }
  c->m.active().push_back(r);
}

// Starts the payload receive of message `seq` for r (matched, size known).
void start_payload(RecvComm* c, Request* r, uint64_t size, uint64_t seq) {
  r->nbytes = size;
  r->state = State::kActive;
  void* dst = r->data;
  if (size > r->size) {
    // Too long: still drain the payload so the next messages flow.
    MPLUG_WARN(c->ctx->host,
               "ucx: a %" PRIu64 "-byte message (tag %" PRIu64 ") does not fit a %" PRIu64 "-byte receive", size,
               r->tag, r->size);
    r->result = MESHCCL_T_INVALID_USAGE;
    if (c->scratch.size() < size) c->scratch.resize(size);
    dst = c->scratch.data();
  }
  r->data_req = recv_tagged(c, dst, size, utag(c->conn, kPayload, seq), false);
  c->m.active().push_back(r);
}

// One header arrived (len bytes in hdr_buf): match it or keep it.
meshccl_tresult_t take_header(RecvComm* c, size_t len) {
  WireHdr h;
  std::memcpy(&h, c->hdr_buf, sizeof(h));
  const bool inl = h.size <= kInline;
  if (len != sizeof(WireHdr) + (inl ? h.size : 0)) {
    MPLUG_WARN(c->ctx->host, "ucx: malformed message header from %s (%zu bytes for a %" PRIu64 "-byte message)",
               c->peer.c_str(), len, h.size);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  uint64_t seq = c->seq++;
  const unsigned char* payload = c->hdr_buf + sizeof(WireHdr);
  if (Request* r = c->m.match(h.tag)) {
    if (inl) finish_inline(c, r, payload, h.size);
    else start_payload(c, r, h.size, seq);
    return MESHCCL_T_SUCCESS;
  }
  // An inline payload is kept with its header; a separate one stays in UCX's
  // queue until its receive is posted.
  Unexpected* u = c->m.park(h.tag, h.size, inl ? h.size : 0);
  if (u == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  u->seq = seq;
  if (inl && h.size != 0) std::memcpy(u->buf.ptr, payload, h.size);
  return MESHCCL_T_SUCCESS;
}

// Takes in every header that arrived, in order.
meshccl_tresult_t pump(RecvComm* c) {
  progress(c->ctx);
  for (;;) {
    if (!c->hdr_posted) {
      c->hdr_req = recv_tagged(c, c->hdr_buf, sizeof(c->hdr_buf), utag(c->conn, kHeader, c->seq), true);
      c->hdr_posted = true;
    }
    ucs_status_t s = check(c->hdr_req);
    if (s == UCS_INPROGRESS) return MESHCCL_T_SUCCESS;
    size_t len = 0;
    if (s == UCS_OK && c->hdr_req != nullptr) {
      ucp_tag_recv_info_t info{};
      s = ucp_tag_recv_request_test(c->hdr_req, &info);
      len = info.length;
    }
    if (c->hdr_req != nullptr && !UCS_PTR_IS_ERR(c->hdr_req)) ucp_request_free(c->hdr_req);
    c->hdr_req = nullptr;
    c->hdr_posted = false;
    if (s != UCS_OK) return fail(c->ctx->host, ("receiving a message header from " + c->peer).c_str(), s);
    MPLUG_CHECK(take_header(c, len));
  }
}

// A receive's payload that UCX may still be writing: posted and not finished.
bool payload_running(const Request* r) {
  return r->data_req != nullptr && !UCS_PTR_IS_ERR(r->data_req) &&
         ucp_request_check_status(r->data_req) == UCS_INPROGRESS;
}

// A receive that cannot finish yet: did the sender go away? After its
// goodbye, a receive with no message left to come fails at once; otherwise
// (EOF without goodbye, or messages still owed) after a grace period.
// Whether the sender is gone for good: it said goodbye with every header
// in (and the caller waits on no message matched already: `unmatched`), or
// a grace period has passed since its connection ended otherwise.
bool sender_gone(RecvComm* c, bool unmatched, bool* said_bye) {
  if (c->closed_ns == 0) {
    if (!c->watch.due() || !control_closed(c->fd, &c->bye, &c->bye_got)) return false;
    c->closed_ns = now_ns();
  }
  *said_bye = c->bye_got == sizeof(Bye) && c->bye.magic == kByeMagic;
  const bool none_left = *said_bye && c->seq >= c->bye.sent && unmatched;
  return none_left || now_ns() - c->closed_ns >= kGraceNs;
}

meshccl_tresult_t recv_liveness(RecvComm* c, Request* r) {
  bool said_bye = false;
  if (!sender_gone(c, r->state == State::kPosted, &said_bye)) return MESHCCL_T_SUCCESS;
  MPLUG_WARN(c->ctx->host, "ucx: the sender at %s %s; a receive (tag %" PRIu64 ") cannot complete", c->peer.c_str(),
             said_bye ? "closed the connection" : "exited or the connection broke", r->tag);
  return MESHCCL_T_REMOTE_ERROR;
}

}  // namespace

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
  // Does not fail: the matcher's gone state is never set here (a receive
  // posted after its sender left fails at test, see recv_liveness).
  (void)c->m.post(r, [c](Request* r, Unexpected* u) {
    if (u->size <= kInline) finish_inline(c, r, static_cast<unsigned char*>(u->buf.ptr), u->size);
    else start_payload(c, r, u->size, u->seq);
  });
  *request = r;
  return pump(c);
}

meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found) {
  const meshccl_tresult_t res = pump(c);
  (void)c->m.probe(tag, found);  // no gone state there: sender_gone decides below
  if (*found != 0 || res != MESHCCL_T_SUCCESS) return *found != 0 ? MESHCCL_T_SUCCESS : res;
  bool said_bye = false;
  return sender_gone(c, true, &said_bye) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<RecvComm*>(r->comm);
  *done = 0;
  ucs_status_t s = r->state == State::kActive ? check(r->data_req) : UCS_INPROGRESS;
  meshccl_tresult_t res = MESHCCL_T_SUCCESS;
  if (s == UCS_INPROGRESS) {  // a finished receive needs no progress call
    res = pump(c);
    s = r->state == State::kActive ? check(r->data_req) : UCS_INPROGRESS;
  }
  if (s == UCS_INPROGRESS && res == MESHCCL_T_SUCCESS) {
    res = recv_liveness(c, r);
    if (res == MESHCCL_T_SUCCESS) return MESHCCL_T_SUCCESS;  // not yet
  } else if (s == UCS_OK) {
    res = r->result;
  } else if (s != UCS_INPROGRESS) {
    // A transfer UCX gave up on: the sender's death says it better.
    if (c->closed_ns == 0 && control_closed(c->fd, &c->bye, &c->bye_got)) c->closed_ns = now_ns();
    if (c->closed_ns != 0) {
      MPLUG_WARN(c->ctx->host, "ucx: the sender at %s went away during a transfer (%s)", c->peer.c_str(),
                 ucs_status_string(s));
      res = MESHCCL_T_REMOTE_ERROR;
    } else {
      res = fail(c->ctx->host, ("receiving from " + c->peer).c_str(), s);
    }
  }
  // Failed with its payload still running: UCX may go on writing a buffer
  // the caller frees once this returns (see may_progress).
  if (res != MESHCCL_T_SUCCESS && r->state == State::kActive && payload_running(r)) {
    ucp_request_cancel(c->ctx->worker, r->data_req);
    if (payload_running(r)) c->ctx->freeze.set();
  }
  drop(c->ctx->worker, r->data_req);
  if (r->state == State::kActive) c->m.active().remove(r);
  else c->m.posted().remove(r);
  res = report_done(res, r->nbytes, done, size);
  r->magic = 0;
  c->reqs.put(r);
  return res;
}

// ---- closing ---------------------------------------------------------------

void close_send(SendComm* c) {
  Ctx* ctx = c->ctx;
  c->waiting.for_each([&](Request* r) { r->magic = 0; });
  c->active.for_each([&](Request* r) {
    drop_send(c, r);
    r->magic = 0;
  });
  if (c->broken != MESHCCL_T_SUCCESS) ctx->peer_failed = true;
  if (c->ep != nullptr) {
    // Push out what completed sends left in UCX's queues (bounded), then
    // close without waiting for the peer: a force close also ends sends
    // that were given up on, which UCX would otherwise keep until the
    // worker goes.
    if (c->broken == MESHCCL_T_SUCCESS && may_progress(ctx)) {
      ucp_request_param_t fp{};
      void* fr = ucp_ep_flush_nbx(c->ep, &fp);
      uint64_t until = now_ns() + 200'000'000;
      while (check(fr) == UCS_INPROGRESS && now_ns() < until) ucp_worker_progress(ctx->worker);
      // A flush still running: the same as a send given up on.
      if (drop(ctx->worker, fr) && to_other_host(c)) ctx->abandoned = true;
    }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* cr = ucp_ep_close_nbx(c->ep, &p);
    if (check(cr) == UCS_INPROGRESS) ctx->closing.push_back(cr);
    else if (cr != nullptr && !UCS_PTR_IS_ERR(cr)) ucp_request_free(cr);
    c->ep = nullptr;
  }
  if (c->link != nullptr) {
    // UCX may still report the endpoint's failure (during a force close in
    // flight): its handler then finds no comm.
    c->link->comm = nullptr;
    ctx->closed_links.emplace_back(c->link);
    c->link = nullptr;
  }
  if (c->fd >= 0) {
    Bye bye{kByeMagic, c->seq};
    (void)!send(c->fd, &bye, sizeof(bye), MSG_DONTWAIT | MSG_NOSIGNAL);
    close(c->fd);
    c->fd = -1;
  }
}

bool may_progress(Ctx* ctx) { return !ctx->freeze.check(ctx->recvs, payload_running); }

void close_recv(RecvComm* c) {
  Ctx* ctx = c->ctx;
  ucp_worker_h w = ctx->worker;
  // This comm's payloads not matched yet are cancelled; one UCX has matched
  // goes on landing in the receive's buffer, which the caller may have freed
  // already (its operation failed and returned): see may_progress.
  c->m.active().for_each([&](Request* r) {
    if (payload_running(r)) ucp_request_cancel(w, r->data_req);
  });
  const bool progress = may_progress(ctx);  // every open comm of the context, this one included
  c->m.active().for_each([&](Request* r) {
    drop(w, r->data_req);
    r->magic = 0;
  });
  c->m.posted().for_each([&](Request* r) { r->magic = 0; });
  if (c->hdr_posted) drop(w, c->hdr_req);
  std::erase(ctx->recvs, c);
  // Payloads that arrived unexpected stay in UCX's queue: drain them, unless
  // the worker must not be progressed. A drain that does not finish (an eager
  // payload whose sender closed before its last fragments left) leaves UCX
  // writing a buffer of the plugin's own: it is kept until the worker is
  // destroyed, which is then still safe, since no caller's memory is involved.
  c->m.drain([&](Unexpected* u) {
    if (u->size <= kInline || !progress || ctx->freeze.frozen()) return;
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(w, utag(c->conn, kPayload, u->seq), kFullMask, 1, &info);
    if (m == nullptr) return;
    std::vector<unsigned char> sink(info.length);
    ucp_request_param_t p = host_memory();
    void* rq = ucp_tag_msg_recv_nbx(w, sink.data(), sink.size(), m, &p);
    for (int i = 0; i < 1000 && check(rq) == UCS_INPROGRESS; ++i) ucp_worker_progress(w);
    if (drop(w, rq)) ctx->sinks.push_back(std::move(sink));
  });
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

}  // namespace meshccl::plugin::ucx
