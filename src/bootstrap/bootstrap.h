// Per-communicator out-of-band channel over TCP: tagged messages between any
// two ranks (connections made on first use and kept), allgather and barrier.
// Used at init, split and finalize, never on the data path. One thread at a
// time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "bootstrap/unique_id.h"
#include "util/socket.h"
#include "util/status.h"

namespace meshccl {

// The rank a connection's greeting (its first bytes) names, or -1 unless it
// is a whole greeting from a rank in [0, nranks) to rank `me` whose proof
// (HMAC-SHA256 under the communicator's key over sender, receiver and a
// fresh nonce) holds. The key itself is never sent.
int greeting_sender(const void* bytes, size_t size, const uint8_t key[kSecretBytes], int nranks, int me);
// The greeting rank `from` sends when it connects to rank `to`
// (greeting_size() bytes).
size_t greeting_size();
void make_greeting(const uint8_t key[kSecretBytes], int from, int to, void* out);

class Bootstrap {
 public:
  // listener: this rank's listening socket (its address is in peers[rank]).
  // key: this communicator's (root_exchange, derive_key).
  Bootstrap(int rank, int nranks, Socket listener, std::vector<SockAddr> peers, const uint8_t key[kSecretBytes],
            AbortFlag abort);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  Status send(int peer, uint32_t tag, const void* data, size_t size);
  // Receives exactly `size` bytes sent with the same tag by peer.
  Status recv(int peer, uint32_t tag, void* data, size_t size);
  // all holds nranks blocks of `block` bytes; this rank's block is filled.
  Status allgather(void* all, size_t block);
  Status barrier();
  // Non-blocking: a connection with peer exists and the peer closed it.
  bool peer_closed(int peer) const;

  // A listening socket on the same interface as this bootstrap (for a child
  // communicator of a split).
  Status new_listener(Socket* out, SockAddr* addr) const;
  const uint8_t* key() const { return key_; }
  // The abort flag its waits poll; ncclCommShrink swaps it while the
  // survivors of an aborted communicator agree (waits stay bounded by
  // MESHCCL_TIMEOUT).
  AbortFlag abort_flag() const { return abort_; }
  void set_abort_flag(AbortFlag abort) { abort_ = abort; }

 private:
  Status send_conn(int peer, const Socket** out);
  Status recv_conn(int peer, const Socket** out, Deadline dl);

  int rank_;
  int nranks_;
  Socket listener_;
  std::vector<SockAddr> peers_;
  uint8_t key_[kSecretBytes];
  AbortFlag abort_;
  std::vector<Socket> send_;
  std::vector<Socket> recv_;
  // Accepted connections whose greeting is still arriving: read together, so
  // idle or slow connections from strangers cannot hold up the real peers.
  struct Pending {
    Socket sock;
    std::vector<unsigned char> got;
    double deadline_us;
  };
  std::vector<Pending> pending_;
  std::map<std::pair<int, uint32_t>, std::deque<std::vector<char>>> unexpected_;
  uint32_t collective_tag_ = 0x80000000u;  // allgather/barrier rounds
};

}  // namespace meshccl
