// The vocabulary every layer shares: what kind of operation a call is, its
// datatypes and its reduction operators (the last two from the kernels' leaf
// header, kernels/elements.h). Pure and header-only, so the transports and the
// scheduler can all use it without linking anything above them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/elements.h"
#include "nccl.h"

namespace meshccl {

enum class OpKind : uint8_t {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AlltoAll,
  Gather,
  Scatter,
  Send,
  Recv,
  SparseAllReduce,  // meshcclSparseAllReduce: row-sparse input, dense output (collectives/sparse_allreduce.cpp)
};

constexpr const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "AllReduce";
    case OpKind::Broadcast: return "Broadcast";
    case OpKind::Reduce: return "Reduce";
    case OpKind::AllGather: return "AllGather";
    case OpKind::ReduceScatter: return "ReduceScatter";
    case OpKind::AlltoAll: return "AlltoAll";
    case OpKind::Gather: return "Gather";
    case OpKind::Scatter: return "Scatter";
    case OpKind::Send: return "Send";
    case OpKind::Recv: return "Recv";
    case OpKind::SparseAllReduce: return "SparseAllReduce";
  }
  return "?";
}
constexpr bool is_p2p(OpKind k) { return k == OpKind::Send || k == OpKind::Recv; }
constexpr bool is_rooted(OpKind k) {
  return k == OpKind::Broadcast || k == OpKind::Reduce || k == OpKind::Gather || k == OpKind::Scatter;
}
constexpr bool is_reduction(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::Reduce || k == OpKind::ReduceScatter || k == OpKind::SparseAllReduce;
}

// "float", "bfloat16", ... as nccl-tests names them; "invalid" otherwise.
constexpr const char* dtype_name(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "half";
    case ncclFloat32: return "float";
    case ncclFloat64: return "double";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat8e4m3: return "f8e4m3";
    case ncclFloat8e5m2: return "f8e5m2";
    default: return "invalid";
  }
}

}  // namespace meshccl
