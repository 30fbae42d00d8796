#include "plugins/common/tcp_gate.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace meshccl::plugin
