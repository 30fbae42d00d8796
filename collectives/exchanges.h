// Chunked exchanges of ranges of an operation's data between pairs of
// ranks, for the pairwise-exchange AllReduces (halving_doubling.cpp,
// recursive_doubling.cpp): each chunk a step of its own, tagged by (phase,
// chunk), started after the steps that last wrote or read the range it
// touches, so that consecutive exchanges overlap chunk by chunk.
#pragma once

#include <algorithm>
#include <vector>

#include "base/op_desc.h"
#include "collectives/algorithms.h"
#include "sched/plan.h"

namespace meshccl::detail {

// Steps that wrote or read [lo, hi) of the output, sorted and disjoint.
struct Piece {
  size_t lo, hi;
  Plan::StepId id;
};
using Pieces = std::vector<Piece>;

// Makes s wait for every piece overlapping [lo, hi).
inline void depend(Plan* plan, Plan::StepId s, const Pieces& ps, size_t lo, size_t hi) {
  auto it = std::lower_bound(ps.begin(), ps.end(), lo, [](const Piece& p, size_t v) { return p.hi <= v; });
  for (; it != ps.end() && it->lo < hi; ++it) plan->add_dep(s, it->id);
}

// Chunked transfers of ranges of the data, each chunk tagged by (phase,
// chunk) and started after the pieces it overlaps in `after`.
class Exchanges {
 public:
  Exchanges(const OpDesc& op, Plan* plan, Plan::StepId ready, int phases)
      : op_(op),
        plan_(plan),
        es_(op.elem()),
        ready_(ready),
        ce_(detail::chunk_elems(op, op.count, phases)),
        per_((op.count + ce_ - 1) / ce_) {}

  // Sends base[lo, hi) to peer.
  Pieces send(int peer, int phase, const void* base, size_t lo, size_t hi, const std::vector<const Pieces*>& after) {
    return each(phase, lo, hi, [&](uint32_t tag, size_t a, size_t b) {
      Plan::StepId s = plan_->send(peer, tag, at(base, a, es_), (b - a) * es_);
      for (const Pieces* p : after) depend(plan_, s, *p, a, b);
      return s;
    });
  }
  // Receives peer's [lo, hi) into the output.
  Pieces recv(int peer, int phase, size_t lo, size_t hi, const Pieces& after) {
    return each(phase, lo, hi, [&](uint32_t tag, size_t a, size_t b) {
      Plan::StepId s = plan_->recv(peer, tag, at(op_.recvbuff, a, es_), (b - a) * es_);
      depend(plan_, s, after, a, b);
      return s;
    });
  }
  // output[lo, hi) = src[lo, hi) op peer's [lo, hi), through a ring of slots.
  Pieces recv_reduce(int peer, int phase, const void* src, size_t lo, size_t hi,
                     const std::vector<const Pieces*>& after) {
    return each(phase, lo, hi, [&](uint32_t tag, size_t a, size_t b) {
      void* slot = next_slot();
      Plan::StepId s = plan_->recv_reduce(peer, tag, slot, at(op_.recvbuff, a, es_), at(src, a, es_), b - a);
      for (const Pieces* p : after) depend(plan_, s, *p, a, b);
      return took_slot(s, s);
    });
  }
  // The same where the reduction must wait for steps the receive need not
  // (a send of the same range of the output, which the reduction overwrites):
  // each chunk's receive into its slot posts at once, and only its reduction
  // waits. A receive that waited too would never post where a send completes
  // once the peer has read it (shared memory) and the peer waits likewise.
  Pieces recv_then_reduce(int peer, int phase, const void* src, size_t lo, size_t hi,
                          const std::vector<const Pieces*>& after) {
    return each(phase, lo, hi, [&](uint32_t tag, size_t a, size_t b) {
      void* slot = next_slot();
      Plan::StepId rv = plan_->recv(peer, tag, slot, (b - a) * es_);
      Plan::StepId s = plan_->reduce(at(op_.recvbuff, a, es_), at(src, a, es_), slot, b - a, {rv});
      for (const Pieces* p : after) depend(plan_, s, *p, a, b);
      return took_slot(rv, s);
    });
  }

 private:
  static constexpr int kSlots = 8;
  // The next slot of the ring; took_slot() says which step lands in it
  // (waiting for the step that last read it) and which one reads it last.
  void* next_slot() {
    // A slot holds a chunk, or the whole data when that is smaller (an 8-byte
    // AllReduce reserved 8 chunks of 512 KiB).
    const size_t slot = std::min(ce_, op_.count) * es_;
    if (slots_ == nullptr) slots_ = plan_->scratch(kSlots * slot);
    cur_ = used_++ % kSlots;
    return static_cast<char*>(slots_) + cur_ * slot;
  }
  Plan::StepId took_slot(Plan::StepId lands, Plan::StepId reads) {
    plan_->add_dep(lands, last_[cur_]);
    last_[cur_] = reads;
    return reads;
  }
  template <typename Fn>
  Pieces each(int phase, size_t lo, size_t hi, Fn&& fn) {
    Pieces out;
    uint32_t c = 0;
    for (size_t a = lo; a < hi; a += ce_, ++c) {
      const size_t b = std::min(hi, a + ce_);
      Plan::StepId s = fn(static_cast<uint32_t>(static_cast<size_t>(phase) * per_) + c, a, b);
      plan_->add_dep(s, ready_);
      out.push_back({a, b, s});
    }
    return out;
  }

  const OpDesc& op_;
  Plan* plan_;
  size_t es_;
  Plan::StepId ready_;
  size_t ce_, per_;
  void* slots_ = nullptr;
  size_t used_ = 0;
  size_t cur_ = 0;
  std::vector<Plan::StepId> last_ = std::vector<Plan::StepId>(kSlots, Plan::kNoStep);
};

// The fold of the pairwise-exchange AllReduces when p is not a power of two
// (p2 = the largest power of two below it, rem = p - p2): of the first 2 rem
// ranks each even one sends its input to the next and receives the result in
// the last phase, which completes its plan (true); each odd one reduces that
// input into its output (*partial; *base becomes the output). Other ranks:
// nothing.
inline bool fold_in(Exchanges& x, const OpDesc& op, int r, int rem, const void* input, int fold_phase, int last_phase,
                    Pieces* partial, const void** base) {
  if (r >= 2 * rem) return false;
  if (r % 2 == 0) {
    Pieces sent = x.send(r + 1, fold_phase, input, 0, op.count, {});
    x.recv(r + 1, last_phase, 0, op.count, sent);
    return true;
  }
  *partial = x.recv_reduce(r - 1, fold_phase, input, 0, op.count, {});
  *base = op.recvbuff;
  return false;
}

// The fold and its return, one after the other: the whole data each way
// between the pairs of the first 2 rem ranks.
inline double fold_cost(const BuildCtx& ctx, int rem, double bytes) {
  if (rem == 0) return 0;
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < 2 * rem; r += 2) pairs.emplace_back(r, r + 1);
  return 2 * step_cost(ctx, pairs).us(bytes);
}

}  // namespace meshccl::detail
