// Every transfer a plan posts goes through Links: one queue per link (peer)
// of the engine's rank. Today a transfer goes to the transport at once, in
// the order posted, and the bytes in flight on each link are counted; this is
// the seam where chunking, per-link credits and priorities across operations
// belong. Transfers to the rank itself are matched here by tag.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "sched/executor.h"
#include "transport/mesh.h"
#include "util/status.h"

namespace meshccl {

// What Links completes steps of (self transfers): a plan being run.
class StepSink {
 public:
  virtual void complete_step(uint32_t step) = 0;

 protected:
  ~StepSink() = default;
};

class Links {
 public:
  Links(int rank, Mesh* mesh, Executor* exec)
      : rank_(rank), mesh_(mesh), exec_(exec), inflight_(mesh != nullptr ? mesh->size() : 0, 0) {}

  // Posts a transfer to another rank; r->handle == nullptr after success
  // means the transport is busy (retry later).
  Status isend(int peer, const void* src, size_t bytes, uint64_t tag, Request* r);
  Status irecv(int peer, void* dst, size_t bytes, uint64_t tag, Request* r);
  // Tests a posted transfer; when done, its bytes leave the link's count.
  Status test(int peer, size_t bytes, Request& r, bool* done, size_t* got);
  // Bytes posted and not yet completed on the link to peer.
  size_t inflight(int peer) const { return inflight_[peer]; }

  // A transfer to or from this rank: matched with its counterpart by tag;
  // both steps complete when the second one arrives.
  struct SelfEntry {
    StepSink* run;
    uint32_t step;
    void* dst;
    const void* src;
    size_t bytes;
  };
  void self_post(bool is_send, uint64_t tag, SelfEntry e);

  int rank() const { return rank_; }
  Mesh* mesh() const { return mesh_; }

 private:
  int rank_;
  Mesh* mesh_;
  Executor* exec_;  // copies of self transfers
  std::vector<size_t> inflight_;
  std::map<uint64_t, std::vector<SelfEntry>> self_sends_, self_recvs_;
};

}  // namespace meshccl
