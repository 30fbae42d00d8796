#include "transport/mesh.h"

#include <array>
#include <cstring>

#include "transport/select.h"
#include "util/log.h"
#include "util/param.h"
#include "util/wait.h"

namespace meshccl {

namespace {
constexpr uint32_t kTagHandle = 0x7e57a000u;
}

Mesh::~Mesh() {
  // Receives first, on every link: a transport's close_send may wait for
  // sends its peer still has to take or refuse, and the peer refuses them
  // when it closes its receive side. Closing a link's send before the other
  // links' receives would let two ranks each wait in close_send for the
  // other's close_recv until MESHCCL_TIMEOUT.
  for (Link& l : links_)
    if (l.transport != nullptr && !l.recv_closed) l.transport->close_recv(l.recv);
  for (Link& l : links_)
    if (l.transport != nullptr && !l.send_closed) l.transport->close_send(l.send);
  links_.clear();
  transports_.clear();  // finalizes the plugin contexts
}

const char* Mesh::transport_name(int peer) const {
  const Link& l = links_[peer];
  return l.transport ? l.transport->name() : "self";
}

const meshccl_transport_props_v1_t* Mesh::props(int peer) const {
  const Link& l = links_[peer];
  return l.transport ? &l.transport->props() : nullptr;
}

std::string Mesh::transport_for(const std::vector<PeerInfo>& peers, int a, int b) {
  return choose_transport(peers, a, b);
}

Status Mesh::connect_all(Bootstrap& bs, const std::vector<PeerInfo>& peers, const std::atomic<bool>* abort,
                         std::unique_ptr<Mesh>* out) {
  const int n = bs.nranks(), me = bs.rank();
  std::unique_ptr<Mesh> mesh(new Mesh());
  mesh->links_.resize(n);
  MC_TRY(check_transport_request(peers, me));
  if (n == 1) {
    *out = std::move(mesh);
    return kOk;
  }

  // One context per transport this rank's pairs use.
  auto get = [&](const std::string& name, Transport** out) -> Status {
    for (const std::unique_ptr<Transport>& t : mesh->transports_) {
      if (name == t->name()) {
        *out = t.get();
        return kOk;
      }
    }
    const meshccl_transport_v1_t* api = nullptr;
    MC_TRY(find_transport(name, &api));
    std::unique_ptr<Transport> t;
    MC_TRY(Transport::open(api, me, n, &t));
    *out = t.get();
    mesh->transports_.push_back(std::move(t));
    return kOk;
  };
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const std::string name = transport_for(peers, me, p);
    if (name.empty())
      return MC_ERROR(ncclInvalidUsage,
                      "rank %d (%s) and rank %d (%s) have no transport in common that may connect them: rank %d has "
                      "%s, rank %d has %s",
                      me, peers[me].host_id, p, peers[p].host_id, me, transports_of(peers[me]).c_str(), p,
                      transports_of(peers[p]).c_str());
    const int scope = pair_scope(peers, me, p, name);
    if (!scope_allows(scope, peers[me], peers[p]))
      return MC_ERROR(ncclInvalidUsage, "transport %s cannot connect rank %d (%s) and rank %d (%s): %s", name.c_str(),
                      me, peers[me].host_id, p, peers[p].host_id,
                      scope == MESHCCL_SCOPE_HOST ? "a node-scope transport, and the ranks run on different machines"
                                                  : "its scope is not known on both ranks (it did not load)");
    MC_TRY(get(name, &mesh->links_[p].transport));
  }

  // Receive side listens for each peer and ships the handle; send side
  // connects with the handle it got.
  std::vector<void*> listens(n, nullptr);
  std::vector<std::array<char, MESHCCL_TRANSPORT_HANDLE_BYTES>> mine(n), theirs(n);
  Status st = kOk;
  for (int p = 0; p < n && st.ok(); ++p) {
    if (p == me) continue;
    std::memset(mine[p].data(), 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
    st = mesh->links_[p].transport->listen(mine[p].data(), &listens[p]);
  }
  for (int k = 1; k < n && st.ok(); ++k) {
    int to = (me + k) % n, from = (me - k + n) % n;
    st = bs.send(to, kTagHandle, mine[to].data(), MESHCCL_TRANSPORT_HANDLE_BYTES);
    if (st.ok()) st = bs.recv(from, kTagHandle, theirs[from].data(), MESHCCL_TRANSPORT_HANDLE_BYTES);
  }
  Deadline dl = Deadline::from_timeout_param();
  Backoff backoff;
  int pending = st.ok() ? 2 * (n - 1) : 0;
  while (st.ok() && pending > 0) {
    bool moved = false;
    for (int p = 0; p < n && st.ok(); ++p) {
      if (p == me) continue;
      Link& l = mesh->links_[p];
      if (l.send == nullptr) {
        st = l.transport->connect(theirs[p].data(), &l.send);
        if (l.send != nullptr) --pending, moved = true;
      }
      if (st.ok() && l.recv == nullptr) {
        st = l.transport->accept(listens[p], &l.recv);
        if (l.recv != nullptr) --pending, moved = true;
      }
    }
    if (!st.ok()) break;
    if (abort != nullptr && abort->load()) st = MC_ERROR(ncclInvalidUsage, "connection setup aborted");
    else if (dl.expired())
      st = MC_ERROR(ncclRemoteError, "rank %d: connections to peers not established within MESHCCL_TIMEOUT", me);
    moved ? backoff.progress() : backoff.idle();
  }
  for (int p = 0; p < n; ++p)
    if (listens[p] != nullptr) mesh->links_[p].transport->close_listen(listens[p]);
  MC_TRY(st);
  for (int p = 0; p < n; ++p)
    if (p != me) MC_INFO(kInit, "rank %d <-> rank %d via %s", me, p, mesh->links_[p].transport->name());
  *out = std::move(mesh);
  return kOk;
}

void Mesh::close(int peer, bool send) {
  Link& l = links_[peer];
  bool& closed = send ? l.send_closed : l.recv_closed;
  void*& comm = send ? l.send : l.recv;
  if (l.transport == nullptr || closed) return;
  closed = true;
  if (send) l.transport->close_send(comm);
  else l.transport->close_recv(comm);
  comm = nullptr;
}

Status Mesh::closed_error(int peer, bool send) const {
  return MC_ERROR(ncclRemoteError, "the connection %s rank %d was closed when this communicator failed",
                  send ? "to" : "from", peer);
}

Status Mesh::test(Request& r, bool* done, size_t* size) {
  if (r.closed != nullptr && *r.closed) {
    *done = true;
    return MC_ERROR(ncclRemoteError, "the connection of a transfer was closed when its communicator failed");
  }
  return r.transport->test(r.handle, done, size);
}

Status Mesh::isend(int peer, const void* data, size_t size, uint64_t tag, Request* r) {
  Link& l = links_[peer];
  r->transport = l.transport;
  r->handle = nullptr;
  r->closed = &l.send_closed;
  if (l.send_closed) return closed_error(peer, true);
  return l.transport->isend(l.send, data, size, tag, &r->handle);
}

Status Mesh::irecv(int peer, void* data, size_t size, uint64_t tag, Request* r) {
  Link& l = links_[peer];
  r->transport = l.transport;
  r->handle = nullptr;
  r->closed = &l.recv_closed;
  if (l.recv_closed) return closed_error(peer, false);
  return l.transport->irecv(l.recv, data, size, tag, &r->handle);
}

Status Mesh::probe(int peer, uint64_t tag, bool* found) {
  Link& l = links_[peer];
  if (l.recv_closed) return closed_error(peer, false);
  return l.transport->probe(l.recv, tag, found);
}

}  // namespace meshccl
