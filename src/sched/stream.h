// Running launched operations: inline on the caller's thread (NULL stream),
// or through a meshccl host stream whose worker thread runs its work in order.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sched/launch.h"
#include "util/status.h"
#include "util/wait.h"

namespace meshccl {

struct OpHandle;
class FdClaims;

class Run;

// One operation ready to run on one communicator.
struct Launch {
  CommSched* comm = nullptr;
  std::unique_ptr<Run> run;
};

// Counted launches (users, pending_ops) that will never run: an allocation
// failed while they were handed on. Their communicators are failed, since this
// rank may have started an operation its peers cannot finish without it, and
// the counts are released, so that abort and destroy return.
void abandon_launches(std::vector<Launch>& launches);

// Launches handed to the engines, waiting to complete.
class Submitted {
 public:
  // Submits every launch to its communicator's engine.
  Submitted(std::vector<Launch>& launches, int priority);
  // One progress pass over the engines involved (timeouts, liveness and abort
  // honoured); true when something moved. done() tells when all completed.
  bool poll();
  bool done() const;
  // After done(): releases the communicators and returns the first error,
  // whose text (made by whichever thread found it) becomes the calling
  // thread's last error and error_text().
  Status finish();
  const std::string& error_text() const { return error_text_; }
  // How to wait for these launches: the most yielding of their communicators'.
  const WaitPolicy& wait_policy() const { return wait_; }
  // The wait descriptors of every engine involved (Engine::wait_fds); false
  // when one of them cannot wait on descriptors now.
  bool wait_fds(std::vector<pollfd>* out, FdClaims* claims);

 private:
  struct Waiting {
    CommSched* comm;
    std::shared_ptr<OpHandle> op;
  };
  std::vector<Waiting> ops_;
  std::vector<CommSched*> comms_;
  WaitPolicy wait_;
  std::string error_text_;
};

// Submits every launch, then drives all their engines until all complete.
// Returns the first error.
Status run_launches(std::vector<Launch>& launches, int priority);

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -7;  // eight levels (Links keeps 16)

}  // namespace meshccl

// A host stream runs its work in order. Whoever waits on it drives it: the
// thread that enqueues (while the stream is idle, for a short bounded time, so
// small operations complete without a hand-off), a thread in synchronize, and
// otherwise the stream's worker thread, which stands aside while a
// synchronizing thread drives.
struct meshcclStream {
  explicit meshcclStream(int priority);
  ~meshcclStream();

  // Queues a group of launches; they start after everything queued before.
  void enqueue(std::vector<meshccl::Launch> launches);
  meshccl::Status synchronize();
  meshccl::Status query();
  // Nothing queued or running. Both counts move under mu_ with the queue
  // and the running item, each enqueued item counting once as completed when
  // it retires; read without the lock (every call's express path asks),
  // completed_ first: equal counts then held at that moment.
  bool idle() const {
    const uint64_t done = completed_.load(std::memory_order_acquire);
    return done == enqueued_.load(std::memory_order_acquire);
  }

  const int priority;

 private:
  void worker();
  // One pass: starts the next item when none runs, polls the running one,
  // retires it when done. False when nothing moved or another thread drives
  // (then *busy, when given, is set).
  bool drive(bool* busy = nullptr);
  bool has_work_locked() const { return running_ != nullptr || !queue_.empty(); }
  // The running item's wait descriptors (Submitted::wait_fds); false when
  // another thread drives or nothing runs.
  bool wait_fds(std::vector<pollfd>* out, meshccl::FdClaims* claims);
  meshccl::WaitPolicy wait_policy() {
    std::lock_guard<std::mutex> lock(mu_);
    return wait_;
  }

  std::mutex mu_;        // queue_, running_ hand-over, error_, counters' waiters
  std::mutex drive_mu_;  // held by the one thread driving
  std::condition_variable cv_work_;
  std::deque<std::vector<meshccl::Launch>> queue_;
  std::unique_ptr<meshccl::Submitted> running_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<int> syncers_{0};
  meshccl::Status error_;
  std::string error_text_;  // error_'s message, handed to whoever synchronizes or queries
  meshccl::WaitPolicy wait_ = meshccl::WaitPolicy::standalone();  // of the last work started
  bool shutdown_ = false;
  std::thread thread_;
};

namespace meshccl {
// Registry of live host streams: tells a meshccl stream from a CUDA stream.
meshcclStream* find_stream(const void* handle);
void stream_register(meshcclStream* s);
void stream_unregister(meshcclStream* s);
}  // namespace meshccl
