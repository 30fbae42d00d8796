#include "sched/engine.h"

#include <algorithm>
#include <cstring>

#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

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
        MC_TRY(Mesh::test(reqs_[i], &done, &got));
        if (!done) {
          inflight_[keep++] = i;
          continue;
        }
        const Step& s = plan_->steps()[i];
        if (s.kind != StepKind::Send && got != s.bytes)
          return MC_ERROR(ncclInvalidUsage,
                          "%s: received %zu bytes from rank %d, expected %zu (mismatched calls across ranks?)",
                          op_kind_name(plan_->kind), got, s.peer, s.bytes);
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
    }
    *started = true;
    complete_step(i);
    return kOk;
  }

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
    Status s = run->poll(this, moved);
    if (!s.ok()) {
      fail_all(s);
      return;
    }
  }
  size_t keep = 0;
  for (size_t k = 0; k < active_.size(); ++k) {
    if (active_[k]->finished()) {
      active_[k]->release(scratch_);
      complete_run(active_[k].get(), kOk);
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
  Status live = liveness_ ? liveness_() : kOk;
  const double timeout_us = timeout_seconds() * 1e6;
  std::lock_guard<std::mutex> lock(mu_);
  if (op.done.load()) return;
  if (!live.ok()) {
    fail_all(live);
  } else if (timeout_us > 0 && idle > timeout_us) {
    int peer = active_.empty() ? -1 : active_.front()->waiting_on();
    fail_all(MC_ERROR(ncclRemoteError, "rank %d: no progress for %.0f s (MESHCCL_TIMEOUT)%s%s", rank_, idle / 1e6,
                      peer >= 0 ? ", waiting for rank " : "", peer >= 0 ? std::to_string(peer).c_str() : ""));
  }
}

}  // namespace meshccl
