#include "base/signature.h"

#include "base/op_desc.h"

#include <cstdio>

namespace meshccl {

namespace {

std::string kind_str(uint8_t k) {
  if (k <= static_cast<uint8_t>(OpKind::SparseAllReduce)) return op_kind_name(static_cast<OpKind>(k));
  return "kind " + std::to_string(k);
}

std::string redop_str(uint8_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    case kRedOpPreMulSum: return "premulsum";
    case kNoRedOp: return "none";
    default: return "op " + std::to_string(op);
  }
}

}  // namespace

std::string signature_difference(const OpSignature& mine, int my_rank, const OpSignature& theirs, int their_rank) {
  std::string out;
  auto field = [&](const char* name, const std::string& a, const std::string& b) {
    if (a == b) return;
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%s%s is %s on rank %d (this rank) but %s on rank %d", out.empty() ? "" : "; ",
                  name, a.c_str(), my_rank, b.c_str(), their_rank);
    out += buf;
  };
  field("collective", kind_str(mine.kind), kind_str(theirs.kind));
  field("count", std::to_string(mine.count), std::to_string(theirs.count));
  field("datatype", dtype_name(static_cast<ncclDataType_t>(mine.dtype)),
        dtype_name(static_cast<ncclDataType_t>(theirs.dtype)));
  if (mine.kind == theirs.kind) {  // otherwise these differ as a consequence
    field("reduction op", redop_str(mine.redop), redop_str(theirs.redop));
    field("root", std::to_string(mine.root), std::to_string(theirs.root));
  }
  if (out.empty() && !(mine == theirs)) out = "the signatures differ in an unknown field (a different meshccl build?)";
  return out;
}

}  // namespace meshccl
