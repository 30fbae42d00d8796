#include "api/group.h"

#include <algorithm>
#include <map>
#include <thread>

#include "meshccl_config.h"
#include "sched/launch.h"
#include "util/log.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/device_ops.h"
#endif

namespace meshccl {

namespace {
struct CommRef {
  ncclComm* comm;
  uint64_t serial;
};
struct GroupState {
  std::vector<PendingOp> ops;
  std::vector<const void*> cuda_streams;  // per op: its CUDA stream, when it goes the device path
  std::vector<bool> device;               // per op: goes the device path
  std::vector<CommRef> owners;            // per op: its communicator, as recorded
  std::vector<PendingInit> inits;
  ncclResult_t error = ncclSuccess;  // first failed call inside the group
  std::string message;
};
thread_local GroupState g_group;
// Group nesting depth, read by every call (in_group): a plain int kept apart
// from g_group, whose constructor makes each access go through a TLS wrapper
// function first. (Not initial-exec: a library that Python loads after torch
// finds no static TLS left, "cannot allocate memory in static TLS block".)
thread_local int t_group_depth = 0;

Status run_inits(std::vector<PendingInit>& inits) {
  std::vector<std::thread> threads;
  std::vector<Status> results(inits.size());
  std::vector<std::string> messages(inits.size());
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
      threads.emplace_back([&results, &messages, i, body] {
        results[i] = body();
        if (!results[i].ok()) messages[i] = thread_last_error();
      });
    } else {
      any_async = true;
      in.comm->async_thread = std::thread([body] { (void)body(); });
    }
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i)  // the caller's thread hears why
    if (!results[i].ok()) return MC_ERROR(results[i].code(), "ncclGroupEnd : %s", messages[i].c_str());
  return any_async ? Status(ncclInProgress) : kOk;
}
}  // namespace

bool in_group() { return t_group_depth > 0; }
void group_record(ncclComm* owner, PendingOp op, bool device, const void* cuda_stream) {
  g_group.owners.push_back({owner, owner->serial});
  g_group.ops.push_back(op);
  g_group.device.push_back(device);
  g_group.cuda_streams.push_back(cuda_stream);
}

namespace {
// Launches a group's ops: those of communicators with device work (this
// group's or still in flight) through the device path, the others as before.
Status launch_group(std::vector<PendingOp>& ops, const std::vector<bool>& device,
                    const std::vector<const void*>& cuda_streams) {
#if MESHCCL_HAVE_CUDA
  std::vector<CommSched*> device_comms;
  for (size_t i = 0; i < ops.size(); ++i) {
    const bool dev = device[i] || (ops[i].stream == nullptr && cuda::busy(ops[i].comm));
    if (dev && std::find(device_comms.begin(), device_comms.end(), ops[i].comm) == device_comms.end())
      device_comms.push_back(ops[i].comm);
  }
  if (!device_comms.empty()) {
    std::vector<cuda::DeviceOp> dev_ops;
    std::vector<PendingOp> host_ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      const bool on_dev_comm = ops[i].stream == nullptr &&
                               std::find(device_comms.begin(), device_comms.end(), ops[i].comm) != device_comms.end();
      if (on_dev_comm) {
        dev_ops.push_back({ops[i], reinterpret_cast<CUstream>(const_cast<void*>(cuda_streams[i])), device[i]});
      } else {
        host_ops.push_back(ops[i]);
      }
    }
    Status s = cuda::launch_device(dev_ops);
    if (!host_ops.empty()) {
      Status h = launch(host_ops);
      if (s.ok()) s = h;
    }
    return s;
  }
#else
  (void)device;
  (void)cuda_streams;
#endif
  return launch(ops);
}
}  // namespace
void group_record_init(PendingInit init) {
  init.serial = init.comm->serial;
  g_group.inits.push_back(init);
}

namespace {
// Holds the communicators a group's work is for until the group has
// launched it. Another thread may destroy one of them while this thread's
// group is open (its own destroy calls group_forget): the work for it is
// dropped instead of touching freed memory.
class GroupPins {
 public:
  GroupPins() = default;
  GroupPins(const GroupPins&) = delete;
  GroupPins& operator=(const GroupPins&) = delete;
  ~GroupPins() {
    for (ncclComm* c : held_) comm_unpin(c);
  }
  bool hold(const CommRef& r) {
    if (std::find(held_.begin(), held_.end(), r.comm) != held_.end()) return true;
    if (std::find(gone_.begin(), gone_.end(), r.comm) != gone_.end()) return false;
    if (!comm_pin(r.comm, r.serial)) {
      gone_.push_back(r.comm);
      return false;
    }
    held_.push_back(r.comm);
    return true;
  }

 private:
  std::vector<ncclComm*> held_, gone_;
};

// Pins what ops and inits need; drops (and counts) the work of communicators
// destroyed meanwhile.
size_t pin_or_drop(GroupPins& pins, std::vector<PendingOp>& ops, std::vector<CommRef>& owners,
                   std::vector<bool>& device, std::vector<const void*>& cuda_streams, std::vector<PendingInit>& inits) {
  size_t kept = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!pins.hold(owners[i])) continue;
    ops[kept] = ops[i];
    owners[kept] = owners[i];
    device[kept] = device[i];
    cuda_streams[kept] = cuda_streams[i];
    ++kept;
  }
  size_t dropped = ops.size() - kept;
  ops.resize(kept);
  owners.resize(kept);
  device.resize(kept);
  cuda_streams.resize(kept);
  dropped += std::erase_if(inits, [&pins](const PendingInit& in) { return !pins.hold({in.comm, in.serial}); });
  return dropped;
}
}  // namespace

void group_note_error(ncclResult_t code, const std::string& message) {
  if (t_group_depth == 0 || g_group.error != ncclSuccess) return;
  g_group.error = code;
  g_group.message = message;
}

size_t group_forget(const ncclComm* comm) {
  if (t_group_depth == 0) return 0;
  size_t before = g_group.ops.size() + g_group.inits.size();
  const CommSched* sched = &comm->sched;
  // ops, device and cuda_streams are parallel: erase from all three alike.
  size_t kept = 0;
  for (size_t i = 0; i < g_group.ops.size(); ++i) {
    if (g_group.ops[i].comm == sched) continue;
    g_group.ops[kept] = g_group.ops[i];
    g_group.owners[kept] = g_group.owners[i];
    g_group.device[kept] = g_group.device[i];
    g_group.cuda_streams[kept] = g_group.cuda_streams[i];
    ++kept;
  }
  g_group.ops.resize(kept);
  g_group.owners.resize(kept);
  g_group.device.resize(kept);
  g_group.cuda_streams.resize(kept);
  std::erase_if(g_group.inits, [comm](const PendingInit& in) { return in.comm == comm; });
  size_t dropped = before - g_group.ops.size() - g_group.inits.size();
  if (dropped > 0)
    group_note_error(ncclInvalidUsage, "a communicator was destroyed with " + std::to_string(dropped) +
                                           " operations on it pending in the open group; they were dropped");
  return dropped;
}

Status group_start() {
  ++t_group_depth;
  return kOk;
}

Status group_end() {
  if (t_group_depth == 0) return MC_ERROR(ncclInvalidUsage, "ncclGroupEnd : not in a group call");
  if (--t_group_depth > 0) return kOk;
  std::vector<PendingInit> inits = std::move(g_group.inits);
  std::vector<PendingOp> ops = std::move(g_group.ops);
  std::vector<bool> device = std::move(g_group.device);
  std::vector<const void*> cuda_streams = std::move(g_group.cuda_streams);
  std::vector<CommRef> owners = std::move(g_group.owners);
  g_group.inits.clear();
  g_group.ops.clear();
  g_group.owners.clear();
  ncclResult_t error = g_group.error;
  std::string message = std::move(g_group.message);
  g_group.error = ncclSuccess;
  g_group.message.clear();
  g_group.device.clear();
  g_group.cuda_streams.clear();
  GroupPins pins;
  if (size_t dropped = pin_or_drop(pins, ops, owners, device, cuda_streams, inits);
      dropped > 0 && error == ncclSuccess) {
    error = ncclInvalidUsage;
    message = "a communicator was destroyed (by another thread) with " + std::to_string(dropped) +
              " operations on it pending in this thread's group; they were dropped";
  }
  Status init_status = kOk;
  if (!inits.empty()) {
    init_status = run_inits(inits);
    if (!init_status.ok() && init_status.code() != ncclInProgress) return init_status;
  }
  if (error != ncclSuccess)  // as NCCL: a failed call fails the group, nothing of it runs
    return MC_ERROR(error, "ncclGroupEnd : a call inside the group failed, so none of its %zu operations ran: %s",
                    ops.size(), message.c_str());
  if (!ops.empty()) MC_TRY(launch_group(ops, device, cuda_streams));
  return init_status;
}

Status group_simulate_end(ncclSimInfo_t* info) {
  if (info == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclGroupSimulateEnd : simInfo is NULL");
  if (info->magic != 0x74685283)
    return MC_ERROR(ncclInvalidArgument,
                    "ncclGroupSimulateEnd : simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER");
  if (t_group_depth == 0) return MC_ERROR(ncclInvalidUsage, "ncclGroupSimulateEnd : not in a group call");
  if (--t_group_depth > 0) return kOk;
  // The tuner's estimate for each op, with the algorithm it would pick.
  GroupPins pins;
  Status s = kOk;
  double us = 0;
  for (size_t i = 0; i < g_group.ops.size() && s.ok(); ++i) {
    double cost = 0;
    if (!pins.hold(g_group.owners[i]))
      s = MC_ERROR(ncclInvalidUsage,
                   "ncclGroupSimulateEnd : a communicator of the group was destroyed by another thread");
    else s = g_group.ops[i].comm->runs->estimate(g_group.ops[i].desc, &cost);
    us += cost;
  }
  g_group.ops.clear();
  g_group.owners.clear();
  g_group.device.clear();
  g_group.cuda_streams.clear();
  g_group.inits.clear();
  g_group.error = ncclSuccess;
  g_group.message.clear();
  MC_TRY(s);
  info->estimatedTime = static_cast<float>(us);
  return kOk;
}

}  // namespace meshccl
