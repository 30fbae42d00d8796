// What an operation is, as the ranks called it: for collectives a compact
// signature every rank must agree on (collective,
// count, datatype, reduction, root) at the same position of a communicator's
// call sequence. Plain bytes with no tie to plans or engines: a plan
// exchanges signatures through its own messages (MESHCCL_CHECKS), and any
// other path can compare them with the same function and report the same
// message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/op.h"
#include "nccl.h"

namespace meshccl {

// The reduction as called: ncclSum .. ncclAvg keep their ncclRedOp_t values;
// every ncclRedOpCreatePreMulSum operator is one value (ranks may pass
// different scalars, as in NCCL); collectives that do not reduce have none.
constexpr uint8_t kRedOpPreMulSum = ncclNumOps;
constexpr uint8_t kNoRedOp = 0xff;

// Trivially copyable and the same layout on every rank: sent as bytes, or
// kept in shared memory. Zeroed memory never equals a signature (version).
struct OpSignature {
  static constexpr uint8_t kVersion = 1;
  uint64_t count = 0;  // per NCCL's definition for the collective
  int32_t root = -1;   // -1 when the collective has no root
  uint8_t kind = 0;    // OpKind
  uint8_t dtype = 0;   // ncclDataType_t
  uint8_t redop = kNoRedOp;
  uint8_t version = kVersion;
  bool operator==(const OpSignature&) const = default;
};
static_assert(sizeof(OpSignature) == 16, "OpSignature travels as 16 bytes");

// op: ncclSum..ncclAvg, or kRedOpPreMulSum; ignored unless the kind reduces.
// root: ignored unless the kind has one.
// (Inline: every call makes one.)
inline OpSignature make_signature(OpKind kind, size_t count, ncclDataType_t dtype, uint8_t redop, int root) {
  OpSignature s;
  s.count = count;
  s.kind = static_cast<uint8_t>(kind);
  s.dtype = static_cast<uint8_t>(dtype);
  s.redop = is_reduction(kind) ? redop : kNoRedOp;
  s.root = is_rooted(kind) ? root : -1;
  return s;
}

// "" when the signatures agree; otherwise every field that differs with
// both values, e.g. "count is 100 on rank 0 (this rank) but 50 on rank 2".
std::string signature_difference(const OpSignature& mine, int my_rank, const OpSignature& theirs, int their_rank);

}  // namespace meshccl
