// The signature check: every rank sends its operation's signature straight to
// every other rank and compares what it receives (a Check step). Direct rather
// than a ring: one message latency at any rank count, and every rank sees every
// signature, so when any two ranks differ every rank fails the operation with
// ncclInvalidUsage and a message naming the difference.
//
// Gated (MESHCCL_CHECKS=1, every collective): every data step waits for the
// check, so a mismatch fails the operation before any data moves and leaves the
// communicator usable.
//
// Overlapped (operations of kFreeCheckBytes or more, always): the data moves
// alongside the exchange, whose few small messages cost nothing measurable next
// to the transfer; the operation completes only after the check passed. A
// mismatch may leave data in flight, so it fails the communicator as well.
#include "collectives/algorithms.h"

namespace meshccl {

namespace {

constexpr size_t kFreeCheckBytes = size_t{1} << 20;

// The largest buffer of the operation on any rank: a function of the
// signature alone, so ranks that agree on it agree on whether to check.
size_t op_bytes(const OpDesc& op) {
  size_t b = op.count * op.elem();
  switch (op.kind) {
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AlltoAll:
    case OpKind::Gather:
    case OpKind::Scatter:
      return b * static_cast<size_t>(op.nranks);
    default:
      return b;
  }
}

}  // namespace

Status add_signature_check(const OpDesc& op, Plan* plan) {
  if (is_p2p(op.kind) || op.nranks == 1) return kOk;
  const bool gate = op.checks;
  if (!gate && op_bytes(op) < kFreeCheckBytes) return kOk;
  const int n = op.nranks, r = op.rank;
  const Plan::StepId data_end = static_cast<Plan::StepId>(plan->size());
  plan->signatures.assign(static_cast<size_t>(n), OpSignature{});
  plan->signatures[r] = op.signature();
  plan->check_gates_data = gate;
  const Plan::StepId check = plan->check();
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    plan->add_dep(check, plan->send(to, kControlTag, &plan->signatures[r], sizeof(OpSignature)));
    plan->add_dep(check, plan->recv(from, kControlTag, &plan->signatures[from], sizeof(OpSignature)));
  }
  if (gate)
    for (Plan::StepId s = 0; s < data_end; ++s) plan->add_dep(s, check);
  return kOk;
}

}  // namespace meshccl
