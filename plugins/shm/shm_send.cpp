// Sender end of an shm connection: writes eager messages and rendezvous
// descriptors into the ring in posting order, then watches the rendezvous
// slots the receiver completes (or streams a payload when asked to).
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "plugins/shm/shm_comm.h"

namespace meshccl::plugin::shm {
namespace {

// Contiguous ring space for a record of `bytes` at the write position; pads to
// the end of the ring first when the record would straddle it. nullptr when
// the receiver has not freed enough yet, or when its read position is
// impossible (behind the last one seen or ahead of what we wrote: the
// segment is corrupt; sets bad_tail, which fails the connection at once).
// Records are at most cap/2, so an empty ring always has room and the
// sender cannot wedge itself.
RecHdr* reserve(SendComm* c, uint64_t bytes) {
  uint64_t off = c->head % c->cap;
  uint64_t pad = off + bytes > c->cap ? c->cap - off : 0;
  uint64_t need = pad + bytes;
  if (c->head + need - c->tail_cache > c->cap) {
    const uint64_t tail = c->seg->tail.v.load(std::memory_order_acquire);
    seg_acquire(c->seg);
    if (tail < c->tail_cache || tail > c->head) {
      c->bad_tail = true;
      return nullptr;
    }
    c->tail_cache = tail;
    if (c->head + need - c->tail_cache > c->cap) return nullptr;
  }
  if (pad != 0) {
    reinterpret_cast<RecHdr*>(c->ring + off)->type = kRecPad;
    c->head += pad;  // published together with the record that follows
  }
  return reinterpret_cast<RecHdr*>(c->ring + c->head % c->cap);
}

void publish(SendComm* c, uint64_t bytes) {
  c->head += bytes;
  seg_release(c->seg);
  c->seg->head.v.store(c->head, std::memory_order_release);
}

void finish(Request* r, meshccl_tresult_t result) {
  r->state = State::kDone;
  r->result = result;
}

// Largest payload of one streamed chunk: keeps records within cap/2.
uint64_t stream_chunk(const SendComm* c) { return c->cap / 4 - sizeof(RecHdr); }

bool write_eager(SendComm* c, Request* r) {
  uint64_t bytes = record_bytes(r->size);
  RecHdr* h = reserve(c, bytes);
  if (h == nullptr) return false;
  h->type = kRecEager;
  h->slot = 0;
  h->tag = r->tag;
  h->size = r->size;
  h->offset = 0;
  if (r->size != 0) std::memcpy(h + 1, r->data, r->size);
  publish(c, bytes);
  finish(r, MESHCCL_T_SUCCESS);
  return true;
}

bool write_rts(SendComm* c, Request* r) {
  if (c->nfree == 0) return false;
  uint64_t bytes = record_bytes(sizeof(RdvDesc));
  RecHdr* h = reserve(c, bytes);
  if (h == nullptr) return false;
  uint32_t slot = c->free_slots[--c->nfree];
  // Ordered before the receiver can see the RTS by the release of publish().
  c->seg->slots[slot].v.store(kSlotPosted, std::memory_order_relaxed);
  h->type = kRecRts;
  h->slot = slot;
  h->tag = r->tag;
  h->size = r->size;
  h->offset = 0;
  std::memcpy(h + 1, &r->desc, sizeof(RdvDesc));
  local_rdv_add(c->nonce, slot, r->desc.addr, r->size);
  publish(c, bytes);
  r->slot = slot;
  r->offset = 0;
  r->state = State::kWaitRdv;
  return true;
}

// Pushes chunks of a rendezvous the receiver cannot read directly.
bool stream(SendComm* c, Request* r) {
  bool moved = false;
  uint64_t max = stream_chunk(c);
  while (r->offset < r->size) {
    uint64_t n = std::min(r->size - r->offset, max);
    uint64_t bytes = record_bytes(n);
    RecHdr* h = reserve(c, bytes);
    if (h == nullptr) break;
    h->type = kRecData;
    h->slot = r->slot;
    h->tag = r->tag;
    h->size = n;
    h->offset = r->offset;
    std::memcpy(h + 1, r->data + r->offset, n);
    publish(c, bytes);
    r->offset += n;
    moved = true;
  }
  return moved;
}

void fail_all(SendComm* c, meshccl_tresult_t result, const char* why) {
  if (c->broken == MESHCCL_T_SUCCESS) MPLUG_WARN(c->ctx->host, "shm: send to pid %d failed: %s", c->peer_pid, why);
  c->broken = result;
  for (Request* r; (r = c->queue.pop_front()) != nullptr;) finish(r, result);
  for (Request* r; (r = c->active.pop_front()) != nullptr;) {
    local_rdv_remove(c->nonce, r->slot);
    finish(r, result);
  }
}

// An active transfer's slot as the receiver left it: finished (done, too
// short a buffer, or a failed read) ends the request; kSlotStream asks for
// its payload through the ring. Whether anything moved.
bool check_slot(SendComm* c, Request* r) {
  const uint32_t st = c->seg->slots[r->slot].v.load(std::memory_order_acquire);
  seg_acquire(c->seg);
  if (st == kSlotStream) {
    c->streaming = true;
    return stream(c, r);
  }
  if (st != kSlotDone && st != kSlotTrunc && st != kSlotFailed) return false;
  c->active.remove(r);
  local_rdv_remove(c->nonce, r->slot);
  c->free_slots[c->nfree++] = r->slot;
  meshccl_tresult_t result = MESHCCL_T_SUCCESS;
  if (st == kSlotTrunc) {
    MPLUG_INFO(c->ctx->host, "shm: receiver's buffer too small for %" PRIu64 " bytes (tag %" PRIu64 ")", r->size,
               r->tag);
    result = MESHCCL_T_INVALID_USAGE;
  } else if (st == kSlotFailed) {
    MPLUG_WARN(c->ctx->host, "shm: pid %d could not read %" PRIu64 " bytes (tag %" PRIu64 ") from us", c->peer_pid,
               r->size, r->tag);
    result = MESHCCL_T_REMOTE_ERROR;
  }
  finish(r, result);
  return true;
}

void progress(SendComm* c) {
  if (c->broken != MESHCCL_T_SUCCESS) return;
  // Read before the completion scan: transfers the receiver finished before
  // closing still complete normally.
  const bool closed = c->seg->hdr.receiver_closed.load(std::memory_order_acquire) != 0;
  seg_acquire(c->seg);
  bool moved = false;
  // The receiver raises slot_changes after every slot it sets: unless it
  // did, or a transfer is being streamed, no active transfer changed (with
  // hundreds in flight the scan was a tenth of a pipelined all-reduce's time).
  const uint64_t changes = c->seg->slot_changes.v.load(std::memory_order_acquire);
  const bool scan = changes != c->changes_seen || c->streaming;
  c->changes_seen = changes;
  c->streaming = false;
  if (scan) c->active.for_each([&](Request* r) { moved |= check_slot(c, r); });
  if (closed) {
    if (!c->queue.empty() || !c->active.empty())
      fail_all(c, MESHCCL_T_REMOTE_ERROR, "the receiver closed the connection");
    return;
  }
  while (!c->queue.empty()) {
    Request* r = c->queue.front();
    bool ok = r->size <= c->eager ? write_eager(c, r) : write_rts(c, r);
    if (!ok) break;
    c->queue.remove(r);
    if (r->state == State::kWaitRdv) c->active.push_back(r);
    moved = true;
  }
  if (c->bad_tail) {
    char why[160];
    std::snprintf(why, sizeof(why),
                  "the shared ring is corrupt: the receiver's read position is outside [%" PRIu64 ", %" PRIu64 "]",
                  c->tail_cache, c->head);
    fail_all(c, MESHCCL_T_INTERNAL_ERROR, why);
    return;
  }
  if (!moved && !(c->queue.empty() && c->active.empty()) && c->watch.due() && !pid_alive(c->peer_pid))
    fail_all(c, MESHCCL_T_REMOTE_ERROR, "the receiver process died");
}

// What the receiver needs to read the payload without our help.
void describe(SendComm* c, Request* r) {
  RdvDesc& d = r->desc;
  d = RdvDesc{};
  d.pid = c->ctx->pid;
  d.addr = reinterpret_cast<uint64_t>(r->data);
  const meshccl_transport_host_v1_t* host = c->ctx->host;
  meshccl_shared_region_v1_t reg{};
  if (host->find_shared == nullptr || host->find_shared(r->data, r->size, &reg) != 1) return;
  // Only regions of this process: their fd can be checked here, and the
  // identity (inode) tells the receiver when a reused fd is a new file.
  struct stat st;
  if (reg.pid != c->ctx->pid || reg.size < r->size || fstat(reg.fd, &st) != 0) return;
  d.has_region = 1;
  d.region_pid = reg.pid;
  d.region_fd = reg.fd;
  d.region_offset = reg.offset;
  d.region_ino = st.st_ino;
  d.region_dev = st.st_dev;
}

void release(SendComm* c, Request* r) {
  r->magic = 0;
  c->reqs.put(r);
}

}  // namespace

meshccl_tresult_t send_post(SendComm* c, const void* data, size_t size, uint64_t tag, void** request) {
  if (c->broken != MESHCCL_T_SUCCESS) return c->broken;
  Request* r = c->reqs.get();
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->magic = kReqMagic;
  r->kind = Kind::kSend;
  r->state = State::kQueued;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(const_cast<void*>(data));
  r->size = size;
  if (size > c->eager) describe(c, r);
  c->queue.push_back(r);
  progress(c);
  *request = r;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t send_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<SendComm*>(r->comm);
  if (r->state != State::kDone) progress(c);
  if (r->state != State::kDone) {
    *done = 0;
    return MESHCCL_T_SUCCESS;
  }
  meshccl_tresult_t result = r->result;
  *done = 1;
  if (size != nullptr) *size = result == MESHCCL_T_SUCCESS ? r->size : 0;
  release(c, r);
  return result;
}

void send_close(SendComm* c) {
  // Our rendezvous buffers may be freed as soon as this returns: withdraw
  // each one the receiver has not finished, waiting out a chunk it is
  // copying right now (bounded: a chunk is short, a dead receiver is noticed).
  // A receiver stopped mid-chunk (SIGSTOP) must not hold an abort: after 1 s
  // the payload is withdrawn under it, and it fails the message when it
  // resumes (shm_recv.cpp, copy_chunk).
  c->active.for_each([&](Request* r) {
    std::atomic<uint32_t>& slot = c->seg->slots[r->slot].v;
    const uint64_t give_up = now_ns() + 1'000'000'000ull;
    for (uint64_t spins = 1;; ++spins) {
      uint32_t st = kSlotPosted;
      seg_release(c->seg);
      if (slot.compare_exchange_strong(st, kSlotCancelled, std::memory_order_acq_rel)) break;
      seg_acquire(c->seg);
      if (st != kSlotReading) break;  // done, failed, or streamed: our memory is not read
      if (spins % 1024 == 0 && (!pid_alive(c->peer_pid) || now_ns() > give_up)) {
        seg_release(c->seg);
        if (slot.compare_exchange_strong(st, kSlotCancelled, std::memory_order_acq_rel))
          MPLUG_WARN(c->ctx->host, "shm: pid %d was reading a message from us for 1 s (stopped?); withdrawn",
                     c->peer_pid);
        break;
      }
      sched_yield();
    }
    local_rdv_remove(c->nonce, r->slot);
  });
  // The receiver fails whatever is still pending from us.
  seg_release(c->seg);
  c->seg->hdr.sender_closed.store(1, std::memory_order_release);
  munmap(c->seg, c->map_bytes);
}

}  // namespace meshccl::plugin::shm
