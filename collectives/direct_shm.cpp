// Direct shared-memory collectives for communicators whose ranks share one
// host (src/transport/node_region.h). Each round, every rank copies its input
// into its own slot and raises its `arrived` flag; then every rank reads what
// it needs straight from the peers' slots:
//
//   AllReduce  small: each rank reduces all slots into its output (one flag
//              wait). Larger: each rank reduces one block of the round in
//              place in its own slot, raises `reduced`, then copies every
//              block out (two flag waits, the reduction split over all cores).
//   Reduce     the same; only the root copies out.
//   Broadcast  the root's slot is copied out by the others.
//   AllGather, Gather: each rank's piece is copied out by the others (root).
//   ReduceScatter: each rank reduces its block from every slot.
//   AlltoAll, Scatter: each rank copies its block out of every slot (root's).
//
// An operation larger than a slot runs in rounds, each covering the same range
// of every block (blocks are per-peer for ReduceScatter, AlltoAll and Scatter,
// whose slots hold one chunk per peer). Each round copies its range in before
// anything of that range is written, so every collective also works in place.
// Every rank waits for every peer's arrival in each round and compares the
// operation signature in the slot header with its own, so mismatched calls
// (collective, count, datatype, op, root) are found on every rank and reported
// as ncclInvalidUsage. The exceptions are a rooted round (a Broadcast or
// Scatter whose input fits the header), where a peer waits for and compares
// with its root only and the root waits for nobody, and an empty call (count
// 0), where nobody waits: a rank that waited for nobody compares its peers'
// headers later (check_unchecked: at its next wait or round that waits for
// peers, after a batch of such rounds, at the latest kRunAhead rounds on),
// which lets it run up to NodeRegion::kRunAhead rounds ahead. No thread
// hand-off, no message, no allocation per call.
//
// Rounds run in the operation's lane of the region: one lane in call order
// (FIFO), or with priority scheduling one per stream priority level, whose
// slots are one chunk long; there, before each round, an operation first lets
// the rounds of more urgent lanes that every rank has announced run
// (yield_to_urgent), and the header's call number catches a call issued at
// different priorities on different ranks.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "kernels/reduce.h"
#include "mem/memalloc.h"
#include "sched/engine.h"
#include "transport/node_region.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

namespace {

using detail::at;

// Kinds whose slot holds one chunk per peer.
bool per_peer_blocks(OpKind k) { return k == OpKind::ReduceScatter || k == OpKind::AlltoAll || k == OpKind::Scatter; }

// Bytes one rank's input occupies over the whole operation.
size_t input_bytes(const OpDesc& op) {
  const size_t bytes = op.count * op.elem();
  return per_peer_blocks(op.kind) ? bytes * static_cast<size_t>(op.nranks) : bytes;
}

// Elements of each block one round covers.
size_t round_elems(const NodeRegion* node, const OpDesc& op) {
  const size_t blocks = per_peer_blocks(op.kind) ? static_cast<size_t>(op.nranks) : 1;
  return node->slot_bytes() / (op.elem() * blocks);
}

class DirectRun final : public Run {
 public:
  DirectRun(NodeRegion* node, const OpDesc& op, int lane, uint64_t rounds)
      : node_(node),
        op_(op),
        sig_(op.signature()),
        lane_(lane),
        call_(node->take_call()),
        first_(node->reserve_rounds(lane, rounds)),
        last_(first_ + rounds - 1),
        round_(first_) {
    round_elems_ = round_elems(node, op);
    // Inputs that fit the header's first line travel with the arrival itself
    // (single-round operations only: the slot data is not touched at all).
    inline_ = input_bytes(op) <= NodeRegion::kInlineBytes && op.count <= round_elems_;
    // A Broadcast or Scatter that fits the header reads only its root's
    // input: a peer waits for the root alone, and the root for nobody.
    rooted_ = inline_ && (op.kind == OpKind::Broadcast || op.kind == OpKind::Scatter);
    // An empty call reads nothing: it publishes its signature and waits for
    // nobody, and its rank compares every peer's later (check_unchecked).
    empty_ = op.count == 0;
    waits_none_ = empty_ || (rooted_ && node->rank() == op.root);
    // Reduce within a round by one rank (small) or split over all ranks.
    two_phase_ = (op.kind == OpKind::AllReduce || op.kind == OpKind::Reduce) &&
                 std::min(op.count, round_elems_) * op.elem() * static_cast<size_t>(op.nranks) > kOnePhaseBytes;
  }

  const char* name() const override { return op_kind_name(op_.kind); }

  void start(ScratchPool& /*pool*/) override { op_.read_scalar(); }

  Status poll(Engine* /*eng*/, bool* moved) override {
    if (!active_) {
      // From now on this operation is polled until it ends: with priority
      // scheduling, peers' less urgent operations may wait for its rounds.
      // (Only less urgent lanes read a lane's announcements: the least
      // urgent lane's are never read.)
      active_ = true;
      if (lane_ > 0) {
        node_->urgent_running().fetch_add(1, std::memory_order_relaxed);
        node_->activate(lane_, first_, last_);
      }
    }
    for (;;) {
      switch (state_) {
        case State::Turn: {
          bool turn = false;
          MC_TRY(my_turn(&turn));
          if (!turn) return kOk;
          publish();
          state_ = State::Arrive;
          *moved = true;
          [[fallthrough]];
        }
        case State::Arrive: {
          bool ready = false;
          MC_TRY(all_arrived(&ready));
          if (!ready) return kOk;
          peers_read_buffers_ = false;
          for (int p = 0; p < n() && !rooted_ && !empty_; ++p)
            peers_read_buffers_ |= header(p).input_at == NodeRegion::kInBuffer;
          MC_TRY(read_inputs());
          *moved = true;
          if (!two_phase_) break;
          control(me()).reduced.value.store(round_, std::memory_order_release);
          state_ = State::Reduced;
          [[fallthrough]];
        }
        case State::Reduced: {
          bool ready = false;
          MC_TRY(all_at(&NodeRegion::Control::reduced, &ready));
          if (!ready) return kOk;
          copy_blocks_out();
          *moved = true;
          break;
        }
        case State::Release: {
          // Peers read this rank's own buffer: it may change only once every
          // reader is done with it.
          bool ready = false;
          MC_TRY(all_at(&NodeRegion::Control::done, &ready));
          if (!ready) return kOk;
          *moved = true;
          break;
        }
        case State::Done: return kOk;
      }
      if (state_ == State::Arrive && peers_read_buffers_ && !two_phase_) {
        control(me()).done.value.store(round_, std::memory_order_release);
        state_ = State::Release;
        continue;
      }
      node_->finished(lane_).store(round_, std::memory_order_release);
      if (round_ == last_) {
        state_ = State::Done;
        if (lane_ > 0) node_->urgent_running().fetch_sub(1, std::memory_order_release);
        return kOk;
      }
      ++round_;
      snapped_ = false;
      state_ = State::Turn;
      // Priority scheduling: one round (chunk) per poll, so that the engine
      // polls more urgent runs (plans too) between two chunks.
      if (node_->lanes() > 1) return kOk;
    }
  }

  bool finished() const override { return state_ == State::Done; }
  int waiting_on() const override { return waiting_; }

 private:
  enum class State { Turn, Arrive, Reduced, Release, Done };
  // Rounds at least this large per rank read ncclMemAlloc inputs in place.
  static constexpr size_t kZeroCopyBytes = 64 * 1024;
  static constexpr size_t kOnePhaseBytes = 16 * 1024;
  // Rounds run without comparing (check_unchecked) that are compared together.
  static constexpr size_t kCheckBatch = 16;

  int me() const { return node_->rank(); }
  NodeRegion::SlotHeader& header(int p) const { return node_->header(p, lane_, round_); }
  NodeRegion::Control& control(int p) const { return node_->control(p, lane_); }
  int n() const { return node_->nranks(); }
  size_t es() const { return op_.elem(); }
  // This round's elements of the operation (multi-round kinds).
  size_t lo() const { return (round_ - first_) * round_elems_; }
  size_t len() const { return std::min(round_elems_, op_.count - lo()); }
  // Block b of the round, 64-byte aligned, for the two-phase reduction.
  void block(int b, size_t* begin, size_t* end) const {
    const size_t align = std::max<size_t>(1, 64 / es());
    size_t per = (len() + static_cast<size_t>(n()) - 1) / static_cast<size_t>(n());
    per = (per + align - 1) / align * align;
    *begin = std::min(len(), per * static_cast<size_t>(b));
    *end = std::min(len(), *begin + per);
  }

  Status my_turn(bool* ready) {
    *ready = false;
    if (node_->finished(lane_).load(std::memory_order_acquire) != round_ - 1) return kOk;
    // Every peer must be past the last reader of what this round overwrites:
    // the data slot of round - 2, or the header of round - kRing.
    const uint64_t back = inline_ ? NodeRegion::kRunAhead : 1;
    for (int p = 0; p < n(); ++p) {
      if (round_ > back && !arrived(p, round_ - back)) {
        waiting_ = p;
        // A mismatch this rank can see, or one a peer found, comes before
        // a peer's leaving: that peer may have left because of it.
        MC_TRY(check_unchecked(true));
        MC_TRY(peer_failure());
        return unless_left(p, [&] { return arrived(p, round_ - back); });
      }
    }
    waiting_ = -1;
    // Rounds this rank ran without comparing (a root's, an empty call's):
    // those kRunAhead rounds back are due before this round lets peers reuse
    // their headers; the others wait for a batch.
    MC_TRY(check_unchecked(false));
    if (yield_to_urgent()) return kOk;
    *ready = true;
    return kOk;
  }

  // Whether this rank waits for p's arrival at this round and compares p's call
  // with its own: every peer, except in a rooted round (a peer waits for the root,
  // the root for nobody) and an empty call (nobody).
  bool waits_for(int p) const {
    if (p == me() || waits_none_) return false;
    return !rooted_ || p == op_.root;
  }

  // The rounds this rank finished without comparing (node_->unchecked: as a
  // root, or with an empty call) are compared with every peer's header once
  // every peer has arrived at them: whenever this rank waits, in its next
  // round that waits for peers, once kCheckBatch of them are due, and at the
  // latest before it arrives kRunAhead rounds past one (after which a peer
  // may reuse that header). eager: now, as far as the peers have arrived;
  // otherwise only when a batch or the kRunAhead bound is due, so that a root
  // of back-to-back small Broadcasts reads its peers' header lines, which
  // they have just written, in one pass per batch instead of one line per
  // call. Between them, every pair of ranks is compared in every
  // round: a peer compares itself with its root, a root with every peer, an
  // empty call's rank with every peer, so a mismatch is found by at least
  // one rank of each pair that differs.
  Status check_unchecked(bool eager) {
    std::vector<uint64_t>& due = node_->unchecked(lane_);
    if (due.empty()) return kOk;
    if (!eager && due.size() < kCheckBatch && due.front() + NodeRegion::kRunAhead > round_) return kOk;
    size_t done = 0;
    Status s = kOk;
    for (; done < due.size() && s.ok(); ++done) {
      const uint64_t r = due[done];
      bool all = true;
      for (int p = 0; p < n() && all; ++p) all = p == me() || arrived(p, r);
      if (!all) break;
      const NodeRegion::SlotHeader& own = node_->header(me(), lane_, r);
      for (int p = 0; p < n() && s.ok(); ++p)
        if (p != me()) s = compare(p, r, own.signature, own.call, r != round_);
    }
    due.erase(due.begin(), due.begin() + static_cast<std::ptrdiff_t>(done));
    return s;
  }

  // Rank p's call at round r against this rank's (sig, call): ncclInvalidUsage
  // naming the difference, after marking this rank as having found one.
  // earlier: round r belongs to an earlier call of this rank (a root's or an
  // empty one, which returned without waiting). The match is tested inline
  // (most rounds compare at least one peer); mismatch() does the rest.
  Status compare(int p, uint64_t r, const OpSignature& sig, uint32_t call, bool earlier) {
    const NodeRegion::SlotHeader& h = node_->header(p, lane_, r);
    if (h.round.load(std::memory_order_relaxed) == r && h.signature == sig && (node_->lanes() == 1 || h.call == call))
        [[likely]]
      return kOk;
    return mismatch(p, r, sig, call, earlier);
  }

  [[gnu::noinline]] Status mismatch(int p, uint64_t r, const OpSignature& sig, uint32_t call, bool earlier) {
    const NodeRegion::SlotHeader& h = node_->header(p, lane_, r);
    const bool same_round = h.round.load(std::memory_order_relaxed) == r;
    node_->failed(me()).value.store(r, std::memory_order_release);
    std::string diff = same_round ? signature_difference(sig, me(), h.signature, p)
                                  : "rank " + std::to_string(p) + " is at another call";
    // The same signature at another call: the ranks issued calls at
    // different stream priorities, which put them in different lanes.
    if (diff.empty())
      diff = "rank " + std::to_string(p) + " reached this call at another position (its direct call " +
             std::to_string(h.call) + ", this rank's " + std::to_string(call) +
             "): a collective's stream priority must be the same on every rank";
    if (earlier)
      return MC_ERROR(ncclInvalidUsage,
                      "%s: mismatched calls across ranks at this rank's earlier %s, which it issued %s and "
                      "which returned before the peers arrived: %s",
                      op_kind_name(op_.kind), op_kind_name(static_cast<OpKind>(sig.kind)),
                      sig.count == 0 ? "with count 0" : "as the root", diff.c_str());
    return MC_ERROR(ncclInvalidUsage, "%s: mismatched calls across ranks: %s", op_kind_name(op_.kind), diff.c_str());
  }

  // Priority scheduling, between two rounds (chunks) of this operation: every
  // round of a more urgent lane that every rank had announced when this round
  // came up runs first. Announced rounds belong to operations every rank is
  // already driving (NodeRegion::activate), so each of them completes without
  // this one, whatever waits for this one (an urgent call reserved but queued
  // behind work that needs this one is not announced yet); and only those of
  // the snapshot, so a stream of later urgent calls cannot hold this operation
  // back forever.
  bool yield_to_urgent() {
    const int lanes = node_->lanes();
    if (lane_ + 1 >= lanes) return false;
    if (!snapped_ && node_->urgent_running().load(std::memory_order_acquire) == 0) return false;
    if (!snapped_) {
      for (int u = lane_ + 1; u < lanes; ++u) {
        // Every rank's announcements include this rank's: when this rank has
        // finished every round it announced in lane u, it has finished every
        // round all ranks announced there, and the peers' flags (a cache line
        // each) need not be read. The common case: nothing more urgent runs.
        const uint64_t done = node_->finished(u).load(std::memory_order_acquire);
        uint64_t all = node_->control(me(), u).announced.value.load(std::memory_order_acquire);
        for (int p = 0; p < n() && all > done; ++p)
          if (p != me()) all = std::min(all, node_->control(p, u).announced.value.load(std::memory_order_acquire));
        urgent_[u] = all;
      }
      snapped_ = true;
    }
    for (int u = lane_ + 1; u < lanes; ++u)
      if (node_->finished(u).load(std::memory_order_acquire) < urgent_[u]) return true;
    return false;
  }

  // A rank that found a mismatch never arrives at later rounds: waiting for
  // it ends with its finding.
  Status peer_failure() const {
    for (int q = 0; q < n(); ++q) {
      const uint64_t failed = node_->failed(q).value.load(std::memory_order_acquire);
      if (q != me() && failed != 0 && failed != NodeRegion::kLeft)
        return MC_ERROR(ncclInvalidUsage, "%s: mismatched calls across ranks: rank %d found them on this communicator",
                        op_kind_name(op_.kind), q);
    }
    return kOk;
  }

  // Waiting for p, which left the communicator (aborted or destroyed it): it
  // will never do what `done` asks, unless it did so before it left (looked
  // at after its leaving, which it wrote last).
  template <typename Done>
  Status unless_left(int p, Done&& done) const {
    if (!node_->left(p) || done()) return kOk;
    return MC_ERROR(ncclRemoteError,
                    "%s: rank %d left this communicator (aborted or destroyed it) during the operation",
                    op_kind_name(op_.kind), p);
  }

  void publish() {
    char* slot = node_->data(me(), lane_, round_);
    const size_t e = es(), c = op_.count;
    auto in = [&](size_t block) { return at(op_.sendbuff, block * c + lo(), e); };
    NodeRegion::SlotHeader& hdr = header(me());
    MemBlockRef ref;
    if (inline_) {
      // A rooted round's peers publish no input.
      if (op_.count != 0 && (!rooted_ || me() == op_.root)) copy_input(reinterpret_cast<char*>(hdr.inline_data), in);
      hdr.input_at = NodeRegion::kInline;
    } else if (zero_copy_input() && mem_find_block(op_.sendbuff, input_bytes(op_), &ref)) {
      hdr.input = NodeRegion::BufferRef{0, ref.pid, ref.fd, 0, ref.ino, ref.dev, ref.offset, ref.file_size};
      hdr.input_at = NodeRegion::kInBuffer;
    } else {
      copy_input(slot, in);
      hdr.input_at = NodeRegion::kInSlot;
    }
    hdr.signature = sig_;
    hdr.call = call_;
    hdr.round.store(round_, std::memory_order_release);  // arrival
  }

  // Rank p has published round r (or a later one in the same slot).
  bool arrived(int p, uint64_t r) const {
    return node_->header(p, lane_, r).round.load(std::memory_order_acquire) >= r;
  }

  template <typename In>
  void copy_input(char* slot, const In& in) {
    const size_t e = es(), l = len();
    switch (op_.kind) {
      case OpKind::Broadcast:
        if (me() == op_.root) std::memcpy(slot, in(0), l * e);
        break;
      case OpKind::AllReduce:
      case OpKind::Reduce:
        if (op_.premul) {
          kernels::scale(op_.dtype, slot, in(0), l, op_.scalar);
        } else if (two_phase_) {
          // This rank reduces its own block from its input directly; the
          // peers read only the other blocks.
          size_t b, end;
          block(me(), &b, &end);
          std::memcpy(slot, in(0), b * e);
          std::memcpy(slot + end * e, static_cast<const char*>(in(0)) + end * e, (l - end) * e);
        } else {
          std::memcpy(slot, in(0), l * e);
        }
        break;
      case OpKind::ReduceScatter:
        for (int p = 0; p < n(); ++p) {
          char* dst = slot + static_cast<size_t>(p) * l * e;
          if (op_.premul) kernels::scale(op_.dtype, dst, in(static_cast<size_t>(p)), l, op_.scalar);
          else if (p != me()) std::memcpy(dst, in(static_cast<size_t>(p)), l * e);
        }
        break;
      case OpKind::AlltoAll:
        for (int p = 0; p < n(); ++p)
          if (p != me()) std::memcpy(slot + static_cast<size_t>(p) * l * e, in(static_cast<size_t>(p)), l * e);
        break;
      case OpKind::Scatter:
        if (me() != op_.root) break;
        for (int p = 0; p < n(); ++p)
          if (p != me()) std::memcpy(slot + static_cast<size_t>(p) * l * e, in(static_cast<size_t>(p)), l * e);
        break;
      default:  // AllGather, Gather
        std::memcpy(slot, in(0), l * e);
        break;
    }
  }

  Status all_arrived(bool* ready) {
    *ready = false;
    for (int p = 0; p < n(); ++p) {
      if (!waits_for(p) || arrived(p, round_)) continue;
      waiting_ = p;
      // As in my_turn: a mismatch comes before a peer's leaving (a root,
      // which waits for nobody, learns of its call's mismatch here, at its
      // next call, after the peers that found it may have left).
      MC_TRY(check_unchecked(true));
      Status failure = peer_failure();
      if (failure.ok()) return unless_left(p, [&] { return arrived(p, round_); });
      // A rank found a mismatch, which it can only after arriving here (and,
      // in a rooted round, with only its root arrived): compare with every
      // peer already here, so that this rank names the difference it can see
      // rather than who found it.
      bool all = true;
      for (int q = 0; q < n(); ++q) {
        if (!waits_for(q)) continue;
        if (arrived(q, round_)) MC_TRY(compare(q, round_, sig_, call_, false));
        else all = false;
      }
      if (!all) return failure;
      break;
    }
    waiting_ = -1;
    for (int p = 0; p < n(); ++p)
      if (waits_for(p)) MC_TRY(compare(p, round_, sig_, call_, false));
    if (waits_none_) node_->unchecked(lane_).push_back(round_);
    MC_TRY(check_unchecked(!waits_none_));
    *ready = true;
    return kOk;
  }

  // Every rank's flag has reached this round.
  Status all_at(NodeRegion::Flag NodeRegion::Control::*flag, bool* ready) {
    *ready = false;
    for (int p = 0; p < n(); ++p) {
      auto reached = [&] { return (control(p).*flag).value.load(std::memory_order_acquire) >= round_; };
      if (!reached()) {
        waiting_ = p;
        return unless_left(p, reached);
      }
    }
    waiting_ = -1;
    *ready = true;
    return kOk;
  }

  // Peer p's input for `block` (a per-peer block, else 0) in this round: in
  // its own buffer when it published one, else in its slot.
  const char* input(int p, size_t block) {
    const NodeRegion::SlotHeader& h = header(p);
    if (h.input_at == NodeRegion::kInline) {
      return reinterpret_cast<const char*>(h.inline_data) + (per_peer_blocks(op_.kind) ? block * len() * es() : 0);
    }
    if (h.input_at == NodeRegion::kInBuffer) {
      const char* base = p == me() ? static_cast<const char*>(op_.sendbuff) : node_->map_peer_buffer(lane_, p, h.input);
      if (base == nullptr) return nullptr;
      return base + (block * op_.count + lo()) * es();
    }
    return node_->data(p, lane_, round_) + (per_peer_blocks(op_.kind) ? block * len() * es() : 0);
  }

  // Whether peers may read this round's input from the user's buffer.
  bool zero_copy_input() const {
    if (op_.premul || (op_.kind == OpKind::AlltoAll && op_.sendbuff == op_.recvbuff)) return false;
    if (op_.kind == OpKind::Broadcast && me() != op_.root) return false;
    if (op_.kind == OpKind::Scatter && me() != op_.root) return false;
    const size_t blocks = per_peer_blocks(op_.kind) ? static_cast<size_t>(n()) : 1;
    return len() * es() * blocks >= kZeroCopyBytes;
  }

  // dst = reduction over every rank's input for `block` (a per-peer block,
  // else 0), elements [offset, offset + count) of this round. own: where this
  // rank's input lies when not in its slot or buffer reference (nullptr: there).
  Status reduce_inputs(void* dst, size_t block, size_t offset, size_t count, const void* own = nullptr) {
    const void* srcs[64];
    std::vector<const void*> many;
    const void** s = srcs;
    if (n() > 64) {
      many.resize(static_cast<size_t>(n()));
      s = many.data();
    }
    for (int p = 0; p < n(); ++p) {
      const char* src = p == me() && own != nullptr ? static_cast<const char*>(own) : input(p, block);
      if (src == nullptr) return unmappable(p);
      s[p] = p == me() && own != nullptr ? src : src + offset * es();
    }
    kernels::reduce_n(op_.dtype, op_.op, dst, s, n(), count);
    if (op_.avg) kernels::divide(op_.dtype, dst, dst, count, n());
    return kOk;
  }

  Status unmappable(int p) const {
    return MC_ERROR(ncclSystemError, "%s: cannot map rank %d's buffer (pid %d)", op_kind_name(op_.kind), p,
                    header(p).input.pid);
  }

  Status read_inputs() {
    if (op_.count == 0) return kOk;
    const size_t e = es(), c = op_.count, l = len();
    auto out = [&](size_t block) { return at(op_.recvbuff, block * c + lo(), e); };
    auto own = [&](size_t block) { return at(op_.sendbuff, block * c + lo(), e); };
    const size_t mine = static_cast<size_t>(me());
    // Copies every rank's input for `block` to out(p) (p's input from own()).
    auto gather = [&](size_t block, size_t own_block) -> Status {
      for (int p = 0; p < n(); ++p) {
        const void* src = p == me() ? own(own_block) : input(p, block);
        if (src == nullptr) return unmappable(p);
        void* dst = out(static_cast<size_t>(p));
        if (dst != src) std::memcpy(dst, src, l * e);
      }
      return kOk;
    };
    switch (op_.kind) {
      case OpKind::AllReduce:
      case OpKind::Reduce:
        if (two_phase_) {
          size_t b, end;
          block(me(), &b, &end);
          const void* from = op_.premul ? nullptr : at(own(0), b, e);
          if (end > b) return reduce_inputs(node_->data(me(), lane_, round_) + b * e, 0, b, end - b, from);
        } else if (op_.kind == OpKind::AllReduce || me() == op_.root) {
          return reduce_inputs(out(0), 0, 0, l);
        }
        return kOk;
      case OpKind::Broadcast: {
        const void* src = me() == op_.root ? own(0) : input(op_.root, 0);
        if (src == nullptr) return unmappable(op_.root);
        if (out(0) != src) std::memcpy(out(0), src, l * e);
        return kOk;
      }
      case OpKind::ReduceScatter:
        return reduce_inputs(at(op_.recvbuff, lo(), e), mine, 0, l, op_.premul ? nullptr : own(mine));
      case OpKind::AllGather: return gather(0, 0);
      case OpKind::Gather: return me() == op_.root ? gather(0, 0) : kOk;
      case OpKind::AlltoAll: return gather(mine, mine);
      case OpKind::Scatter: {
        const void* src = me() == op_.root ? own(mine) : input(op_.root, mine);
        if (src == nullptr) return unmappable(op_.root);
        void* dst = at(op_.recvbuff, lo(), e);
        if (dst != src) std::memcpy(dst, src, l * e);
        return kOk;
      }
      default: return kOk;
    }
  }

  void copy_blocks_out() {
    if (op_.kind == OpKind::Reduce && me() != op_.root) return;
    const size_t e = es();
    char* out = static_cast<char*>(at(op_.recvbuff, lo(), e));
    for (int p = 0; p < n(); ++p) {
      size_t b, end;
      block(p, &b, &end);
      if (end > b) std::memcpy(out + b * e, node_->data(p, lane_, round_) + b * e, (end - b) * e);
    }
  }

  NodeRegion* node_;
  OpDesc op_;
  OpSignature sig_;
  int lane_;
  uint32_t call_;
  uint64_t first_, last_, round_;
  // Priority scheduling: the more urgent lanes' rounds this round waits for
  // (snapped_: taken for this round).
  uint64_t urgent_[NodeRegion::kPriorityLanes] = {};
  bool snapped_ = false;
  bool active_ = false;  // polled once: its rounds are announced
  size_t round_elems_ = 0;
  bool two_phase_ = false;
  State state_ = State::Turn;
  bool peers_read_buffers_ = false;
  bool inline_ = false;
  bool rooted_ = false;
  bool empty_ = false;
  bool waits_none_ = false;  // waits for no peer's arrival in its round (a root's, an empty call)
  int waiting_ = -1;
};

}  // namespace

namespace {
// Rounds the operation takes, or 0 when the direct algorithm does not apply.
uint64_t direct_rounds(NodeRegion* node, const OpDesc& op, size_t max_bytes) {
  if (node == nullptr || op.nranks < 2 || node->nranks() != op.nranks) return 0;
  if (op.count == 0) return 1;  // an empty call takes a round too: its peers compare its signature
  const size_t need = input_bytes(op);
  if (need == 0 || need > max_bytes) return 0;
  const size_t per = round_elems(node, op);
  if (per == 0) return 0;
  return (op.count + per - 1) / per;
}
}  // namespace

std::unique_ptr<Run> make_direct_run(NodeRegion* node, const OpDesc& op, size_t max_bytes) {
  const uint64_t rounds = direct_rounds(node, op, max_bytes);
  if (rounds == 0) return nullptr;
  return std::make_unique<DirectRun>(node, op, node->lane_for(op.priority), rounds);
}

Status run_direct_now(NodeRegion* node, const OpDesc& op, size_t max_bytes, double budget_us, const WaitPolicy& wait,
                      bool* taken, std::unique_ptr<Run>* rest) {
  *taken = false;
  rest->reset();
  const int lane = node->lane_for(op.priority);
  if (!node->idle(lane)) return kOk;
  const uint64_t rounds = direct_rounds(node, op, max_bytes);
  if (rounds == 0) return kOk;
  *taken = true;
  MC_INFO(kTune, "%s: %zu elements of %s -> algorithm %s, on the calling thread", op_kind_name(op.kind), op.count,
          dtype_name(op.dtype), kDirectShm);
  // An operation of one round may wait longer here when the policy says so
  // (oversubscribed cores: WaitPolicy::express_one_round_us).
  if (rounds == 1) budget_us = std::max(budget_us, wait.express_one_round_us);
  DirectRun run(node, op, lane, rounds);
  // Poll the flags (yielding to a peer that may share this core); look at
  // the clock only every so often.
  double until = -1;
  Backoff backoff(wait);
  for (uint32_t i = 1;; ++i) {
    bool moved = false;
    MC_TRY(run.poll(nullptr, &moved));
    if (run.finished()) return kOk;
    if ((i & 15) == 0) {
      const double now = now_us();
      if (until < 0) until = now + budget_us;
      else if (now >= until) break;
    }
    moved ? backoff.progress() : backoff.yield_only();
  }
  *rest = std::make_unique<DirectRun>(std::move(run));
  return kOk;
}

}  // namespace meshccl
