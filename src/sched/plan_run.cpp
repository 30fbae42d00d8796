// Running one plan: its steps start as their dependencies complete;
// transfers go through the engine's links, local work to its executor.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "sched/engine.h"
#include "sched/links.h"
#include "util/log.h"

namespace meshccl {

class PlanRun final : public Run, public StepSink {
 public:
  PlanRun(std::unique_ptr<Plan> plan, uint64_t tag_base) : plan_(std::move(plan)), tag_base_(tag_base) {}

  void start(ScratchPool& pool) override {
    if (plan_->scalar_src != nullptr) std::memcpy(plan_->scalar, plan_->scalar_src, dtype_size(plan_->dtype));
    const size_t n = plan_->size();
    remaining_.assign(n, 0);
    xfers_ = std::vector<Xfer>(n);
    // Dependents in CSR form.
    std::vector<uint32_t> counts(n + 1, 0);
    auto each_dep = [&](auto&& fn) {
      for (uint32_t i = 0; i < n; ++i) {
        const Step& s = plan_->steps()[i];
        for (uint32_t k = 0; k < s.dep_count; ++k) fn(plan_->deps()[s.dep_begin + k], i);
      }
      for (auto& [step, dep] : plan_->late_deps_) fn(dep, step);
    };
    each_dep([&](uint32_t dep, uint32_t i) {
      ++counts[dep + 1];
      ++remaining_[i];
    });
    for (size_t i = 0; i < n; ++i) counts[i + 1] += counts[i];
    dependents_.assign(counts[n], 0);
    std::vector<uint32_t> fill(counts.begin(), counts.end() - 1);
    dep_offsets_ = std::move(counts);
    each_dep([&](uint32_t dep, uint32_t i) { dependents_[fill[dep]++] = i; });
    ready_.reserve(n);
    retry_.reserve(n);
    for (uint32_t i = 0; i < n; ++i)
      if (remaining_[i] == 0) ready_.push_back(i);
    if (plan_->scratch_bytes() > 0) {
      scratch_ = pool.acquire(plan_->scratch_bytes());
      for (Step& s : plan_->steps()) {
        s.dst = bind(s.dst);
        s.src = bind(s.src);
        s.src2 = bind(s.src2);
        s.tmp = bind(s.tmp);
      }
    }
  }

  void complete_step(uint32_t i) override {
    ++completed_;
    if (i == plan_->let_go_after) let_go_ = true;
    for (uint32_t k = dep_offsets_[i]; k < dep_offsets_[i + 1]; ++k) {
      uint32_t j = dependents_[k];
      if (--remaining_[j] == 0) ready_.push_back(j);
    }
  }

  Status poll(Engine* eng, bool* moved) override {
    Links& links = eng->links();
    Executor& exec = eng->executor();
    if (!windows_set_) set_windows(links);
    // A few passes: local steps and completions make more steps ready.
    for (int pass = 0; pass < 8; ++pass) {
      bool local = false;
      retry_.clear();
      for (size_t r = 0; r < ready_.size(); ++r) {  // grows while local steps complete
        uint32_t i = ready_[r];
        bool started = false;
        MC_TRY(start_step(links, exec, i, &started));
        if (started) local = true;
        else retry_.push_back(i);
      }
      ready_.swap(retry_);
      // While a more urgent run waits for the engine, this pass tests one
      // chunk per link direction and reduces one finished transfer: the
      // rest waits for a later poll, after the urgent run's.
      bool yield = eng->urgent_waiting(priority());
      links.pump(moved, yield);
      size_t keep = 0;
      for (size_t k = 0; k < inflight_.size(); ++k) {
        uint32_t i = inflight_[k];
        const Step& s = plan_->steps()[i];
        const Xfer& x = xfers_[i];
        if (!x.finished || (yield && local)) {
          inflight_[keep++] = i;
          continue;
        }
        if (!x.error.ok()) {
          failed_peer_ = s.peer;
          return explain_transfer_error(x.error, x.reason, s);
        }
        const size_t got = x.got;
        if (s.kind != StepKind::Send && got != s.bytes)
          return MC_ERROR(ncclInvalidUsage,
                          "%s: received %zu bytes from rank %d where this rank expected %zu: mismatched calls "
                          "across ranks %s",
                          op_kind_name(plan_->kind), got, s.peer, s.bytes, mismatch_hint());
        if (s.kind == StepKind::RecvReduce) exec.reduce2(plan_->dtype, plan_->op, s.dst, s.src, s.tmp, s.count);
        transfer_done(i);
        complete_step(i);
        local = true;
        yield = yield || eng->urgent_waiting(priority());
      }
      inflight_.resize(keep);
      if (!local) break;
      *moved = true;
      if (ready_.empty() || yield) break;
    }
    return kOk;
  }

  bool finished() const override { return completed_ == plan_->size(); }
  const char* name() const override { return op_kind_name(plan_->kind); }
  bool can_end_alone() const override { return check_failed_ && plan_->check_gates_data && inflight_.empty(); }
  bool let_go() const override { return let_go_; }
  int waiting_on() const override {
    for (uint32_t i : inflight_) return plan_->steps()[i].peer;
    return -1;
  }
  int failed_peer() const override { return failed_peer_; }
  // A plan fails on the death of a peer it exchanges with; the others' deaths
  // reach it through the peers that wait for them (their notices).
  bool depends_on(int peer) const override {
    const auto& steps = plan_->steps();
    return std::any_of(steps.begin(), steps.end(), [peer](const Step& s) { return s.peer == peer; });
  }
  bool call(OpSignature* sig, uint64_t* seq) const override {
    if (plan_->call.version == 0) return false;
    *sig = plan_->call;
    *seq = this->seq();
    return true;
  }
  void release(ScratchPool& pool) override {
    pool.release(scratch_);
    scratch_ = nullptr;
  }

 private:
  struct Window {
    std::vector<uint32_t> order;  // transfer steps of one link direction, in tag order
    size_t head = 0;              // order[0, head) are finished
  };

  template <typename T>
  T* bind(T* p) {
    if (p == nullptr || !Plan::is_scratch(p)) return p;
    return reinterpret_cast<T*>(scratch_->data() + Plan::scratch_offset(p));
  }

  // The window (docs/priority.md): on each link direction, only the
  // transfers among the first links.policy().window unfinished ones in tag
  // order may keep a chunk in flight without credit. Both ends order the
  // messages between them by the same tags, and every algorithm tags its
  // messages so that a message depends only on messages with smaller tags
  // (the signature exchange, tagged from kControlTag up, comes first), so
  // the unfinished message with the smallest tag is always ready and in the
  // window at both ends: no deadlock, and at most `window` chunks per run
  // and link direction go without credit.
  static uint32_t order_key(uint32_t tag) { return tag ^ kControlTag; }

  // Links without a window (Links::windowed: shared memory by default) keep
  // every transfer exempt.
  static bool in_window(const Links& links, const Step& s) {
    return (s.kind == StepKind::Send || s.kind == StepKind::Recv || s.kind == StepKind::RecvReduce) &&
           s.peer != links.rank() && links.windowed(s.peer);
  }

  void set_windows(const Links& links) {
    windows_set_ = true;
    window_ = links.policy().priority ? links.policy().window : 0;
    if (window_ == 0) return;  // every transfer exempt
    if (within_window(links)) {
      window_ = 0;  // no link direction has more transfers than the window: all stay exempt
      return;
    }
    const size_t n = plan_->size();
    group_of_.assign(n, kNoGroup);
    xdone_.assign(n, 0);
    std::map<int, uint32_t> groups;  // peer * 2 + send -> index in windows_
    for (uint32_t i = 0; i < n; ++i) {
      const Step& s = plan_->steps()[i];
      if (!in_window(links, s)) continue;
      const int key = s.peer * 2 + (s.kind == StepKind::Send ? 1 : 0);
      auto [it, added] = groups.emplace(key, static_cast<uint32_t>(windows_.size()));
      if (added) windows_.emplace_back();
      group_of_[i] = it->second;
      windows_[it->second].order.push_back(i);
      xfers_[i].exempt = false;
    }
    const auto& steps = plan_->steps();
    for (Window& w : windows_) {
      std::stable_sort(w.order.begin(), w.order.end(),
                       [&](uint32_t a, uint32_t b) { return order_key(steps[a].tag) < order_key(steps[b].tag); });
      slide(w);
    }
  }

  // Whether no link direction of the plan carries more than window_
  // transfers (small plans: a send/recv, a small collective), found without
  // allocating; false also when the plan has too many directions to count here.
  bool within_window(const Links& links) const {
    constexpr size_t kFew = 16;
    int keys[kFew];
    size_t counts[kFew];
    size_t groups = 0;
    for (const Step& s : plan_->steps()) {
      if (!in_window(links, s)) continue;
      const int key = s.peer * 2 + (s.kind == StepKind::Send ? 1 : 0);
      size_t g = 0;
      while (g < groups && keys[g] != key) ++g;
      if (g == groups) {
        if (groups == kFew) return false;
        keys[groups] = key;
        counts[groups++] = 0;
      }
      if (++counts[g] > window_) return false;
    }
    return true;
  }

  // Moves a window past its finished transfers and marks the first window_
  // unfinished ones exempt.
  void slide(Window& w) {
    while (w.head < w.order.size() && xdone_[w.order[w.head]] != 0) ++w.head;
    size_t open = 0;
    for (size_t k = w.head; k < w.order.size() && open < window_; ++k) {
      const uint32_t i = w.order[k];
      if (xdone_[i] != 0) continue;
      xfers_[i].exempt = true;
      ++open;
    }
  }

  void transfer_done(uint32_t i) {
    if (window_ == 0 || group_of_[i] == kNoGroup) return;
    xdone_[i] = 1;
    slide(windows_[group_of_[i]]);
  }

  Status start_step(Links& links, Executor& exec, uint32_t i, bool* started) {
    const Step& s = plan_->steps()[i];
    uint64_t tag = tag_base_ | s.tag;
    if (s.kind == StepKind::Send && !plan_->send_tag_base.empty()) tag = plan_->send_tag_base[s.peer] | s.tag;
    if (s.kind == StepKind::Recv && !plan_->recv_tag_base.empty()) tag = plan_->recv_tag_base[s.peer] | s.tag;
    switch (s.kind) {
      case StepKind::Send:
      case StepKind::Recv:
      case StepKind::RecvReduce: {
        bool is_send = s.kind == StepKind::Send;
        void* dst = s.kind == StepKind::RecvReduce ? s.tmp : s.dst;
        if (s.peer == links.rank()) {
          if (s.kind == StepKind::RecvReduce) return MC_ERROR(ncclInternalError, "reduce from self in a plan");
          *started = true;
          links.self_post(is_send, tag, Links::SelfEntry{this, i, dst, s.src, s.bytes});
          return kOk;
        }
        Xfer& x = xfers_[i];
        x.peer = s.peer;
        x.send = is_send;
        x.ptr = static_cast<char*>(is_send ? const_cast<void*>(s.src) : dst);
        x.bytes = s.bytes;
        x.tag = tag;
        links.post(&x, priority());
        inflight_.push_back(i);
        *started = true;
        return kOk;
      }
      case StepKind::Copy: exec.copy(s.dst, s.src, s.bytes); break;
      case StepKind::Reduce: exec.reduce2(plan_->dtype, plan_->op, s.dst, s.src, s.src2, s.count); break;
      case StepKind::Divide: exec.divide(plan_->dtype, s.dst, s.src, s.count, plan_->divisor); break;
      case StepKind::Scale: exec.scale(plan_->dtype, s.dst, s.src, s.count, plan_->scalar); break;
      case StepKind::Check: MC_TRY(check_signatures(links.rank())); break;
    }
    *started = true;
    complete_step(i);
    return kOk;
  }

  // Every rank's signature arrived: any difference fails the operation.
  Status check_signatures(int rank) {
    const std::vector<OpSignature>& sigs = plan_->signatures;
    int first = -1, others = 0;
    for (int p = 0; p < static_cast<int>(sigs.size()); ++p) {
      if (p == rank || sigs[p] == sigs[rank]) continue;
      if (first < 0) first = p;
      else ++others;
    }
    if (first < 0) return kOk;
    check_failed_ = true;
    std::string diff = signature_difference(sigs[rank], rank, sigs[first], first);
    if (others > 0) diff += " (and " + std::to_string(others) + " more ranks differ from this one)";
    return MC_ERROR(ncclInvalidUsage, "%s: mismatched calls across ranks (collective #%llu of this communicator): %s",
                    op_kind_name(plan_->kind), static_cast<unsigned long long>(seq()), diff.c_str());
  }

  // A transfer failed: say with whom, and that a message that did not fit its
  // receive is a mismatch (the transport's own line says so in its terms).
  // The transport's own words, when it gave a reason, say what happened.
  Status explain_transfer_error(Status ts, const std::string& reason, const Step& s) const {
    if (ts.code() == ncclRemoteError && !reason.empty())
      return MC_ERROR(ncclRemoteError, "%s: the transfer with rank %d failed: %s", op_kind_name(plan_->kind), s.peer,
                      reason.c_str());
    if (ts.code() == ncclRemoteError)
      return MC_ERROR(ncclRemoteError, "%s: lost rank %d (it exited or closed its connections)",
                      op_kind_name(plan_->kind), s.peer);
    if (ts.code() != ncclInvalidUsage) return ts;
    if (s.kind == StepKind::Send)
      return MC_ERROR(ncclInvalidUsage,
                      "%s: rank %d refused this rank's message of %zu bytes as larger than it expected: mismatched "
                      "calls across ranks %s",
                      op_kind_name(plan_->kind), s.peer, s.bytes, mismatch_hint());
    return MC_ERROR(ncclInvalidUsage,
                    "%s: a message from rank %d is larger than the %zu bytes this rank expected: mismatched calls "
                    "across ranks %s",
                    op_kind_name(plan_->kind), s.peer, s.bytes, mismatch_hint());
  }

  const char* mismatch_hint() const {
    if (is_p2p(plan_->kind)) return "(the send and the receive differ in count or datatype)";
    return "(count or datatype differ; MESHCCL_CHECKS=1 names the argument that differs)";
  }

  // The operation's number in its communicator's collective sequence.
  uint64_t seq() const { return tag::sequence(tag_base_); }

  std::unique_ptr<Plan> plan_;
  uint64_t tag_base_;
  std::vector<uint32_t> remaining_;
  std::vector<uint32_t> dep_offsets_;
  std::vector<uint32_t> dependents_;
  std::vector<Xfer> xfers_;  // the transfer of each send and receive step
  static constexpr uint32_t kNoGroup = ~0u;
  bool windows_set_ = false;
  size_t window_ = 0;               // 0: no window, every transfer exempt
  std::vector<Window> windows_;     // one per link direction this plan uses
  std::vector<uint32_t> group_of_;  // per step: its window, or kNoGroup
  std::vector<uint8_t> xdone_;      // per step: transfer finished
  std::vector<uint32_t> ready_;
  std::vector<uint32_t> retry_;  // poll's steps that did not start, kept for its capacity
  std::vector<uint32_t> inflight_;
  size_t completed_ = 0;
  std::vector<unsigned char>* scratch_ = nullptr;
  bool check_failed_ = false;
  bool let_go_ = false;
  int failed_peer_ = -1;
};

std::unique_ptr<Run> make_plan_run(std::unique_ptr<Plan> plan, uint64_t tag_base) {
  return std::make_unique<PlanRun>(std::move(plan), tag_base);
}

}  // namespace meshccl
