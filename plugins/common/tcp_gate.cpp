#include "plugins/common/tcp_gate.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <utility>

#include "plugins/common/plugin_util.h"
#include "plugins/common/socket_iface.h"

namespace meshccl::plugin {

void TcpGate::open(const meshccl_transport_host_v1_t* host, const char* who, int listen_fd, uint64_t magic,
                   uint64_t nonce) {
  close_all();
  host_ = host;
  who_ = who;
  listen_fd_ = listen_fd;
  magic_ = magic;
  nonce_ = nonce;
}

void TcpGate::refuse(size_t i, const char* why) {
  MPLUG_WARN(host_, "%s: refused connection from %s: %s", who_, pending_[i].peer.c_str(), why);
  ::close(pending_[i].fd);
  pending_.erase(pending_.begin() + static_cast<long>(i));
}

// Reads the hello of every pending connection; the index of the first that
// presented this listener's nonce, or -1.
long TcpGate::identify() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    ssize_t n = recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(GateHello) - p.got, MSG_DONTWAIT);
    if (n == 0) {
      refuse(i, "closed before identifying itself");
      continue;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ++i;
      else refuse(i, std::strerror(errno));
      continue;
    }
    p.got += static_cast<uint32_t>(n);
    if (p.got < sizeof(GateHello)) continue;  // read the rest right away
    if (p.hello.magic != magic_ || p.hello.nonce != nonce_) {
      refuse(i, "it did not present this listener's nonce");
      continue;
    }
    return static_cast<long>(i);
  }
  return -1;
}

meshccl_tresult_t TcpGate::poll(int* fd, std::string* peer) {
  *fd = -1;
  if (listen_fd_ < 0) return MESHCCL_T_SUCCESS;
  for (;;) {
    sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    int c = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return sys_fail(host_, who_, "accept()");
    }
    if (pending_.size() >= kMaxPending) refuse(0, "too many unidentified connections");
    Pending p;
    p.fd = c;
    p.peer = socket::addr_to_string(reinterpret_cast<sockaddr*>(&sa));
    pending_.push_back(std::move(p));
  }
  long i = identify();
  if (i < 0) return MESHCCL_T_SUCCESS;  // not yet
  *fd = pending_[static_cast<size_t>(i)].fd;
  *peer = pending_[static_cast<size_t>(i)].peer;
  pending_.erase(pending_.begin() + i);
  while (!pending_.empty()) refuse(0, "the listener already has its sender");
  // One sender per listener: later connection attempts are refused by the
  // kernel instead of queueing up behind a socket nobody reads.
  ::close(listen_fd_);
  listen_fd_ = -1;
  return MESHCCL_T_SUCCESS;
}

void TcpGate::close_all() {
  for (Pending& p : pending_) ::close(p.fd);
  pending_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

TcpDial& TcpDial::operator=(TcpDial&& o) noexcept {
  if (this != &o) {
    close();
    host_ = o.host_;
    who_ = o.who_;
    to_ = o.to_;
    len_ = o.len_;
    peer_ = std::move(o.peer_);
    hello_ = o.hello_;
    fd_ = std::exchange(o.fd_, -1);
    connected_ = o.connected_;
    sent_ = o.sent_;
    dialed_ns_ = o.dialed_ns_;
  }
  return *this;
}

meshccl_tresult_t TcpDial::start(const meshccl_transport_host_v1_t* host, const char* who, const sockaddr_storage& to,
                                 socklen_t len, const std::string& peer, GateHello hello) {
  close();
  host_ = host;
  who_ = who;
  to_ = to;
  len_ = len;
  peer_ = peer;
  hello_ = hello;
  return dial();
}

meshccl_tresult_t TcpDial::dial() {
  close();
  fd_ = ::socket(to_.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return sys_fail(host_, who_, "socket()");
  socket::tune_tcp(fd_);
  dialed_ns_ = now_ns();
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&to_), len_) == 0) {
    connected_ = true;
  } else if (errno != EINPROGRESS) {
    int err = errno;
    return fail(err == ECONNREFUSED ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
  }
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t TcpDial::fail(meshccl_tresult_t r, const char* why) {
  MPLUG_WARN(host_, "%s: connecting to %s failed: %s", who_, peer_.c_str(), why);
  close();
  return r;
}

meshccl_tresult_t TcpDial::poll(int* fd) {
  *fd = -1;
  if (fd_ < 0) return fail(MESHCCL_T_SYSTEM_ERROR, "the connection was closed");
  if (!connected_) {
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) {
      if (now_ns() - dialed_ns_ < kRedialNs) return MESHCCL_T_SUCCESS;  // not yet
      MPLUG_INFO(host_, "%s: no answer from %s for %" PRIu64 " ms; connecting again", who_, peer_.c_str(),
                 kRedialNs / 1'000'000);
      return dial();
    }
    int err = 0;
    socklen_t elen = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) err = errno;
    if (err != 0)
      return fail(err == ECONNREFUSED ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
    connected_ = true;
  }
  while (sent_ < sizeof(hello_)) {
    ssize_t w =
        send(fd_, reinterpret_cast<const char*>(&hello_) + sent_, sizeof(hello_) - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return MESHCCL_T_SUCCESS;
    if (w < 0) return fail(MESHCCL_T_REMOTE_ERROR, std::strerror(errno));
    sent_ += static_cast<uint32_t>(w);
  }
  *fd = std::exchange(fd_, -1);
  connected_ = false;
  sent_ = 0;
  return MESHCCL_T_SUCCESS;
}

void TcpDial::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connected_ = false;
  sent_ = 0;
}

}  // namespace meshccl::plugin
