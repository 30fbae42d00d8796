// Every transfer a plan posts goes through Links: two queues (send, receive)
// per link (peer) of the engine's rank. A transfer larger than two chunks of
// its link moves in chunks (a few tens of microseconds of link time, set per
// link by the communicator from the agreed cost model, so both ends cut a
// transfer alike); all chunks of a transfer carry its tag, and the transports
// match equal tags in order. Between chunks the most urgent transfer (lowest
// priority value, then the oldest) posts first. A transfer its run marks
// exempt (the run's window: its first transfers on the link in tag order,
// docs/priority.md) may always keep one chunk in flight, so none starves and
// none deadlocks on credit; any other chunk posts only while the link's
// credit (bytes in flight, shared by every communicator of the process on
// that link) has room and no more urgent transfer of any communicator waits
// on it.
// With scheduling off (MESHCCL_PRIORITY=0) a transfer goes whole, in the order
// posted. Transfers to the rank itself are matched here by tag.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
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

// Accounting of one link (one direction to one peer process) shared by every
// communicator of this process: bytes in flight and transfers waiting to
// post, per priority level (0 = most urgent).
struct LinkShare {
  static constexpr int kLevels = 16;
  std::atomic<int64_t> inflight[kLevels] = {};
  std::atomic<int> waiting[kLevels] = {};
  // Bytes in flight of transfers at `level` or more urgent: less urgent
  // traffic never takes credit from more urgent traffic.
  int64_t inflight_upto(int level) const {
    int64_t n = 0;
    for (int l = 0; l <= level; ++l) n += inflight[l].load(std::memory_order_relaxed);
    return n;
  }
  // True when a transfer of a more urgent level than `level` waits.
  bool urgent_waiting(int level) const {
    for (int l = 0; l < level; ++l)
      if (waiting[l].load(std::memory_order_relaxed) > 0) return true;
    return false;
  }
};
// The process-wide share of the link named key (the same key from every
// communicator that reaches the same peer process the same way). Never freed.
LinkShare* link_share(const std::string& key);

// One transfer as Links schedules it; owned by the run that posted it, which
// keeps it alive until done (or until the communicator is freed after a
// failure).
struct Xfer {
  int peer = -1;
  bool send = false;
  char* ptr = nullptr;
  size_t bytes = 0;
  uint64_t tag = 0;
  int level = 0;     // 0 = most urgent
  uint64_t seq = 0;  // posting order on this engine
  // In its run's window: may keep one chunk in flight without credit. Set by
  // the run (before or after posting); a transfer leaves the window only by
  // finishing.
  bool exempt = true;
  // Progress, written by Links.
  size_t posted = 0;    // bytes handed to the transport
  size_t done = 0;      // bytes completed
  size_t got = 0;       // bytes the receives reported
  uint32_t nposts = 0;  // chunks handed to the transport
  Status error;         // the transport's error; the transfer is then finished
  std::string reason;   // with error: what the transport said about it ("" if nothing)
  bool finished = false;
  bool counted_waiting = false;
  struct Chunk {
    Request req;
    size_t bytes;
    double posted_us;  // for the trace (0 when off)
  };
  // The chunks in flight, oldest first. The first chunk of an empty queue
  // sits in the queue itself, so that a transfer of one chunk at a time
  // (every transfer of a small operation, and any under FIFO scheduling)
  // allocates nothing; more go to a vector read from a head index. (A
  // std::deque allocated twice on construction, for every step of every
  // plan: 40 of a small AllReduce plan's 110 allocations; the vector then
  // allocated once per transfer.)
  class Fifo {
   public:
    bool empty() const { return size() == 0; }
    size_t size() const { return (has_one_ ? 1 : 0) + v_.size() - head_; }
    Chunk& front() { return has_one_ ? one_ : v_[head_]; }
    void push_back(const Chunk& c) {
      if (empty()) {  // the inline slot (an empty vector is always cleared, pop_front)
        one_ = c;
        has_one_ = true;
        return;
      }
      if (head_ > 0 && head_ * 2 >= v_.size()) {  // reuse the space of those done
        v_.erase(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(head_));
        head_ = 0;
      }
      v_.push_back(c);
    }
    void pop_front() {
      if (has_one_) {
        has_one_ = false;  // the inline slot is always the oldest
        return;
      }
      if (++head_ == v_.size()) clear();
    }
    void clear() {
      has_one_ = false;
      v_.clear();
      head_ = 0;
    }
    // Oldest first.
    template <class Fn>
    void for_each(Fn&& fn) const {
      if (has_one_) fn(one_);
      for (size_t i = head_; i < v_.size(); ++i) fn(v_[i]);
    }

   private:
    Chunk one_{};
    bool has_one_ = false;
    std::vector<Chunk> v_;
    size_t head_ = 0;
  };
  Fifo chunks;

  // Bytes still to hand to the transport (a 0-byte transfer posts once).
  bool to_post() const { return nposts == 0 || posted < bytes; }
  // Every byte handed over and completed.
  bool drained() const { return !to_post() && chunks.empty(); }
};

// Priority scheduling settings of one engine, read at communicator creation.
struct LinkPolicy {
  bool priority = true;  // false: FIFO, whole transfers
  size_t window = 1;     // exempt transfers per run and link direction (0: every transfer)
};

class Links {
 public:
  Links(int rank, Mesh* mesh, Executor* exec);
  ~Links();
  // Forgets every queued transfer (the communicator is being freed, its
  // runs still alive): their bytes and waiters leave the shared accounting.
  void abandon();
  // The communicator failed: closes the connection directions that still
  // have chunks in a transport (a closing transport withdraws them, so no
  // caller's buffer is read or written afterwards, and the peer's matching
  // operation fails instead of taking what the buffer holds by then), then
  // abandons every transfer.
  void withdraw();

  // Per-link configuration (at communicator creation, before any operation):
  // chunk bytes (0 = transfers go whole), chunks in flight per direction
  // beyond the exempt ones (the credit), whether runs keep a window on the
  // link (policy.window; else every transfer there is exempt), and the
  // process-wide shares of the link's two directions.
  void configure(const LinkPolicy& policy, int peer, size_t chunk_bytes, size_t credit_chunks, bool windowed,
                 LinkShare* send_share, LinkShare* recv_share);
  const LinkPolicy& policy() const { return policy_; }
  size_t chunk_bytes(int peer) const { return peer < static_cast<int>(q_.size()) ? q_[peer].chunk : 0; }
  bool windowed(int peer) const { return peer < static_cast<int>(q_.size()) && q_[peer].windowed; }
  size_t credit_chunks(int peer) const {
    return peer < static_cast<int>(q_.size()) && q_[peer].chunk > 0 ? q_[peer].credit / q_[peer].chunk : 0;
  }

  // Queues a transfer (x->peer, send, ptr, bytes, tag filled in) at a
  // priority (lower = more urgent). It moves as pump() is called.
  void post(Xfer* x, int priority);
  // Posts chunks by priority and credit, and completes finished chunks;
  // *moved when anything did. A transport error finishes its transfer with
  // the error, for the run that owns it to report. brief: a more urgent run
  // waits for the engine; complete at most one chunk per link direction.
  void pump(bool* moved, bool brief = false);
  // Bytes posted and not yet completed to and from peer by this engine.
  size_t inflight(int peer) const;
  // The most chunks of less urgent levels than `level` that were in flight
  // toward peer at once while a transfer of `level` or more urgent waited
  // to post there (what an urgent transfer can find ahead of it); reset by
  // reading.
  size_t take_max_ahead(int peer);

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

  // The descriptors to block on (each network transport's wait descriptor,
  // armed) while every unfinished transfer has a chunk in a transport that
  // gives one; false (block on nothing) when any waits elsewhere: on a
  // shared-memory link, for credit, or on a transport that said not now
  // (*not_now set: it has events a test() takes in first, so the caller
  // polls again at once rather than sleeping).
  bool wait_fds(std::vector<int>* fds, bool* not_now);

  int rank() const { return rank_; }
  Mesh* mesh() const { return mesh_; }

 private:
  struct Dir {
    std::vector<Xfer*> xfers;  // not finished, most urgent first, then oldest
    LinkShare* share = nullptr;
    LinkShare own;  // when the communicator names no share
    size_t inflight = 0;
    size_t max_ahead = 0;  // see take_max_ahead (sends)
  };
  struct Queue {
    size_t chunk = 0;
    size_t credit = 0;     // bytes: credit chunks x chunk
    bool windowed = true;  // runs keep a window on this link
    Dir dir[2];            // 0 = receives, 1 = sends
  };
  // Chunks one pass completes per link direction: on shared memory a
  // receive's test copies its chunk, and the engine starts and tests newly
  // urgent work only between passes.
  static constexpr size_t kPassChunks = 4;
  void pump_dir(Queue& q, Dir& d, bool brief, bool* moved);
  Status test_chunks(Dir& d, Xfer* x, size_t* budget, bool* moved);
  // *blocked_level: the least urgent level whose chunks found no credit in
  // this pass so far (kLevels: none); chunks of that level and less urgent
  // ones wait for the next pass without asking again.
  Status post_chunks(Queue& q, Dir& d, Xfer* x, int* blocked_level, bool* moved);
  // Tags of the transfers of one pass that have bytes left to post, as an
  // open-addressed set stamped with the pass (nothing to clear between
  // passes; a linear list made each pass quadratic in the transfers queued).
  void busy_reset(size_t expect);
  bool busy_has(uint64_t tag) const;
  void busy_add(uint64_t tag);
  void leave_waiting(Dir& d, Xfer* x);
  void note_ahead(Dir& d);

  int rank_;
  Mesh* mesh_;
  Executor* exec_;  // copies of self transfers
  LinkPolicy policy_;
  std::vector<Queue> q_;
  uint64_t seq_ = 0;
  size_t queued_ = 0;  // transfers not finished, all links
  std::vector<uint64_t> busy_keys_;
  std::vector<uint32_t> busy_stamp_;
  uint32_t busy_pass_ = 0;
  std::map<uint64_t, std::vector<SelfEntry>> self_sends_, self_recvs_;
};

}  // namespace meshccl
