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
  // The same at a given stream priority (comm_priority); wait_async() waits
  // for these too. Communicators without priorities ignore it.
  virtual void all_reduce_async_at(float* buf, size_t n, ReduceOp op, int /*priority*/) {
    all_reduce_async(buf, n, op);
  }
  // The stream priority of the blocking calls and exchanges (set once, before
  // any communication).
  virtual void set_priority(int /*priority*/) {}
  // The same for a row-sparse buf (rows x row_len, most rows zero, like a
  // token embedding's gradient): only the rows that are not all zero need
  // to travel. The default reduces it densely; NcclComm sends the non-zero
  // rows through meshcclSparseAllReduce.
  virtual void sparse_all_reduce_async(float* buf, size_t rows, size_t row_len, ReduceOp op) {
    all_reduce_async(buf, rows * row_len, op);
  }
  // Blocking, on the critical path: out (size() x n) = every rank's n floats
  // in rank order; out (n) = this rank's block of the element-wise sum of
  // every rank's in (size() x n).
  virtual void all_gather(const float* in, float* out, size_t n) = 0;
  virtual void reduce_scatter(const float* in, float* out, size_t n) = 0;
  // All sends and receives as one group (so that matching pairs on two ranks
  // never wait on each other), on a high-priority stream; returns when done.
  virtual void exchange(const P2POp* ops, int n) = 0;

  // Seconds the caller spent blocked in this communicator (blocking calls and
  // waits), for the progress line's compute/communication split.
  double wait_seconds = 0.0;
  // Bytes this rank sent, counted as ring algorithms send them: all-reduce
  // 2(p-1)/p x size, all-gather and reduce-scatter (p-1) x block, point to
  // point the message (for the communication-volume figures).
  double bytes_sent = 0.0;
};

}  // namespace meshtrain
