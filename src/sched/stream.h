// Launching plans: inline on the caller's thread (NULL stream), or through a
// meshccl host stream whose worker thread runs its work in order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "sched/plan.h"
#include "util/status.h"

struct ncclComm;

namespace meshccl {

// One operation ready to run on one communicator.
struct Launch {
  ncclComm* comm = nullptr;
  std::unique_ptr<Plan> plan;
  uint64_t tag_base = 0;
};

// Submits every launch, then drives all their engines until all complete
// (timeouts, liveness, abort honoured). Returns the first error.
Status run_launches(std::vector<Launch>& launches, int priority);

constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -3;

}  // namespace meshccl

struct meshcclStream {
  explicit meshcclStream(int priority);
  ~meshcclStream();

  // Queues a group of launches; they start after everything queued before.
  void enqueue(std::vector<meshccl::Launch> launches);
  meshccl::Status synchronize();
  meshccl::Status query();

  const int priority;

 private:
  void worker();

  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  std::deque<std::vector<meshccl::Launch>> queue_;
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  meshccl::Status error_;
  bool shutdown_ = false;
  std::thread thread_;
};

namespace meshccl {
// Registry of live host streams: tells a meshccl stream from a CUDA stream.
meshcclStream* find_stream(const void* handle);
void stream_register(meshcclStream* s);
void stream_unregister(meshcclStream* s);
}  // namespace meshccl
