#include "api/enqueue.h"

#include "api/group.h"
#include "base/tag.h"
#include "meshccl_config.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/device_ops.h"
#endif
#include "api/validate.h"
#include "sched/stream.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

Status enqueue(ncclComm* comm, OpDesc& desc, cudaStream_t stream) {
  meshcclStream* s = nullptr;
  bool cuda_stream = false;
  MC_TRY(resolve_stream(op_kind_name(desc.kind), stream, &s, &cuda_stream));
  desc.rank = comm->rank;
  desc.nranks = comm->nranks;
  desc.chunk_bytes = comm->settings.chunk_bytes;
  desc.settings = &comm->settings;
  MC_TRACE(
      kColl,
      "%s: opCount %llu sendbuff %p recvbuff %p count %zu datatype %d root %d peer %d comm %p [nranks=%d] stream %p",
      op_kind_name(desc.kind), static_cast<unsigned long long>(comm->coll_seq), desc.sendbuff, desc.recvbuff,
      desc.count, static_cast<int>(desc.dtype), desc.root, desc.peer, static_cast<void*>(comm), comm->nranks,
      static_cast<void*>(stream));
  desc.checks = comm->checks;
  desc.priority = s != nullptr ? s->priority : kLeastPriority;
#if MESHCCL_HAVE_CUDA
  // Device buffers or a CUDA stream: the device path (src/cuda). A capturing
  // stream is refused here, before the op takes a sequence number.
  const bool device = s == nullptr && cuda::wants_device(desc, cuda_stream);
  if (device) MC_TRY(cuda::refuse_capture(op_kind_name(desc.kind), reinterpret_cast<CUstream>(stream)));
  if (desc.kind == OpKind::SparseAllReduce && (device || cuda_stream))
    return MC_ERROR(ncclInvalidArgument, "meshcclSparseAllReduce : host memory and host or NULL streams only");
#endif
  // Empty point-to-point operations are dropped after the checks. An empty
  // collective takes its place in the sequence like any other, so that its
  // peers compare its signature (a count of 0 on one rank only is a
  // mismatch, not a call the others' next one pairs with). A sparse
  // all-reduce of an empty tensor has nothing to check.
  if (desc.count == 0 && (desc.kind == OpKind::SparseAllReduce || is_p2p(desc.kind))) return kOk;
  uint64_t tag;
  if (desc.kind == OpKind::Send) tag = comm->p2p_seq.send_tag(desc.peer, desc.tagged, desc.user_tag);
  else if (desc.kind == OpKind::Recv) tag = comm->p2p_seq.recv_tag(desc.peer, desc.tagged, desc.user_tag);
  else tag = tag::collective(comm->coll_seq++);
  PendingOp op{&comm->sched, desc, s, tag};
#if MESHCCL_HAVE_CUDA
  // Staged and ordered on the stream by the communicator's proxy. A host op on
  // a communicator with device work in flight queues behind that work,
  // keeping call order.
  if (in_group()) {
    group_record(comm, op, device, stream);
    return kOk;
  }
  if (device || (s == nullptr && cuda::busy(op.comm))) {
    std::vector<cuda::DeviceOp> ops{{op, reinterpret_cast<CUstream>(stream), device}};
    return cuda::launch_device(ops);
  }
#else
  (void)cuda_stream;
  if (in_group()) {
    group_record(comm, op);
    return kOk;
  }
#endif
  return launch_one(op);
}

}  // namespace meshccl
