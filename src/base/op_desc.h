// One operation as a rank called it, after argument checks: the input every
// algorithm plans from and every launch path carries.
#pragma once

#include <cstring>

#include <cstddef>
#include <cstdint>

#include "base/op.h"
#include "base/plan_settings.h"
#include "base/signature.h"
#include "nccl.h"

namespace meshccl {

struct OpDesc {
  OpKind kind = OpKind::AllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // per NCCL's definition for the collective
  ncclDataType_t dtype = ncclFloat32;
  ReduceOp op = ReduceOp::Sum;
  bool avg = false;     // divide by nranks at the end
  bool premul = false;  // scale own input by `scalar` first
  alignas(8) unsigned char scalar[8] = {};
  // A device-resident PreMulSum scalar in device memory: the device path
  // (src/cuda) reads it where the stream reaches the op into `scalar`.
  const void* scalar_ptr = nullptr;
  // A PreMulSum scalar made with ncclScalarDevice in host memory: nccl.h says
  // it is read when the collective runs, so runs read it again into `scalar`
  // when their stream reaches them (read_scalar); `scalar` holds its value at
  // the call, for an operation that runs at once.
  const void* scalar_src = nullptr;
  int root = 0;
  int peer = -1;
  bool tagged = false;    // Send/Recv by meshcclSendTagged/meshcclRecvTagged:
  uint32_t user_tag = 0;  // matched by (peer, user_tag), in order within one
  int rank = 0;
  int nranks = 1;
  size_t chunk_bytes = 512 * 1024;
  // Its communicator's frozen settings; null: the process's (tools, tests).
  const PlanSettings* settings = nullptr;
  bool checks = false;  // MESHCCL_CHECKS on this communicator
  int priority = 0;     // its stream's (0 least urgent, negative more urgent)
  // SparseAllReduce: sendbuff holds nnz rows of row_len elements, whose row
  // numbers are indices[0..nnz); recvbuff the dense rows x row_len result
  // (count = rows * row_len).
  const int64_t* indices = nullptr;
  size_t nnz = 0;
  size_t rows = 0;
  size_t row_len = 0;
  size_t elem() const { return dtype_size(dtype); }
  void read_scalar() {
    if (scalar_src != nullptr) std::memcpy(scalar, scalar_src, elem());
  }
  OpSignature signature() const {
    const uint8_t redop = premul ? kRedOpPreMulSum : avg ? static_cast<uint8_t>(ncclAvg) : static_cast<uint8_t>(op);
    return make_signature(kind, count, dtype, redop, root);
  }
};

}  // namespace meshccl
