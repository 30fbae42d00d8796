// Messages of the libfabric transport: headers with small payloads inline,
// longer payloads in chunks, matching by user tag, and closing (a "bye"
// header from a sender, a notice on the back channel from a receiver).
#include <rdma/fi_errno.h>
#include <sched.h>

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "plugins/ofi/ofi_comm.h"

namespace meshccl::plugin::ofi {

namespace {

constexpr uint64_t kFlushNs = 500'000'000;    // how long a close waits to hand over its notice
constexpr uint64_t kLetGoNs = 1'000'000'000;  // how long a close waits for its sends to be taken
// How long what a sender that exited wrote before may take to arrive.
constexpr uint64_t kDeadGraceNs = 1'000'000'000;

template <class Post>
meshccl_tresult_t post_retry(Ctx* ctx, const char* what, Op* op, bool wait, Post&& post) {
  uint64_t deadline = 0;
  for (;;) {
    ssize_t rc = post();
    if (rc == 0) {
      ++op->posted;
      return MESHCCL_T_SUCCESS;
    }
    if (rc != -FI_EAGAIN) return fi_fail(ctx->host, what, rc);
    if (!wait) return kBusy;
    MPLUG_CHECK(progress(ctx));
    if (deadline == 0) deadline = now_ns() + kFlushNs;
    if (now_ns() > deadline) {
      MPLUG_WARN(ctx->host, "ofi: %s: the queue stayed full for %" PRIu64 " ms", what, kFlushNs / 1'000'000);
      return MESHCCL_T_SYSTEM_ERROR;
    }
  }
}

// Hands a close notice over without waiting for it to leave: closing a
// job's many connections would otherwise wait on each in turn (up to
// kFlushNs apiece on a busy provider). The notice stays in ctx->notices
// until libfabric reports it sent, progress retries it while libfabric has
// no room, and finalize gives what is left one bounded wait.
void send_notice(Ctx* ctx, Request* r, fi_addr_t to, uint64_t tag) {
  ctx->notices.push_back({r, to, tag, now_ns() + kFlushNs});
  meshccl_tresult_t res = post_tsend(ctx, r->buf, sizeof(WireHdr), to, tag, &r->hdr, false);
  if (res != MESHCCL_T_SUCCESS && res != kBusy) {  // said why; the peer learns of the close another way
    ctx->notices.pop_back();
    release(ctx, r);
  }
}

void drop(Ctx* ctx, Request*& r) {
  if (r == nullptr) return;
  if (busy(r->hdr)) fi_cancel(&ctx->ep->fid, &r->hdr);
  if (busy(r->body)) fi_cancel(&ctx->ep->fid, &r->body);
  release(ctx, r);
  r = nullptr;
}

// ---- sending -------------------------------------------------------------------

// Takes in what the receiver's side reported: the hello sent (or not), a
// notice that the receiver closed.
void refresh(SendComm* c) {
  Ctx* ctx = c->ctx;
  if (c->hello != nullptr && c->hello->state == State::kPosted && !busy(c->hello->hdr)) {
    if (c->hello->hdr.err != 0 && c->broken == MESHCCL_T_SUCCESS)
      c->broken = op_fail(ctx, "sending the hello", c->hello->hdr);
    release(ctx, c->hello);
    c->hello = nullptr;
  }
  if (c->back != nullptr && !busy(c->back->hdr) && c->back->hdr.posted > 0) {
    if (c->broken == MESHCCL_T_SUCCESS) {
      if (c->back->hdr.err != 0) {
        c->broken = op_fail(ctx, "waiting for the receiver's notices", c->back->hdr);
      } else {
        WireHdr h;
        std::memcpy(&h, c->back->buf, sizeof(h));
        c->delivered_below = h.complete_below;
        c->receiver_closed = true;
        MPLUG_INFO(ctx->host, "ofi: the receiver closed connection %u", c->conn);
        c->broken = MESHCCL_T_REMOTE_ERROR;
      }
    }
    release(ctx, c->back);
    c->back = nullptr;
  }
}

meshccl_tresult_t post_header(SendComm* c, Request* r) {
  WireHdr h{r->tag, r->size, 0, 0, 0};
  std::memcpy(r->buf, &h, sizeof(h));
  size_t n = sizeof(h);
  if (r->nchunks == 0) {
    if (r->size != 0) std::memcpy(r->buf + sizeof(h), r->data, r->size);
    n += r->size;
  }
  meshccl_tresult_t res = post_tsend(c->ctx, r->buf, n, c->peer, ftag(kHeader, c->conn, c->seq, 0), &r->hdr, false);
  if (res != MESHCCL_T_SUCCESS) return res;
  r->seq = c->seq++;
  r->state = State::kPosted;
  return MESHCCL_T_SUCCESS;
}

}  // namespace

meshccl_tresult_t post_tsend(Ctx* ctx, const void* buf, size_t n, fi_addr_t to, uint64_t tag, Op* op, bool wait) {
  return post_retry(ctx, "sending (fi_tsend)", op, wait,
                    [&] { return fi_tsend(ctx->ep, buf, n, nullptr, to, tag, op); });
}

meshccl_tresult_t post_trecv(Ctx* ctx, void* buf, size_t n, fi_addr_t from, uint64_t tag, Op* op, bool wait) {
  return post_retry(ctx, "receiving (fi_trecv)", op, wait,
                    [&] { return fi_trecv(ctx->ep, buf, n, nullptr, from, tag, 0, op); });
}

// Posts what waits in the send queue, in order, until libfabric is full.
meshccl_tresult_t advance_sends(SendComm* c) {
  Ctx* ctx = c->ctx;
  if (c->hello != nullptr && c->hello->state == State::kQueued) {  // the hello goes first
    meshccl_tresult_t res =
        post_tsend(ctx, c->hello->buf, sizeof(Hello), c->peer, ftag(kHello, c->conn, 0, 0), &c->hello->hdr, false);
    if (res == kBusy) return MESHCCL_T_SUCCESS;
    if (res != MESHCCL_T_SUCCESS) return res;
    c->hello->state = State::kPosted;
  }
  for (Request* r = c->queue.front(); r != nullptr; r = r->next) {
    if (r->state == State::kQueued) {
      meshccl_tresult_t res = post_header(c, r);
      if (res == kBusy) return MESHCCL_T_SUCCESS;
      if (res != MESHCCL_T_SUCCESS) return res;
    }
    while (r->state == State::kPosted && r->chunks_posted < r->nchunks) {
      uint64_t off = r->chunks_posted * ctx->chunk;
      uint64_t len = std::min(ctx->chunk, r->size - off);
      meshccl_tresult_t res = post_tsend(ctx, r->data + off, len, c->peer,
                                         ftag(kPayload, c->conn, r->seq, r->chunks_posted), &r->body, false);
      if (res == kBusy) return MESHCCL_T_SUCCESS;
      if (res != MESHCCL_T_SUCCESS) return res;
      ++r->chunks_posted;
    }
    r->state = State::kActive;
  }
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  Ctx* ctx = c->ctx;
  MPLUG_CHECK(progress(ctx));
  refresh(c);
  if (c->broken != MESHCCL_T_SUCCESS) return c->broken;
  uint64_t nchunks = size <= kInline ? 0 : (size + ctx->chunk - 1) / ctx->chunk;
  if (nchunks > kMaxChunks) {
    MPLUG_WARN(ctx->host, "ofi: a %zu-byte message needs more than %" PRIu64 " messages of %" PRIu64 " bytes", size,
               kMaxChunks, ctx->chunk);
    return MESHCCL_T_INVALID_USAGE;
  }
  Request* r = new_request(ctx, Kind::kSend, c);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kQueued;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(const_cast<void*>(data));
  r->size = size;
  r->nchunks = nchunks;
  c->queue.push_back(r);
  *request = r;
  meshccl_tresult_t res = advance_sends(c);
  if (res != MESHCCL_T_SUCCESS) c->broken = res;  // reported by test
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t send_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<SendComm*>(r->comm);
  Ctx* ctx = c->ctx;
  *done = 0;
  meshccl_tresult_t res = progress(ctx);
  refresh(c);
  if (res == MESHCCL_T_SUCCESS && c->broken == MESHCCL_T_SUCCESS) res = advance_sends(c);
  if (res != MESHCCL_T_SUCCESS && c->broken == MESHCCL_T_SUCCESS) c->broken = res;
  if (r->state == State::kActive && !busy(r->hdr) && !busy(r->body)) {
    const Op& bad = r->hdr.err != 0 ? r->hdr : r->body;
    res = bad.err != 0 ? op_fail(ctx, "sending a message", bad) : MESHCCL_T_SUCCESS;
    if (res == MESHCCL_T_REMOTE_ERROR && c->broken == MESHCCL_T_SUCCESS) c->broken = res;
  } else if (c->broken != MESHCCL_T_SUCCESS) {
    // The receiver may close once it holds the data, before libfabric here
    // heard back: those sends succeeded.
    bool delivered = r->state == State::kActive && r->seq < c->delivered_below;
    res = delivered ? MESHCCL_T_SUCCESS : c->broken;
    if (!delivered)
      MPLUG_WARN(ctx->host, "ofi: a send on connection %u failed: the receiver closed or failed", c->conn);
  } else if (peer_dead(ctx->host, c->peer_pid, c->watch)) {
    res = c->broken = MESHCCL_T_REMOTE_ERROR;
  } else {
    return MESHCCL_T_SUCCESS;  // in flight
  }
  if (size != nullptr) *size = res == MESHCCL_T_SUCCESS ? r->size : 0;
  c->queue.remove(r);
  release(ctx, r);
  *done = 1;
  return res;
}

// ---- receiving -----------------------------------------------------------------

namespace {

// The sender said bye (take_header): nothing more arrives.
bool sender_closed(const RecvComm* c) { return c->m.gone() != MESHCCL_T_SUCCESS; }

// The sender's process is gone and what it sent before had its time to
// arrive. An eager send completes once the socket took it, so a sender may
// finish its sends, close and exit while its last messages are still on
// their way (in the kernel, or in libfabric's hands here): they are still
// taken for kDeadGraceNs after the process was seen gone (same host: by pid).
bool sender_dead(RecvComm* c) {
  if (c->dead_ns == 0) {
    if (!peer_dead(c->ctx->host, c->peer_pid, c->watch)) return false;
    c->dead_ns = now_ns();
  }
  return now_ns() - c->dead_ns >= kDeadGraceNs;
}

// The list r is on: posted while it waits for its message; active once
// matched, or once the sender closed without sending it (take_header).
List<Request>& list_of(RecvComm* c, const Request* r) {
  return r->state == State::kPosted && !sender_closed(c) ? c->m.posted() : c->m.active();
}

meshccl_tresult_t post_slot(RecvComm* c, Request* s) {
  s->hdr = Op{s, 0, 0, 0, 0, 0};
  meshccl_tresult_t res =
      post_trecv(c->ctx, s->buf, kBufBytes, c->peer, ftag(kHeader, c->conn, s->seq, 0), &s->hdr, false);
  s->state = res == MESHCCL_T_SUCCESS ? State::kPosted : State::kQueued;
  return res == kBusy ? MESHCCL_T_SUCCESS : res;
}

meshccl_tresult_t post_chunks(RecvComm* c, Request* r) {
  Ctx* ctx = c->ctx;
  bool truncated = r->nbytes > r->size;
  // A window of chunks at a time: a provider that copies a whole posted
  // receive in one progress call (shm with CMA) then does bounded work per poll.
  while (r->chunks_posted < r->nchunks && r->body.posted - r->body.finished < kChunkWindow) {
    uint64_t off = r->chunks_posted * ctx->chunk;
    uint64_t len = std::min(ctx->chunk, r->nbytes - off);
    unsigned char* dst = truncated ? c->scratch.data() : r->data + off;
    meshccl_tresult_t res =
        post_trecv(ctx, dst, len, c->peer, ftag(kPayload, c->conn, r->seq, r->chunks_posted), &r->body, false);
    if (res == kBusy) return MESHCCL_T_SUCCESS;
    if (res != MESHCCL_T_SUCCESS) return res;
    ++r->chunks_posted;
  }
  return MESHCCL_T_SUCCESS;
}

// r matched message `seq` of `size` bytes; `inl` holds its payload when it
// came inline.
meshccl_tresult_t start_recv(RecvComm* c, Request* r, uint64_t size, uint64_t seq, const void* inl) {
  r->nbytes = size;
  r->seq = seq;
  c->m.active().push_back(r);
  if (size > r->size) {
    MPLUG_WARN(c->ctx->host,
               "ofi: a %" PRIu64 "-byte message (tag %" PRIu64 ") does not fit a %" PRIu64 "-byte receive", size,
               r->tag, r->size);
    r->result = MESHCCL_T_INVALID_USAGE;
  }
  if (size <= kInline) {
    if (r->result == MESHCCL_T_SUCCESS && size != 0) std::memcpy(r->data, inl, size);
    r->state = State::kDone;
    return MESHCCL_T_SUCCESS;
  }
  r->state = State::kActive;
  r->nchunks = (size + c->ctx->chunk - 1) / c->ctx->chunk;
  if (size > r->size && c->scratch.size() < std::min(size, c->ctx->chunk))
    c->scratch.resize(std::min(size, c->ctx->chunk));
  return post_chunks(c, r);
}

// One header arrived in slot s: match it, keep it as unexpected, or learn
// that the sender closed.
meshccl_tresult_t take_header(RecvComm* c, Request* s) {
  WireHdr h;
  std::memcpy(&h, s->buf, sizeof(h));
  if (h.flags & kFlagBye) {
    c->complete_below = h.complete_below;
    // Receives still waiting stay as they are, among the matched ones:
    // recv_test fails them (the sender closed before sending their message).
    c->m.lose_peer(MESHCCL_T_REMOTE_ERROR, [c](Request* r) { c->m.active().push_back(r); });
    return MESHCCL_T_SUCCESS;
  }
  bool inl = h.size <= kInline;
  if (s->hdr.bytes != sizeof(h) + (inl ? h.size : 0)) {
    MPLUG_WARN(c->ctx->host, "ofi: a malformed message header on connection %u", c->conn);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  const unsigned char* payload = s->buf + sizeof(h);
  if (Request* r = c->m.match(h.tag)) return start_recv(c, r, h.size, s->seq, payload);
  Unexpected* u = c->m.park(h.tag, h.size, inl ? h.size : 0);
  if (u == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  u->seq = s->seq;
  if (inl && h.size != 0) std::memcpy(u->buf.ptr, payload, h.size);
  return MESHCCL_T_SUCCESS;
}

// Takes in every header that arrived, in order, and keeps receives posted.
meshccl_tresult_t pump(RecvComm* c) {
  MPLUG_CHECK(progress(c->ctx));
  for (int i = 0; i < 4 * kHdrWindow && !sender_closed(c); ++i) {
    Request* s = c->slots[c->seq % kHdrWindow];
    if (s->state == State::kQueued) MPLUG_CHECK(post_slot(c, s));
    if (s->state == State::kQueued || busy(s->hdr)) break;
    if (s->hdr.err != 0) return op_fail(c->ctx, "receiving a message header", s->hdr);
    MPLUG_CHECK(take_header(c, s));
    ++c->seq;
    s->seq += kHdrWindow;
    if (!sender_closed(c)) MPLUG_CHECK(post_slot(c, s));
  }
  for (Request* r = c->m.active().front(); r != nullptr; r = r->next)
    if (r->state == State::kActive && r->chunks_posted < r->nchunks && r->body.err == 0) MPLUG_CHECK(post_chunks(c, r));
  return MESHCCL_T_SUCCESS;
}

}  // namespace

meshccl_tresult_t start_slots(RecvComm* c) {
  for (int i = 0; i < kHdrWindow; ++i) {
    Request* s = new_request(c->ctx, Kind::kSlot, c);
    if (s == nullptr) return MESHCCL_T_SYSTEM_ERROR;
    s->seq = static_cast<uint64_t>(i);
    c->slots[i] = s;
    MPLUG_CHECK(post_slot(c, s));
  }
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request) {
  Request* r = new_request(c->ctx, Kind::kRecv, c);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kPosted;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(data);
  r->size = size;
  meshccl_tresult_t res = MESHCCL_T_SUCCESS;
  const meshccl_tresult_t gone =
      c->m.post(r, [c, &res](Request* r, Unexpected* u) { res = start_recv(c, r, u->size, u->seq, u->buf.ptr); });
  if (gone != MESHCCL_T_SUCCESS) {
    release(c->ctx, r);
    MPLUG_WARN(c->ctx->host, "ofi: the sender closed connection %u", c->conn);
    return gone;
  }
  *request = r;
  if (res == MESHCCL_T_SUCCESS) (void)pump(c);  // an error here is reported by test
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found) {
  const meshccl_tresult_t res = pump(c);
  const meshccl_tresult_t gone = c->m.probe(tag, found);
  if (*found != 0 || res != MESHCCL_T_SUCCESS) return *found != 0 ? MESHCCL_T_SUCCESS : res;
  if (gone != MESHCCL_T_SUCCESS) return gone;
  return sender_dead(c) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<RecvComm*>(r->comm);
  Ctx* ctx = c->ctx;
  *done = 0;
  meshccl_tresult_t pr = pump(c);
  meshccl_tresult_t res;
  if (r->state == State::kDone) {
    res = r->result;
  } else if (r->state == State::kActive && (r->chunks_posted == r->nchunks || r->body.err != 0) && !busy(r->body)) {
    res = r->body.err != 0 ? op_fail(ctx, "receiving a message", r->body) : r->result;
    if (res == MESHCCL_T_SUCCESS && r->body.bytes != r->nbytes) {
      MPLUG_WARN(ctx->host, "ofi: %" PRIu64 " of %" PRIu64 " bytes arrived", r->body.bytes, r->nbytes);
      res = MESHCCL_T_SYSTEM_ERROR;
    }
  } else if (pr != MESHCCL_T_SUCCESS) {
    res = pr;
  } else if (sender_closed(c) && (r->state == State::kPosted || r->seq >= c->complete_below)) {
    MPLUG_WARN(ctx->host, "ofi: the sender closed connection %u before sending this message", c->conn);
    res = MESHCCL_T_REMOTE_ERROR;
  } else if (sender_dead(c)) {
    res = MESHCCL_T_REMOTE_ERROR;
  } else {
    return MESHCCL_T_SUCCESS;  // in flight
  }
  list_of(c, r).remove(r);
  if (busy(r->body)) fi_cancel(&ctx->ep->fid, &r->body);
  res = report_done(res, r->nbytes, done, size);
  release(ctx, r);
  return res;
}

// ---- closing -------------------------------------------------------------------

namespace {

uint64_t timeout_ns(const meshccl_transport_host_v1_t* host) {
  const char* v = param_str(host, "MESHCCL_TIMEOUT");
  double s = v != nullptr ? std::strtod(v, nullptr) : 0;
  if (!(s > 0)) s = 30;
  return static_cast<uint64_t>(std::min(s, 86400.0) * 1e9);
}

// Sends libfabric still holds; once the receiver said it closed, only those
// it holds the data of (below its mark): it cancelled the rest, so nothing
// will read them again, and they complete only when the connection goes
// (waiting for that would wait for the receiver's own close, which may be
// waiting for ours).
size_t held_sends(const SendComm* c) {
  const uint64_t below = c->receiver_closed ? c->delivered_below : UINT64_MAX;
  size_t n = 0;
  for (const Request* r = c->queue.front(); r != nullptr; r = r->next)
    n += (busy(r->hdr) || busy(r->body)) && (r->state != State::kActive || r->seq < below);
  return n;
}

// The caller may free a send's buffer as soon as close returns, but
// libfabric reads it until the send completes (a rendezvous payload is read
// when the receiver takes it), and a send cannot be cancelled. So close
// waits, briefly, for every send libfabric holds to complete or fail: the
// receiver takes what was wholly handed over, a dead or closed peer fails
// it. A peer that takes nothing (stopped, or its host unreachable) must not
// hold an abort for MESHCCL_TIMEOUT: past kLetGoNs (or the timeout, when
// shorter) the context is no longer progressed by anyone (closes, the helper
// thread, finalize), so libfabric reads those buffers no more; finalize
// closes its endpoint without progressing it.
void wait_sends_let_go(SendComm* c, bool peer_stopped) {
  Ctx* ctx = c->ctx;
  size_t held = held_sends(c);
  if (held == 0) return;
  for (Request* r = c->queue.front(); r != nullptr; r = r->next)
    if (busy(r->body)) fi_cancel(&ctx->ep->fid, &r->body);
  const uint64_t deadline = now_ns() + std::min(timeout_ns(ctx->host), kLetGoNs);
  const char* why =
      peer_stopped ? "to a stopped peer process" : "to a peer that took nothing for 1 s (stopped or unreachable?)";
  while (!peer_stopped && (held = held_sends(c)) != 0) {
    if (progress(ctx) != MESHCCL_T_SUCCESS || now_ns() > deadline) break;
    refresh(c);
    if (peer_dead(ctx->host, c->peer_pid, c->watch)) {
      why = "to a peer process that exited";
      // A dead peer's connection fails what is left: give the provider a
      // moment to report it.
      const uint64_t until = now_ns() + kFlushNs;
      while ((held = held_sends(c)) != 0 && now_ns() < until && progress(ctx) == MESHCCL_T_SUCCESS) {}
      break;
    }
    sched_yield();
  }
  if (held == 0) return;
  ctx->sends_abandoned = true;
  ctx->stopping = true;  // the helper thread progresses no more either
  MPLUG_INFO(ctx->host,
             "ofi: closing connection %u while libfabric still holds %zu send(s) %s; the context is no longer "
             "progressed",
             c->conn, held, why);
}

}  // namespace

bool may_progress(Ctx* ctx) {
  const bool frozen = ctx->freeze.check(ctx->recvs, [](const Request* r) { return busy(r->body); });
  if (frozen) ctx->stopping = true;  // the helper thread progresses no more either
  return !frozen && !ctx->sends_abandoned;
}

// A peer process on this host that is stopped, or that died, may hold a
// lock of the provider (libfabric's shm takes the receiver's region lock in
// fi_tsend and spins on it: a peer stopped or killed while holding it left
// the sender spinning for good). Such a peer gets no close notice.
bool peer_unreachable(int32_t pid) { return pid > 0 && (pid_stopped(pid) || !pid_alive(pid)); }

void close_send(SendComm* c) {
  Ctx* ctx = c->ctx;
  const bool live_ctx = may_progress(ctx);
  if (live_ctx) (void)progress(ctx);
  refresh(c);
  auto& cn = ctx->connecting;
  for (size_t i = 0; i < cn.size(); ++i) {
    if (cn[i] == c) {
      cn.erase(cn.begin() + static_cast<long>(i));
      break;
    }
  }
  // No bye to a peer that cannot take it (peer_unreachable), and what it has
  // not taken is abandoned at once.
  const bool stopped = peer_unreachable(c->peer_pid);
  bool live = c->broken == MESHCCL_T_SUCCESS && c->back != nullptr && c->back->hdr.posted > 0 &&
              (c->hello == nullptr || c->hello->state == State::kPosted) && !stopped;
  if (live) {
    // Messages from the first one not wholly handed over never complete.
    uint64_t below = c->seq;
    for (Request* r = c->queue.front(); r != nullptr; r = r->next)
      if (r->state == State::kPosted) below = std::min(below, r->seq);
    Request* bye = new_request(ctx, Kind::kCtl, c);
    if (bye != nullptr) {
      WireHdr h{0, 0, kFlagBye, 0, below};
      std::memcpy(bye->buf, &h, sizeof(h));
      send_notice(ctx, bye, c->peer, ftag(kHeader, c->conn, c->seq++, 0));
    }
  }
  if (live_ctx) wait_sends_let_go(c, stopped);
  while (Request* r = c->queue.pop_front()) release(ctx, r);
  drop(ctx, c->hello);
  drop(ctx, c->back);
}

void close_recv(RecvComm* c) {
  Ctx* ctx = c->ctx;
  if (may_progress(ctx)) (void)progress(ctx);  // every open comm of the context, this one included
  // Tell the sender, whose sends would wait forever (see close_send).
  if (!sender_closed(c) && !peer_unreachable(c->peer_pid)) {
    uint64_t below = c->seq;
    for (Request* r = c->m.active().front(); r != nullptr; r = r->next)
      if (r->state == State::kActive && (r->chunks_posted < r->nchunks || busy(r->body)))
        below = std::min(below, r->seq);
    for (Unexpected* u = c->m.unexpected().front(); u != nullptr; u = u->next)
      if (u->size > kInline) below = std::min(below, u->seq);
    Request* note = new_request(ctx, Kind::kCtl, c);
    if (note != nullptr) {
      WireHdr h{0, 0, kFlagBye, 0, below};
      std::memcpy(note->buf, &h, sizeof(h));
      send_notice(ctx, note, c->peer, ftag(kBack, c->conn, 0, 0));
    }
  }
  while (Request* r = c->m.posted().pop_front()) release(ctx, r);
  while (Request* r = c->m.active().pop_front()) drop(ctx, r);
  for (Request*& s : c->slots) drop(ctx, s);
  c->m.drain();
  std::erase(ctx->recvs, c);
}

void advance_notices(Ctx* ctx) {
  auto& ns = ctx->notices;
  const uint64_t now = now_ns();
  size_t keep = 0;
  for (size_t i = 0; i < ns.size(); ++i) {
    Ctx::Notice& n = ns[i];
    if (n.r->hdr.posted == 0 && now <= n.deadline) {
      meshccl_tresult_t res = post_tsend(ctx, n.r->buf, sizeof(WireHdr), n.to, n.tag, &n.r->hdr, false);
      if (res != MESHCCL_T_SUCCESS && res != kBusy) n.deadline = 0;  // failed, and said why
    }
    if (n.r->hdr.posted > 0 && !busy(n.r->hdr)) {
      release(ctx, n.r);  // sent (or failed: the connection is gone)
    } else if (now > n.deadline) {
      if (n.deadline != 0 && n.r->hdr.posted == 0)
        MPLUG_INFO(ctx->host,
                   "ofi: a close notice found no room for %" PRIu64
                   " ms; the peer learns of the close when the connection goes",
                   kFlushNs / 1'000'000);
      release(ctx, n.r);  // orphaned if libfabric still holds it
    } else {
      ns[keep++] = n;
    }
  }
  ns.resize(keep);
}

void drain_notices(Ctx* ctx) {
  const uint64_t until = now_ns() + kFlushNs;
  while (!ctx->notices.empty() && now_ns() < until && progress(ctx) == MESHCCL_T_SUCCESS) sched_yield();
  for (Ctx::Notice& n : ctx->notices) release(ctx, n.r);
  ctx->notices.clear();
}

}  // namespace meshccl::plugin::ofi
