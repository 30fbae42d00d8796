#include "sched/recv_any.h"

#include <string>

#include "sched/engine.h"
#include "sched/plan.h"

namespace meshccl {

namespace {

class RecvAnyRun final : public Run {
 public:
  explicit RecvAnyRun(RecvAnyArgs a) : a_(std::move(a)), gone_(a_.peers.size(), 0) {}

  const char* name() const override { return "RecvAnySource"; }
  bool finished() const override { return sub_ != nullptr && sub_->finished(); }
  // Until a message is taken nothing is in flight: a failure then (no probe
  // on a transport, every peer gone) leaves the communicator usable.
  bool can_end_alone() const override { return sub_ == nullptr; }
  int waiting_on() const override { return sub_ != nullptr ? sub_->waiting_on() : -1; }
  // While it looks for its message, a peer that died is one it no longer
  // asks (find: its transport says so); every peer gone fails it.
  bool depends_on(int peer) const override { return sub_ != nullptr && sub_->depends_on(peer); }
  int failed_peer() const override { return sub_ != nullptr ? sub_->failed_peer() : -1; }
  void release(ScratchPool& pool) override {
    if (sub_ != nullptr) sub_->release(pool);
  }

  Status poll(Engine* eng, bool* moved) override {
    if (sub_ == nullptr) {
      MC_TRY(find(eng, moved));
      if (sub_ == nullptr) return kOk;
    }
    return sub_->poll(eng, moved);
  }

 private:
  // One pass over the peers, from the one after the last asked first.
  Status find(Engine* eng, bool* moved) {
    Mesh* mesh = eng->mesh();
    const size_t n = a_.peers.size();
    size_t gone = 0;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (next_ + k) % n;
      if (gone_[i]) {
        ++gone;
        continue;
      }
      const int peer = a_.peers[i];
      bool claimed = false;
      uint64_t tag = 0;
      Status s = a_.seq->claim_if(
          peer, a_.tagged, a_.user_tag, [&](uint64_t t, bool* found) { return mesh->probe(peer, t, found); }, &claimed,
          &tag);
      if (s.code() == ncclRemoteError) {  // that peer can send nothing more; the others still may
        gone_[i] = 1;
        ++gone;
        continue;
      }
      MC_TRY(s);
      if (!claimed) continue;
      next_ = i + 1;
      *a_.source = peer;
      *moved = true;
      start(eng, peer, tag);
      return kOk;
    }
    if (n > 0 && gone == n)
      return MC_ERROR(ncclRemoteError, "receive from any source: every peer it could take a message from has gone");
    return kOk;
  }

  void start(Engine* eng, int peer, uint64_t tag) {
    auto plan = std::make_unique<Plan>();
    plan->kind = OpKind::Recv;
    plan->algorithm = "p2p_any_source";
    plan->recv(peer, 0, a_.dst, a_.bytes);
    sub_ = make_plan_run(std::move(plan), tag);
    sub_->inherit_priority(*this);
    sub_->start(eng->scratch());
  }

  RecvAnyArgs a_;
  std::vector<char> gone_;
  size_t next_ = 0;
  std::unique_ptr<Run> sub_;
};

}  // namespace

std::unique_ptr<Run> make_recv_any_run(RecvAnyArgs args) { return std::make_unique<RecvAnyRun>(std::move(args)); }

}  // namespace meshccl
