#include "util/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "plugins/common/socket_iface.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

std::string SockAddr::str() const {
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return "<unset>";
  return plugin::socket::addr_to_string(reinterpret_cast<const sockaddr*>(&ss));
}

int SockAddr::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::set_port(int port) {
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
}

Status parse_host_port(const std::string& s, SockAddr* out) {
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return MC_ERROR(ncclInvalidArgument, "malformed address \"%s\" (expected [ipv6]:port)", s.c_str());
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos)
      return MC_ERROR(ncclInvalidArgument, "malformed address \"%s\" (expected host:port)", s.c_str());
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535)
    return MC_ERROR(ncclInvalidArgument, "bad port in address \"%s\"", s.c_str());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return MC_ERROR(ncclSystemError, "cannot resolve \"%s\": %s", host.c_str(), gai_strerror(rc));
  std::memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
  out->len = res->ai_addrlen;
  freeaddrinfo(res);
  out->set_port(static_cast<int>(p));
  return kOk;
}

Status pick_interface(SockAddr* out, std::string* ifname) {
  std::string spec = param_str(Param::SocketIfname);
  std::string fam = param_str(Param::SocketFamily);
  int family = fam == "AF_INET" ? AF_INET : fam == "AF_INET6" ? AF_INET6 : AF_UNSPEC;
  std::vector<plugin::socket::Iface> all = plugin::socket::list_ifaces();
  int i = plugin::socket::pick_iface(all, spec.c_str(), family);
  if (i < 0 && all.empty()) {
    // Listing the interfaces needs a socket: at the descriptor limit that,
    // not the network, is what failed.
    int probe = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (probe < 0 && (errno == EMFILE || errno == ENFILE))
      return MC_ERROR(ncclSystemError, "cannot list network interfaces: %s (out of file descriptors?)",
                      strerror(errno));
    if (probe >= 0) ::close(probe);
  }
  if (i < 0)
    return MC_ERROR(ncclSystemError, "no usable network interface%s%s",
                    spec.empty() ? "" : " matches MESHCCL_SOCKET_IFNAME=", spec.c_str());
  std::memset(&out->ss, 0, sizeof(out->ss));
  std::memcpy(&out->ss, &all[i].addr, all[i].addr_len);
  out->len = all[i].addr_len;
  out->set_port(0);
  if (ifname) *ifname = all[i].name;
  return kOk;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

// Poll one fd for events in slices so an abort flag is noticed promptly.
Status wait_fd(int fd, short events, Deadline dl, AbortFlag abort, const char* what) {
  for (;;) {
    if (abort != nullptr && abort->load(std::memory_order_relaxed))
      return MC_ERROR(ncclInvalidUsage, "%s interrupted: communicator aborted", what);
    double left = dl.seconds_left();
    if (left <= 0)
      return MC_ERROR(ncclRemoteError, "%s timed out after MESHCCL_TIMEOUT=%.0f s", what, timeout_seconds());
    int ms = left > 0.1 ? 100 : static_cast<int>(left * 1000) + 1;
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return kOk;
    if (rc < 0 && errno != EINTR) return MC_ERROR(ncclSystemError, "%s: poll failed: %s", what, strerror(errno));
  }
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Status socket_listen(const SockAddr& at, Socket* out, SockAddr* bound) {
  int fd = ::socket(at.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return MC_ERROR(ncclSystemError, "socket() failed: %s", strerror(errno));
  Socket s(fd);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&at.ss), at.len) != 0)
    return MC_ERROR(ncclSystemError, "bind to %s failed: %s", at.str().c_str(), strerror(errno));
  if (::listen(fd, 1024) != 0) return MC_ERROR(ncclSystemError, "listen failed: %s", strerror(errno));
  if (bound) {
    bound->len = sizeof(bound->ss);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound->ss), &bound->len);
  }
  *out = std::move(s);
  return kOk;
}

Status socket_accept(const Socket& listener, Deadline dl, AbortFlag abort, Socket* out) {
  for (;;) {
    MC_TRY(wait_fd(listener.fd(), POLLIN, dl, abort, "accept"));
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      tune(fd);
      *out = Socket(fd);
      return kOk;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
      return MC_ERROR(ncclSystemError, "accept failed: %s", strerror(errno));
  }
}

// A SYN lost while a link is down is sent again by the kernel only after 1,
// then 2, 4, ... s, so a 3 s outage could hold a connect for 7 s. Each
// attempt waits at most kConnectAttemptS; the next starts with a fresh SYN.
constexpr double kConnectAttemptS = 1.0;

Status socket_connect(const SockAddr& to, Deadline dl, AbortFlag abort, Socket* out) {
  int delay_ms = 1;
  for (;;) {
    int fd = ::socket(to.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return MC_ERROR(ncclSystemError, "socket() failed: %s", strerror(errno));
    Socket s(fd);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&to.ss), to.len);
    if (rc != 0 && errno == EINPROGRESS) {
      Deadline attempt = Deadline::after(std::min(dl.seconds_left(), kConnectAttemptS));
      if (!wait_fd(fd, POLLOUT, attempt, abort, "connect").ok()) {
        if (abort != nullptr && abort->load())
          return MC_ERROR(ncclInvalidUsage, "connect interrupted: communicator aborted");
        if (dl.expired() || dl.seconds_left() <= 0)
          return MC_ERROR(ncclRemoteError, "connect to %s timed out after MESHCCL_TIMEOUT=%.0f s", to.str().c_str(),
                          timeout_seconds());
        continue;  // no answer to this SYN yet: a new socket sends a new one
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc == 0) {
      int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      tune(fd);
      *out = std::move(s);
      return kOk;
    }
    int e = errno;
    if (e != ECONNREFUSED && e != ETIMEDOUT && e != ENETUNREACH && e != EHOSTUNREACH && e != ECONNRESET)
      return MC_ERROR(ncclSystemError, "connect to %s failed: %s", to.str().c_str(), strerror(e));
    if (abort != nullptr && abort->load())
      return MC_ERROR(ncclInvalidUsage, "connect interrupted: communicator aborted");
    if (dl.expired())
      return MC_ERROR(ncclRemoteError, "connect to %s failed (%s) until MESHCCL_TIMEOUT=%.0f s", to.str().c_str(),
                      strerror(e), timeout_seconds());
    usleep(delay_ms * 1000);
    if (delay_ms < 100) delay_ms *= 2;
  }
}

Status socket_send_all(const Socket& s, const void* data, size_t size, Deadline dl, AbortFlag abort) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(s.fd(), p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      MC_TRY(wait_fd(s.fd(), POLLOUT, dl, abort, "send"));
      continue;
    }
    return MC_ERROR(ncclRemoteError, "send to peer failed: %s", n < 0 ? strerror(errno) : "connection closed");
  }
  return kOk;
}

Status socket_recv_all(const Socket& s, void* data, size_t size, Deadline dl, AbortFlag abort) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::recv(s.fd(), p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return MC_ERROR(ncclRemoteError, "peer closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      MC_TRY(wait_fd(s.fd(), POLLIN, dl, abort, "receive"));
      continue;
    }
    return MC_ERROR(ncclRemoteError, "receive from peer failed: %s", strerror(errno));
  }
  return kOk;
}

bool socket_peer_closed(const Socket& s) {
  if (!s.valid()) return true;
  pollfd p{s.fd(), POLLIN | POLLRDHUP, 0};
  int rc = ::poll(&p, 1, 0);
  if (rc <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) return true;
  char c;
  ssize_t n = ::recv(s.fd(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0;
}

}  // namespace meshccl
