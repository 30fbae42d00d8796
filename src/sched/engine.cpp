#include "sched/engine.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kernels/reduce.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

namespace {
// No operation uses this tag: collectives leave bit 63 clear and
// point-to-point operations use step tag 0 only (api/enqueue).
constexpr uint64_t kNoticeTag = ~uint64_t{0};
}  // namespace

// ---------------------------------------------------------------- scratch

std::vector<unsigned char>* ScratchPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  // Best fit among kept buffers; grow the smallest one otherwise.
  std::vector<unsigned char>* best = nullptr;
  size_t best_i = 0;
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->size() >= bytes && (best == nullptr || free_[i]->size() < best->size())) {
      best = free_[i];
      best_i = i;
    }
  }
  if (best == nullptr && !free_.empty()) {
    best_i = 0;
    best = free_[0];
    best->resize(bytes);
  }
  if (best == nullptr) return new std::vector<unsigned char>(bytes);
  free_.erase(free_.begin() + static_cast<long>(best_i));
  return best;
}

void ScratchPool::release(std::vector<unsigned char>* buf) {
  if (buf == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(buf);
}

ScratchPool::~ScratchPool() {
  for (auto* b : free_) delete b;
}

// ---------------------------------------------------------------- one plan

class PlanRun final : public Run {
 public:
  PlanRun(std::unique_ptr<Plan> plan, uint64_t tag_base) : plan_(std::move(plan)), tag_base_(tag_base) {}

  void start(ScratchPool& pool) override {
    const size_t n = plan_->size();
    remaining_.assign(n, 0);
    reqs_.assign(n, Request{});
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
    dep_offsets_ = counts;
    dependents_.assign(counts[n], 0);
    std::vector<uint32_t> fill(counts.begin(), counts.end() - 1);
    each_dep([&](uint32_t dep, uint32_t i) { dependents_[fill[dep]++] = i; });
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

  void complete_step(uint32_t i) {
    ++completed_;
    for (uint32_t k = dep_offsets_[i]; k < dep_offsets_[i + 1]; ++k) {
      uint32_t j = dependents_[k];
      if (--remaining_[j] == 0) ready_.push_back(j);
    }
  }

  Status poll(Engine* eng, bool* moved) override {
    Mesh* mesh = eng->mesh();
    const int rank = eng->rank();
    // A few passes: local steps and completions make more steps ready.
    for (int pass = 0; pass < 8; ++pass) {
      bool local = false;
      std::vector<uint32_t> retry;
      for (size_t r = 0; r < ready_.size(); ++r) {  // grows while local steps complete
        uint32_t i = ready_[r];
        bool started = false;
        MC_TRY(start_step(eng, mesh, rank, i, &started));
        if (started) local = true;
        else retry.push_back(i);
      }
      ready_.swap(retry);
      size_t keep = 0;
      for (size_t k = 0; k < inflight_.size(); ++k) {
        uint32_t i = inflight_[k];
        bool done = false;
        size_t got = 0;
        const Step& s = plan_->steps()[i];
        Status ts = Mesh::test(reqs_[i], &done, &got);
        if (!ts.ok()) return explain_transfer_error(ts, s);
        if (!done) {
          inflight_[keep++] = i;
          continue;
        }
        if (s.kind != StepKind::Send && got != s.bytes)
          return MC_ERROR(ncclInvalidUsage,
                          "%s: received %zu bytes from rank %d where this rank expected %zu: mismatched calls "
                          "across ranks %s",
                          op_kind_name(plan_->kind), got, s.peer, s.bytes, mismatch_hint());
        if (s.kind == StepKind::RecvReduce)
          kernels::reduce2(plan_->dtype, plan_->op, s.dst, s.src, s.tmp, s.count);
        complete_step(i);
        local = true;
      }
      inflight_.resize(keep);
      if (!local) break;
      *moved = true;
      if (ready_.empty()) break;
    }
    return kOk;
  }

  bool finished() const override { return completed_ == plan_->size(); }
  bool can_end_alone() const override { return check_failed_ && plan_->check_gates_data && inflight_.empty(); }
  int waiting_on() const override {
    for (uint32_t i : inflight_) return plan_->steps()[i].peer;
    return -1;
  }
  void release(ScratchPool& pool) override {
    pool.release(scratch_);
    scratch_ = nullptr;
  }

 private:
  template <typename T>
  T* bind(T* p) {
    if (p == nullptr || !Plan::is_scratch(p)) return p;
    return reinterpret_cast<T*>(scratch_->data() + Plan::scratch_offset(p));
  }

  Status start_step(Engine* eng, Mesh* mesh, int rank, uint32_t i, bool* started) {
    const Step& s = plan_->steps()[i];
    const uint64_t tag = tag_base_ | s.tag;
    switch (s.kind) {
      case StepKind::Send:
      case StepKind::Recv:
      case StepKind::RecvReduce: {
        bool is_send = s.kind == StepKind::Send;
        void* dst = s.kind == StepKind::RecvReduce ? s.tmp : s.dst;
        if (s.peer == rank) {
          if (s.kind == StepKind::RecvReduce) return MC_ERROR(ncclInternalError, "reduce from self in a plan");
          *started = true;
          eng->self_post(is_send, tag, Engine::SelfEntry{this, i, dst, s.src, s.bytes});
          return kOk;
        }
        Request& r = reqs_[i];
        if (is_send) MC_TRY(mesh->isend(s.peer, s.src, s.bytes, tag, &r));
        else MC_TRY(mesh->irecv(s.peer, dst, s.bytes, tag, &r));
        if (r.handle == nullptr) return kOk;  // transport busy: retry later
        inflight_.push_back(i);
        *started = true;
        return kOk;
      }
      case StepKind::Copy:
        if (s.dst != s.src && s.bytes > 0) std::memcpy(s.dst, s.src, s.bytes);
        break;
      case StepKind::Reduce:
        kernels::reduce2(plan_->dtype, plan_->op, s.dst, s.src, s.src2, s.count);
        break;
      case StepKind::Divide:
        kernels::divide(plan_->dtype, s.dst, s.src, s.count, plan_->divisor);
        break;
      case StepKind::Scale:
        kernels::scale(plan_->dtype, s.dst, s.src, s.count, plan_->scalar);
        break;
      case StepKind::Check:
        MC_TRY(check_signatures(rank));
        break;
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
  Status explain_transfer_error(Status ts, const Step& s) const {
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
  uint64_t seq() const { return (tag_base_ & ~(uint64_t{1} << 63)) >> kStepTagBits; }

  std::unique_ptr<Plan> plan_;
  uint64_t tag_base_;
  std::vector<uint32_t> remaining_;
  std::vector<uint32_t> dep_offsets_;
  std::vector<uint32_t> dependents_;
  std::vector<Request> reqs_;
  std::vector<uint32_t> ready_;
  std::vector<uint32_t> inflight_;
  size_t completed_ = 0;
  std::vector<unsigned char>* scratch_ = nullptr;
  bool check_failed_ = false;
};

std::unique_ptr<Run> make_plan_run(std::unique_ptr<Plan> plan, uint64_t tag_base) {
  return std::make_unique<PlanRun>(std::move(plan), tag_base);
}

// ---------------------------------------------------------------- engine

Engine::Engine(int rank, Mesh* mesh, std::atomic<bool>* abort, std::function<Status()> liveness)
    : rank_(rank), mesh_(mesh), abort_(abort), liveness_(std::move(liveness)) {}

Engine::~Engine() = default;

std::shared_ptr<OpHandle> Engine::submit(std::unique_ptr<Run> run, int priority) {
  run->priority_ = priority;
  run->handle_ = std::make_shared<OpHandle>();
  std::shared_ptr<OpHandle> h = run->handle();
  if (!fatal().ok()) {
    h->status = fatal();
    h->done.store(true, std::memory_order_release);
    return h;
  }
  run->start(scratch_);
  std::lock_guard<std::mutex> lock(incoming_mu_);
  incoming_.push_back(std::move(run));
  if (nactive_.fetch_add(1) == 0) last_progress_us_.store(now_us(), std::memory_order_relaxed);
  return h;
}

void Engine::complete_run(Run* run, Status s) {
  run->handle()->status = s;
  run->handle()->done.store(true, std::memory_order_release);
  nactive_.fetch_sub(1);
}

void Engine::self_post(bool is_send, uint64_t tag, SelfEntry e) {
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
  if (n > 0 && rcv.dst != snd.src) std::memcpy(rcv.dst, snd.src, n);
  snd.run->complete_step(snd.step);
  rcv.run->complete_step(rcv.step);
}

void Engine::progress_locked(bool* moved) {
  {
    std::lock_guard<std::mutex> lock(incoming_mu_);
    for (auto& r : incoming_) {
      auto pos = std::upper_bound(active_.begin(), active_.end(), r, [](const auto& a, const auto& b) {
        return a->priority() < b->priority();
      });
      active_.insert(pos, std::move(r));
    }
    incoming_.clear();
  }
  if (!fatal().ok()) return;
  for (size_t k = 0; k < active_.size(); ++k) {
    Run* run = active_[k].get();
    if (run->finished() || !run->error_.ok()) continue;
    Status s = run->poll(this, moved);
    if (s.ok()) continue;
    if (run->can_end_alone()) {
      run->error_ = s;
      *moved = true;
      continue;
    }
    // A peer that failed and closed its connections: its notice, if it
    // sent one, says why.
    if (s.code() == ncclRemoteError) {
      Status notice = poll_notices();
      if (!notice.ok()) {
        fail_all(notice);
        return;
      }
    }
    fail_all(s);
    // Peers see a lost peer for themselves; an error found here they would
    // otherwise only meet at MESHCCL_TIMEOUT.
    if (s.code() != ncclRemoteError) notify_peers(s);
    return;
  }
  size_t keep = 0;
  for (size_t k = 0; k < active_.size(); ++k) {
    Run* run = active_[k].get();
    if (run->finished() || !run->error_.ok()) {
      run->release(scratch_);
      complete_run(run, run->error_);
      *moved = true;
    } else {
      active_[keep++] = std::move(active_[k]);
    }
  }
  active_.resize(keep);
}

bool Engine::progress() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool moved = false;
  progress_locked(&moved);
  if (moved) last_progress_us_.store(now_us(), std::memory_order_relaxed);
  return moved;
}

void Engine::fail_all(Status s) {
  int expected = ncclSuccess;
  fatal_.compare_exchange_strong(expected, s.code());
  std::lock_guard<std::mutex> lock(incoming_mu_);
  for (auto& r : incoming_) active_.push_back(std::move(r));
  incoming_.clear();
  for (auto& r : active_) {
    if (!r->handle()->done.load()) complete_run(r.get(), fatal());
    graveyard_.push_back(std::move(r));  // transports may still reference its buffers
  }
  active_.clear();
}

Status Engine::wait(OpHandle& op) {
  Backoff backoff;
  while (!op.done.load(std::memory_order_acquire)) {
    if (progress()) backoff.progress();
    else backoff.idle();
    check_stalled(op);
  }
  return op.status;
}

void Engine::check_stalled(OpHandle& op) {
  if (abort_ != nullptr && abort_->load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!op.done.load()) fail_all(MC_ERROR(ncclInvalidUsage, "operation interrupted: the communicator was aborted"));
    return;
  }
  // Peers are looked at only after 100 ms without progress, then every 100 ms.
  const double now = now_us();
  const double idle = now - last_progress_us_.load(std::memory_order_relaxed);
  if (idle <= 100000 || now - last_check_us_.load(std::memory_order_relaxed) <= 100000) return;
  last_check_us_.store(now, std::memory_order_relaxed);
  const double timeout_us = timeout_seconds() * 1e6;
  std::lock_guard<std::mutex> lock(mu_);
  if (op.done.load()) return;
  // A peer's notice first: it says why the peer stopped (it may have exited since).
  Status bad = poll_notices();
  if (bad.ok() && liveness_) bad = liveness_();
  if (!bad.ok()) {
    fail_all(bad);
  } else if (timeout_us > 0 && idle > timeout_us) {
    int peer = active_.empty() ? -1 : active_.front()->waiting_on();
    fail_all(MC_ERROR(ncclRemoteError, "rank %d: no progress for %.0f s (MESHCCL_TIMEOUT)%s%s", rank_, idle / 1e6,
                      peer >= 0 ? ", waiting for rank " : "", peer >= 0 ? std::to_string(peer).c_str() : ""));
  }
}

// ---------------------------------------------------------------- notices

void Engine::notify_peers(Status s) {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (notified_ || n <= 1) return;
  notified_ = true;
  LastErrorScope keep;  // a notice that cannot be delivered is not the error
  notice_out_.code = s.code();
  std::snprintf(notice_out_.text, sizeof(notice_out_.text), "%s", thread_last_error().c_str());
  // Best effort, briefly: a small message normally leaves at once; a peer
  // that does not drain its connection falls back on MESHCCL_TIMEOUT.
  std::vector<Request> reqs(n);
  std::vector<char> state(n, 0);  // 0 to post, 1 posted, 2 done or failed
  state[rank_] = 2;
  Deadline dl = Deadline::after(std::min(1.0, timeout_seconds() > 0 ? timeout_seconds() : 1.0));
  Backoff backoff;
  for (int left = n - 1; left > 0 && !dl.expired();) {
    for (int p = 0; p < n; ++p) {
      if (state[p] == 0) {
        if (!mesh_->isend(p, &notice_out_, sizeof(notice_out_), kNoticeTag, &reqs[p]).ok()) state[p] = 2, --left;
        else if (reqs[p].handle != nullptr) state[p] = 1;
      }
      if (state[p] != 1) continue;
      bool done = false;
      if (!Mesh::test(reqs[p], &done, nullptr).ok() || done) state[p] = 2, --left;
    }
    backoff.idle();
  }
}

Status Engine::poll_notices() {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (n <= 1) return kOk;
  if (notices_in_.empty()) {
    notices_in_.resize(n);
    notice_reqs_.resize(n);
    notice_state_.assign(n, 0);
    notice_state_[rank_] = 2;
  }
  int from = -1;
  {
    LastErrorScope keep;  // a peer that is gone is reported by liveness, not here
    for (int p = 0; p < n && from < 0; ++p) {
      if (notice_state_[p] == 0) {
        if (!mesh_->irecv(p, &notices_in_[p], sizeof(Notice), kNoticeTag, &notice_reqs_[p]).ok()) notice_state_[p] = 2;
        else if (notice_reqs_[p].handle != nullptr) notice_state_[p] = 1;
      }
      if (notice_state_[p] != 1) continue;
      bool done = false;
      size_t got = 0;
      const bool ok = Mesh::test(notice_reqs_[p], &done, &got).ok();
      if (!ok || done) notice_state_[p] = 2;
      if (ok && done && got == sizeof(Notice)) from = p;
    }
  }
  if (from < 0) return kOk;
  Notice& m = notices_in_[from];
  m.text[sizeof(m.text) - 1] = '\0';
  // A mismatch is the caller's error on every rank; anything else is a
  // failure elsewhere.
  return MC_ERROR(m.code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError,
                  "rank %d: rank %d failed an operation of this communicator: %s", rank_, from, m.text);
}

}  // namespace meshccl
