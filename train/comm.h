// What the engine needs from a communicator along one parallel dimension. The
// model and engine only see this interface: on the single-rank path every
// pointer is null and nothing of meshccl is ever called. nccl_comm.cpp
// implements it on meshccl. Every operation starts with one call that
// returns a Work handle; a blocking call is start and wait:
//   comm->all_reduce(buf, n, ReduceOp::Sum, Urgency::critical()).wait();
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain {

enum class ReduceOp { Sum, Max, Avg };

// How a step's communications share the links (--comm-sched):
//   Fifo      every communication on one stream priority, in the order issued;
//   Priority  each gets the priority its dependencies give it, most urgent
//             first: pipeline sends/receives, tensor-parallel collectives
//             (and the small blocking ones: loss, gradient norm),
//             data-parallel gradient buckets by when the next forward needs
//             them (the first layer's first), sparse embedding gradients.
enum class CommSched { Fifo, Priority };
enum class CommKind { Pipeline, Tensor, DataParallel, Sparse };

// Parses "fifo" or "priority"; returns false on anything else.
bool parse_comm_sched(const std::string& s, CommSched* out);
const char* comm_sched_name(CommSched s);

// The meshccl stream priority (0 = least urgent .. -7 = most) of a
// communication. position, for DataParallel: where the bucket starts in the
// parameters, 0 = the first layer's .. 1 = past the last layer's.
int comm_priority(CommSched sched, CommKind kind, double position = 0.0);

struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One communication in flight. wait() returns once it is complete (a
// reduction's result is in place, every buffer may be read and reused) and
// counts the time it blocked in its communicator's wait_seconds; waiting
// again does nothing. Destroying a handle does not wait: the operation runs
// on, and its buffers must stay untouched until something waits for it.
class [[nodiscard]] Work {
 public:
  Work() = default;  // nothing in flight
  explicit Work(std::function<void()> wait) : wait_(std::move(wait)) {}
  Work(Work&& o) noexcept : wait_(std::exchange(o.wait_, nullptr)) {}
  Work& operator=(Work&& o) noexcept {
    wait_ = std::exchange(o.wait_, nullptr);
    return *this;
  }
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work() = default;

  void wait() {
    if (auto w = std::exchange(wait_, nullptr)) w();
  }

 private:
  std::function<void()> wait_;
};

// How urgent a communication is, which decides the meshccl stream it runs on:
//   critical()     the caller needs it before it can go on: the
//                  communicator's own stream, at the priority of its kind
//                  (given when it is made, split_comms);
//   background(p)  the caller computes meanwhile: a stream of priority p
//                  (comm_priority), one per level.
struct Urgency {
  static constexpr Urgency critical() { return Urgency{}; }
  static constexpr Urgency background(int priority) { return Urgency{true, priority}; }
  bool in_background = false;
  int priority = 0;  // of a background communication
};

// Seconds the caller spent blocked in a communicator (starting operations and
// waiting for them), for the progress line's compute/communication split, and
// the bytes this rank sent, counted as ring algorithms send them: all-reduce
// 2(p-1)/p x size, all-gather and reduce-scatter (p-1) x block, point to
// point the message (for the communication-volume figures).
struct CommCounters {
  double wait_seconds = 0.0;
  double bytes_sent = 0.0;
};

class Comm : public virtual CommCounters {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: buf = op over every rank's buf.
  virtual Work all_reduce(float* buf, size_t n, ReduceOp op, Urgency u) = 0;
  // The same for a row-sparse buf (rows x row_len, most rows zero, like a
  // token embedding's gradient): only the rows that are not all zero travel
  // (meshcclSparseAllReduce), on streams of their own, so that they never
  // queue behind dense reductions at the same level.
  virtual Work sparse_all_reduce(float* buf, size_t rows, size_t row_len, ReduceOp op, Urgency u) = 0;
  // out (size() x n) = every rank's n floats in rank order.
  virtual Work all_gather(const float* in, float* out, size_t n, Urgency u) = 0;
  // out (n) = this rank's block of the element-wise sum of every rank's in
  // (size() x n).
  virtual Work reduce_scatter(const float* in, float* out, size_t n, Urgency u) = 0;
};

}  // namespace meshtrain
