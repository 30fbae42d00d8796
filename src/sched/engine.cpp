#include "sched/engine.h"

#include <poll.h>

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

Engine::Engine(int rank, Mesh* mesh, std::atomic<bool>* abort, Liveness liveness, WaitPolicy wait)
    : rank_(rank),
      mesh_(mesh),
      abort_(abort),
      liveness_(std::move(liveness)),
      wait_(wait),
      exec_(&host_executor()),
      links_(rank, mesh, exec_),
      notices_(rank, mesh),
      probes_(rank, mesh) {}

// The failed runs (graveyard_) own transfer records: the links let go of
// them first.
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
    std::lock_guard<std::mutex> lock(incoming_mu_);
    h->status = fatal();
    h->message = fatal_text_;
    h->settled.store(true, std::memory_order_relaxed);
    h->done.store(true, std::memory_order_release);
    return h;
  }
  run->start(scratch_);
  std::lock_guard<std::mutex> lock(incoming_mu_);
  incoming_.push_back(std::move(run));
  if (priority < incoming_top_.load(std::memory_order_relaxed))
    incoming_top_.store(priority, std::memory_order_relaxed);
  if (nactive_.fetch_add(1) == 0) last_progress_us_.store(now_us(), std::memory_order_relaxed);
  return h;
}

void Engine::settle(Run* run, Status s) {
  // Two threads may settle one run at once (one failing the communicator,
  // one driving progress): the first writes its outcome, the other leaves it.
  if (run->handle()->settled.exchange(true, std::memory_order_acq_rel)) return;
  if (trace_on()) trace_op(reinterpret_cast<uintptr_t>(this), rank_, run->name(), run->priority(), run->submitted_us_);
  run->handle()->status = s;
  // The text of the error this thread just made (the handle's waiter may be
  // another thread, whose own last error says nothing of it).
  if (!s.ok()) run->handle()->message = thread_last_error();
  run->handle()->done.store(true, std::memory_order_release);
}

void Engine::retire(Run* run, Status s) {
  settle(run, s);
  if (run->let_go_) background_.fetch_sub(1, std::memory_order_acq_rel);
  nactive_.fetch_sub(1);
}

void Engine::take_incoming() {
  std::lock_guard<std::mutex> lock(incoming_mu_);
  for (auto& r : incoming_) {
    auto pos = std::upper_bound(active_.begin(), active_.end(), r,
                                [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
    active_.insert(pos, std::move(r));
  }
  incoming_.clear();
  incoming_top_.store(kNoRun, std::memory_order_relaxed);
}

void Engine::progress_locked(bool* moved) {
  // A run more urgent than the one just polled, submitted during its poll
  // (by another thread), is taken in and the pass starts over in priority
  // order, at most kRestarts times per pass: the runs polled already are
  // polled again, the urgent one first.
  constexpr int kRestarts = 4;
  take_incoming();
  if (!fatal().ok()) return;
  int restarts = 0;
  active_top_ = kNoRun;
  for (size_t k = 0; k < active_.size(); ++k) {
    Run* run = active_[k].get();
    if (run->finished() || !run->error_.ok()) continue;
    if (active_top_ == kNoRun) active_top_ = run->priority();
    Status s = run->poll(this, moved);
    if (s.ok()) {
      if (!run->let_go_ && !run->finished() && run->let_go()) {
        run->let_go_ = true;
        background_.fetch_add(1, std::memory_order_acq_rel);
        settle(run, kOk);
        wants_background_ = true;  // handed to the background thread once mu_ is released
        *moved = true;
      }
      if (restarts < kRestarts && incoming_top_.load(std::memory_order_relaxed) < run->priority()) {
        take_incoming();
        ++restarts;
        active_top_ = kNoRun;
        k = static_cast<size_t>(-1);  // ++k: 0
      }
      continue;
    }
    if (run->can_end_alone()) {
      run->error_ = s;
      *moved = true;
      continue;
    }
    // A peer that failed and closed its connections: its notice, if it
    // sent one, says why and who failed first.
    int first = s.code() == ncclRemoteError ? run->failed_peer() : rank_;
    if (s.code() == ncclRemoteError) {
      int by_notice = -1;
      bool known = false;
      Status notice = notices_.poll(&by_notice, &known);
      if (!notice.ok()) s = notice, first = by_notice == rank_ ? first : by_notice;
    }
    fail_and_notify(s, first);
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

double Engine::timeout() const { return timeout_s_ > 0 ? timeout_s_ : timeout_seconds(); }

void Engine::stop_background() { background().remove(this); }

void Engine::fail_all(Status s, int first) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_locked(s, first);
}

void Engine::fail_locked(Status s, int first) {
  mark_failed(s, first);
  end_runs();
}

void Engine::mark_failed(Status s, int first) {
  int expected = ncclSuccess;
  if (fatal_.compare_exchange_strong(expected, s.code())) {
    const std::string named = " failed first";
    if (first >= 0 && first != rank_ && s.code() == ncclRemoteError &&
        thread_last_error().find(named) == std::string::npos)
      amend_last_error(thread_last_error() + "; rank " + std::to_string(first) + named);
  }
  std::lock_guard<std::mutex> lock(incoming_mu_);
  if (s.code() == fatal().code() && fatal_text_.empty()) fatal_text_ = thread_last_error();
}

void Engine::end_runs() {
  // A transfer still in a transport would go on reading or writing its
  // caller's buffer after the caller got its error back and freed it: a
  // receiver reading a freed send buffer delivers garbage as a good message.
  links_.withdraw();
  std::lock_guard<std::mutex> lock(incoming_mu_);
  for (auto& r : incoming_) active_.push_back(std::move(r));
  incoming_.clear();
  incoming_top_.store(kNoRun, std::memory_order_relaxed);
  for (auto& r : active_) {
    retire(r.get(), fatal());
    graveyard_.push_back(std::move(r));  // their transfer records stay valid for the links
  }
  active_.clear();
}

void Engine::fail_and_notify(Status s, int first, bool suspect) {
  mark_failed(s, first);
  // Peers that wait on this rank would otherwise meet a closed connection (and
  // blame this rank) or MESHCCL_TIMEOUT.
  notices_.send(s, first >= 0 ? first : rank_, suspect);
  end_runs();
}

Status Engine::wait(OpHandle& op) {
  Backoff backoff(wait_);
  FdWaiter fd;
  while (!op.done.load(std::memory_order_acquire)) {
    if (progress()) {
      backoff.progress();
      fd.moved();
    } else {
      fd.idle(backoff, wait_, [this](std::vector<pollfd>* fds, FdClaims* claims) { return wait_fds(fds, claims); });
    }
    check_stalled(op);
  }
  // An operation done without waiting (its peers were all there first, as
  // for the late rank of a recursive-doubling AllReduce) still takes in the
  // probes those peers sent while they waited.
  collect_probes(now_us());
  return op.status;
}

bool Engine::wait_fds(std::vector<pollfd>* out, FdClaims* claims) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  std::vector<int> fds;
  bool not_now = false;
  if (!links_.wait_fds(&fds, &not_now)) {
    if (not_now) claims->not_now();
    return false;
  }
  if (!claims->take(&fd_claimed_)) return false;
  for (int f : fds) out->push_back(pollfd{f, POLLIN, 0});
  return true;
}

// Without any engine's lock: another thread may drive one meanwhile (its
// progress wakes nobody here, hence the bound).
int FdWaiter::block() {
  timespec ts{0, kMaxNs};
  return ppoll(fds_.data(), fds_.size(), &ts, nullptr);
}

void Engine::collect_probes(double now) {
  // Outside a stall, at most this often: the probes peers sent are taken in
  // (one test per peer), so they do not pile up on this rank's connections.
  constexpr double kCollectUs = 1e6;
  const double idle = now - last_progress_us_.load(std::memory_order_relaxed);
  if (idle <= 100000 && now - last_collect_us_.load(std::memory_order_relaxed) > kCollectUs) {
    // Peers stalled in a collective sent their probes to this rank too, which
    // reads them only when it stalls itself: a rank that never stalls (the
    // late one) would keep every probe parked on its connections.
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      last_collect_us_.store(now, std::memory_order_relaxed);
      if (fatal().ok()) probes_.collect();
    }
  }
}

void Engine::check_stalled(OpHandle& op) {
  if (abort_ != nullptr && abort_->load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!op.done.load()) fail_locked(MC_ERROR(ncclInvalidUsage, "operation interrupted: the communicator was aborted"));
    return;
  }
  // Peers are looked at only after 100 ms without progress, then every 100 ms.
  const double now = now_us();
  const double idle = now - last_progress_us_.load(std::memory_order_relaxed);
  collect_probes(now);
  if (idle <= 100000 || now - last_check_us_.load(std::memory_order_relaxed) <= 100000) return;
  last_check_us_.store(now, std::memory_order_relaxed);
  const double timeout_us = timeout() * 1e6;
  std::lock_guard<std::mutex> lock(mu_);
  if (op.done.load()) return;
  // A peer's notice first: it says why the peer stopped (it may have exited
  // since) and who failed first, or whom it suspects.
  int first = -1;
  bool known = false;
  Status bad = notices_.poll(&first, &known);
  if (!bad.ok() && !known) {
    fail_suspecting(bad);
    return;
  }
  // Only the peers an operation in flight depends on.
  auto matters = [this](int peer) {
    return std::any_of(active_.begin(), active_.end(), [peer](const auto& r) { return r->depends_on(peer); });
  };
  if (bad.ok() && liveness_) bad = liveness_(&first, matters);
  if (!bad.ok()) {
    fail_and_notify(bad, first);
  } else if (Status mismatch = compare_with_peers(); !mismatch.ok()) {
    fail_and_notify(mismatch, rank_);
  } else if (timeout_us > 0 && idle > timeout_us) {
    // Named as a timeout, not as a lost peer: every peer still lives (as far
    // as this rank knows; the peers are asked whom they wait for).
    const Run* waited = active_.empty() ? nullptr : active_.front().get();
    for (const auto& r : active_)
      if (r->handle().get() == &op) waited = r.get();
    const int peer = waited != nullptr ? waited->waiting_on() : -1;
    fail_suspecting(MC_ERROR(ncclRemoteError, "timed out: rank %d: %s made no progress for %.0f s (%s=%.0f)%s%s", rank_,
                             waited != nullptr ? waited->name() : "operation", idle / 1e6, timeout_source_,
                             timeout_us / 1e6, peer >= 0 ? ", waiting for rank " : "",
                             peer >= 0 ? std::to_string(peer).c_str() : ""));
  }
}

// Stalled collectives tell every peer what they are (Probes); a peer stalled
// in the same collective of the sequence under another signature is a
// mismatch that moved no data this rank could compare, e.g. an empty call
// (which exchanges signatures) against one that carries them with its data.
Status Engine::compare_with_peers() {
  OpSignature sig;
  uint64_t seq = 0;
  for (const auto& run : active_) {
    if (!run->call(&sig, &seq)) continue;
    probes_.announce(seq, sig);
    int peer = -1;
    OpSignature theirs;
    if (!probes_.differs(seq, sig, &peer, &theirs)) continue;
    return MC_ERROR(ncclInvalidUsage, "%s: mismatched calls across ranks (collective #%llu of this communicator): %s",
                    run->name(), static_cast<unsigned long long>(seq),
                    signature_difference(sig, rank_, theirs, peer).c_str());
  }
  return kOk;
}

// Nothing moved for MESHCCL_TIMEOUT here, or a peer timed out. The peer
// this rank waits for may itself wait for a stopped one: say whom this rank
// suspects, then listen for a moment (kSuspectGraceS) to the peers that timed
// out too; following their suspects leads every rank to the one that answers
// nobody, or to a rank that says who failed.
void Engine::fail_suspecting(Status s) {
  constexpr double kSuspectGraceS = 1.0;
  const int peer = active_.empty() ? -1 : active_.front()->waiting_on();
  if (peer < 0) {
    fail_and_notify(s, -1);
    return;
  }
  const std::string mine = thread_last_error();
  notices_.send(s, peer, true);
  const Deadline grace = Deadline::after(std::min(kSuspectGraceS, timeout()));
  Backoff backoff(wait_);
  int ignored = -1;
  bool known = false;
  while (!grace.expired() && !(abort_ != nullptr && abort_->load(std::memory_order_relaxed))) {
    LastErrorScope keep;
    (void)notices_.poll(&ignored, &known);
    backoff.idle();
  }
  int first = notices_.resolve(peer, &known);
  if (first < 0 || first == rank_) first = peer;
  amend_last_error(mine + "; rank " + std::to_string(first) + " failed first" +
                   (known ? "" : " (it stopped answering)"));
  fail_locked(Status(s.code()), first);
}

}  // namespace meshccl
