// Receiver end of an shm connection: drains the ring (matching or queueing
// each message), and completes rendezvous transfers with one copy straight
// from the sender's memory, in chunks so that one huge receive cannot starve
// the others.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "plugins/shm/shm_comm.h"

namespace meshccl::plugin::shm {
namespace {

void finish(Request* r, meshccl_tresult_t result) {
  r->state = State::kDone;
  r->result = result;
}

void set_slot(RecvComm* c, uint32_t slot, SlotState st) {
  seg_release(c->seg);
  c->seg->slots[slot].v.store(st, std::memory_order_release);
  c->seg->slot_changes.v.fetch_add(1, std::memory_order_release);
}

void release_region(Request* r) {
  if (r->region != nullptr) --r->region->users;
  r->region = nullptr;
}

void unmap_region(Region& g) {
  munmap(g.base, g.len);
  g = Region{};
}

// Ends a matched rendezvous (kCopy or kStream) on the receiver's side.
void end_rdv(RecvComm* c, Request* r, meshccl_tresult_t result) {
  c->m.active().remove(r);
  if (r->state == State::kStream) c->by_slot[r->slot] = nullptr;
  release_region(r);
  set_slot(c, r->slot, result == MESHCCL_T_SUCCESS ? kSlotDone : kSlotFailed);
  finish(r, result);
}

// The sender's memfd region, mapped once and kept for later messages.
Region* map_region(RecvComm* c, const RdvDesc& d, uint64_t size) {
  const meshccl_transport_host_v1_t* host = c->ctx->host;
  uint64_t end = d.region_offset + size;
  Region* slot = nullptr;
  for (Region& g : c->regions) {
    if (g.base == nullptr) {
      if (slot == nullptr) slot = &g;
      continue;
    }
    if (g.pid != d.region_pid || g.fd != d.region_fd) continue;
    if (g.ino == d.region_ino && g.dev == d.region_dev && end <= g.len && end >= size) {
      g.last_use = ++c->region_clock;
      return &g;
    }
    // The fd now names another file (or the file grew): the old mapping only
    // keeps freed memory alive.
    if (g.users == 0) {
      unmap_region(g);
      if (slot == nullptr) slot = &g;
    }
  }
  if (c->regions_refused) return nullptr;
  if (slot == nullptr) {  // evict the least recently used idle mapping
    for (Region& g : c->regions)
      if (g.users == 0 && (slot == nullptr || g.last_use < slot->last_use)) slot = &g;
    if (slot == nullptr) return nullptr;
    unmap_region(*slot);
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", d.region_pid, d.region_fd);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == EACCES || errno == EPERM) {
      c->regions_refused = true;
      MPLUG_INFO(host, "shm: cannot open %s (%s); reading peer buffers with process_vm_readv", path,
                 std::strerror(errno));
    }
    return nullptr;
  }
  struct stat st;
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_ino) == d.region_ino &&
      static_cast<uint64_t>(st.st_dev) == d.region_dev && static_cast<uint64_t>(st.st_size) >= end && end >= size)
    base = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  *slot = Region{d.region_pid,
                 d.region_fd,
                 d.region_ino,
                 d.region_dev,
                 static_cast<unsigned char*>(base),
                 static_cast<uint64_t>(st.st_size),
                 0,
                 ++c->region_clock};
  MPLUG_INFO(host, "shm: mapped shared region of pid %d fd %d (%" PRIu64 " bytes)", d.region_pid, d.region_fd,
             slot->len);
  return slot;
}

void start_stream(RecvComm* c, Request* r) {
  if (!c->streaming) {
    c->streaming = true;
    MPLUG_INFO(c->ctx->host, "shm: large messages from pid %d stream through the ring (no direct read)", c->peer_pid);
  }
  r->state = State::kStream;
  r->offset = 0;
  release_region(r);
  c->by_slot[r->slot] = r;
  set_slot(c, r->slot, kSlotStream);
}

// A receive matched a rendezvous: pick how to read the payload.
void start_rdv(RecvComm* c, Request* r, uint64_t size, uint32_t slot, const RdvDesc& d) {
  if (size > r->size) {
    MPLUG_WARN(c->ctx->host,
               "shm: message of %" PRIu64 " bytes (tag %" PRIu64 ") does not fit the %" PRIu64 "-byte receive buffer",
               size, r->tag, r->size);
    set_slot(c, slot, kSlotTrunc);
    finish(r, MESHCCL_T_INVALID_USAGE);
    return;
  }
  r->nbytes = size;
  r->slot = slot;
  r->offset = 0;
  r->desc = d;
  r->region = nullptr;
  r->state = State::kCopy;
  c->m.active().push_back(r);
  if (d.pid == c->ctx->pid) {
    if (!local_rdv_check(c->nonce, slot, d.addr, size)) {
      MPLUG_WARN(c->ctx->host, "shm: a rendezvous record names this process's memory that no sender of it posted");
      c->broken = MESHCCL_T_INTERNAL_ERROR;
      end_rdv(c, r, MESHCCL_T_INTERNAL_ERROR);
      return;
    }
    r->how = Copy::kMemcpy;
    r->src = reinterpret_cast<const unsigned char*>(d.addr);
  } else if (d.has_region != 0 && (r->region = map_region(c, d, size)) != nullptr) {
    ++r->region->users;
    r->how = Copy::kRegion;
    r->src = r->region->base + d.region_offset;
  } else if (c->ctx->cma && !c->cma_refused) {
    r->how = Copy::kCma;
  } else {
    start_stream(c, r);
  }
}

// Copies one chunk of a kCopy rendezvous. The slot says kSlotReading while
// the sender's memory is read: a sender that closes waits for the chunk to
// end, then withdraws the payload (kSlotCancelled), so nothing is read from
// a buffer its owner may already have freed. A sender that stops waiting
// (this process was stopped mid-chunk) withdraws it under the reader, which
// then fails the message: the read goes through the kernel or this process's
// own mapping, so it cannot harm either process, only be stale.
// Moves the payload's slot from `from` to `to`; false (the message failed)
// when the sender withdrew the payload first. when: "before" or "while".
bool claim_slot(RecvComm* c, Request* r, uint32_t from, uint32_t to, const char* when) {
  seg_release(c->seg);
  const bool moved = c->seg->slots[r->slot].v.compare_exchange_strong(from, to, std::memory_order_acq_rel);
  seg_acquire(c->seg);
  if (moved) return true;
  MPLUG_WARN(c->ctx->host, "shm: pid %d withdrew a %" PRIu64 "-byte message (tag %" PRIu64 ") %s it was read",
             c->peer_pid, r->nbytes, r->tag, when);
  end_rdv(c, r, MESHCCL_T_REMOTE_ERROR);
  return false;
}

void copy_chunk(RecvComm* c, Request* r) {
  if (!claim_slot(c, r, kSlotPosted, kSlotReading, "before")) return;
  uint64_t n = std::min(c->ctx->copy_chunk, r->nbytes - r->offset);
  if (r->how == Copy::kCma) {
    iovec local{r->data + r->offset, n};
    iovec remote{reinterpret_cast<void*>(r->desc.addr + r->offset), n};
    ssize_t got = process_vm_readv(r->desc.pid, &local, 1, &remote, 1, 0);
    if (got < 0) {
      int err = errno;
      if (err == EPERM || err == ENOSYS) {
        c->cma_refused = true;
        MPLUG_INFO(c->ctx->host, "shm: process_vm_readv refused (%s); peers stream large messages", std::strerror(err));
        set_slot(c, r->slot, kSlotPosted);
        start_stream(c, r);
        return;
      }
      bool gone = err == ESRCH || !pid_alive(r->desc.pid);
      MPLUG_WARN(c->ctx->host, "shm: reading %" PRIu64 " bytes from pid %d failed: %s", n, r->desc.pid,
                 gone ? "the sender process died" : std::strerror(err));
      end_rdv(c, r, err == EFAULT || gone ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR);
      return;
    }
    n = static_cast<uint64_t>(got);
  } else {
    std::memcpy(r->data + r->offset, r->src + r->offset, n);
  }
  // A sender that gave up waiting for this chunk (this process was stopped
  // while it copied) withdrew the payload meanwhile: what was read may be
  // stale, so the message fails.
  if (!claim_slot(c, r, kSlotReading, kSlotPosted, "while")) return;
  r->offset += n;
  if (r->offset == r->nbytes) end_rdv(c, r, MESHCCL_T_SUCCESS);
}

void deliver(RecvComm* c, Request* r, const void* payload, uint64_t size) {
  if (size > r->size) {
    MPLUG_WARN(c->ctx->host,
               "shm: message of %" PRIu64 " bytes (tag %" PRIu64 ") does not fit the %" PRIu64 "-byte receive buffer",
               size, r->tag, r->size);
    finish(r, MESHCCL_T_INVALID_USAGE);
    return;
  }
  if (size != 0) std::memcpy(r->data, payload, size);
  r->nbytes = size;
  finish(r, MESHCCL_T_SUCCESS);
}

void corrupt(RecvComm* c, const char* what) {
  if (c->broken == MESHCCL_T_SUCCESS) MPLUG_WARN(c->ctx->host, "shm: corrupt ring from pid %d: %s", c->peer_pid, what);
  c->broken = MESHCCL_T_INTERNAL_ERROR;
}

// Handles one record; false when it is malformed.
bool on_record(RecvComm* c, const RecHdr& h, const unsigned char* payload, uint64_t room) {
  switch (h.type) {
    case kRecEager: {
      if (h.size > room) return false;
      if (Request* r = c->m.match(h.tag)) {
        deliver(c, r, payload, h.size);
        return true;
      }
      Unexpected* u = c->m.park(h.tag, h.size, h.size);
      if (u == nullptr) {
        MPLUG_WARN(c->ctx->host, "shm: out of memory queueing a %" PRIu64 "-byte message", h.size);
        c->broken = MESHCCL_T_SYSTEM_ERROR;
        return true;
      }
      if (h.size != 0) std::memcpy(u->buf.ptr, payload, h.size);
      return true;
    }
    case kRecRts: {
      if (h.slot >= kSlots || sizeof(RdvDesc) > room) return false;
      RdvDesc d;
      std::memcpy(&d, payload, sizeof(d));
      if (Request* r = c->m.match(h.tag)) {
        start_rdv(c, r, h.size, h.slot, d);
        return true;
      }
      Unexpected* u = c->m.park(h.tag, h.size, 0);  // the payload stays with the sender
      if (u == nullptr) {
        c->broken = MESHCCL_T_SYSTEM_ERROR;
        return true;
      }
      u->rdv = true;
      u->slot = h.slot;
      u->desc = d;
      return true;
    }
    case kRecData: {
      if (h.slot >= kSlots || h.size > room) return false;
      Request* r = c->by_slot[h.slot];
      if (r == nullptr) return true;  // its receive already failed
      if (h.offset > r->nbytes || h.size > r->nbytes - h.offset) return false;
      std::memcpy(r->data + h.offset, payload, h.size);
      r->offset += h.size;
      if (r->offset == r->nbytes) end_rdv(c, r, MESHCCL_T_SUCCESS);
      return true;
    }
    default: return false;
  }
}

// Consumes everything the sender has published. Returns whether any record
// was consumed.
bool drain(RecvComm* c) {
  bool moved = false;
  while (c->broken == MESHCCL_T_SUCCESS) {
    if (c->tail == c->head_cache) {
      c->head_cache = c->seg->head.v.load(std::memory_order_acquire);
      seg_acquire(c->seg);
      if (c->tail == c->head_cache) break;
      if (c->head_cache - c->tail > c->cap) {
        corrupt(c, "write position out of range");
        break;
      }
    }
    uint64_t off = c->tail % c->cap;
    const unsigned char* rec = c->ring + off;
    RecHdr h;
    std::memcpy(&h, rec, sizeof(h));  // a private copy: the header is peer-written memory
    uint64_t contiguous = std::min(c->cap - off, c->head_cache - c->tail);
    if (contiguous < sizeof(RecHdr)) {
      corrupt(c, "misaligned write position");
      break;
    }
    uint64_t bytes = 0;
    if (h.type == kRecPad) {
      bytes = c->cap - off;
    } else {
      uint64_t room = contiguous - sizeof(RecHdr);
      if (!on_record(c, h, rec + sizeof(RecHdr), room)) {
        corrupt(c, "malformed record");
        break;
      }
      bytes = record_bytes(h.type == kRecRts ? sizeof(RdvDesc) : h.size);
    }
    if (bytes > contiguous) {
      corrupt(c, "record overruns the write position");
      break;
    }
    c->tail += bytes;
    seg_release(c->seg);
    c->seg->tail.v.store(c->tail, std::memory_order_release);
    moved = true;
  }
  return moved;
}

// Nothing more will come through the ring: every waiting receive and every
// matched rendezvous fails. True when one was pending (worth a warning).
bool fail_pending(RecvComm* c, meshccl_tresult_t result) {
  bool pending = c->m.lose_peer(result, [result](Request* r) { finish(r, result); });
  while (Request* r = c->m.active().front()) {
    end_rdv(c, r, result);
    pending = true;
  }
  return pending;
}

// After a drain that found nothing: has the sender gone away?
void check_sender(RecvComm* c) {
  const char* why = nullptr;
  const bool closed = c->seg->hdr.sender_closed.load(std::memory_order_acquire) != 0;
  seg_acquire(c->seg);
  if (closed) why = "the sender closed the connection";
  else if (c->watch.due() && !pid_alive(c->peer_pid)) why = "the sender process died";
  if (why == nullptr) return;
  drain(c);  // whatever it published before it went away is still good
  if (fail_pending(c, MESHCCL_T_REMOTE_ERROR))
    MPLUG_WARN(c->ctx->host, "shm: receive from pid %d failed: %s", c->peer_pid, why);
}

void progress(RecvComm* c) {
  if (c->broken != MESHCCL_T_SUCCESS || c->m.gone() != MESHCCL_T_SUCCESS) return;
  if (drain(c) || (c->m.posted().empty() && c->m.active().empty())) return;
  check_sender(c);
}

void release(RecvComm* c, Request* r) {
  r->magic = 0;
  c->reqs.put(r);
}

}  // namespace

meshccl_tresult_t recv_post(RecvComm* c, void* data, size_t size, uint64_t tag, void** request) {
  progress(c);
  if (c->broken != MESHCCL_T_SUCCESS) {
    fail_pending(c, c->broken);
    return c->broken;
  }
  Request* r = c->reqs.get();
  if (r == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  r->magic = kReqMagic;
  r->kind = Kind::kRecv;
  r->result = MESHCCL_T_SUCCESS;
  r->comm = c;
  r->tag = tag;
  r->data = static_cast<unsigned char*>(data);
  r->size = size;
  r->state = State::kPosted;
  const meshccl_tresult_t res = c->m.post(r, [c](Request* r, Unexpected* u) {
    if (!u->rdv) deliver(c, r, u->buf.ptr, u->size);
    else if (c->m.gone() != MESHCCL_T_SUCCESS) finish(r, c->m.gone());  // its sender can no longer vouch for the buffer
    else start_rdv(c, r, u->size, u->slot, u->desc);
  });
  if (res != MESHCCL_T_SUCCESS) {
    release(c, r);
    MPLUG_WARN(c->ctx->host, "shm: receive (tag %" PRIu64 ") posted after pid %d went away", tag, c->peer_pid);
    return res;
  }
  *request = r;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t recv_probe(RecvComm* c, uint64_t tag, int* found) {
  if (c->broken == MESHCCL_T_SUCCESS && c->m.gone() == MESHCCL_T_SUCCESS && !drain(c)) check_sender(c);
  const meshccl_tresult_t res = c->m.probe(tag, found);
  return *found != 0 || c->broken == MESHCCL_T_SUCCESS ? res : c->broken;
}

meshccl_tresult_t recv_test(Request* r, int* done, size_t* size) {
  auto* c = static_cast<RecvComm*>(r->comm);
  if (r->state != State::kDone) progress(c);
  if (r->state == State::kCopy) copy_chunk(c, r);
  if (r->state != State::kDone && c->broken != MESHCCL_T_SUCCESS) fail_pending(c, c->broken);
  if (r->state != State::kDone) {
    *done = 0;
    return MESHCCL_T_SUCCESS;
  }
  const meshccl_tresult_t result = report_done(r->result, r->nbytes, done, size);
  release(c, r);
  return result;
}

void recv_close(RecvComm* c) {
  seg_release(c->seg);
  c->seg->hdr.receiver_closed.store(1, std::memory_order_release);
  for (Region& g : c->regions)
    if (g.base != nullptr) unmap_region(g);
  c->m.drain();
  munmap(c->seg, c->map_bytes);
}

}  // namespace meshccl::plugin::shm
