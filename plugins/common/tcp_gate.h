// Both sides of a nonce-checked TCP connection, shared by the socket and ucx
// transports (their data socket / control socket): TcpGate listens, TcpDial
// connects.
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

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
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

// The connecting side: a non-blocking connect that then writes the hello.
// A SYN lost while a link is down is sent again by the kernel only after 1,
// then 2, 4, ... s, so a 3 s outage could hold a connect for 7 s; a connect
// not answered within kRedialNs starts again with a new socket (a new SYN).
class TcpDial {
 public:
  static constexpr uint64_t kRedialNs = 1'000'000'000;

  TcpDial() = default;
  ~TcpDial() { close(); }
  TcpDial(TcpDial&& o) noexcept { *this = std::move(o); }
  TcpDial& operator=(TcpDial&& o) noexcept;
  TcpDial(const TcpDial&) = delete;
  TcpDial& operator=(const TcpDial&) = delete;

  // Starts connecting to `to` (`peer` names it in logs, `who` the
  // transport). An error, logged as "<who>: connecting to <peer> failed:
  // <why>", when connect() fails at once.
  meshccl_tresult_t start(const meshccl_transport_host_v1_t* host, const char* who, const sockaddr_storage& to,
                          socklen_t len, const std::string& peer, GateHello hello);
  // Advances without blocking. *fd is the connection, the hello written
  // (now the caller's), or -1 while under way. An error (logged) when the
  // connection failed; the dial is then closed.
  meshccl_tresult_t poll(int* fd);
  void close();

 private:
  meshccl_tresult_t dial();
  meshccl_tresult_t fail(meshccl_tresult_t r, const char* why);

  const meshccl_transport_host_v1_t* host_ = nullptr;
  const char* who_ = "";
  sockaddr_storage to_{};
  socklen_t len_ = 0;
  std::string peer_;
  GateHello hello_{};
  int fd_ = -1;
  bool connected_ = false;
  uint32_t sent_ = 0;       // bytes of the hello written
  uint64_t dialed_ns_ = 0;  // when the current connect() was issued
};

// The dials of a context under way, one per listener handle: a host polls
// connect until it says done.
template <class Handle>
struct Dialing {
  Handle handle;
  TcpDial dial;
};

// Starts (first call) or advances the dial to `h`'s listener; *fd as
// TcpDial::poll. A dial leaves `list` once it connected or failed.
template <class Handle>
meshccl_tresult_t dial_handle(std::vector<Dialing<Handle>>& list, const Handle& h,
                              const meshccl_transport_host_v1_t* host, const char* who, const sockaddr_storage& to,
                              socklen_t len, const std::string& peer, GateHello hello, int* fd) {
  *fd = -1;
  size_t i = 0;
  while (i < list.size() && std::memcmp(&list[i].handle, &h, sizeof(h)) != 0) ++i;
  if (i == list.size()) {
    Dialing<Handle> d{h, {}};
    if (meshccl_tresult_t r = d.dial.start(host, who, to, len, peer, hello); r != MESHCCL_T_SUCCESS) return r;
    list.push_back(std::move(d));
  }
  meshccl_tresult_t r = list[i].dial.poll(fd);
  if (r != MESHCCL_T_SUCCESS || *fd >= 0) list.erase(list.begin() + static_cast<long>(i));
  return r;
}

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_TCP_GATE_H_
