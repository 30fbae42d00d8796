#include "sched/stream.h"

#include <algorithm>
#include <new>

#include "sched/engine.h"
#include "util/live_set.h"
#include "util/log.h"
#include "util/param.h"
#include "util/wait.h"

namespace meshccl {

void abandon_launches(std::vector<Launch>& launches) {
  const Status why(ncclSystemError);
  MC_WARN("out of memory while starting an operation: its communicator is failed (abort or destroy it)");
  for (Launch& l : launches) {
    l.comm->engine->fail_all(why);
    --l.comm->pending_ops;
    --l.comm->users;
  }
  launches.clear();
}

Submitted::Submitted(std::vector<Launch>& launches, int priority) {
  try {
    ops_.reserve(launches.size());
    comms_.reserve(launches.size());
  } catch (const std::bad_alloc&) {
    abandon_launches(launches);
    throw;
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    Launch& l = launches[i];
    try {
      ops_.push_back({l.comm, l.comm->engine->submit(std::move(l.run), priority)});
    } catch (const std::bad_alloc&) {
      // The ones submitted are failed with their engines; none will be waited for.
      abandon_launches(launches);
      ops_.clear();
      throw;
    }
    if (std::find(comms_.begin(), comms_.end(), l.comm) != comms_.end()) continue;
    const WaitPolicy& w = l.comm->engine->wait_policy();
    if (comms_.empty() || w.yield < wait_.yield) wait_ = w;
    comms_.push_back(l.comm);
  }
}

bool Submitted::poll() {
  // Every engine in turn, so none waits on a peer that only this thread can
  // move (one thread driving several ranks).
  bool moved = false;
  for (CommSched* c : comms_) moved |= c->engine->progress();
  bool waiting = false;
  for (Waiting& w : ops_)
    if (!w.op->done.load(std::memory_order_acquire)) {
      w.comm->engine->check_stalled(*w.op);
      waiting = true;
    }
  // Done at once (check_stalled never ran): the probes peers sent meanwhile.
  if (!waiting) {
    const double now = now_us();
    for (CommSched* c : comms_) c->engine->collect_probes(now);
  }
  return moved;
}

bool Submitted::wait_fds(std::vector<pollfd>* out, FdClaims* claims) {
  for (CommSched* c : comms_)
    if (!c->engine->wait_fds(out, claims)) return false;
  return !out->empty();
}

bool Submitted::done() const {
  for (const Waiting& w : ops_)
    if (!w.op->done.load(std::memory_order_acquire)) return false;
  return true;
}

Status Submitted::finish() {
  Status first = kOk;
  for (Waiting& w : ops_) {
    if (first.ok() && !w.op->status.ok()) {
      first = w.op->status;
      error_text_ = w.op->message;
    }
    --w.comm->pending_ops;
    --w.comm->users;
  }
  ops_.clear();
  if (!first.ok() && !error_text_.empty() && error_text_ != thread_last_error()) amend_last_error(error_text_);
  return first;
}

Status run_launches(std::vector<Launch>& launches, int priority) {
  Submitted sub(launches, priority);
  Backoff backoff(sub.wait_policy());
  FdWaiter fd;
  auto gather = [&sub](std::vector<pollfd>* fds, FdClaims* claims) { return sub.wait_fds(fds, claims); };
  while (!sub.done()) {
    if (sub.poll()) {
      backoff.progress();
      fd.moved();
    } else {
      fd.idle(backoff, sub.wait_policy(), gather);
    }
  }
  return sub.finish();
}

namespace {
LiveSet<meshcclStream>& live_streams() {
  static auto* s = new LiveSet<meshcclStream>();
  return *s;
}
}  // namespace

meshcclStream* find_stream(const void* handle) {
  if (handle == nullptr || !live_streams().contains(handle)) return nullptr;
  return static_cast<meshcclStream*>(const_cast<void*>(handle));
}
void stream_register(meshcclStream* s) { live_streams().add(s); }
void stream_unregister(meshcclStream* s) { live_streams().remove(s); }

}  // namespace meshccl

meshcclStream::meshcclStream(int prio) : priority(prio), thread_([this] { worker(); }) {}

meshcclStream::~meshcclStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

void meshcclStream::enqueue(std::vector<meshccl::Launch> launches) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      queue_.push_back(std::move(launches));  // strong guarantee: `launches` intact when it throws
    } catch (const std::bad_alloc&) {
      meshccl::abandon_launches(launches);
      throw;
    }
    enqueued_.fetch_add(1);
  }
  // Drive the stream here for a little while: a small operation whose peers
  // are ready completes without waking the worker, and work queued behind a
  // slow one drains on this thread, so the stream is idle again for the next
  // call's express path. Another thread driving makes this return at once.
  const double budget_us = static_cast<double>(meshccl::param_int(meshccl::Param::InlineUs));
  const double until = meshccl::now_us() + budget_us;
  meshccl::Backoff backoff;
  do {
    bool busy = false;
    if (drive(&busy)) backoff.progress();
    else if (busy) break;  // the worker (or a synchronizing thread) has it
    else backoff.yield_only();
  } while (completed_.load(std::memory_order_acquire) < enqueued_.load() && meshccl::now_us() < until);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!has_work_locked()) return;
  }
  cv_work_.notify_one();
}

bool meshcclStream::drive(bool* busy) {
  std::unique_lock<std::mutex> driving(drive_mu_, std::try_to_lock);
  if (!driving.owns_lock()) {
    if (busy != nullptr) *busy = true;
    return false;
  }
  bool moved = false;
  for (;;) {
    if (running_ == nullptr) {
      std::vector<meshccl::Launch> item;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) return moved;
        item = std::move(queue_.front());
        queue_.pop_front();
        // running_ is set before mu_ is released: the stream never looks idle
        // between the pop and the submit.
        try {
          running_ = std::make_unique<meshccl::Submitted>(item, priority);
        } catch (const std::bad_alloc&) {
          // The work item is abandoned (its communicators failed) and counts
          // as completed with the error; this thread, maybe the stream's
          // worker, goes on.
          if (!item.empty()) meshccl::abandon_launches(item);
          if (error_.ok()) error_ = meshccl::Status(ncclSystemError);
          completed_.fetch_add(1, std::memory_order_release);
          moved = true;
          continue;
        }
        wait_ = running_->wait_policy();
      }
      moved = true;
    }
    moved |= running_->poll();
    if (!running_->done()) return moved;
    meshccl::Status s = running_->finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) {
        error_ = s;
        error_text_ = running_->error_text();
      }
      running_.reset();
      completed_.fetch_add(1, std::memory_order_release);
    }
    moved = true;
  }
}

bool meshcclStream::wait_fds(std::vector<pollfd>* out, meshccl::FdClaims* claims) {
  std::unique_lock<std::mutex> driving(drive_mu_, std::try_to_lock);
  return driving.owns_lock() && running_ != nullptr && running_->wait_fds(out, claims);
}

void meshcclStream::worker() {
  meshccl::Backoff backoff;
  meshccl::FdWaiter fd;
  auto gather = [this](std::vector<pollfd>* fds, meshccl::FdClaims* claims) { return wait_fds(fds, claims); };
  meshccl::WaitPolicy policy;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return syncers_.load() == 0 && (shutdown_ || has_work_locked()); };
      if (!ready()) {
        // Its claims on the engines go before it sleeps here: a thread that
        // synchronizes (the worker stands aside) or another stream's thread
        // would otherwise find them held and sleep in steps meanwhile.
        fd.moved();
        cv_work_.wait(lock, ready);
        // Work handed over afresh: the polls before the wait (often while
        // another thread drove the stream to its end) say nothing about this
        // work. Without the reset, a wait that had reached its sleeping phase
        // would sleep at its first empty poll from then on.
        backoff.restart();
      }
      if (!has_work_locked()) return;  // shutdown with nothing left
      backoff.set_policy(wait_);
      policy = wait_;
    }
    if (drive()) {
      backoff.progress();
      fd.moved();
    } else {
      fd.idle(backoff, policy, gather);
    }
  }
}

meshccl::Status meshcclStream::synchronize() {
  const uint64_t target = enqueued_.load();
  ++syncers_;
  meshccl::Backoff backoff(wait_policy());
  meshccl::FdWaiter fd;
  auto gather = [this](std::vector<pollfd>* fds, meshccl::FdClaims* claims) { return wait_fds(fds, claims); };
  while (completed_.load(std::memory_order_acquire) < target) {
    const meshccl::WaitPolicy policy = wait_policy();
    if (drive()) {
      backoff.progress();
      fd.moved();
    } else {
      fd.idle(backoff, policy, gather);
    }
    backoff.set_policy(policy);
  }
  std::lock_guard<std::mutex> lock(mu_);
  --syncers_;
  // The worker stood aside while this thread drove; it is needed again only
  // when work was queued meanwhile (by another thread). Waking it for nothing
  // costs a context switch per synchronize, often on the core where a peer
  // rank is polling.
  if (syncers_.load() == 0 && (has_work_locked() || shutdown_)) cv_work_.notify_one();
  // The failure's text becomes the caller's last error: the run may have
  // failed on the stream's worker thread.
  if (!error_.ok() && !error_text_.empty()) meshccl::amend_last_error(error_text_);
  return error_;
}

meshccl::Status meshcclStream::query() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok()) {
    if (!error_text_.empty()) meshccl::amend_last_error(error_text_);
    return error_;
  }
  return completed_.load() >= enqueued_.load() ? meshccl::kOk : meshccl::Status(ncclInProgress);
}
