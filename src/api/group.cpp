#include "api/group.h"

#include <map>
#include <thread>

#include "sched/engine.h"
#include "sched/stream.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {
struct GroupState {
  int depth = 0;
  std::vector<PendingOp> ops;
  std::vector<PendingInit> inits;
};
thread_local GroupState g_group;

Status run_inits(std::vector<PendingInit>& inits) {
  std::vector<std::thread> threads;
  std::vector<Status> results(inits.size());
  bool any_async = false;
  for (size_t i = 0; i < inits.size(); ++i) {
    PendingInit& in = inits[i];
    auto body = [in] {
      Status s = comm_init_rank(in.comm, in.nranks, in.id, in.rank);
      if (!s.ok()) in.comm->state.store(ncclComm::State::Failed);
      in.comm->async_error.store(s.code());
      return s;
    };
    if (in.comm->config.blocking) {
      threads.emplace_back([&results, i, body] { results[i] = body(); });
    } else {
      any_async = true;
      in.comm->async_thread = std::thread([body] { (void)body(); });
    }
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results)
    if (!s.ok()) return s;
  return any_async ? Status(ncclInProgress) : kOk;
}
}  // namespace

bool in_group() { return g_group.depth > 0; }
void group_record(PendingOp op) { g_group.ops.push_back(op); }
void group_record_init(PendingInit init) { g_group.inits.push_back(init); }

Status group_start() {
  ++g_group.depth;
  return kOk;
}

namespace {
// Hands runs made for ops to their streams, or runs them here (NULL stream).
Status dispatch(std::vector<PendingOp>& ops, std::vector<std::unique_ptr<Run>>& runs) {
  std::vector<Launch> inline_launches;
  std::map<meshcclStream*, std::vector<Launch>> per_stream;
  for (size_t i = 0; i < ops.size(); ++i) {
    PendingOp& op = ops[i];
    ++op.comm->pending_ops;
    ++op.comm->users;  // released when the launch has run
    Launch l{op.comm, std::move(runs[i])};
    if (op.stream != nullptr) per_stream[op.stream].push_back(std::move(l));
    else inline_launches.push_back(std::move(l));
  }
  for (auto& [stream, launches] : per_stream) stream->enqueue(std::move(launches));
  if (inline_launches.empty()) return kOk;
  return run_launches(inline_launches, kLeastPriority);
}
}  // namespace

Status launch(std::vector<PendingOp>& ops) {
  std::vector<std::unique_ptr<Run>> runs(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) MC_TRY(make_run(ops[i].comm->tune, ops[i].desc, ops[i].comm->node.get(), ops[i].tag_base, &runs[i]));
  return dispatch(ops, runs);
}

Status launch_one(PendingOp& op) {
  ncclComm* comm = op.comm;
  NodeRegion* node = comm->node.get();
  // A direct collective with nothing ahead of it runs right here: no run
  // object, no queue, no other thread.
  const size_t max_bytes = node != nullptr ? direct_max_bytes(op.desc.kind) : 0;
  if (max_bytes > 0 && (op.stream == nullptr || op.stream->idle()) && comm->engine->fatal().ok() &&
      !comm->abort_flag.load()) {
    bool taken = false;
    std::vector<std::unique_ptr<Run>> rest(1);
    Status s = run_direct_now(node, op.desc, max_bytes, static_cast<double>(param_int(Param::InlineUs)), &taken,
                              &rest[0]);
    if (!s.ok()) {
      comm->engine->fail_all(s);  // as if the engine had run it: the communicator is failed
      return s;
    }
    if (taken) {
      if (rest[0] == nullptr) return kOk;
      std::vector<PendingOp> ops{op};
      return dispatch(ops, rest);
    }
  }
  std::vector<PendingOp> ops{op};
  return launch(ops);
}

Status group_end() {
  if (g_group.depth == 0) return MC_ERROR(ncclInvalidUsage, "ncclGroupEnd : not in a group call");
  if (--g_group.depth > 0) return kOk;
  std::vector<PendingInit> inits = std::move(g_group.inits);
  std::vector<PendingOp> ops = std::move(g_group.ops);
  g_group.inits.clear();
  g_group.ops.clear();
  Status init_status = kOk;
  if (!inits.empty()) {
    init_status = run_inits(inits);
    if (!init_status.ok() && init_status.code() != ncclInProgress) return init_status;
  }
  if (!ops.empty()) MC_TRY(launch(ops));
  return init_status;
}

Status group_simulate_end(ncclSimInfo_t* info) {
  if (info == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclGroupSimulateEnd : simInfo is NULL");
  if (info->magic != 0x74685283)
    return MC_ERROR(ncclInvalidArgument, "ncclGroupSimulateEnd : simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER");
  if (g_group.depth == 0) return MC_ERROR(ncclInvalidUsage, "ncclGroupSimulateEnd : not in a group call");
  if (--g_group.depth > 0) return kOk;
  // The tuner's estimate for each op, with the algorithm it would pick.
  double us = 0;
  for (const PendingOp& op : g_group.ops) {
    const Algorithm* pick = nullptr;
    double cost = 0;
    MC_TRY(choose_algorithm(op.comm->tune, op.desc, &pick, &cost));
    us += cost;
  }
  g_group.ops.clear();
  g_group.inits.clear();
  info->estimatedTime = static_cast<float>(us);
  return kOk;
}

}  // namespace meshccl
