#include "sched/notices.h"

#include <algorithm>
#include <cstdio>

#include "base/tag.h"
#include "util/log.h"
#include "util/wait.h"

namespace meshccl {

void Notices::send(Status s, int first, bool suspect) {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (sent_ || n <= 1) return;
  sent_ = true;
  LastErrorScope keep;  // a notice that cannot be delivered is not the error
  out_.code = s.code();
  out_.first = first;
  out_.suspect = suspect ? 1 : 0;
  // A failure relayed from a peer's notice passes on that notice's text, so
  // messages do not nest once per hop.
  std::snprintf(out_.text, sizeof(out_.text), "%s", relay_.empty() ? thread_last_error().c_str() : relay_.c_str());
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

Status Notices::poll(int* first, bool* known) {
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (n <= 1) return kOk;
  post_receives();
  int from = -1;
  for (int p = 0; p < n && from < 0; ++p)
    if (state_[p] == 3) from = p;
  if (from < 0) return kOk;
  const Notice& m = in_[from];
  *first = resolve(from, known);
  relay_ = m.text;
  // A mismatch is the caller's error on every rank; anything else is a
  // failure elsewhere.
  return MC_ERROR(m.code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError,
                  "rank %d: rank %d failed an operation of this communicator: %s", rank_, from, m.text);
}

void Notices::post_receives() {
  const int n = mesh_->size();
  if (in_.empty()) {
    in_.resize(n);
    reqs_.resize(n);
    state_.assign(n, 0);
    state_[rank_] = 2;
  }
  LastErrorScope keep;  // a peer that is gone is reported by liveness, not here
  for (int p = 0; p < n; ++p) {
    if (state_[p] == 0) {
      if (!mesh_->irecv(p, &in_[p], sizeof(Notice), tag::kNotice, &reqs_[p]).ok()) state_[p] = 2;
      else if (reqs_[p].handle != nullptr) state_[p] = 1;
    }
    if (state_[p] != 1) continue;
    bool done = false;
    size_t got = 0;
    const bool ok = Mesh::test(reqs_[p], &done, &got).ok();
    if (!ok || done) state_[p] = ok && got == sizeof(Notice) ? 3 : 2;
    if (state_[p] == 3) in_[p].text[sizeof(in_[p].text) - 1] = '\0';
  }
}

int Notices::resolve(int start, bool* known) const {
  const int n = static_cast<int>(state_.size());
  *known = false;
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int f = start, hops = 0; hops < n && f >= 0 && f < n && f != rank_ && seen[f] == 0; ++hops) {
    if (state_[f] != 3) return f;  // silent: stopped, dead or unreachable
    const Notice& m = in_[f];
    if (m.first < 0 || m.first >= n) break;
    if (m.suspect == 0) {
      *known = true;
      return m.first;
    }
    seen[f] = 1;
    f = m.first;
  }
  // The suspicions went round in a circle (live ranks waiting for each
  // other): the rank that failed is one that said nothing.
  for (int p = 0; p < n; ++p)
    if (p != rank_ && state_[p] != 3) return p;
  return start;
}

void Probes::poll() {
  constexpr int kMaxTaken = 64;  // per peer and call: bounded even against a flood
  const int n = mesh_ != nullptr ? mesh_->size() : 0;
  if (peers_.empty()) peers_.resize(static_cast<size_t>(n));
  LastErrorScope keep;  // a peer that is gone is reported by liveness, not here
  for (int p = 0; p < n; ++p) {
    Peer& q = peers_[static_cast<size_t>(p)];
    if (p == rank_ || q.broken) continue;
    bool done = false;
    if (q.send_busy && (!Mesh::test(q.send, &done, nullptr).ok() || done)) q.send_busy = false;
    // Every probe that has arrived, the last one kept: a receive stays posted
    // for the next.
    for (int taken = 0; taken < kMaxTaken && !q.broken; ++taken) {
      if (!q.recv_posted) {
        if (!mesh_->irecv(p, &q.in, sizeof(Probe), tag::kProbe, &q.recv).ok()) q.broken = true;
        else q.recv_posted = q.recv.handle != nullptr;
        if (!q.recv_posted) break;
      }
      done = false;
      size_t got = 0;
      if (!Mesh::test(q.recv, &done, &got).ok()) {
        q.broken = true;
      } else if (!done) {
        break;
      } else {
        q.recv_posted = false;
        if (got == sizeof(Probe)) q.last = q.in, q.heard = true;
      }
    }
  }
}

void Probes::announce(uint64_t seq, const OpSignature& sig) {
  poll();
  if (seq == announced_) return;
  announced_ = seq;
  LastErrorScope keep;
  for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
    Peer& q = peers_[static_cast<size_t>(p)];
    if (p == rank_ || q.broken || q.send_busy) continue;
    q.out = Probe{seq, sig};
    if (!mesh_->isend(p, &q.out, sizeof(Probe), tag::kProbe, &q.send).ok()) q.broken = true;
    else q.send_busy = q.send.handle != nullptr;
  }
}

bool Probes::differs(uint64_t seq, const OpSignature& sig, int* peer, OpSignature* theirs) {
  poll();
  for (int p = 0; p < static_cast<int>(peers_.size()); ++p) {
    const Peer& q = peers_[static_cast<size_t>(p)];
    if (!q.heard || q.last.seq != seq || q.last.sig == sig) continue;
    *peer = p;
    *theirs = q.last.sig;
    return true;
  }
  return false;
}

}  // namespace meshccl
