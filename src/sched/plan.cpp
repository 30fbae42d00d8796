#include "sched/plan.h"

#include <type_traits>

namespace meshccl {

std::unique_ptr<Plan> Plan::clone() const {
  std::unique_ptr<Plan> p(new Plan(*this));
  const auto* lo = reinterpret_cast<const unsigned char*>(signatures.data());
  const auto* hi = lo + signatures.size() * sizeof(OpSignature);
  auto* to = reinterpret_cast<unsigned char*>(p->signatures.data());
  auto rebase = [&](auto*& ptr) {
    const auto* c = reinterpret_cast<const unsigned char*>(ptr);
    if (c >= lo && c < hi) ptr = reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(to + (c - lo));
  };
  if (lo != hi)
    for (Step& s : p->steps_) {
      rebase(s.dst);
      rebase(s.src);
      rebase(s.src2);
      rebase(s.tmp);
    }
  return p;
}

Plan::StepId Plan::add(Step s, std::initializer_list<StepId> deps) {
  s.dep_begin = static_cast<uint32_t>(deps_.size());
  s.dep_count = 0;
  for (StepId d : deps)
    if (d != kNoStep) deps_.push_back(d), ++s.dep_count;
  steps_.push_back(s);
  return static_cast<StepId>(steps_.size() - 1);
}

Plan::StepId Plan::send(int peer, uint32_t tag, const void* src, size_t bytes, std::initializer_list<StepId> deps) {
  Step s{StepKind::Send};
  s.peer = peer_of(peer);
  s.tag = group_.tag_base + tag;
  s.src = src;
  s.bytes = bytes;
  return add(s, deps);
}

Plan::StepId Plan::recv(int peer, uint32_t tag, void* dst, size_t bytes, std::initializer_list<StepId> deps) {
  Step s{StepKind::Recv};
  s.peer = peer_of(peer);
  s.tag = group_.tag_base + tag;
  s.dst = dst;
  s.bytes = bytes;
  return add(s, deps);
}

Plan::StepId Plan::recv_reduce(int peer, uint32_t tag, void* tmp, void* dst, const void* src, size_t count,
                               std::initializer_list<StepId> deps) {
  Step s{StepKind::RecvReduce};
  s.peer = peer_of(peer);
  s.tag = group_.tag_base + tag;
  s.tmp = tmp;
  s.dst = dst;
  s.src = src;
  s.count = count;
  s.bytes = count * dtype_size(dtype);
  return add(s, deps);
}

Plan::StepId Plan::copy(void* dst, const void* src, size_t bytes, std::initializer_list<StepId> deps) {
  Step s{StepKind::Copy};
  s.dst = dst;
  s.src = src;
  s.bytes = bytes;
  return add(s, deps);
}

Plan::StepId Plan::reduce(void* dst, const void* a, const void* b, size_t count, std::initializer_list<StepId> deps) {
  Step s{StepKind::Reduce};
  s.dst = dst;
  s.src = a;
  s.src2 = b;
  s.count = count;
  return add(s, deps);
}

Plan::StepId Plan::divide(void* dst, const void* src, size_t count, std::initializer_list<StepId> deps) {
  Step s{StepKind::Divide};
  s.dst = dst;
  s.src = src;
  s.count = count;
  return add(s, deps);
}

Plan::StepId Plan::scale(void* dst, const void* src, size_t count, std::initializer_list<StepId> deps) {
  Step s{StepKind::Scale};
  s.dst = dst;
  s.src = src;
  s.count = count;
  return add(s, deps);
}

Plan::StepId Plan::check() { return add(Step{StepKind::Check}, {}); }

void* Plan::scratch(size_t bytes) {
  size_t off = (scratch_bytes_ + 63) & ~size_t{63};
  scratch_bytes_ = off + bytes;
  return reinterpret_cast<void*>(kScratchBase + off);
}

void Plan::add_dep(StepId step, StepId dep) {
  if (dep != kNoStep) late_deps_.emplace_back(step, dep);
}

void Plan::redirect_dependents(StepId from, StepId to) {
  for (uint32_t& d : deps_)
    if (d == from) d = to;
  for (auto& [step, dep] : late_deps_)
    if (dep == from) dep = to;
}

}  // namespace meshccl
