#include "cuda/device_ops.h"

#include <condition_variable>
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "cuda/driver.h"
#include "cuda/memory.h"
#include "cuda/stream_wait.h"
#include "sched/engine.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl::cuda {

namespace {

// Bytes an op reads from sendbuff and writes to recvbuff on this rank (0 when
// it does not touch the buffer), per NCCL's definition of count.
struct Extents {
  size_t send = 0;
  size_t recv = 0;
};

Extents extents(const OpDesc& d) {
  const size_t n = d.count * d.elem();
  const size_t all = n * static_cast<size_t>(d.nranks);
  const bool root = d.rank == d.root;
  switch (d.kind) {
    case OpKind::AllReduce: return {n, n};
    case OpKind::Broadcast: return {root ? n : 0, n};
    case OpKind::Reduce: return {n, root ? n : 0};
    case OpKind::AllGather: return {n, all};
    case OpKind::ReduceScatter: return {all, n};
    case OpKind::AlltoAll: return {all, all};
    case OpKind::Gather: return {n, root ? all : 0};
    case OpKind::Scatter: return {root ? all : 0, n};
    case OpKind::Send: return {n, 0};
    case OpKind::Recv: return {0, n};
    case OpKind::SparseAllReduce: return {};  // host memory only (refused in api/enqueue)
  }
  return {};
}

// Makes ctx current for a scope and restores the caller's context after.
class CtxScope {
 public:
  explicit CtxScope(CUcontext ctx) {
    const Driver* d = driver();
    d->cuCtxGetCurrent(&saved_);
    if (saved_ != ctx) d->cuCtxSetCurrent(ctx);
    changed_ = saved_ != ctx;
  }
  ~CtxScope() {
    if (changed_) driver()->cuCtxSetCurrent(saved_);
  }
  CtxScope(const CtxScope&) = delete;
  CtxScope& operator=(const CtxScope&) = delete;

 private:
  CUcontext saved_ = nullptr;
  bool changed_ = false;
};

bool is_device(const void* p, size_t bytes) { return bytes > 0 && p != nullptr && classify(p) == MemKind::Device; }

// Pinned host memory for staging, reused once the stream passed the copy
// back out of it (its event).
struct Slot {
  void* host = nullptr;
  size_t size = 0;
  CUevent free_ev = nullptr;
  bool reserved = false;
};

struct Output {
  void* dev;
  const void* host;
  size_t bytes;
};

struct Item {
  std::vector<PendingOp> ops;
  std::vector<CUevent> ready;  // one per stream: everything before the op on it
  uint32_t seq = 0;
  bool sync = false;  // a caller waits for it (host ops)
  Status status;
  bool done = false;
  // Device-resident PreMulSum scalars, staged: copied into desc.scalar when the op runs.
  std::vector<std::pair<size_t, const void*>> scalars;
};

class CommDevice {
 public:
  CommDevice(CommSched* comm, CUcontext ctx) : comm_(comm), ctx_(ctx) {}
  ~CommDevice() { stop(); }

  Status init() {
    const Driver* d = driver();
    void* host = nullptr;
    MC_CU(d->cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc (flag)");
    flag_ = static_cast<volatile uint32_t*>(host);
    *flag_ = 0;
    MC_CU(d->cuMemHostGetDevicePointer(&flag_dev_, host, 0), "cuMemHostGetDevicePointer");
    mode_ = wait_mode();
    thread_ = std::thread([this] { loop(); });
    return kOk;
  }

  bool busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_ || !queue_.empty();
  }

  // Stages and queues ops (all of this communicator's, in call order).
  Status submit(std::vector<DeviceOp*>& ops, std::shared_ptr<Item>* out) {
    CtxScope scope(ctx_);  // the streams and staging belong to the communicator's context
    auto item = std::make_shared<Item>();
    std::vector<CUstream> streams;
    std::map<CUstream, std::vector<Output>> outputs;
    std::map<CUstream, std::vector<Slot*>> used;
    Status s = stage(ops, item.get(), streams, outputs, used);
    if (s.ok()) s = queue_waits(item.get(), streams, outputs, used);
    if (!s.ok()) {
      // Nothing runs: waits already queued pass, slots free once the copies
      // already queued into them are done, events go.
      const Driver* d = driver();
      raise_flag(flag_, item->seq);
      for (CUevent ev : item->ready) d->cuEventDestroy(ev);
      std::lock_guard<std::mutex> lock(pool_mu_);
      for (auto& [stream, slots] : used) {
        for (Slot* slot : slots) {
          if (!slot->reserved) continue;
          d->cuEventRecord(slot->free_ev, stream);
          slot->reserved = false;
        }
      }
      return s;
    }
    ++comm_->pending_ops;
    ++comm_->users;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(item);
    }
    cv_.notify_one();
    *out = item;
    return kOk;
  }

  Status stage(std::vector<DeviceOp*>& ops, Item* item, std::vector<CUstream>& streams,
               std::map<CUstream, std::vector<Output>>& outputs, std::map<CUstream, std::vector<Slot*>>& used) {
    const Driver* d = driver();
    item->seq = ++seq_;
    for (DeviceOp* dop : ops) {
      OpDesc& desc = dop->op.desc;
      if (!dop->on_stream) {
        item->sync = true;
        item->ops.push_back(dop->op);
        continue;
      }
      CUstream s = dop->stream;
      if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
      const Extents e = extents(desc);
      const bool send_dev = is_device(desc.sendbuff, e.send);
      const bool recv_dev = is_device(desc.recvbuff, e.recv);
      const auto* sb = static_cast<const unsigned char*>(desc.sendbuff);
      auto* rb = static_cast<unsigned char*>(desc.recvbuff);
      if (send_dev && recv_dev && sb < rb + e.recv && rb < sb + e.send) {
        // In place (or overlapping): one staging buffer over the union, all of it read.
        const unsigned char* lo = sb < rb ? sb : rb;
        const unsigned char* hi = (sb + e.send > rb + e.recv) ? sb + e.send : rb + e.recv;
        Slot* slot = nullptr;
        MC_TRY(acquire(static_cast<size_t>(hi - lo), &slot));
        used[s].push_back(slot);
        auto* h = static_cast<unsigned char*>(slot->host);
        MC_CU(d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(h), reinterpret_cast<CUdeviceptr>(lo),
                               static_cast<size_t>(hi - lo), s),
              "staging in");
        desc.sendbuff = h + (sb - lo);
        desc.recvbuff = h + (rb - lo);
        outputs[s].push_back({rb, desc.recvbuff, e.recv});
      } else {
        if (send_dev) {
          Slot* slot = nullptr;
          MC_TRY(acquire(e.send, &slot));
          used[s].push_back(slot);
          MC_CU(
              d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(slot->host), reinterpret_cast<CUdeviceptr>(sb), e.send, s),
              "staging in");
          desc.sendbuff = slot->host;
        }
        if (recv_dev) {
          Slot* slot = nullptr;
          MC_TRY(acquire(e.recv, &slot));
          used[s].push_back(slot);
          desc.recvbuff = slot->host;
          outputs[s].push_back({rb, slot->host, e.recv});
        }
      }
      // A buffer the op does not touch on this rank (Broadcast's input off the
      // root, Reduce's output off the root) but named in place follows the
      // staged one, so the algorithms still see an in-place call.
      if (sb != nullptr && sb == rb) {
        if (e.send == 0) desc.sendbuff = desc.recvbuff;
        if (e.recv == 0) desc.recvbuff = const_cast<void*>(desc.sendbuff);
      }
      if (desc.scalar_ptr != nullptr) {
        // A device-resident PreMulSum scalar, read where the stream reaches the op.
        Slot* slot = nullptr;
        MC_TRY(acquire(desc.elem(), &slot));
        used[s].push_back(slot);
        MC_CU(d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(slot->host),
                               reinterpret_cast<CUdeviceptr>(desc.scalar_ptr), desc.elem(), s),
              "staging the PreMulSum scalar");
        item->scalars.emplace_back(item->ops.size(), slot->host);
        desc.scalar_ptr = nullptr;
      }
      item->ops.push_back(dop->op);
    }
    return kOk;
  }

  Status queue_waits(Item* item, const std::vector<CUstream>& streams, std::map<CUstream, std::vector<Output>>& outputs,
                     std::map<CUstream, std::vector<Slot*>>& used) {
    const Driver* d = driver();
    for (CUstream s : streams) {
      CUevent ev = nullptr;
      MC_CU(d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      item->ready.push_back(ev);
      MC_CU(d->cuEventRecord(ev, s), "cuEventRecord");
      MC_TRY(stream_wait_flag(s, mode_, flag_, flag_dev_, item->seq));
      for (const Output& o : outputs[s])
        MC_CU(d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(o.dev), reinterpret_cast<CUdeviceptr>(o.host), o.bytes, s),
              "staging out");
      std::lock_guard<std::mutex> lock(pool_mu_);
      for (Slot* slot : used[s]) {
        MC_CU(d->cuEventRecord(slot->free_ev, s), "cuEventRecord");
        slot->reserved = false;
      }
    }
    return kOk;
  }

  Status wait(const std::shared_ptr<Item>& item) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return item->done; });
    return item->status;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!thread_.joinable()) return;
      shutdown_ = true;
    }
    cv_.notify_all();
    thread_.join();
    const Driver* d = driver();
    CUcontext caller = nullptr;  // restored after: the caller's thread keeps its context
    d->cuCtxGetCurrent(&caller);
    d->cuCtxSetCurrent(ctx_);
    for (auto& slot : slots_) {
      d->cuEventSynchronize(slot->free_ev);
      d->cuEventDestroy(slot->free_ev);
      d->cuMemFreeHost(slot->host);
    }
    slots_.clear();
    if (flag_ != nullptr) d->cuMemFreeHost(const_cast<uint32_t*>(flag_));
    flag_ = nullptr;
    d->cuCtxSetCurrent(caller);
  }

 private:
  Status acquire(size_t bytes, Slot** out) {
    const Driver* d = driver();
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto& slot : slots_) {
      if (slot->reserved || slot->size < bytes) continue;
      if (d->cuEventQuery(slot->free_ev) != CUDA_SUCCESS) continue;
      slot->reserved = true;
      *out = slot.get();
      return kOk;
    }
    auto slot = std::make_unique<Slot>();
    slot->size = bytes < 4096 ? 4096 : bytes;
    MC_CU(d->cuMemHostAlloc(&slot->host, slot->size, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc (staging)");
    CUresult r = d->cuEventCreate(&slot->free_ev, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      d->cuMemFreeHost(slot->host);
      return cu_status(r, "cuEventCreate");
    }
    slot->reserved = true;
    *out = slot.get();
    slots_.push_back(std::move(slot));
    return kOk;
  }

  void loop() {
    const Driver* d = driver();
    d->cuCtxSetCurrent(ctx_);
    for (;;) {
      std::shared_ptr<Item> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return shutdown_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = queue_.front();
        queue_.pop_front();
        running_ = true;
      }
      Status s = run(*item);
      // Raised also on failure: the stream must never wait forever.
      raise_flag(flag_, item->seq);
      for (CUevent ev : item->ready) d->cuEventDestroy(ev);
      if (!s.ok()) comm_->engine->fail_all(s);  // the error was logged where it arose
      {
        std::lock_guard<std::mutex> lock(mu_);
        item->status = s;
        item->done = true;
        running_ = false;
      }
      cv_done_.notify_all();
      --comm_->pending_ops;
      --comm_->users;
    }
  }

  Status run(Item& item) {
    const Driver* d = driver();
    // Everything before the op on its streams (the input copies included).
    Deadline dl = Deadline::from_timeout_param();
    Backoff backoff(comm_->engine->wait_policy());
    for (CUevent ev : item.ready) {
      for (;;) {
        CUresult r = d->cuEventQuery(ev);
        if (r == CUDA_SUCCESS) break;
        if (r != CUDA_ERROR_NOT_READY) return cu_status(r, "waiting for the stream");
        if (comm_->abort->load(std::memory_order_relaxed))
          return MC_ERROR(ncclInvalidUsage, "device operation : communicator aborted");
        if (dl.expired())
          return MC_ERROR(ncclRemoteError,
                          "device operation : the CUDA stream did not reach the operation within MESHCCL_TIMEOUT");
        backoff.idle();
      }
    }
    for (auto& [index, host] : item.scalars)
      std::memcpy(item.ops[index].desc.scalar, host, item.ops[index].desc.elem());
    if (!comm_->engine->fatal().ok()) return comm_->engine->fatal();
    return launch(item.ops);
  }

  CommSched* comm_;
  CUcontext ctx_;
  WaitMode mode_ = WaitMode::HostFunc;
  volatile uint32_t* flag_ = nullptr;
  CUdeviceptr flag_dev_ = 0;
  uint32_t seq_ = 0;  // of the last item submitted (callers of one comm are serialised by g_mu)

  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Slot>> slots_;

  std::mutex mu_;
  std::condition_variable cv_, cv_done_;
  std::deque<std::shared_ptr<Item>> queue_;
  bool running_ = false;
  bool shutdown_ = false;
  std::thread thread_;
};

std::mutex g_mu;  // the registry; also serialises submissions
std::map<const CommSched*, std::unique_ptr<CommDevice>>& registry() {
  static auto* m = new std::map<const CommSched*, std::unique_ptr<CommDevice>>();
  return *m;
}

// The communicator's context: that of the first CUDA stream it is used with
// (a process may drive ranks on several GPUs from one thread, switching the
// current device between calls), else the caller's current one.
Status device_for(CommSched* comm, CUstream first_stream, CommDevice** out) {
  auto& reg = registry();
  auto it = reg.find(comm);
  if (it != reg.end()) {
    *out = it->second.get();
    return kOk;
  }
  const Driver* d = driver();
  CUcontext ctx = nullptr;
  const uintptr_t sv = reinterpret_cast<uintptr_t>(first_stream);
  if (sv > 2) MC_CU(d->cuStreamGetCtx(first_stream, &ctx), "cuStreamGetCtx");
  if (ctx == nullptr) MC_CU(d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) {
    // No context on this thread (the caller passed a CUDA stream without
    // making a device current): use device 0's primary context, as the
    // runtime would.
    CUdevice dev = 0;
    MC_CU(d->cuDeviceGet(&dev, 0), "cuDeviceGet");
    MC_CU(d->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    MC_CU(d->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  }
  auto dev = std::make_unique<CommDevice>(comm, ctx);
  {
    CtxScope scope(ctx);  // the wait-mode measurement and the flag in this context
    MC_TRY(dev->init());
  }
  *out = dev.get();
  reg[comm] = std::move(dev);
  return kOk;
}
}  // namespace

bool wants_device(const OpDesc& desc, bool cuda_stream) {
  if (!available()) return false;
  if (cuda_stream) return true;
  const Extents e = extents(desc);
  return is_device(desc.sendbuff, e.send) || is_device(desc.recvbuff, e.recv) ||
         (desc.scalar_ptr != nullptr && classify(desc.scalar_ptr) == MemKind::Device);
}

bool busy(const CommSched* comm) {
  if (!available()) return false;
  CommDevice* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(comm);
    if (it == registry().end()) return false;
    dev = it->second.get();
  }
  return dev->busy();
}

Status refuse_capture(const char* what, CUstream stream) {
  const Driver* d = driver();
  if (d == nullptr) return MC_ERROR(ncclInvalidUsage, "%s : %s", what, why_unavailable().c_str());
  // The staging copies and the host-side operation cannot be captured into a
  // graph that would replay them: refuse before queuing anything.
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  MC_CU(d->cuStreamIsCapturing(stream, &st), "cuStreamIsCapturing");
  if (st != CU_STREAM_CAPTURE_STATUS_NONE)
    return MC_ERROR(ncclInvalidUsage,
                    "%s : stream %p is capturing a CUDA graph; meshccl does not support graph capture of its "
                    "operations (run them outside the capture)",
                    what, static_cast<void*>(stream));
  return kOk;
}

Status launch_device(std::vector<DeviceOp>& ops) {
  const Driver* d = driver();
  if (d == nullptr) return MC_ERROR(ncclInvalidUsage, "device operation : %s", why_unavailable().c_str());
  for (const DeviceOp& op : ops)
    if (op.on_stream) MC_TRY(refuse_capture(op_kind_name(op.op.desc.kind), op.stream));
  std::unique_lock<std::mutex> lock(g_mu);
  std::map<CommSched*, std::vector<DeviceOp*>> per_comm;
  std::vector<CommSched*> order;
  for (DeviceOp& op : ops) {
    if (per_comm.find(op.op.comm) == per_comm.end()) order.push_back(op.op.comm);
    per_comm[op.op.comm].push_back(&op);
  }
  std::vector<std::pair<CommDevice*, std::shared_ptr<Item>>> waits;
  Status first = kOk;
  for (CommSched* comm : order) {
    CommDevice* dev = nullptr;
    CUstream first_stream = nullptr;
    for (DeviceOp* op : per_comm[comm])
      if (op->on_stream) {
        first_stream = op->stream;
        break;
      }
    Status s = device_for(comm, first_stream, &dev);
    std::shared_ptr<Item> item;
    if (s.ok()) s = dev->submit(per_comm[comm], &item);
    if (!s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    if (item->sync) waits.emplace_back(dev, item);
  }
  // Waited for outside the lock: the peers' items may come from other threads.
  lock.unlock();
  for (auto& [dev, item] : waits) {
    Status s = dev->wait(item);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

void release(CommSched* comm) {
  if (!available()) return;
  std::unique_ptr<CommDevice> dev;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = registry().find(comm);
    if (it == registry().end()) return;
    dev = std::move(it->second);
    registry().erase(it);
  }
  dev->stop();
}

}  // namespace meshccl::cuda
