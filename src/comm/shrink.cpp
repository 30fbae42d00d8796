// ncclCommShrink: the survivors of a communicator build a child without the
// excluded ranks, with no new unique id.
//
// The excluded ranks may be dead, so the survivors cannot use the parent's
// ring allgather (every step of it passes through every rank). Instead each
// survivor sends one record straight to every other survivor over the
// parent's bootstrap and receives theirs, on a tag reserved for shrinks:
//
//   record = { magic, shrink number, hash of the exclude list, child's listening
//              address, the transport asked for the child (its config's netName) }
//
// Every wait is bounded by MESHCCL_TIMEOUT (the bootstrap's deadlines); a
// survivor that never sends its record (it died too, or it was not told to
// shrink) fails the call with ncclRemoteError naming it, and survivors that
// were given different exclude lists fail with ncclInvalidUsage on every
// survivor. From the records every survivor derives the same child: members
// in parent order, a secret derived from the parent's, and the parent's
// system graph restricted to the members, then the ordinary setup
// (connections, shared region, engine, tuning) over the child's own bootstrap.
#include <algorithm>
#include <cstring>

#include "comm/comm.h"
#include "transport/select.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

constexpr uint32_t kShrinkMagic = 0x53484b31;     // "SHK1"
constexpr uint32_t kShrinkTagBase = 0x40000000u;  // below the bootstrap's collective tags

struct Record {
  uint32_t magic;
  uint32_t seq;
  uint64_t exclude_hash;
  sockaddr_storage addr;
  TransportRecord transport;  // for the child (its config's netName)
  uint32_t bad_transport;     // this rank could not make its transport record
};

// Restores the bootstrap's abort flag when the exchange ends.
class AbortSwap {
 public:
  AbortSwap(Bootstrap* b, AbortFlag during) : b_(b), saved_(b->abort_flag()) { b_->set_abort_flag(during); }
  ~AbortSwap() { b_->set_abort_flag(saved_); }
  AbortSwap(const AbortSwap&) = delete;
  AbortSwap& operator=(const AbortSwap&) = delete;

 private:
  Bootstrap* b_;
  AbortFlag saved_;
};

}  // namespace

// ncclCommShrink's exclude list: in range, no duplicates, not the caller.
Status shrink_exclude_list(const ncclComm* comm, const int* list, int count, std::vector<int>* out) {
  if (count < 0 || (count > 0 && list == nullptr))
    return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : invalid exclude list (%d ranks at %p)", count,
                    static_cast<const void*>(list));
  out->assign(list, list + count);
  std::sort(out->begin(), out->end());
  for (size_t i = 0; i < out->size(); ++i) {
    int r = (*out)[i];
    if (r < 0 || r >= comm->nranks)
      return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : excluded rank %d out of range (nranks %d)", r,
                      comm->nranks);
    if (i > 0 && (*out)[i - 1] == r) return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : rank %d excluded twice", r);
    if (r == comm->rank)
      return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : rank %d excludes itself (excluded ranks must not call it)",
                      r);
  }
  if (static_cast<int>(out->size()) >= comm->nranks)
    return MC_ERROR(ncclInvalidArgument, "ncclCommShrink : every rank excluded");
  return kOk;
}

Status comm_shrink(ncclComm* parent, const std::vector<int>& excluded, bool abort_parent, ncclComm* child) {
  MC_TRY(settings_refresh());
  ScopedTimeout timeout(child->config.timeout_s);
  if (!child_priority_ok(parent, child))
    return MC_ERROR(ncclInvalidArgument,
                    "ncclCommShrink : the config asks for %s scheduling in a child of a communicator with %s: a "
                    "shrink child keeps its parent's (meshcclConfig_t.priority is read at ncclCommInitRankConfig)",
                    priority_on(parent) ? "FIFO" : "priority", priority_on(parent) ? "priority" : "FIFO");
  const int n = parent->nranks;
  if (abort_parent) {
    // NCCL_SHRINK_ABORT: end what is in flight on the parent; it stays
    // failed and the caller frees it afterwards.
    parent->abort_flag.store(true);
    (void)comm_wait_idle(parent, Deadline::after(parent->timeout_s()));
    parent->state.store(ncclComm::State::Failed);
  } else {
    if (parent->state.load() == ncclComm::State::Failed || (parent->engine && !parent->engine->fatal().ok()))
      return MC_ERROR(ncclInvalidUsage,
                      "ncclCommShrink : rank %d: the communicator has failed; shrink it with NCCL_SHRINK_ABORT",
                      parent->rank);
    if (!comm_wait_idle(parent, Deadline::after(parent->timeout_s())))
      return MC_ERROR(ncclRemoteError, "ncclCommShrink : operations still pending after MESHCCL_TIMEOUT");
  }
  std::vector<int> members;
  for (int r = 0; r < n; ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) members.push_back(r);
  const int cn = static_cast<int>(members.size());
  const int crank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank) - members.begin());
  const uint32_t seq = parent->shrink_seq++;
  const uint32_t tag = kShrinkTagBase | (seq & 0x0fffffffu);

  Socket listener;
  SockAddr addr;
  MC_TRY(parent->bootstrap->new_listener(&listener, &addr));
  Record me{};
  me.magic = kShrinkMagic;
  me.seq = seq;
  me.exclude_hash = hash64(excluded.data(), excluded.size() * sizeof(int), 0x5a41 + static_cast<uint64_t>(n));
  std::memcpy(&me.addr, &addr.ss, sizeof(addr.ss));
  const Status transport_made = transport_request(child->config.net_name, &me.transport);
  me.bad_transport = transport_made.ok() ? 0 : 1;
  std::vector<Record> all(cn);
  all[crank] = me;
  {
    // The parent's flag is set after an abort; the child's flag (which the
    // caller may set through ncclCommAbort on the new handle) ends the wait.
    AbortSwap swap(parent->bootstrap.get(), &child->abort_flag);
    for (int i = 0; i < cn; ++i) {
      if (i == crank) continue;
      Status s = parent->bootstrap->send(members[i], tag, &me, sizeof(me));
      if (!s.ok())
        return MC_ERROR(ncclRemoteError, "ncclCommShrink : rank %d could not reach surviving rank %d", parent->rank,
                        members[i]);
    }
    for (int i = 0; i < cn; ++i) {
      if (i == crank) continue;
      Status s = parent->bootstrap->recv(members[i], tag, &all[i], sizeof(Record));
      if (!s.ok())
        return MC_ERROR(
            s.code() == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError,
            "ncclCommShrink : rank %d: surviving rank %d did not join the shrink (it closed its connection or "
            "MESHCCL_TIMEOUT passed: dead too, or told to exclude other ranks?)",
            parent->rank, members[i]);
    }
  }
  for (int i = 0; i < cn; ++i) {
    if (all[i].magic != kShrinkMagic || all[i].seq != seq)
      return MC_ERROR(ncclInvalidUsage, "ncclCommShrink : rank %d sent a malformed shrink record (shrink #%u here)",
                      members[i], seq);
    if (all[i].bad_transport != 0) {
      MC_TRY(transport_made);
      return MC_ERROR(ncclInvalidUsage,
                      "ncclCommShrink : rank %d could not make its transport record for the child (its log says why)",
                      members[i]);
    }
    if (all[i].exclude_hash != me.exclude_hash)
      return MC_ERROR(
          ncclInvalidUsage,
          "ncclCommShrink : rank %d was given a different exclude list than rank %d (this rank, %d excluded)",
          members[i], parent->rank, static_cast<int>(excluded.size()));
  }

  child->rank = crank;
  child->nranks = cn;
  child->local_ranks = parent->local_ranks;
  child->parent_tune = parent->tune;
  child->settings = parent->settings;
  uint8_t secret[kSecretBytes];
  derive_key(parent->bootstrap->key(), "meshccl shrink", seq, me.exclude_hash, secret);
  child->comm_hash = key_id(secret);
  std::vector<SockAddr> addrs(cn);
  child->peers.resize(cn);
  child->topo = parent->topo.subset(members);
  for (int i = 0; i < cn; ++i) {
    std::memcpy(&addrs[i].ss, &all[i].addr, sizeof(sockaddr_storage));
    addrs[i].len = addrs[i].ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    child->peers[i] = parent->peers[members[i]];
    child->peers[i].rank = i;
    MC_TRY(apply_transport_request(all[i].transport, members[i], &child->peers[i]));
    if (parent->checks) child->peers[i].flags |= kPeerChecks;
    std::memcpy(&child->peers[i].bootstrap_addr, &all[i].addr, sizeof(sockaddr_storage));
  }
  child->bootstrap =
      std::make_unique<Bootstrap>(crank, cn, std::move(listener), std::move(addrs), secret, &child->abort_flag);
  MC_INFO(kInit, "ncclCommShrink comm %p rank %d excluded %d%s -> rank %d of %d", static_cast<void*>(parent),
          parent->rank, static_cast<int>(excluded.size()), abort_parent ? " (parent aborted)" : "", crank, cn);
  return comm_finish_setup(child);
}

}  // namespace meshccl
