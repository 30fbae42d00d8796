// A plan is what one rank does for one operation: a small DAG of steps from a
// fixed vocabulary. Algorithms (collectives/) build plans; the engine runs
// them and never decides topology.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/op.h"
#include "base/tag.h"
#include "base/signature.h"
#include "nccl.h"

namespace meshccl {

enum class StepKind : uint8_t {
  Send,        // send bytes at src to peer
  Recv,        // receive bytes from peer into dst
  RecvReduce,  // receive into a scratch slot, then dst = src op slot
  Copy,        // dst = src (bytes)
  Reduce,      // dst = src op src2 (count elements)
  Divide,      // dst = src / divisor (ncclAvg), count elements
  Scale,       // dst = src * scalar (PreMulSum), count elements
  Check,       // compare Plan::signatures; a difference fails the operation
};

// Step tags are tag::kStepBits wide (base/tag.h: under the operation's
// sequence number). Algorithms use [0, kControlTag) (detail::chunk_elems keeps
// them there); tags from kControlTag up carry the signature exchange, so it
// can never match a data message, whatever the ranks called.
constexpr uint32_t kControlTag = tag::kControlStep;

struct Step {
  StepKind kind;
  int32_t peer = -1;
  uint32_t tag = 0;     // distinguishes messages of one operation between one pair
  void* tmp = nullptr;  // RecvReduce: where the message lands before reducing
  void* dst = nullptr;
  const void* src = nullptr;
  const void* src2 = nullptr;
  size_t bytes = 0;
  size_t count = 0;
  uint32_t dep_begin = 0;  // deps[dep_begin, dep_begin + dep_count)
  uint32_t dep_count = 0;
};

// The ranks a plan's steps name are positions in a group of the
// communicator's ranks (as in an MPI sub-communicator); the plan maps them to
// communicator ranks as steps are added, and adds tag_base to their tags, so
// that plans built for sub-groups compose into one plan.
struct PlanGroup {
  const int* ranks = nullptr;  // communicator rank of each position; null: the whole communicator
  uint32_t tag_base = 0;
};

class Plan {
 public:
  using StepId = uint32_t;
  static constexpr StepId kNoStep = ~StepId{0};

  // Room for a small plan's steps and dependencies at once, not grown step
  // by step (an 8-byte AllReduce's plan reallocated them 17 times).
  Plan() {
    steps_.reserve(16);
    deps_.reserve(32);
  }
  Plan(Plan&&) = default;
  Plan& operator=(const Plan&) = delete;
  // A copy to run (a communicator keeps the plans of repeated calls): steps
  // that point into this plan's own signatures point into the copy's.
  std::unique_ptr<Plan> clone() const;

  // Step builders; deps are earlier step ids (kNoStep among them adds nothing).
  StepId send(int peer, uint32_t tag, const void* src, size_t bytes, std::initializer_list<StepId> deps = {});
  StepId recv(int peer, uint32_t tag, void* dst, size_t bytes, std::initializer_list<StepId> deps = {});
  // dst = src op (received data); the message lands in tmp first.
  StepId recv_reduce(int peer, uint32_t tag, void* tmp, void* dst, const void* src, size_t count,
                     std::initializer_list<StepId> deps = {});
  StepId copy(void* dst, const void* src, size_t bytes, std::initializer_list<StepId> deps = {});
  StepId reduce(void* dst, const void* a, const void* b, size_t count, std::initializer_list<StepId> deps = {});
  StepId divide(void* dst, const void* src, size_t count, std::initializer_list<StepId> deps = {});
  StepId scale(void* dst, const void* src, size_t count, std::initializer_list<StepId> deps = {});
  StepId check();  // dependencies added with add_dep
  // The group later steps are built for; returns the previous one.
  PlanGroup set_group(PlanGroup g) {
    PlanGroup prev = group_;
    group_ = g;
    return prev;
  }

  // Add a dependency after the fact (the step must not have started);
  // dep == kNoStep adds nothing.
  void add_dep(StepId step, StepId dep);
  // Every step that depends on `from` depends on `to` instead.
  void redirect_dependents(StepId from, StepId to);
  // Calls fn(dep) for each dependency of `step`.
  template <typename Fn>
  void each_dep(StepId step, Fn&& fn) const {
    const Step& s = steps_[step];
    for (uint32_t k = 0; k < s.dep_count; ++k) fn(deps_[s.dep_begin + k]);
    for (const auto& [st, dep] : late_deps_)
      if (st == step) fn(dep);
  }

  // Reserves scratch memory (from the communicator's pool, bound when the plan
  // starts). Returns a placeholder pointer usable in any step field; offsets
  // from it stay valid within the reservation.
  void* scratch(size_t bytes);
  size_t scratch_bytes() const { return scratch_bytes_; }
  static bool is_scratch(const void* p) { return reinterpret_cast<uintptr_t>(p) >= kScratchBase; }
  static size_t scratch_offset(const void* p) { return reinterpret_cast<uintptr_t>(p) - kScratchBase; }

  // Reduction parameters shared by every reducing step of the plan.
  ncclDataType_t dtype = ncclFloat32;
  ReduceOp op = ReduceOp::Sum;
  int divisor = 1;
  alignas(8) unsigned char scalar[8] = {};  // PreMulSum scalar, one element of dtype
  const void* scalar_src = nullptr;         // read into scalar when the plan starts (OpDesc::scalar_src)

  OpKind kind = OpKind::AllReduce;
  std::string algorithm;  // for logs and traces

  // Signature check (collectives/signature_check.cpp): one entry per rank,
  // this rank's filled in, the others received by the exchange. Gated: every
  // data step waits for the check, so a mismatch fails the operation before
  // any data moves and nothing else of it is in flight.
  std::vector<OpSignature> signatures;
  bool check_gates_data = false;
  // The collective as this rank called it (version 0: not a collective), for
  // the comparison a stalled operation makes with its peers' (Probes).
  OpSignature call{.version = 0};

  // A plan of point-to-point messages that follow each pair's own sequence
  // (a reshard): the tag base of the messages sent to / received from each
  // communicator rank, used instead of the run's; empty: the run's for all.
  std::vector<uint64_t> send_tag_base, recv_tag_base;
  // Once this step has completed, the caller's buffers are no longer used
  // and the operation counts as complete for its caller; the rest of the
  // plan runs in the background (Run::let_go). kNoStep: at the end.
  StepId let_go_after = kNoStep;

  const std::vector<Step>& steps() const { return steps_; }
  std::vector<Step>& steps() { return steps_; }
  const std::vector<uint32_t>& deps() const { return deps_; }
  size_t size() const { return steps_.size(); }

 private:
  StepId add(Step s, std::initializer_list<StepId> deps);
  int peer_of(int pos) const { return group_.ranks != nullptr ? group_.ranks[pos] : pos; }
  PlanGroup group_;
  std::vector<Step> steps_;
  std::vector<uint32_t> deps_;
  std::vector<std::pair<StepId, StepId>> late_deps_;
  // Placeholders live in the upper half of the address space, which user
  // pointers never reach on Linux.
  static constexpr uintptr_t kScratchBase = uintptr_t{1} << 63;
  size_t scratch_bytes_ = 0;
  Plan(const Plan&) = default;  // clone()
  friend class PlanRun;
};

}  // namespace meshccl
