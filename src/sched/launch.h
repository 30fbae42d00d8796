// Launching operations: the one path from a checked operation to a run on
// its communicator's engine, inline on the caller's thread (NULL stream, the
// express path) or through a host stream. The scheduler knows a communicator
// only through CommSched, and asks the algorithms above it for runs through
// RunMaker, so it never includes the communicator or the algorithms.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/op_desc.h"
#include "util/status.h"

struct meshcclStream;

namespace meshccl {

class Engine;
class Run;

// What the scheduler asks of the algorithms (collectives/tuner.cpp). Its
// make_run is the one place that decides between the direct shared-memory
// algorithm and a plan.
class RunMaker {
 public:
  virtual ~RunMaker() = default;
  // The run for op, or null in *out when op completed here. With
  // inline_budget_us > 0 the maker may first run op on the calling thread for
  // about that long (the express path); *ran_here tells that it did, so that
  // an error is the communicator's, as if the engine had run it.
  virtual Status make_run(const OpDesc& op, uint64_t tag_base, double inline_budget_us, bool* ran_here,
                          std::unique_ptr<Run>* out) = 0;
  // The estimate the tuner would act on (ncclGroupSimulateEnd), microseconds.
  virtual Status estimate(const OpDesc& op, double* us) = 0;
};

// What the scheduler knows of one communicator: its engine, its algorithms,
// its abort flag and the counts that keep it alive while work is in flight.
struct CommSched {
  Engine* engine = nullptr;
  RunMaker* runs = nullptr;
  const std::atomic<bool>* abort = nullptr;
  std::atomic<int> users{0};        // threads inside the library on this comm, and launches not yet finished
  std::atomic<int> pending_ops{0};  // launched, not yet completed
};

// One operation ready to launch: its communicator, what it is, where it runs,
// and the tag base that names its messages (see api/enqueue).
struct PendingOp {
  CommSched* comm;
  OpDesc desc;
  meshcclStream* stream;
  uint64_t tag_base;
};

// Launches ops now (at group end): each gets its run, NULL-stream work runs
// here together (one thread may drive several ranks), each host stream gets
// its share as one work item.
Status launch(std::vector<PendingOp>& ops);
// Launches one op outside a group; a small direct collective with nothing
// ahead of it completes on the calling thread without a hand-off.
Status launch_one(PendingOp& op);
// Launches a run built elsewhere (a reshard's plan) on comm, on stream or,
// when stream is null, here.
Status launch_run(CommSched* comm, meshcclStream* stream, std::unique_ptr<Run> run);

}  // namespace meshccl
