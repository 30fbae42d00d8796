#include "sched/links.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "sched/trace.h"
#include "transport/registry.h"
#include "util/wait.h"

namespace meshccl {

LinkShare* link_share(const std::string& key) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<LinkShare>> shares;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = shares[key];
  if (!s) s = std::make_unique<LinkShare>();
  return s.get();
}

Links::Links(int rank, Mesh* mesh, Executor* exec)
    : rank_(rank), mesh_(mesh), exec_(exec), q_(mesh != nullptr ? mesh->size() : 0) {
  for (Queue& q : q_)
    for (Dir& d : q.dir) d.share = &d.own;
}

Links::~Links() { abandon(); }

void Links::abandon() {
  // A failed communicator leaves transfers behind: its bytes and waiters
  // leave the process-wide accounting.
  queued_ = 0;
  for (Queue& q : q_)
    for (Dir& d : q.dir) {
      for (Xfer* x : d.xfers) {
        leave_waiting(d, x);
        x->chunks.for_each([&](const Xfer::Chunk& c) {
          d.share->inflight[x->level].fetch_sub(static_cast<int64_t>(c.bytes), std::memory_order_relaxed);
        });
        x->chunks.clear();
      }
      d.xfers.clear();
      d.inflight = 0;
    }
}

void Links::withdraw() {
  for (size_t peer = 0; peer < q_.size(); ++peer)
    for (int dir = 0; dir < 2; ++dir) {
      const std::vector<Xfer*>& xs = q_[peer].dir[dir].xfers;
      if (std::any_of(xs.begin(), xs.end(), [](const Xfer* x) { return !x->chunks.empty(); }))
        mesh_->close(static_cast<int>(peer), dir == 1);
    }
  abandon();
}

void Links::configure(const LinkPolicy& policy, int peer, size_t chunk_bytes, size_t credit_chunks, bool windowed,
                      LinkShare* send_share, LinkShare* recv_share) {
  policy_ = policy;
  if (peer < 0 || peer >= static_cast<int>(q_.size())) return;
  q_[peer].chunk = policy.priority ? chunk_bytes : 0;
  q_[peer].windowed = windowed;
  q_[peer].credit = q_[peer].chunk * std::max<size_t>(credit_chunks, 1);
  q_[peer].dir[1].share = send_share != nullptr ? send_share : &q_[peer].dir[1].own;
  q_[peer].dir[0].share = recv_share != nullptr ? recv_share : &q_[peer].dir[0].own;
}

size_t Links::inflight(int peer) const { return q_[peer].dir[0].inflight + q_[peer].dir[1].inflight; }

bool Links::wait_fds(std::vector<int>* fds, bool* not_now) {
  fds->clear();
  *not_now = false;
  if (queued_ == 0) return false;
  std::vector<Transport*> ts;
  for (int p = 0; p < static_cast<int>(q_.size()); ++p) {
    for (const Dir& d : q_[p].dir) {
      if (d.xfers.empty()) continue;
      Transport* t = p == rank_ ? nullptr : mesh_->transport(p);
      if (t == nullptr || !t->has_wait_fd() || d.inflight == 0) return false;
      if (std::find(ts.begin(), ts.end(), t) == ts.end()) ts.push_back(t);
    }
  }
  for (Transport* t : ts) {
    const int fd = t->wait_fd();
    if (fd < 0) {
      *not_now = true;
      return false;
    }
    fds->push_back(fd);
  }
  return !fds->empty();
}

size_t Links::take_max_ahead(int peer) {
  const size_t n = q_[peer].dir[1].max_ahead;
  q_[peer].dir[1].max_ahead = 0;
  return n;
}

void Links::note_ahead(Dir& d) {
  // The most urgent transfer with bytes left to post: count this engine's
  // chunks of less urgent transfers in flight ahead of it (none when every
  // transfer queued has one level: the queue is sorted by level).
  if (d.xfers.empty() || d.xfers.front()->level == d.xfers.back()->level) return;
  const Xfer* first = nullptr;
  for (const Xfer* x : d.xfers)
    if (!x->finished && x->posted < x->bytes) {
      first = x;
      break;
    }
  if (first == nullptr) return;
  size_t ahead = 0;
  for (const Xfer* x : d.xfers)
    if (x->level > first->level) ahead += x->chunks.size();
  d.max_ahead = std::max(d.max_ahead, ahead);
}

void Links::post(Xfer* x, int priority) {
  x->level = policy_.priority ? std::clamp(priority + LinkShare::kLevels / 2, 0, LinkShare::kLevels - 1) : 0;
  x->seq = seq_++;
  x->posted = x->done = x->got = 0;
  x->nposts = 0;
  x->finished = false;
  Dir& d = q_[x->peer].dir[x->send ? 1 : 0];
  auto pos = std::upper_bound(d.xfers.begin(), d.xfers.end(), x,
                              [](const Xfer* a, const Xfer* b) { return a->level < b->level; });
  d.xfers.insert(pos, x);
  d.share->waiting[x->level].fetch_add(1, std::memory_order_relaxed);
  x->counted_waiting = true;
  ++queued_;
}

void Links::leave_waiting(Dir& d, Xfer* x) {
  if (!x->counted_waiting) return;
  x->counted_waiting = false;
  d.share->waiting[x->level].fetch_sub(1, std::memory_order_relaxed);
}

Status Links::test_chunks(Dir& d, Xfer* x, size_t* budget, bool* moved) {
  // Chunks of one transfer share a tag, so they complete in order.
  for (; *budget > 0 && !x->chunks.empty(); --*budget) {
    bool done = false;
    size_t got = 0;
    MC_TRY(Mesh::test(x->chunks.front().req, &done, &got));
    if (!done) break;
    const size_t bytes = x->chunks.front().bytes;
    if (trace_on()) trace_chunk(rank_, x->peer, x->send, bytes, x->level, x->tag, x->chunks.front().posted_us);
    x->chunks.pop_front();
    x->done += bytes;
    x->got += got;
    d.inflight -= bytes;
    d.share->inflight[x->level].fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    *moved = true;
    // A short receive ends the transfer (the plan reports the mismatch);
    // the communicator fails, so chunks still posted are left as they are.
    if (!x->send && got != bytes) {
      x->finished = true;
      break;
    }
  }
  return kOk;
}

Status Links::post_chunks(Queue& q, Dir& d, Xfer* x, int* blocked_level, bool* moved) {
  const size_t credit = q.credit;
  while (!x->finished && x->to_post()) {
    const size_t left = x->bytes - x->posted;
    size_t n = left;
    if (q.chunk > 0 && left > 2 * q.chunk) n = q.chunk;  // up to two chunks go whole: no runt last chunk
    if (q.chunk == 0 && !x->chunks.empty()) break;       // FIFO: whole transfers
    if (q.chunk > 0 && (!x->chunks.empty() || !x->exempt)) {
      // Beyond the one chunk of an exempt transfer, a chunk needs credit and
      // no more urgent waiter.
      if (x->level >= *blocked_level) break;
      const int64_t used = std::max<int64_t>(d.share->inflight_upto(x->level), 0);
      if (static_cast<size_t>(used) + n > credit || d.share->urgent_waiting(x->level)) {
        *blocked_level = x->level;
        break;
      }
    }
    Request r;
    if (x->send) MC_TRY(mesh_->isend(x->peer, x->ptr + x->posted, n, x->tag, &r));
    else MC_TRY(mesh_->irecv(x->peer, x->ptr + x->posted, n, x->tag, &r));
    if (r.handle == nullptr) break;  // transport busy: retry later
    x->chunks.push_back({r, n, trace_on() ? now_us() : 0.0});
    x->posted += n;
    ++x->nposts;
    d.inflight += n;
    d.share->inflight[x->level].fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    *moved = true;
    if (x->posted >= x->bytes) leave_waiting(d, x);
  }
  return kOk;
}

void Links::busy_reset(size_t expect) {
  size_t cap = 16;
  while (cap < 2 * expect) cap *= 2;
  if (busy_keys_.size() < cap) {
    busy_keys_.assign(cap, 0);
    busy_stamp_.assign(cap, 0);
    busy_pass_ = 0;
  }
  if (++busy_pass_ == 0) {  // the stamp wrapped: forget every old one
    std::fill(busy_stamp_.begin(), busy_stamp_.end(), 0);
    busy_pass_ = 1;
  }
}

bool Links::busy_has(uint64_t tag) const {
  const size_t mask = busy_keys_.size() - 1;
  for (size_t i = (tag * 0x9E3779B97F4A7C15ull) >> 32 & mask;; i = (i + 1) & mask) {
    if (busy_stamp_[i] != busy_pass_) return false;
    if (busy_keys_[i] == tag) return true;
  }
}

void Links::busy_add(uint64_t tag) {
  const size_t mask = busy_keys_.size() - 1;
  size_t i = (tag * 0x9E3779B97F4A7C15ull) >> 32 & mask;
  while (busy_stamp_[i] == busy_pass_ && busy_keys_[i] != tag) i = (i + 1) & mask;
  busy_keys_[i] = tag;
  busy_stamp_[i] = busy_pass_;
}

void Links::pump_dir(Queue& q, Dir& d, bool brief, bool* moved) {
  if (q.chunk > 0 && &d == &q.dir[1]) note_ahead(d);
  // Tags with an earlier transfer that has bytes left to post: a later
  // transfer with the same tag waits, so chunks of the two never interleave.
  busy_reset(d.xfers.size());
  // A pass completes at most kPassChunks chunks of a chunked link direction,
  // and while a more urgent transfer of this engine and direction is
  // unfinished, at most one of less urgent transfers: on shared memory a
  // receive's test copies its chunk, and the engine's next pass starts and
  // tests urgent work first.
  size_t budget = brief ? 1 : q.chunk > 0 ? kPassChunks : SIZE_MAX;
  int urgent_level = LinkShare::kLevels;
  int blocked_level = LinkShare::kLevels;
  for (Xfer* x : d.xfers) {
    if (urgent_level < x->level) budget = std::min<size_t>(budget, 1);
    Status s = test_chunks(d, x, &budget, moved);
    if (s.ok() && !busy_has(x->tag)) s = post_chunks(q, d, x, &blocked_level, moved);
    if (s.ok()) s = test_chunks(d, x, &budget, moved);
    if (!x->finished && !x->drained()) urgent_level = std::min(urgent_level, x->level);
    if (!s.ok()) {
      x->error = s;
      x->reason = transport_warning();
      x->finished = true;
      *moved = true;
    }
    if (!x->finished && x->to_post()) busy_add(x->tag);
  }
  // Finished transfers leave the queue.
  size_t keep = 0;
  for (Xfer* x : d.xfers) {
    if (x->finished || x->drained()) {
      x->finished = true;
      leave_waiting(d, x);
      // Chunks left by a failed transfer no longer count (the communicator fails).
      x->chunks.for_each([&](const Xfer::Chunk& c) {
        d.inflight -= c.bytes;
        d.share->inflight[x->level].fetch_sub(static_cast<int64_t>(c.bytes), std::memory_order_relaxed);
      });
      x->chunks.clear();
      --queued_;
      continue;
    }
    d.xfers[keep++] = x;
  }
  d.xfers.resize(keep);
}

void Links::pump(bool* moved, bool brief) {
  if (queued_ == 0) return;
  for (Queue& q : q_)
    for (Dir& d : q.dir)
      if (!d.xfers.empty()) pump_dir(q, d, brief, moved);
}

void Links::self_post(bool is_send, uint64_t tag, SelfEntry e) {
  auto& mine = is_send ? self_sends_ : self_recvs_;
  auto& other = is_send ? self_recvs_ : self_sends_;
  auto it = other.find(tag);
  if (it == other.end() || it->second.empty()) {
    mine[tag].push_back(e);
    return;
  }
  SelfEntry o = it->second.front();
  it->second.erase(it->second.begin());
  if (it->second.empty()) other.erase(it);
  const SelfEntry& snd = is_send ? e : o;
  const SelfEntry& rcv = is_send ? o : e;
  size_t n = std::min(snd.bytes, rcv.bytes);
  exec_->copy(rcv.dst, snd.src, n);
  snd.run->complete_step(snd.step);
  rcv.run->complete_step(rcv.step);
}

}  // namespace meshccl
