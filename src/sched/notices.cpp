#include "sched/notices.h"

#include <algorithm>
#include <cstdio>

#include "base/tag.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

void Notices::send(Status s) {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (sent_ || n <= 1) return;
  sent_ = true;
  LastErrorScope keep;  // a notice that cannot be delivered is not the error
  out_.code = s.code();
  std::snprintf(out_.text, sizeof(out_.text), "%s", thread_last_error().c_str());
  // Best effort, briefly: a small message normally leaves at once; a peer
  // that does not drain its connection falls back on MESHCCL_TIMEOUT.
  std::vector<Request> reqs(n);
  std::vector<char> state(n, 0);  // 0 to post, 1 posted, 2 done or failed
  state[rank_] = 2;
  Deadline dl = Deadline::after(std::min(1.0, timeout_seconds() > 0 ? timeout_seconds() : 1.0));
  Backoff backoff;
  for (int left = n - 1; left > 0 && !dl.expired();) {
    for (int p = 0; p < n; ++p) {
      if (state[p] == 0) {
        if (!mesh_->isend(p, &out_, sizeof(out_), tag::kNotice, &reqs[p]).ok()) state[p] = 2, --left;
        else if (reqs[p].handle != nullptr) state[p] = 1;
      }
      if (state[p] != 1) continue;
      bool done = false;
      if (!Mesh::test(reqs[p], &done, nullptr).ok() || done) state[p] = 2, --left;
    }
    backoff.idle();
  }
}

Status Notices::poll() {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (n <= 1) return kOk;
  if (in_.empty()) {
    in_.resize(n);
    reqs_.resize(n);
    state_.assign(n, 0);
    state_[rank_] = 2;
  }
  int from = -1;
  {
    LastErrorScope keep;  // a peer that is gone is reported by liveness, not here
    for (int p = 0; p < n && from < 0; ++p) {
      if (state_[p] == 0) {
        if (!mesh_->irecv(p, &in_[p], sizeof(Notice), tag::kNotice, &reqs_[p]).ok()) state_[p] = 2;
        else if (reqs_[p].handle != nullptr) state_[p] = 1;
      }
      if (state_[p] != 1) continue;
      bool done = false;
      size_t got = 0;
      const bool ok = Mesh::test(reqs_[p], &done, &got).ok();
      if (!ok || done) state_[p] = 2;
      if (ok && done && got == sizeof(Notice)) from = p;
    }
  }
  if (from < 0) return kOk;
  Notice& m = in_[from];
  m.text[sizeof(m.text) - 1] = '\0';
  // A mismatch is the caller's error on every rank; anything else is a
  // failure elsewhere.
  return MC_ERROR(m.code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError,
                  "rank %d: rank %d failed an operation of this communicator: %s", rank_, from, m.text);
}

}  // namespace meshccl
