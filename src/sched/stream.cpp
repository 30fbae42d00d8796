#include "sched/stream.h"

#include <algorithm>

#include "comm/comm.h"
#include "util/live_set.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

Status run_launches(std::vector<Launch>& launches, int priority) {
  struct Waiting {
    ncclComm* comm;
    std::shared_ptr<OpHandle> op;
  };
  std::vector<Waiting> ops;
  ops.reserve(launches.size());
  std::vector<ncclComm*> comms;
  for (Launch& l : launches) {
    ops.push_back({l.comm, l.comm->engine->submit(std::move(l.plan), l.tag_base, priority)});
    if (std::find(comms.begin(), comms.end(), l.comm) == comms.end()) comms.push_back(l.comm);
  }
  if (ops.size() == 1) {
    Status s = comms[0]->engine->wait(*ops[0].op);
    --comms[0]->pending_ops;
    return s;
  }
  // Several operations, possibly on several communicators (one thread
  // driving several ranks): progress every engine in turn, so none waits on
  // a peer that only this thread can move.
  Backoff backoff;
  for (;;) {
    bool moved = false;
    for (ncclComm* c : comms) moved |= c->engine->progress();
    moved ? backoff.progress() : backoff.idle();
    bool all_done = true;
    for (Waiting& w : ops) {
      if (w.op->done.load(std::memory_order_acquire)) continue;
      all_done = false;
      w.comm->engine->check_stalled(*w.op);
    }
    if (all_done) break;
  }
  Status first = kOk;
  for (Waiting& w : ops) {
    if (first.ok() && !w.op->status.ok()) first = w.op->status;
    --w.comm->pending_ops;
  }
  return first;
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
    queue_.push_back(std::move(launches));
    enqueued_.fetch_add(1);
  }
  cv_work_.notify_one();
}

void meshcclStream::worker() {
  for (;;) {
    std::vector<meshccl::Launch> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return shutdown_ || !queue_.empty(); });
      if (queue_.empty()) return;  // shutdown with nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    meshccl::Status s = meshccl::run_launches(item, priority);
    for (meshccl::Launch& l : item) --l.comm->users;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      completed_.fetch_add(1);
    }
    cv_done_.notify_all();
  }
}

meshccl::Status meshcclStream::synchronize() {
  uint64_t target = enqueued_.load();
  meshccl::Backoff backoff;
  for (int i = 0; i < 2200 && completed_.load(std::memory_order_acquire) < target; ++i) backoff.idle();
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return completed_.load() >= target; });
  return error_;
}

meshccl::Status meshcclStream::query() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok()) return error_;
  return completed_.load() >= enqueued_.load() ? meshccl::kOk : meshccl::Status(ncclInProgress);
}
