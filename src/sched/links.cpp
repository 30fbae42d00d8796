#include "sched/links.h"

#include <algorithm>

namespace meshccl {

Status Links::isend(int peer, const void* src, size_t bytes, uint64_t tag, Request* r) {
  MC_TRY(mesh_->isend(peer, src, bytes, tag, r));
  if (r->handle != nullptr) inflight_[peer] += bytes;
  return kOk;
}

Status Links::irecv(int peer, void* dst, size_t bytes, uint64_t tag, Request* r) {
  MC_TRY(mesh_->irecv(peer, dst, bytes, tag, r));
  if (r->handle != nullptr) inflight_[peer] += bytes;
  return kOk;
}

Status Links::test(int peer, size_t bytes, Request& r, bool* done, size_t* got) {
  MC_TRY(Mesh::test(r, done, got));
  if (*done) inflight_[peer] -= std::min(inflight_[peer], bytes);
  return kOk;
}

void Links::self_post(bool is_send, uint64_t tag, SelfEntry e) {
  auto& mine = is_send ? self_sends_ : self_recvs_;
  auto& other = is_send ? self_recvs_ : self_sends_;
  auto it = other.find(tag);
  if (it == other.end() || it->second.empty()) {
    mine[tag].push_back(e);
    return;
  }
  SelfEntry o = it->second.front();
  it->second.erase(it->second.begin());
  if (it->second.empty()) other.erase(it);
  const SelfEntry& snd = is_send ? e : o;
  const SelfEntry& rcv = is_send ? o : e;
  size_t n = std::min(snd.bytes, rcv.bytes);
  exec_->copy(rcv.dst, snd.src, n);
  snd.run->complete_step(snd.step);
  rcv.run->complete_step(rcv.step);
}

}  // namespace meshccl
