// The receive side's matching rules, written once for every transport.
//
// A receive comm owns one Matcher. The transport tells it what happened on
// its wire (a header arrived, the peer went away, the comm closes) and does
// the moving of bytes itself; the Matcher keeps the lists and applies the
// rules that must not differ between transports (transport.h):
//
//  - order: a message goes to the oldest posted receive with its tag; a new
//    receive takes the oldest message that arrived with its tag before it;
//  - peer gone: once nothing more can arrive, every waiting receive fails
//    with the reason, a new receive fails at post unless its message is
//    already here, and probe reports the reason when nothing is here;
//  - completion: test() reports a request once, its size only on success;
//  - close: every parked payload goes back to its pool;
//  - freeze (Freeze below): a receive the library below has matched and
//    cannot cancel keeps its context from being progressed again once the
//    caller gave up on it.
//
// Req needs `tag`; Unex needs `tag`, `size` and `buf` (a BufferPool::Buf);
// both derive from Linked<>. Matched receives that a transport still moves
// (a rendezvous, a payload in the library's hands) live in active().
#ifndef MESHCCL_PLUGINS_COMMON_MATCHER_H_
#define MESHCCL_PLUGINS_COMMON_MATCHER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshccl/transport.h"
#include "plugins/common/msg_engine.h"

namespace meshccl::plugin {

template <class Req, class Unex>
class Matcher {
 public:
  // Parked payloads come from and go back to bufs, which outlives the matcher.
  explicit Matcher(BufferPool* bufs) : bufs_(bufs) {}
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // ---- a receive is posted ----
  // With a message for r's tag already here: deliver(r, u) takes it (the
  // oldest), then its payload and entry go back. Otherwise r waits, or, once
  // the peer is gone, the post fails with gone() and r is not kept.
  template <class Deliver>
  meshccl_tresult_t post(Req* r, Deliver&& deliver) {
    if (Unex* u = unexpected_.take_tag(r->tag)) {
      deliver(r, u);
      recycle(u);
      return MESHCCL_T_SUCCESS;
    }
    if (gone_ != MESHCCL_T_SUCCESS) return gone_;
    posted_.push_back(r);
    return MESHCCL_T_SUCCESS;
  }

  // ---- a message header arrived ----
  // The oldest receive waiting for tag, off the posted list; nullptr if none.
  Req* match(uint64_t tag) { return posted_.take_tag(tag); }
  // Parks a message no receive waits for yet, with a payload buffer of
  // `bytes` (0: none yet); nullptr when out of memory (nothing is kept).
  Unex* park(uint64_t tag, uint64_t size, uint64_t bytes) {
    Unex* u = unex_.get();
    BufferPool::Buf b = bufs_->get(bytes);
    if (u == nullptr || (bytes != 0 && b.ptr == nullptr)) {
      if (u != nullptr) unex_.put(u);
      bufs_->put(b);
      return nullptr;
    }
    u->tag = tag;
    u->size = size;
    u->buf = b;
    unexpected_.push_back(u);
    return u;
  }
  // A parked message that will never be whole (its sender went away in the
  // middle of it): off the list and back to the pools.
  void drop(Unex* u) {
    unexpected_.remove(u);
    recycle(u);
  }
  // A taken message's payload and entry back to the pools.
  void recycle(Unex* u) {
    bufs_->put(u->buf);
    u->buf = {};
    unex_.put(u);
  }

  // ---- probe ----
  meshccl_tresult_t probe(uint64_t tag, int* found) const {
    *found = unexpected_.has_tag(tag) ? 1 : 0;
    return *found != 0 ? MESHCCL_T_SUCCESS : gone_;
  }

  // ---- the peer went away: nothing more will arrive ----
  // Records why (the first reason stays) and hands each waiting receive to
  // fail(r). True when a receive was waiting (worth a warning).
  template <class Fail>
  bool lose_peer(meshccl_tresult_t why, Fail&& fail) {
    if (gone_ == MESHCCL_T_SUCCESS) gone_ = why;
    const bool waiting = !posted_.empty();
    for (Req* r; (r = posted_.pop_front()) != nullptr;) fail(r);
    return waiting;
  }
  meshccl_tresult_t gone() const { return gone_; }

  // ---- close ----
  // Every parked message back to the pools; each is shown to last(u) first.
  template <class Last>
  void drain(Last&& last) {
    for (Unex* u; (u = unexpected_.pop_front()) != nullptr;) {
      last(u);
      recycle(u);
    }
  }
  void drain() {
    drain([](Unex*) {});
  }

  // Whether running(r) holds for a matched receive still being moved.
  template <class Running>
  bool any_running(Running&& running) const {
    for (const Req* r = active_.front(); r != nullptr; r = r->next)
      if (running(r)) return true;
    return false;
  }

  List<Req>& posted() { return posted_; }
  List<Req>& active() { return active_; }
  List<Unex>& unexpected() { return unexpected_; }
  BufferPool& bufs() { return *bufs_; }

 private:
  BufferPool* bufs_;
  Pool<Unex> unex_;
  List<Req> posted_;       // waiting for a message, in posting order
  List<Req> active_;       // matched, still being moved
  List<Unex> unexpected_;  // arrived before their receive, in arrival order
  meshccl_tresult_t gone_ = MESHCCL_T_SUCCESS;
};

// What test() reports for a finished request: done, its size only when it
// succeeded, its result. The caller then gives the request back.
inline meshccl_tresult_t report_done(meshccl_tresult_t result, uint64_t bytes, int* done, size_t* size) {
  *done = 1;
  if (size != nullptr) *size = result == MESHCCL_T_SUCCESS ? bytes : 0;
  return result;
}

// The freeze rule of a context whose library below cannot cancel a receive
// it has matched (UCX, libfabric): once the caller gave up on an operation
// it may free its buffers, and the payload lands whenever the context is
// progressed, on behalf of any comm. So while any open receive comm of the
// context has such a payload running, the context is frozen for good: no
// close progresses it again and finalize keeps its memory.
class Freeze {
 public:
  // recvs: the context's open receive comms, each with a Matcher `m`;
  // running(r): whether the library still moves r's payload.
  template <class Comm, class Running>
  bool check(const std::vector<Comm*>& recvs, Running&& running) {
    for (size_t i = 0; i < recvs.size() && !frozen_; ++i) frozen_ = recvs[i]->m.any_running(running);
    return frozen_;
  }
  void set() { frozen_ = true; }
  bool frozen() const { return frozen_; }

 private:
  bool frozen_ = false;
};

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_MATCHER_H_
