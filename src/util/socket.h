// Blocking TCP helpers with deadlines, for the bootstrap (not the data path).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <string>

#include "util/status.h"
#include "util/wait.h"

namespace meshccl {

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string str() const;  // "1.2.3.4:5678" or "[::1]:5678"
  int port() const;
  void set_port(int port);
};

// Parses "host:port", "[v6]:port" or "ipv4:port"; resolves host names.
Status parse_host_port(const std::string& s, SockAddr* out);
// The address to listen on, chosen by the same rules as the socket
// transport (plugins/common/socket_iface.h: MESHCCL_SOCKET_IFNAME,
// MESHCCL_SOCKET_FAMILY). Port 0.
Status pick_interface(SockAddr* out, std::string* ifname);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

// An abort flag polled during waits; may be null.
using AbortFlag = const std::atomic<bool>*;

Status socket_listen(const SockAddr& at, Socket* out, SockAddr* bound);
Status socket_accept(const Socket& listener, Deadline dl, AbortFlag abort, Socket* out);
// Retries refused/unreachable connections until the deadline.
Status socket_connect(const SockAddr& to, Deadline dl, AbortFlag abort, Socket* out);
Status socket_send_all(const Socket& s, const void* data, size_t size, Deadline dl, AbortFlag abort);
Status socket_recv_all(const Socket& s, void* data, size_t size, Deadline dl, AbortFlag abort);
// True when the peer has closed (EOF or error) — a non-blocking check.
bool socket_peer_closed(const Socket& s);

}  // namespace meshccl
