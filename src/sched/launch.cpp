#include "sched/launch.h"

#include <iterator>
#include <map>
#include <new>
#include <span>

#include "sched/engine.h"
#include "sched/stream.h"
#include "util/param.h"

namespace meshccl {

namespace {
// Hands the runs made for ops to their streams, or runs them here (NULL stream).
// The containers are filled before anything is counted, so an allocation
// failure here leaves no count behind (see abandon_launches for later ones).
Status dispatch(std::vector<PendingOp>& ops, std::vector<std::unique_ptr<Run>>& runs) {
  std::vector<Launch> inline_launches;
  std::map<meshcclStream*, std::vector<Launch>> per_stream;
  for (size_t i = 0; i < ops.size(); ++i) {
    PendingOp& op = ops[i];
    if (runs[i] == nullptr) continue;  // completed while it was made
    Launch l{op.comm, std::move(runs[i])};
    if (op.stream != nullptr) per_stream[op.stream].push_back(std::move(l));
    else inline_launches.push_back(std::move(l));
  }
  auto count = [](std::vector<Launch>& launches) {
    for (Launch& l : launches) {
      ++l.comm->pending_ops;
      ++l.comm->users;  // released when the launch has run
    }
  };
  count(inline_launches);
  for (auto& entry : per_stream) count(entry.second);
  for (auto it = per_stream.begin(); it != per_stream.end(); ++it) {
    try {
      it->first->enqueue(std::move(it->second));
    } catch (const std::bad_alloc&) {
      for (auto rest = std::next(it); rest != per_stream.end(); ++rest) abandon_launches(rest->second);
      abandon_launches(inline_launches);
      throw;
    }
  }
  if (inline_launches.empty()) return kOk;
  return run_launches(inline_launches, kLeastPriority);
}

// An operation that has taken its sequence number and may be half started on
// this rank cannot be given up alone: an allocation failure while it is made
// or handed on fails its communicator (ncclCommAbort and ncclCommDestroy
// then return at once; the caller's call returns ncclSystemError).
template <typename F>
Status failing_comms_on_oom(std::span<PendingOp> ops, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    for (PendingOp& op : ops) op.comm->engine->fail_all(Status(ncclSystemError));
    throw;
  }
}

Status launch_one_unguarded(PendingOp& op);

}  // namespace

Status launch(std::vector<PendingOp>& ops) {
  return failing_comms_on_oom(ops, [&]() -> Status {
    std::vector<std::unique_ptr<Run>> runs(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      bool ran_here = false;
      MC_TRY(ops[i].comm->runs->make_run(ops[i].desc, ops[i].tag_base, 0, &ran_here, &runs[i]));
    }
    return dispatch(ops, runs);
  });
}

Status launch_one(PendingOp& op) {
  // A span over the one op, not a vector: most calls end here.
  return failing_comms_on_oom(std::span<PendingOp>(&op, 1), [&] { return launch_one_unguarded(op); });
}

namespace {

Status launch_one_unguarded(PendingOp& op) {
  CommSched* comm = op.comm;
  // With nothing ahead of it on its stream, the operation may run right here:
  // no run object, no queue, no other thread.
  const bool express = (op.stream == nullptr || op.stream->idle()) && comm->engine->fatal().ok() &&
                       !comm->abort->load(std::memory_order_relaxed);
  const double budget_us = express ? static_cast<double>(param_int(Param::InlineUs)) : 0;
  std::unique_ptr<Run> run;
  bool ran_here = false;
  Status s = comm->runs->make_run(op.desc, op.tag_base, budget_us, &ran_here, &run);
  if (!s.ok()) {
    if (ran_here) comm->engine->fail_all(s);  // as if the engine had run it: the communicator is failed
    return s;
  }
  // Completed while it was made: nothing to hand on, and no allocation on
  // this path (it is most small operations).
  if (run == nullptr) return kOk;
  std::vector<std::unique_ptr<Run>> runs;
  runs.push_back(std::move(run));
  std::vector<PendingOp> ops{op};
  return dispatch(ops, runs);
}

}  // namespace

Status launch_run(CommSched* comm, meshcclStream* stream, std::unique_ptr<Run> run) {
  std::vector<PendingOp> ops{PendingOp{comm, OpDesc{}, stream, 0}};
  std::vector<std::unique_ptr<Run>> runs;
  runs.push_back(std::move(run));
  return dispatch(ops, runs);
}

}  // namespace meshccl
