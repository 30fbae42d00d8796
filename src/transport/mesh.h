// The connections of one communicator: for every peer, a send and a receive
// connection over the transport chosen for that pair (shm between processes
// of one host, a network transport otherwise, MESHCCL_TRANSPORT to force).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/identity.h"
#include "transport/registry.h"

namespace meshccl {

struct Request {
  Transport* transport = nullptr;
  void* handle = nullptr;
  const bool* closed = nullptr;  // its connection was closed: the handle is gone
};

class Mesh {
 public:
  ~Mesh();
  // Collective over the communicator: builds every connection, in bounded time.
  static Status connect_all(Bootstrap& bootstrap, const std::vector<PeerInfo>& peers, const std::atomic<bool>* abort,
                            std::unique_ptr<Mesh>* out);

  // r->handle == nullptr after success means "busy, retry".
  Status isend(int peer, const void* data, size_t size, uint64_t tag, Request* r);
  Status irecv(int peer, void* data, size_t size, uint64_t tag, Request* r);
  static Status test(Request& r, bool* done, size_t* size);
  // Whether a message from peer with tag has arrived and no receive took it
  // yet (the transport's probe): the next irecv from peer with tag takes it.
  Status probe(int peer, uint64_t tag, bool* found);
  const char* transport_name(int peer) const;
  // The declared properties of the transport to peer (nullptr for self).
  const meshccl_transport_props_v1_t* props(int peer) const;
  // The transport connect_all uses between ranks a and b: the same on both
  // sides and on every rank, as it depends only on the pair and the settings.
  static std::string transport_for(const std::vector<PeerInfo>& peers, int a, int b);
  // The transport of the link to peer (nullptr for self).
  Transport* transport(int peer) const { return links_[peer].transport; }
  int size() const { return static_cast<int>(links_.size()); }  // ranks, this one included
  // Closes one direction of the connection with peer before the mesh goes
  // (its communicator failed): the transport withdraws what it still holds
  // there, requests on it fail without touching their handles, and isend,
  // irecv and probe on it fail.
  void close(int peer, bool send);

 private:
  Mesh() = default;
  struct Link {
    Transport* transport = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
    bool send_closed = false;
    bool recv_closed = false;
  };
  Status closed_error(int peer, bool send) const;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<Link> links_;
};

}  // namespace meshccl
