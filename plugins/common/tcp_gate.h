// The listening side of a nonce-checked TCP connection, shared by the socket
// and ucx transports (their data socket / control socket).
//
// A listener accepts every connection that arrives (at most kMaxPending
// unidentified ones; the oldest is refused beyond that) and reads from each
// a hello {magic, nonce}. The first that presents this listener's nonce is
// its sender: the others are refused, and the listening socket is closed, so
// later connection attempts are refused by the kernel instead of queueing
// behind a socket nobody reads. Any other connection (wrong or short hello,
// closed early, an error) is refused: closed, and logged at WARN as
// "<who>: refused connection from <address>: <why>".
#ifndef MESHCCL_PLUGINS_COMMON_TCP_GATE_H_
#define MESHCCL_PLUGINS_COMMON_TCP_GATE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshccl/transport.h"

namespace meshccl::plugin {

// What a connecting sender writes first.
struct GateHello {
  uint64_t magic;
  uint64_t nonce;
};

class TcpGate {
 public:
  static constexpr size_t kMaxPending = 16;  // also the listening socket's backlog

  TcpGate() = default;
  ~TcpGate() { close_all(); }
  TcpGate(const TcpGate&) = delete;
  TcpGate& operator=(const TcpGate&) = delete;

  // Takes the listening socket `listen_fd` (non-blocking); `who` names the
  // transport in logs.
  void open(const meshccl_transport_host_v1_t* host, const char* who, int listen_fd, uint64_t magic, uint64_t nonce);

  // Accepts what waits and reads hellos, without blocking. *fd is the
  // identified sender's connection (now the caller's) or -1 when none yet;
  // *peer its address. An error only when accept() itself fails.
  meshccl_tresult_t poll(int* fd, std::string* peer);

  // Closes the pending connections and the listening socket.
  void close_all();

  uint64_t nonce() const { return nonce_; }
  bool listening() const { return listen_fd_ >= 0; }
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    int fd = -1;
    uint32_t got = 0;
    GateHello hello{};
    std::string peer;
  };
  void refuse(size_t i, const char* why);
  long identify();

  const meshccl_transport_host_v1_t* host_ = nullptr;
  const char* who_ = "";
  int listen_fd_ = -1;
  uint64_t magic_ = 0;
  uint64_t nonce_ = 0;
  std::vector<Pending> pending_;
};

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_TCP_GATE_H_
