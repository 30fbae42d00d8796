// What the engine needs from a communicator along one parallel dimension. The
// model and engine only see this interface: on the single-rank path every
// pointer is null and nothing of meshccl is ever called. nccl_comm.cpp
// implements it on meshccl.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace meshtrain {

enum class ReduceOp { Sum, Max, Avg };

struct P2POp {
  bool send = false;
  float* buf = nullptr;
  size_t count = 0;
  int peer = 0;  // rank in this communicator
};

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Blocking, in place, on the critical path (high priority).
  virtual void all_reduce(float* buf, size_t n, ReduceOp op) = 0;
  // The same split in two: start returns at once, finish waits for every
  // reduction started so far. Lets the caller compute while the sum runs.
  virtual void all_reduce_start(float* buf, size_t n, ReduceOp op) = 0;
  virtual void all_reduce_finish() = 0;
  // Enqueued on a low-priority stream, returns at once; wait_async() waits for
  // everything enqueued so far. The buffer must stay untouched until then.
  virtual void all_reduce_async(float* buf, size_t n, ReduceOp op) = 0;
  virtual void wait_async() = 0;
  // All sends and receives as one group (so that matching pairs on two ranks
  // never wait on each other), on a high-priority stream; returns when done.
  virtual void exchange(const P2POp* ops, int n) = 0;

  // Seconds the caller spent blocked in this communicator (blocking calls and
  // waits), for the progress line's compute/communication split.
  double wait_seconds = 0.0;
};

}  // namespace meshtrain
