// The signature check: every rank sends its operation's signature straight to
// every other rank and compares what it receives (a Check step). Direct rather
// than a ring: one message latency at any rank count, and every rank sees every
// signature, so when any two ranks differ every rank fails the operation with
// ncclInvalidUsage and a message naming the difference. Every collective plan
// has it (the direct algorithms compare signatures in their slot headers).
//
// Gated (MESHCCL_CHECKS=1): every data step waits for the check, so a
// mismatch fails the operation before any data moves and leaves the
// communicator usable.
//
// Otherwise the data moves alongside the exchange and the operation completes
// only after the check passed. A mismatch may leave data in flight, so it
// fails the communicator as well. The cost (docs/errors.md) is the exchange's
// small messages and, for a rank that otherwise waits for nobody (a root),
// the wait for its peers' signatures.
#include "collectives/algorithms.h"

namespace meshccl {

namespace {

constexpr size_t kFreeCheckBytes = size_t{1} << 20;
// Operations up to this size (op_bytes, so every message is at most this
// long, and ranks that agree on the call agree on how it is checked) carry
// the sender's signature in front of each message's data: two copies of at
// most this much cost nothing next to a message's latency, where a message
// of its own costs one (+4 us on socket, docs/errors.md).
constexpr size_t kCarryBytes = 4096;
constexpr size_t kSigBytes = sizeof(OpSignature);

// The largest buffer of the operation on any rank: a function of the
// signature alone, so ranks that agree on it agree on whether to check.
size_t op_bytes(const OpDesc& op) {
  size_t b = op.count * op.elem();
  switch (op.kind) {
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AlltoAll:
    case OpKind::Gather:
    case OpKind::Scatter: return b * static_cast<size_t>(op.nranks);
    default: return b;
  }
}

bool is_transfer(StepKind k) { return k == StepKind::Send || k == StepKind::Recv || k == StepKind::RecvReduce; }

// A send of `s` bytes becomes: signature and data copied into a staging
// buffer, then sent from there.
void carry_send(Plan* plan, Plan::StepId i, const void* sig) {
  const Step s = plan->steps()[i];
  auto* stage = static_cast<char*>(plan->scratch(kSigBytes + s.bytes));
  const Plan::StepId head = plan->copy(stage, sig, kSigBytes);
  const Plan::StepId body = s.bytes > 0 ? plan->copy(stage + kSigBytes, s.src, s.bytes) : Plan::kNoStep;
  if (body != Plan::kNoStep) {
    std::vector<Plan::StepId> deps;
    plan->each_dep(i, [&](Plan::StepId d) { deps.push_back(d); });
    for (Plan::StepId d : deps) plan->add_dep(body, d);  // the data is ready when the send was
    plan->add_dep(i, body);
  }
  Step& send = plan->steps()[i];
  send.src = stage;
  send.bytes += kSigBytes;
  plan->add_dep(i, head);
}

// A receive lands in a staging buffer; its signature goes to the plan's
// entry for the sender (compared by the check step), its data where the
// receive was meant to put it (a receive-reduce reduces from the staging
// buffer). Whatever waited for the receive waits for the data step.
Plan::StepId carry_recv(Plan* plan, Plan::StepId i) {
  const Step s = plan->steps()[i];
  auto* stage = static_cast<char*>(plan->scratch(kSigBytes + s.bytes));
  Plan::StepId data = Plan::kNoStep;
  if (s.kind == StepKind::RecvReduce) data = plan->reduce(s.dst, s.src, stage + kSigBytes, s.count);
  else if (s.bytes > 0) data = plan->copy(s.dst, stage + kSigBytes, s.bytes);
  const Plan::StepId sig = plan->copy(&plan->signatures[static_cast<size_t>(s.peer)], stage, kSigBytes);
  plan->redirect_dependents(i, data != Plan::kNoStep ? data : sig);
  plan->add_dep(sig, i);
  if (data != Plan::kNoStep) plan->add_dep(data, i);
  Step& recv = plan->steps()[i];
  recv.kind = StepKind::Recv;
  recv.dst = stage;
  recv.tmp = nullptr;
  recv.bytes = s.bytes + kSigBytes;
  return sig;
}

// Small operations: the signature travels in front of each message's data
// and the receiver compares it. No message of its own, and no wait for a
// rank this one does not receive from.
void carry_signatures(const OpDesc& op, Plan* plan) {
  const int r = op.rank;
  plan->signatures.assign(static_cast<size_t>(op.nranks), op.signature());  // unheard ranks agree
  const Plan::StepId end = static_cast<Plan::StepId>(plan->size());
  std::vector<Plan::StepId> sigs;
  for (Plan::StepId i = 0; i < end; ++i) {
    const Step& s = plan->steps()[i];
    if (!is_transfer(s.kind) || s.peer == r) continue;
    if (s.kind == StepKind::Send) carry_send(plan, i, &plan->signatures[static_cast<size_t>(r)]);
    else sigs.push_back(carry_recv(plan, i));
  }
  if (sigs.empty()) return;  // nothing received: a rank that differs learns it from the receivers
  const Plan::StepId check = plan->check();
  for (Plan::StepId s : sigs) plan->add_dep(check, s);
}

// Every rank sends its signature straight to every other rank on the control
// tags and receives theirs.
void exchange_signatures(const OpDesc& op, Plan* plan, bool gate) {
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
}

}  // namespace

Status add_signature_check(const OpDesc& op, Plan* plan) {
  if (is_p2p(op.kind) || op.nranks == 1) return kOk;
  if (op.checks || op.count == 0 || op_bytes(op) >= kFreeCheckBytes) {
    exchange_signatures(op, plan, op.checks);
  } else if (op_bytes(op) <= kCarryBytes) {
    carry_signatures(op, plan);
  }
  return kOk;
}

}  // namespace meshccl
