#include "sched/engine.h"

#include <algorithm>
#include <condition_variable>
#include <thread>

#include "sched/trace.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

// ---------------------------------------------------------------- background

namespace {

// Drives the engines that have background runs (eager sends whose callers
// went on) while no caller drives them, so such a send reaches a receiver
// that waits for it whatever its sender does next, as NCCL's proxy thread
// does. One thread for the process, started on first use, asleep while no
// engine needs it. It drives an engine only with mu_ held, so after
// remove() returns it never touches that engine again.
class Background {
 public:
  void add(Engine* e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::find(engines_.begin(), engines_.end(), e) == engines_.end()) engines_.push_back(e);
      if (!started_) {
        started_ = true;
        std::thread([this] { loop(); }).detach();
      }
    }
    cv_.notify_one();
  }
  void remove(Engine* e) {
    std::lock_guard<std::mutex> lock(mu_);
    engines_.erase(std::remove(engines_.begin(), engines_.end(), e), engines_.end());
  }

 private:
  void loop() {
    long sleep_us = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !engines_.empty(); });
      bool moved = false;
      for (size_t i = 0; i < engines_.size();) {
        Engine* e = engines_[i];
        moved |= e->background_progress();
        if (e->has_background()) ++i;
        else engines_.erase(engines_.begin() + static_cast<long>(i));
      }
      // Callers that drive an engine move its background runs too: this
      // thread steps in only while nothing else moves, and then sleeps
      // between passes (up to 1 ms) rather than spinning beside them.
      sleep_us = moved ? 0 : std::min<long>(1000, std::max<long>(20, sleep_us * 2));
      if (sleep_us > 0) cv_.wait_for(lock, std::chrono::microseconds(sleep_us));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Engine*> engines_;
  bool started_ = false;
};

Background& background() {
  static auto* b = new Background();  // never destroyed: its thread outlives static destructors
  return *b;
}

}  // namespace

// ---------------------------------------------------------------- engine

Engine::Engine(int rank, Mesh* mesh, std::atomic<bool>* abort, std::function<Status()> liveness, WaitPolicy wait)
    : rank_(rank),
      mesh_(mesh),
      abort_(abort),
      liveness_(std::move(liveness)),
      wait_(wait),
      exec_(&host_executor()),
      links_(rank, mesh, exec_),
      notices_(rank, mesh) {}

// The failed runs (graveyard_) own transfers that links_ still lists: the
// links let go of them first.
Engine::~Engine() {
  stop_background();
  links_.abandon();
  trace_flush();
}

std::shared_ptr<OpHandle> Engine::submit(std::unique_ptr<Run> run, int priority) {
  run->priority_ = priority;
  if (trace_on()) run->submitted_us_ = now_us();
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

void Engine::settle(Run* run, Status s) {
  if (run->handle()->done.load(std::memory_order_relaxed)) return;
  if (trace_on()) trace_op(reinterpret_cast<uintptr_t>(this), rank_, run->name(), run->priority(), run->submitted_us_);
  run->handle()->status = s;
  run->handle()->done.store(true, std::memory_order_release);
}

void Engine::retire(Run* run, Status s) {
  settle(run, s);
  if (run->let_go_) background_.fetch_sub(1, std::memory_order_acq_rel);
  nactive_.fetch_sub(1);
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
    if (s.ok()) {
      if (!run->let_go_ && !run->finished() && run->let_go()) {
        run->let_go_ = true;
        background_.fetch_add(1, std::memory_order_acq_rel);
        settle(run, kOk);
        wants_background_ = true;  // handed to the background thread once mu_ is released
        *moved = true;
      }
      continue;
    }
    if (run->can_end_alone()) {
      run->error_ = s;
      *moved = true;
      continue;
    }
    // A peer that failed and closed its connections: its notice, if it
    // sent one, says why.
    if (s.code() == ncclRemoteError) {
      Status notice = notices_.poll();
      if (!notice.ok()) {
        fail_all(notice);
        return;
      }
    }
    fail_all(s);
    // Peers see a lost peer for themselves; an error found here they would
    // otherwise only meet at MESHCCL_TIMEOUT.
    if (s.code() != ncclRemoteError) notices_.send(s);
    return;
  }
  size_t keep = 0;
  for (size_t k = 0; k < active_.size(); ++k) {
    Run* run = active_[k].get();
    if (run->finished() || !run->error_.ok()) {
      run->release(scratch_);
      retire(run, run->error_);
      *moved = true;
    } else {
      active_[keep++] = std::move(active_[k]);
    }
  }
  active_.resize(keep);
}

bool Engine::progress() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  // Another thread drives the engine (and with it every active run, the
  // waiter's included): while it keeps moving, the waiter keeps polling
  // instead of backing off into sleeps, so it sees its operation end at once.
  if (!lock.owns_lock()) return now_us() - last_progress_us_.load(std::memory_order_relaxed) < 200.0;
  bool moved = false;
  progress_locked(&moved);
  if (moved) last_progress_us_.store(now_us(), std::memory_order_relaxed);
  const bool hand_over = wants_background_;
  wants_background_ = false;
  lock.unlock();
  if (hand_over) background().add(this);
  return moved;
}

bool Engine::background_progress() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool moved = false;
  progress_locked(&moved);
  if (moved) last_progress_us_.store(now_us(), std::memory_order_relaxed);
  wants_background_ = false;  // the background thread, which calls this, drives the engine already
  return moved;
}

void Engine::stop_background() { background().remove(this); }

void Engine::fail_all(Status s) {
  int expected = ncclSuccess;
  fatal_.compare_exchange_strong(expected, s.code());
  std::lock_guard<std::mutex> lock(incoming_mu_);
  for (auto& r : incoming_) active_.push_back(std::move(r));
  incoming_.clear();
  for (auto& r : active_) {
    retire(r.get(), fatal());
    graveyard_.push_back(std::move(r));  // transports may still reference its buffers
  }
  active_.clear();
}

Status Engine::wait(OpHandle& op) {
  Backoff backoff(wait_);
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
  Status bad = notices_.poll();
  if (bad.ok() && liveness_) bad = liveness_();
  if (!bad.ok()) {
    fail_all(bad);
  } else if (timeout_us > 0 && idle > timeout_us) {
    // Named as a timeout, not as a lost peer: every peer still lives.
    const Run* waited = active_.empty() ? nullptr : active_.front().get();
    for (const auto& r : active_)
      if (r->handle().get() == &op) waited = r.get();
    const int peer = waited != nullptr ? waited->waiting_on() : -1;
    fail_all(MC_ERROR(ncclRemoteError, "timed out: rank %d: %s made no progress for %.0f s (MESHCCL_TIMEOUT=%.0f)%s%s",
                      rank_, waited != nullptr ? waited->name() : "operation", idle / 1e6, timeout_us / 1e6,
                      peer >= 0 ? ", waiting for rank " : "", peer >= 0 ? std::to_string(peer).c_str() : ""));
  }
}

}  // namespace meshccl
