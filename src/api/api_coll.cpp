// Entry points for communication: each fills an OpDesc after its own checks
// and hands it to the one enqueue path.
#include <limits>

#include "api/enqueue.h"
#include "api/export.h"
#include "api/group.h"
#include "api/validate.h"

using namespace meshccl;

namespace {

Status check_size(const char* fn, size_t count, size_t mult, ncclDataType_t dt) {
  size_t es = dtype_size(dt);
  if (mult != 0 && count > std::numeric_limits<size_t>::max() / mult / es)
    return MC_ERROR(ncclInvalidArgument, "%s : count %zu is too large", fn, count);
  return kOk;
}

// Common checks and enqueue. `root` is the root of rooted collectives and the
// peer of Send/Recv (-1 otherwise). `send_elems`/`recv_elems`: elements this
// rank reads/writes (0 = buffer unused here).
Status collective(const char* fn, OpKind kind, const void* sendbuff, void* recvbuff, size_t count,
                  ncclDataType_t dt, const ncclRedOp_t* op, int root, ncclComm* comm, cudaStream_t stream,
                  size_t send_elems, size_t recv_elems, size_t mult) {
  MC_TRY(check_comm(fn, comm));
  UseGuard use(comm);
  MC_TRY(check_dtype(fn, dt));
  MC_TRY(check_size(fn, count, mult, dt));
  const bool p2p = kind == OpKind::Send || kind == OpKind::Recv;
  OpDesc d;
  d.kind = kind;
  d.sendbuff = sendbuff;
  d.recvbuff = recvbuff;
  d.count = count;
  d.dtype = dt;
  if (p2p) d.peer = root;
  else d.root = root;
  if (op != nullptr) MC_TRY(resolve_op(fn, comm, *op, dt, &d));
  if (p2p) MC_TRY(check_rank(fn, "peer", root, comm->nranks));
  else if (kind == OpKind::Broadcast || kind == OpKind::Reduce || kind == OpKind::Gather || kind == OpKind::Scatter)
    MC_TRY(check_rank(fn, "root", root, comm->nranks));
  MC_TRY(check_buffer(fn, "sendbuff", sendbuff, send_elems));
  MC_TRY(check_buffer(fn, "recvbuff", recvbuff, recv_elems));
  return enqueue(comm, d, stream);
}

}  // namespace

MESHCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclAllReduce", [&] {
    return collective("ncclAllReduce", OpKind::AllReduce, sendbuff, recvbuff, count, datatype, &op, -1, comm, stream,
                      count, count, 1);
  });
}

MESHCCL_EXPORT ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int root, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclBroadcast", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclBroadcast", comm));
    bool is_root = comm->rank == root;
    return collective("ncclBroadcast", OpKind::Broadcast, sendbuff, recvbuff, count, datatype, nullptr, root, comm,
                      stream, is_root ? count : 0, count, 1);
  });
}

MESHCCL_EXPORT ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  return api_guard("ncclBcast", [&] {
    return collective("ncclBcast", OpKind::Broadcast, buff, buff, count, datatype, nullptr, root, comm, stream, count,
                      count, 1);
  });
}

MESHCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclReduce", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclReduce", comm));
    bool is_root = comm->rank == root;
    return collective("ncclReduce", OpKind::Reduce, sendbuff, recvbuff, count, datatype, &op, root, comm, stream,
                      count, is_root ? count : 0, 1);
  });
}

MESHCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclAllGather", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclAllGather", comm));
    size_t n = static_cast<size_t>(comm->nranks);
    return collective("ncclAllGather", OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype, nullptr, -1, comm,
                      stream, sendcount, sendcount * n, n);
  });
}

MESHCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                              cudaStream_t stream) {
  return api_guard("ncclReduceScatter", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclReduceScatter", comm));
    size_t n = static_cast<size_t>(comm->nranks);
    return collective("ncclReduceScatter", OpKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, &op, -1,
                      comm, stream, recvcount * n, recvcount, n);
  });
}

MESHCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                         ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclAlltoAll", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclAlltoAll", comm));
    size_t n = static_cast<size_t>(comm->nranks);
    return collective("ncclAlltoAll", OpKind::AlltoAll, sendbuff, recvbuff, count, datatype, nullptr, -1, comm, stream,
                      count * n, count * n, n);
  });
}

MESHCCL_EXPORT ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclGather", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclGather", comm));
    size_t n = static_cast<size_t>(comm->nranks);
    bool is_root = comm->rank == root;
    return collective("ncclGather", OpKind::Gather, sendbuff, recvbuff, count, datatype, nullptr, root, comm, stream,
                      count, is_root ? count * n : 0, n);
  });
}

MESHCCL_EXPORT ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclScatter", [&]() -> Status {
    MC_TRY(check_comm_handle("ncclScatter", comm));
    size_t n = static_cast<size_t>(comm->nranks);
    bool is_root = comm->rank == root;
    return collective("ncclScatter", OpKind::Scatter, sendbuff, recvbuff, count, datatype, nullptr, root, comm, stream,
                      is_root ? count * n : 0, count, n);
  });
}

MESHCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclSend", [&] {
    return collective("ncclSend", OpKind::Send, sendbuff, nullptr, count, datatype, nullptr, peer, comm, stream,
                      count, 0, 1);
  });
}

MESHCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                     ncclComm_t comm, cudaStream_t stream) {
  return api_guard("ncclRecv", [&] {
    return collective("ncclRecv", OpKind::Recv, nullptr, recvbuff, count, datatype, nullptr, peer, comm, stream,
                      0, count, 1);
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
