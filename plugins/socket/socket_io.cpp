// Moving frames over a connected socket: the sender gathers queued frames
// into one sendmsg; the receiver parses headers from a staging buffer and
// reads large payloads straight into the matched receive buffer. Every call
// does what the socket allows without blocking and resumes partial frames
// on the next call.
#include <endian.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "plugins/socket/socket_comm.h"

namespace meshccl::plugin::socket {
namespace {

constexpr int kMaxIov = 64;
// The kernel moves at most ~2 GiB per call; one iovec stays below that.
constexpr uint64_t kMaxIovBytes = 1ull << 30;
// Payloads this large skip the staging buffer.
constexpr uint64_t kDirect = 64u << 10;
// Bytes one progress call may move, so that a huge frame that keeps
// streaming does not keep the caller away from its other requests, nor its
// engine from more urgent work: a test on loopback, where the peer keeps the
// socket full, moved up to this much at memory speed (16 MiB took 5-10 ms
// and held an urgent operation that long); 1 MiB is two network chunks.
constexpr uint64_t kBudget = 1u << 20;
// An unexpected frame gets at most this much buffer when its header arrives;
// the buffer grows as the payload does, so a header that announces more than
// will ever come costs nothing.
constexpr uint64_t kUnexpectedUpfront = 4u << 20;

void finish(Request* r, meshccl_tresult_t result) {
  r->state = State::kDone;
  r->result = result;
}

bool peer_vanished(int err) {
  return err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ETIMEDOUT || err == EHOSTUNREACH ||
         err == ENETUNREACH || err == ECONNABORTED;
}

// ---- sender ------------------------------------------------------------------

void send_fail_all(SendComm* c, meshccl_tresult_t result, const char* why) {
  if (c->broken == MESHCCL_T_SUCCESS) MPLUG_WARN(c->ctx->host, "socket: send to %s failed: %s", c->peer.c_str(), why);
  c->broken = result;
  for (Request* r; (r = c->queue.pop_front()) != nullptr;) finish(r, result);
}

void send_progress(SendComm* c) {
  if (c->queue.empty() || !c->calls.due(now_ns())) return;
  uint64_t sent = 0;
  while (c->broken == MESHCCL_T_SUCCESS && !c->queue.empty() && sent < kBudget) {
    iovec iov[kMaxIov];
    int n = 0;
    uint64_t total = 0;
    for (Request* r = c->queue.front(); r != nullptr && n + 2 <= kMaxIov; r = r->next) {
      uint64_t off = r->done;
      if (off < sizeof(FrameHdr)) {
        iov[n++] = {reinterpret_cast<unsigned char*>(&r->hdr) + off, sizeof(FrameHdr) - off};
        total += sizeof(FrameHdr) - off;
        off = sizeof(FrameHdr);
      }
      uint64_t poff = off - sizeof(FrameHdr);
      if (poff < r->size) {
        uint64_t len = std::min(r->size - poff, kMaxIovBytes);
        iov[n++] = {r->data + poff, len};
        total += len;
        if (poff + len < r->size || total >= kMaxIovBytes) break;  // the rest goes in a later call
      }
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        c->calls.empty(now_ns());
        return;
      }
      send_fail_all(c, peer_vanished(err) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
      return;
    }
    uint64_t left = static_cast<uint64_t>(w);
    c->calls.moved(now_ns());
    sent += left;
    while (!c->queue.empty()) {
      Request* r = c->queue.front();
      uint64_t frame = sizeof(FrameHdr) + r->size;
      uint64_t take = std::min(frame - r->done, left);
      r->done += take;
      left -= take;
      if (r->done < frame) break;
      c->queue.pop_front();
      finish(r, MESHCCL_T_SUCCESS);
    }
    if (static_cast<uint64_t>(w) < total) return;  // socket buffer full
  }
}

// ---- receiver ----------------------------------------------------------------

void warn_trunc(RecvComm* c, uint64_t size, const Request* r) {
  MPLUG_WARN(c->ctx->host,
             "socket: message of %" PRIu64 " bytes (tag %" PRIu64 ") from %s does not fit the %" PRIu64
             "-byte receive buffer",
             size, r->tag, c->peer.c_str(), r->size);
}

// A frame header arrived: find where its payload goes.
meshccl_tresult_t begin_frame(RecvComm* c, const FrameHdr& h) {
  c->in_frame = true;
  c->size = h.size;
  c->got = 0;
  c->dest = nullptr;
  c->cur_req = nullptr;
  c->cur_unex = nullptr;
  if (Request* r = c->m.match(h.tag)) {
    if (h.size > r->size) {
      warn_trunc(c, h.size, r);
      finish(r, MESHCCL_T_INVALID_USAGE);  // the payload is read and dropped
      return MESHCCL_T_SUCCESS;
    }
    r->state = State::kActive;
    c->cur_req = r;
    c->dest = r->data;
    return MESHCCL_T_SUCCESS;
  }
  Unexpected* u = c->m.park(h.tag, h.size, std::min(h.size, kUnexpectedUpfront));
  if (u == nullptr) {
    MPLUG_WARN(c->ctx->host, "socket: out of memory queueing a %" PRIu64 "-byte message from %s", h.size,
               c->peer.c_str());
    return MESHCCL_T_SYSTEM_ERROR;
  }
  c->cur_unex = u;
  c->dest = static_cast<unsigned char*>(u->buf.ptr);
  return MESHCCL_T_SUCCESS;
}

// Makes the unexpected frame being read hold `need` bytes; false when out of
// memory.
bool unexpected_room(RecvComm* c, uint64_t need) {
  Unexpected* u = c->cur_unex;
  if (u == nullptr || need <= u->buf.cap) return true;
  const uint64_t want = std::min(u->size, std::max(need, 2 * static_cast<uint64_t>(u->buf.cap)));
  BufferPool::Buf b = c->bufs.get(want);
  if (b.ptr == nullptr) {
    MPLUG_WARN(c->ctx->host, "socket: out of memory queueing a %" PRIu64 "-byte message from %s", u->size,
               c->peer.c_str());
    return false;
  }
  if (c->got != 0) std::memcpy(b.ptr, u->buf.ptr, c->got);
  c->bufs.put(u->buf);
  u->buf = b;
  c->dest = static_cast<unsigned char*>(b.ptr);
  return true;
}

void end_frame(RecvComm* c) {
  if (c->cur_req != nullptr) {
    c->cur_req->nbytes = c->size;
    finish(c->cur_req, MESHCCL_T_SUCCESS);
  }
  if (c->cur_unex != nullptr) c->cur_unex->complete = true;
  c->in_frame = false;
  c->cur_req = nullptr;
  c->cur_unex = nullptr;
  c->dest = nullptr;
}

// The stream ended or broke: nothing more will arrive.
void recv_gone(RecvComm* c, meshccl_tresult_t result, const char* why) {
  bool waiting = c->in_frame;
  if (c->in_frame) {
    if (c->cur_req != nullptr) finish(c->cur_req, result);
    if (c->cur_unex != nullptr) c->m.drop(c->cur_unex);
    c->in_frame = false;
    c->cur_req = nullptr;
    c->cur_unex = nullptr;
  }
  if (c->m.lose_peer(result, [&](Request* r) { finish(r, result); })) waiting = true;
  if (waiting) MPLUG_WARN(c->ctx->host, "socket: receive from %s failed: %s", c->peer.c_str(), why);
}

// recv() into buf; returns bytes read, 0 when nothing is available now, -1
// when the stream is over (the comm is then marked gone).
ssize_t read_some(RecvComm* c, void* buf, size_t len) {
  for (;;) {
    ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
    if (n > 0) {
      c->calls.moved(now_ns());
      return n;
    }
    if (n == 0) {
      recv_gone(c, MESHCCL_T_REMOTE_ERROR,
                c->in_frame ? "the sender closed the connection in the middle of a message"
                            : "the sender closed the connection");
      return -1;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      c->calls.empty(now_ns());
      return 0;
    }
    recv_gone(c, peer_vanished(err) ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
    return -1;
  }
}

void recv_progress(RecvComm* c) {
  uint64_t budget = kBudget;
  // A read that returns less than it asked for drained the socket: parse
  // what came and stop, rather than pay for a recv() that says EAGAIN. So
  // does a connection whose recent reads found nothing (EmptyCalls).
  bool may_read = c->calls.due(now_ns());
  while (c->m.gone() == MESHCCL_T_SUCCESS && budget > 0) {
    size_t avail = c->stage_len - c->stage_pos;
    if (!c->in_frame) {
      if (avail >= sizeof(FrameHdr)) {
        FrameHdr h;
        std::memcpy(&h, c->stage.get() + c->stage_pos, sizeof(h));
        c->stage_pos += sizeof(h);
        h.tag = le64toh(h.tag);
        h.size = le64toh(h.size);
        if (meshccl_tresult_t res = begin_frame(c, h); res != MESHCCL_T_SUCCESS) {
          recv_gone(c, res, "out of memory");
          return;
        }
        continue;
      }
      if (!may_read) return;
      std::memmove(c->stage.get(), c->stage.get() + c->stage_pos, avail);
      c->stage_pos = 0;
      c->stage_len = avail;
      size_t want = RecvComm::kStage - avail;
      ssize_t n = read_some(c, c->stage.get() + avail, want);
      if (n <= 0) return;
      c->stage_len += static_cast<size_t>(n);
      budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
      may_read = static_cast<size_t>(n) == want;
      continue;
    }
    uint64_t left = c->size - c->got;
    if (left == 0) {
      end_frame(c);
      continue;
    }
    if (avail > 0) {
      uint64_t n = std::min<uint64_t>(avail, left);
      if (!unexpected_room(c, c->got + n)) {
        recv_gone(c, MESHCCL_T_SYSTEM_ERROR, "out of memory");
        return;
      }
      if (c->dest != nullptr) std::memcpy(c->dest + c->got, c->stage.get() + c->stage_pos, n);
      c->stage_pos += n;
      c->got += n;
      continue;
    }
    if (!may_read) return;
    c->stage_pos = c->stage_len = 0;
    ssize_t n;
    size_t want;
    if (c->dest != nullptr && left >= kDirect) {
      want = std::min(left, budget);
      if (c->cur_unex != nullptr) {  // as much as its buffer holds, grown when full
        if (!unexpected_room(c, c->got + 1)) {
          recv_gone(c, MESHCCL_T_SYSTEM_ERROR, "out of memory");
          return;
        }
        want = std::min<uint64_t>(want, c->cur_unex->buf.cap - c->got);
      }
      n = read_some(c, c->dest + c->got, want);
      if (n > 0) c->got += static_cast<uint64_t>(n);
    } else {
      want = RecvComm::kStage;
      n = read_some(c, c->stage.get(), want);
      if (n > 0) c->stage_len = static_cast<size_t>(n);
    }
    if (n <= 0) return;
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
    may_read = static_cast<size_t>(n) == want;
  }
}

template <class Comm>
void release(Comm* c, Request* r) {
  r->magic = 0;
  c->reqs.put(r);
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
  release(c, r);
  return result;
}

}  // namespace

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  if (c->broken != MESHCCL_T_SUCCESS) return c->broken;
  Request* r = new_request(c, Kind::kSend, const_cast<void*>(data), size, tag);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kQueued;
  r->done = 0;
  r->hdr = FrameHdr{htole64(tag), htole64(size)};
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
  // No read here: frames already in the socket are matched by the next
  // test(), and a receive costs one syscall fewer.
  Request* r = new_request(c, Kind::kRecv, data, size, tag);
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->state = State::kPosted;
  const meshccl_tresult_t res = c->m.post(r, [c](Request* r, Unexpected* u) {
    if (u->size > r->size) {
      warn_trunc(c, u->size, r);
      finish(r, MESHCCL_T_INVALID_USAGE);
      if (u == c->cur_unex) {  // still arriving: drop the rest as it comes
        c->cur_unex = nullptr;
        c->dest = nullptr;
      }
    } else if (u->complete) {
      if (u->size != 0) std::memcpy(r->data, u->buf.ptr, u->size);
      r->nbytes = u->size;
      finish(r, MESHCCL_T_SUCCESS);
    } else {
      // Still arriving: move what is here and let the rest land in place.
      if (c->got != 0) std::memcpy(r->data, u->buf.ptr, c->got);
      r->state = State::kActive;
      c->cur_unex = nullptr;
      c->cur_req = r;
      c->dest = r->data;
    }
  });
  if (res != MESHCCL_T_SUCCESS) {
    release(c, r);
    MPLUG_WARN(c->ctx->host, "socket: receive (tag %" PRIu64 ") posted after %s went away", tag, c->peer.c_str());
    return res;
  }
  *request = r;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found) {
  recv_progress(c);
  return c->m.probe(tag, found);
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

}  // namespace meshccl::plugin::socket
