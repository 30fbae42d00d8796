// meshccl extensions: host streams.
#include "api/export.h"
#include "meshccl.h"
#include "sched/stream.h"

using namespace meshccl;

MESHCCL_EXPORT ncclResult_t meshcclStreamGetPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = kLeastPriority;
  if (greatestPriority) *greatestPriority = kGreatestPriority;
  return ncclSuccess;
}

MESHCCL_EXPORT ncclResult_t meshcclStreamCreateWithPriority(meshcclStream_t* stream, int priority) {
  return api_guard("meshcclStreamCreateWithPriority", [&]() -> Status {
    if (stream == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclStreamCreate : stream is NULL");
    int p = priority > kLeastPriority ? kLeastPriority : priority < kGreatestPriority ? kGreatestPriority : priority;
    auto* s = new meshcclStream(p);
    stream_register(s);
    *stream = s;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t meshcclStreamCreate(meshcclStream_t* stream) {
  return meshcclStreamCreateWithPriority(stream, kLeastPriority);
}

MESHCCL_EXPORT ncclResult_t meshcclStreamGetPriority(meshcclStream_t stream, int* priority) {
  return api_guard("meshcclStreamGetPriority", [&]() -> Status {
    if (find_stream(stream) == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclStreamGetPriority : invalid stream %p", static_cast<void*>(stream));
    if (priority == nullptr) return MC_ERROR(ncclInvalidArgument, "meshcclStreamGetPriority : priority is NULL");
    *priority = stream->priority;
    return kOk;
  });
}

MESHCCL_EXPORT ncclResult_t meshcclStreamSynchronize(meshcclStream_t stream) {
  return api_guard("meshcclStreamSynchronize", [&]() -> Status {
    if (find_stream(stream) == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclStreamSynchronize : invalid stream %p", static_cast<void*>(stream));
    return stream->synchronize();
  });
}

MESHCCL_EXPORT ncclResult_t meshcclStreamQuery(meshcclStream_t stream) {
  return api_guard("meshcclStreamQuery", [&]() -> Status {
    if (find_stream(stream) == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclStreamQuery : invalid stream %p", static_cast<void*>(stream));
    return stream->query();
  });
}

MESHCCL_EXPORT ncclResult_t meshcclStreamDestroy(meshcclStream_t stream) {
  return api_guard("meshcclStreamDestroy", [&]() -> Status {
    if (find_stream(stream) == nullptr)
      return MC_ERROR(ncclInvalidArgument, "meshcclStreamDestroy : invalid stream %p", static_cast<void*>(stream));
    stream_unregister(stream);
    (void)stream->synchronize();
    delete stream;
    return kOk;
  });
}
