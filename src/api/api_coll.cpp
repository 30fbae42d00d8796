// Entry points for communication: each fills an OpDesc after its own checks
// and hands it to the one enqueue path.
#include <cstdint>
#include <utility>

#include "api/enqueue.h"
#include "api/export.h"
#include "api/group.h"
#include "api/validate.h"
#include "comm/comm.h"
#include "meshccl_config.h"
#include "sched/launch.h"
#include "sched/recv_any.h"
#include "util/log.h"
#if MESHCCL_HAVE_CUDA
#include "cuda/device_ops.h"
#endif

using namespace meshccl;

namespace {

// Elements a rank reads or writes, in units of the call's count: none, the
// count, or count x nranks; kAtRoot* only on the root (elsewhere none).
enum class Elems : uint8_t { kNone, kCount, kCountN, kAtRoot, kAtRootN };

// Common checks and enqueue. `root` is the root of rooted collectives and the
// peer of Send/Recv (-1 otherwise). `send`/`recv`: elements this rank
// reads/writes (none = buffer unused here), worked out once the communicator
// is known to be live. dt and op are the raw argument values (op < 0 with
// has_op false: no reduction), checked before use. `user_tag` >= 0: a tagged
// Send/Recv (meshcclSendTagged), the tag as uint32.
Status collective(const char* fn, OpKind kind, const void* sendbuff, void* recvbuff, size_t count, int dt_raw,
                  bool has_op, int op_raw, int root, ncclComm* comm, cudaStream_t stream, Elems send, Elems recv,
                  int64_t user_tag = -1) {
  MC_TRY(check_comm(fn, comm));
  UseGuard use(comm);
  const size_t n = static_cast<size_t>(comm->nranks);
  const bool per_rank =
      send == Elems::kCountN || send == Elems::kAtRootN || recv == Elems::kCountN || recv == Elems::kAtRootN;
  const size_t mult = per_rank ? n : 1;
  auto elems = [&](Elems e) -> size_t {
    switch (e) {
      case Elems::kCount: return count;
      case Elems::kCountN: return count * n;
      case Elems::kAtRoot: return comm->rank == root ? count : 0;
      case Elems::kAtRootN: return comm->rank == root ? count * n : 0;
      default: return 0;
    }
  };

  ncclDataType_t dt;
  MC_TRY(check_dtype(fn, dt_raw, &dt));
  const size_t es = dtype_size(dt);
  MC_TRY(check_size(fn, count, mult, es));
  const bool p2p = kind == OpKind::Send || kind == OpKind::Recv;
  OpDesc d;
  d.kind = kind;
  d.sendbuff = sendbuff;
  d.recvbuff = recvbuff;
  d.count = count;
  d.dtype = dt;
  if (p2p) d.peer = root;
  else d.root = root;
  if (user_tag >= 0) {
    d.tagged = true;
    d.user_tag = static_cast<uint32_t>(user_tag);
  }
  if (has_op) MC_TRY(resolve_op(fn, comm, op_raw, dt, &d));
  if (p2p) MC_TRY(check_rank(fn, "peer", root, comm->nranks));
  else if (kind == OpKind::Broadcast || kind == OpKind::Reduce || kind == OpKind::Gather || kind == OpKind::Scatter)
    MC_TRY(check_rank(fn, "root", root, comm->nranks));
  MC_TRY(check_buffer(fn, "sendbuff", sendbuff, elems(send) * es, false));
  MC_TRY(check_buffer(fn, "recvbuff", recvbuff, elems(recv) * es, true));
  return enqueue(comm, d, stream);
}

// An error is also the communicator's (ncclGetLastError(comm)) and, inside
// a group, the group's: ncclGroupEnd reports it.
template <typename F>
ncclResult_t api_call(const char* fn, ncclComm* comm, F&& body) {
  ncclResult_t r = api_guard(fn, std::forward<F>(body));
  if (r == ncclSuccess || r == ncclInProgress) return r;
  note_comm_error(comm, r);
  if (in_group()) group_note_error(r, thread_last_error());
  return r;
}

}  // namespace

MESHCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclAllReduce", comm, [&] {
    return collective("ncclAllReduce", OpKind::AllReduce, sendbuff, recvbuff, count, enum_bits(datatype), true,
                      enum_bits(op), -1, comm, stream, Elems::kCount, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                           int root, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclBroadcast", comm, [&] {
    return collective("ncclBroadcast", OpKind::Broadcast, sendbuff, recvbuff, count, enum_bits(datatype), false, 0,
                      root, comm, stream, Elems::kAtRoot, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream) {
  return api_call("ncclBcast", comm, [&] {
    return collective("ncclBcast", OpKind::Broadcast, buff, buff, count, enum_bits(datatype), false, 0, root, comm,
                      stream, Elems::kCount, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclReduce", comm, [&] {
    return collective("ncclReduce", OpKind::Reduce, sendbuff, recvbuff, count, enum_bits(datatype), true, enum_bits(op),
                      root, comm, stream, Elems::kCount, Elems::kAtRoot);
  });
}

MESHCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclAllGather", comm, [&] {
    return collective("ncclAllGather", OpKind::AllGather, sendbuff, recvbuff, sendcount, enum_bits(datatype), false, 0,
                      -1, comm, stream, Elems::kCount, Elems::kCountN);
  });
}

MESHCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                               cudaStream_t stream) {
  return api_call("ncclReduceScatter", comm, [&] {
    return collective("ncclReduceScatter", OpKind::ReduceScatter, sendbuff, recvbuff, recvcount, enum_bits(datatype),
                      true, enum_bits(op), -1, comm, stream, Elems::kCountN, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclAlltoAll", comm, [&] {
    return collective("ncclAlltoAll", OpKind::AlltoAll, sendbuff, recvbuff, count, enum_bits(datatype), false, 0, -1,
                      comm, stream, Elems::kCountN, Elems::kCountN);
  });
}

MESHCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclGather", comm, [&] {
    return collective("ncclGather", OpKind::Gather, sendbuff, recvbuff, count, enum_bits(datatype), false, 0, root,
                      comm, stream, Elems::kCount, Elems::kAtRootN);
  });
}

MESHCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         int root, ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclScatter", comm, [&] {
    return collective("ncclScatter", OpKind::Scatter, sendbuff, recvbuff, count, enum_bits(datatype), false, 0, root,
                      comm, stream, Elems::kAtRootN, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                      ncclComm_t comm, cudaStream_t stream) {
  return api_call("ncclSend", comm, [&] {
    return collective("ncclSend", OpKind::Send, sendbuff, nullptr, count, enum_bits(datatype), false, 0, peer, comm,
                      stream, Elems::kCount, Elems::kNone);
  });
}

MESHCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                      cudaStream_t stream) {
  return api_call("ncclRecv", comm, [&] {
    return collective("ncclRecv", OpKind::Recv, nullptr, recvbuff, count, enum_bits(datatype), false, 0, peer, comm,
                      stream, Elems::kNone, Elems::kCount);
  });
}

MESHCCL_EXPORT ncclResult_t meshcclSendTagged(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                              int tag, ncclComm_t comm, cudaStream_t stream) {
  return api_call("meshcclSendTagged", comm, [&] {
    return collective("meshcclSendTagged", OpKind::Send, sendbuff, nullptr, count, enum_bits(datatype), false, 0, peer,
                      comm, stream, Elems::kCount, Elems::kNone, static_cast<uint32_t>(tag));
  });
}

MESHCCL_EXPORT ncclResult_t meshcclRecvTagged(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, int tag,
                                              ncclComm_t comm, cudaStream_t stream) {
  return api_call("meshcclRecvTagged", comm, [&] {
    return collective("meshcclRecvTagged", OpKind::Recv, nullptr, recvbuff, count, enum_bits(datatype), false, 0, peer,
                      comm, stream, Elems::kNone, Elems::kCount, static_cast<uint32_t>(tag));
  });
}

namespace {

// meshcclRecvAnySource and meshcclRecvTaggedAnySource (user_tag >= 0).
Status recv_any(const char* fn, void* recvbuff, size_t count, int dt_raw, int64_t user_tag, int* source, ncclComm* comm,
                cudaStream_t stream) {
  MC_TRY(check_comm(fn, comm));
  UseGuard use(comm);
  ncclDataType_t dt;
  MC_TRY(check_dtype(fn, dt_raw, &dt));
  const size_t es = dtype_size(dt);
  MC_TRY(check_size(fn, count, 1, es));
  if (source == nullptr) return MC_ERROR(ncclInvalidArgument, "%s : source is NULL", fn);
  MC_TRY(check_buffer(fn, "recvbuff", recvbuff, count * es, true));
  if (in_group()) return MC_ERROR(ncclInvalidUsage, "%s : not allowed inside a group", fn);
  if (comm->nranks == 1) return MC_ERROR(ncclInvalidUsage, "%s : no other rank to receive from", fn);
  meshcclStream* s = nullptr;
  MC_TRY(resolve_stream(fn, stream, &s));
#if MESHCCL_HAVE_CUDA
  OpDesc d;
  d.kind = OpKind::Recv;
  d.recvbuff = recvbuff;
  d.count = count;
  d.dtype = dt;
  if (cuda::wants_device(d, false)) return MC_ERROR(ncclInvalidArgument, "%s : host memory only", fn);
#endif
  *source = -1;
  if (count == 0) return kOk;  // as an empty send, which sends nothing
  RecvAnyArgs a;
  a.dst = recvbuff;
  a.bytes = count * es;
  for (int k = 1; k < comm->nranks; ++k) a.peers.push_back((comm->rank + k) % comm->nranks);
  a.tagged = user_tag >= 0;
  a.user_tag = static_cast<uint32_t>(user_tag);
  a.source = source;
  a.seq = &comm->p2p_seq;
  MC_TRACE(kColl, "%s: recvbuff %p count %zu datatype %d tag %lld comm %p stream %p", fn, recvbuff, count,
           static_cast<int>(dt), static_cast<long long>(user_tag), static_cast<void*>(comm),
           static_cast<void*>(stream));
  return launch_run(&comm->sched, s, make_recv_any_run(std::move(a)));
}

}  // namespace

MESHCCL_EXPORT ncclResult_t meshcclRecvAnySource(void* recvbuff, size_t count, ncclDataType_t datatype, int* source,
                                                 ncclComm_t comm, cudaStream_t stream) {
  return api_call("meshcclRecvAnySource", comm, [&] {
    return recv_any("meshcclRecvAnySource", recvbuff, count, enum_bits(datatype), -1, source, comm, stream);
  });
}

MESHCCL_EXPORT ncclResult_t meshcclRecvTaggedAnySource(void* recvbuff, size_t count, ncclDataType_t datatype, int tag,
                                                       int* source, ncclComm_t comm, cudaStream_t stream) {
  return api_call("meshcclRecvTaggedAnySource", comm, [&] {
    return recv_any("meshcclRecvTaggedAnySource", recvbuff, count, enum_bits(datatype), static_cast<uint32_t>(tag),
                    source, comm, stream);
  });
}

MESHCCL_EXPORT ncclResult_t pncclGroupStart(void) {
  return api_guard("ncclGroupStart", [] { return group_start(); });
}

MESHCCL_EXPORT ncclResult_t pncclGroupEnd(void) {
  return api_guard("ncclGroupEnd", [] { return group_end(); });
}

MESHCCL_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  return api_guard("ncclGroupSimulateEnd", [&] { return group_simulate_end(simInfo); });
}

MESHCCL_WEAK_ALIAS(ncclAllReduce)
MESHCCL_WEAK_ALIAS(ncclBroadcast)
MESHCCL_WEAK_ALIAS(ncclBcast)
MESHCCL_WEAK_ALIAS(ncclReduce)
MESHCCL_WEAK_ALIAS(ncclAllGather)
MESHCCL_WEAK_ALIAS(ncclReduceScatter)
MESHCCL_WEAK_ALIAS(ncclAlltoAll)
MESHCCL_WEAK_ALIAS(ncclGather)
MESHCCL_WEAK_ALIAS(ncclScatter)
MESHCCL_WEAK_ALIAS(ncclSend)
MESHCCL_WEAK_ALIAS(ncclRecv)
MESHCCL_WEAK_ALIAS(ncclGroupStart)
MESHCCL_WEAK_ALIAS(ncclGroupEnd)
MESHCCL_WEAK_ALIAS(ncclGroupSimulateEnd)

MESHCCL_EXPORT ncclResult_t meshcclSparseAllReduce(const void* sendvalues, const int64_t* indices, size_t nnz,
                                                   void* recvbuff, size_t rows, size_t rowLen, ncclDataType_t datatype,
                                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  constexpr const char* fn = "meshcclSparseAllReduce";
  return api_call(fn, comm, [&]() -> Status {
    MC_TRY(check_comm(fn, comm));
    UseGuard use(comm);
    ncclDataType_t dt;
    MC_TRY(check_dtype(fn, enum_bits(datatype), &dt));
    const size_t es = dtype_size(dt);
    MC_TRY(check_size(fn, rows, rowLen, es));
    MC_TRY(check_size(fn, nnz, rowLen, es));
    MC_TRY(check_size(fn, nnz, 1, sizeof(int64_t)));
    if (rows > static_cast<size_t>(INT64_MAX))
      return MC_ERROR(ncclInvalidArgument, "%s : rows %zu too large", fn, rows);
    if (rows == 0 && nnz > 0 && rowLen > 0)
      return MC_ERROR(ncclInvalidArgument, "%s : %zu rows given for a tensor of 0 rows", fn, nnz);
    OpDesc d;
    d.kind = OpKind::SparseAllReduce;
    d.sendbuff = sendvalues;
    d.recvbuff = recvbuff;
    d.count = rows * rowLen;
    d.dtype = dt;
    d.root = -1;
    d.indices = indices;
    d.nnz = nnz;
    d.rows = rows;
    d.row_len = rowLen;
    MC_TRY(resolve_op(fn, comm, enum_bits(op), dt, &d));
    if (d.scalar_ptr != nullptr) return MC_ERROR(ncclInvalidArgument, "%s : a PreMulSum scalar in device memory", fn);
    MC_TRY(check_buffer(fn, "sendvalues", sendvalues, d.count == 0 ? 0 : nnz * rowLen * es, false));
    MC_TRY(check_buffer(fn, "indices", indices, d.count == 0 ? 0 : nnz * sizeof(int64_t), false));
    MC_TRY(check_buffer(fn, "recvbuff", recvbuff, d.count * es, true));
    return enqueue(comm, d, stream);
  });
}
