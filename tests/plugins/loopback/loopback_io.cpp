// Moving messages over a connected seqpacket socket: the sender writes a
// header record and then the payload in records of at most kChunk bytes;
// the receiver reads each record whole, straight into the matched buffer.
// Every call moves what the socket allows without blocking, and the next
// call resumes where it stopped.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "tests/plugins/loopback/loopback_comm.h"

namespace meshccl::plugin::loopback {
namespace {

// Bytes one progress call may move, so that a huge message does not keep
// the caller away from its other requests.
constexpr uint64_t kBudget = 16u << 20;
// An unexpected message gets at most this much buffer when its header
// arrives; the buffer grows as the payload does.
constexpr uint64_t kUpfront = 4u << 20;

void finish(Request* r, meshccl_tresult_t result) {
  r->state = State::kDone;
  r->result = result;
}

bool peer_vanished(int err) { return err == EPIPE || err == ECONNRESET || err == ENOTCONN; }

// ---- sender ------------------------------------------------------------------

void send_fail_all(SendComm* c, meshccl_tresult_t result, const char* why) {
  if (c->broken == MESHCCL_T_SUCCESS) MPLUG_WARN(c->ctx->host, "%s: send failed: %s", kName, why);
  c->broken = result;
  for (Request* r; (r = c->queue.pop_front()) != nullptr;) finish(r, result);
}

void send_progress(SendComm* c) {
  uint64_t moved = 0;
  while (c->broken == MESHCCL_T_SUCCESS && !c->queue.empty() && moved < kBudget) {
    Request* r = c->queue.front();
    const Header h{r->tag, r->size};
    const void* from = r->header_sent ? static_cast<const void*>(r->data + r->done) : &h;
    const size_t len = r->header_sent ? std::min(r->size - r->done, kChunk) : sizeof(h);
    const ssize_t w = ::send(c->fd, from, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      send_fail_all(c, peer_vanished(err) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
      return;
    }
    if (static_cast<size_t>(w) != len) {  // a record is sent whole or not at all
      send_fail_all(c, MESHCCL_T_SYSTEM_ERROR, "the kernel cut a record");
      return;
    }
    if (r->header_sent) r->done += len;
    r->header_sent = true;
    moved += len;
    if (r->done == r->size) {
      c->queue.pop_front();
      finish(r, MESHCCL_T_SUCCESS);
    }
  }
}

// ---- receiver ----------------------------------------------------------------

void warn_trunc(RecvComm* c, uint64_t size, const Request* r) {
  MPLUG_WARN(c->ctx->host,
             "%s: message of %" PRIu64 " bytes (tag %" PRIu64 ") does not fit the %" PRIu64 "-byte receive buffer",
             kName, size, r->tag, r->size);
}

// A message too large for its receive: the receive fails once the payload
// is read and dropped. It stays pending until then, so that the caller's
// polls of it drain the connection and the sender's records keep moving
// (the socket holds far less than a large message).
void drop_payload(RecvComm* c, uint64_t size, Request* r) {
  warn_trunc(c, size, r);
  r->result = MESHCCL_T_INVALID_USAGE;
  c->dest = nullptr;
}

// Nothing more will arrive: the message being read and every waiting
// receive fail with result (a receive that was too small keeps its reason).
void recv_gone(RecvComm* c, meshccl_tresult_t result, const char* why) {
  bool waiting = c->in_frame;
  if (c->in_frame) {
    if (c->cur_req != nullptr)
      finish(c->cur_req, c->cur_req->result != MESHCCL_T_SUCCESS ? c->cur_req->result : result);
    if (c->cur_unex != nullptr) c->m.drop(c->cur_unex);
    c->in_frame = false;
    c->cur_req = nullptr;
    c->cur_unex = nullptr;
    c->dest = nullptr;
  }
  if (c->m.lose_peer(result, [&](Request* r) { finish(r, result); })) waiting = true;
  if (waiting) MPLUG_WARN(c->ctx->host, "%s: receive failed: %s", kName, why);
}

// A header arrived: find where its payload goes.
meshccl_tresult_t begin_frame(RecvComm* c, const Header& h) {
  c->in_frame = true;
  c->size = h.size;
  c->got = 0;
  c->dest = nullptr;
  c->cur_req = nullptr;
  c->cur_unex = nullptr;
  if (Request* r = c->m.match(h.tag)) {
    r->state = State::kActive;
    c->cur_req = r;
    if (h.size > r->size) drop_payload(c, h.size, r);
    else c->dest = r->data;
    return MESHCCL_T_SUCCESS;
  }
  Unexpected* u = c->m.park(h.tag, h.size, std::min(h.size, kUpfront));
  if (u == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  u->complete = false;
  c->cur_unex = u;
  c->dest = static_cast<unsigned char*>(u->buf.ptr);
  return MESHCCL_T_SUCCESS;
}

void end_frame(RecvComm* c) {
  if (c->cur_req != nullptr) {
    c->cur_req->nbytes = c->size;
    finish(c->cur_req, c->cur_req->result);  // failed when it was too small
  }
  if (c->cur_unex != nullptr) c->cur_unex->complete = true;
  c->in_frame = false;
  c->cur_req = nullptr;
  c->cur_unex = nullptr;
  c->dest = nullptr;
}

// Makes the unexpected message being read hold `need` bytes; false when out
// of memory.
bool room(RecvComm* c, uint64_t need) {
  Unexpected* u = c->cur_unex;
  if (u == nullptr || need <= u->buf.cap) return true;
  BufferPool::Buf b = c->bufs.get(std::min(u->size, std::max(need, 2 * static_cast<uint64_t>(u->buf.cap))));
  if (b.ptr == nullptr) return false;
  if (c->got != 0) std::memcpy(b.ptr, u->buf.ptr, c->got);
  c->bufs.put(u->buf);
  u->buf = b;
  c->dest = static_cast<unsigned char*>(b.ptr);
  return true;
}

// One record into buf (len bytes expected; buf null: dropped). Its length,
// 0 when none is there yet, -1 when the connection is over (the comm is
// then gone).
ssize_t read_record(RecvComm* c, void* buf, size_t len) {
  for (;;) {
    const ssize_t n = ::recv(c->fd, buf, buf != nullptr ? len : 0, MSG_DONTWAIT | MSG_TRUNC);
    if (n > 0) {
      if (static_cast<size_t>(n) == len) return n;
      char why[96];
      std::snprintf(why, sizeof(why), "a record of %zd bytes where %zu were due", n, len);
      recv_gone(c, MESHCCL_T_REMOTE_ERROR, why);
      return -1;
    }
    if (n == 0) {
      recv_gone(c, MESHCCL_T_REMOTE_ERROR,
                c->in_frame ? "the sender closed the connection in the middle of a message"
                            : "the sender closed the connection");
      return -1;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return 0;
    recv_gone(c, peer_vanished(err) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
    return -1;
  }
}

void recv_progress(RecvComm* c) {
  uint64_t budget = kBudget;
  while (c->m.gone() == MESHCCL_T_SUCCESS && budget > 0) {
    if (!c->in_frame) {
      Header h{};
      if (read_record(c, &h, sizeof(h)) <= 0) return;
      if (begin_frame(c, h) != MESHCCL_T_SUCCESS) {
        recv_gone(c, MESHCCL_T_SYSTEM_ERROR, "out of memory");
        return;
      }
      if (h.size == 0) end_frame(c);
      continue;
    }
    const uint64_t len = std::min(c->size - c->got, kChunk);
    if (!room(c, c->got + len)) {
      recv_gone(c, MESHCCL_T_SYSTEM_ERROR, "out of memory");
      return;
    }
    if (read_record(c, c->dest != nullptr ? c->dest + c->got : nullptr, len) <= 0) return;
    c->got += len;
    budget -= std::min(budget, len);
    if (c->got == c->size) end_frame(c);
  }
}

template <class Comm>
Request* new_request(Comm* c, Kind kind, void* data, size_t size, uint64_t tag) {
  Request* r = c->reqs.get();
  if (r == nullptr) return nullptr;
  r->magic = kReqMagic;
  r->kind = kind;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(data);
  r->size = size;
  return r;
}

template <class Comm>
meshccl_tresult_t finish_test(Comm* c, Request* r, int* done, size_t* size, uint64_t bytes) {
  const meshccl_tresult_t result = report_done(r->result, bytes, done, size);
  r->magic = 0;
  c->reqs.put(r);
  return result;
}

}  // namespace

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  if (c->broken != MESHCCL_T_SUCCESS) return c->broken;
  Request* r = new_request(c, Kind::kSend, const_cast<void*>(data), size, tag);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kQueued;
  r->header_sent = false;
  r->done = 0;
  c->queue.push_back(r);
  send_progress(c);
  *request = r;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t send_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<SendComm*>(r->comm);
  if (r->state != State::kDone) send_progress(c);
  if (r->state != State::kDone) {
    *done = 0;
    return MESHCCL_T_SUCCESS;
  }
  return finish_test(c, r, done, size, r->size);
}

meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request) {
  Request* r = new_request(c, Kind::kRecv, data, size, tag);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kPosted;
  const meshccl_tresult_t res = c->m.post(r, [c](Request* r, Unexpected* u) {
    if (u->size > r->size && u->complete) {
      warn_trunc(c, u->size, r);
      finish(r, MESHCCL_T_INVALID_USAGE);
    } else if (u->size > r->size) {  // still arriving: fails once the rest is dropped
      r->state = State::kActive;
      c->cur_unex = nullptr;
      c->cur_req = r;
      drop_payload(c, u->size, r);
    } else if (u->complete) {
      if (u->size != 0) std::memcpy(r->data, u->buf.ptr, u->size);
      r->nbytes = u->size;
      finish(r, MESHCCL_T_SUCCESS);
    } else {
      // Still arriving: what is here moves now, the rest lands in place.
      if (c->got != 0) std::memcpy(r->data, u->buf.ptr, c->got);
      r->state = State::kActive;
      c->cur_unex = nullptr;
      c->cur_req = r;
      c->dest = r->data;
    }
  });
  if (res != MESHCCL_T_SUCCESS) {
    r->magic = 0;
    c->reqs.put(r);
    MPLUG_WARN(c->ctx->host, "%s: receive (tag %" PRIu64 ") posted after its sender went away", kName, tag);
    return res;
  }
  *request = r;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<RecvComm*>(r->comm);
  if (r->state != State::kDone) recv_progress(c);
  if (r->state != State::kDone) {
    *done = 0;
    return MESHCCL_T_SUCCESS;
  }
  return finish_test(c, r, done, size, r->nbytes);
}

meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found) {
  recv_progress(c);
  return c->m.probe(tag, found);
}

}  // namespace meshccl::plugin::loopback
