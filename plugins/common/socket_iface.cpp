#include "plugins/common/socket_iface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshccl::plugin::socket {
namespace {

struct Spec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
};

Spec parse_spec(const char* s) {
  Spec spec;
  if (*s == '^') {
    spec.exclude = true;
    ++s;
  }
  if (*s == '=') {
    spec.exact = true;
    ++s;
  }
  std::string cur;
  for (;; ++s) {
    if (*s == ',' || *s == '\0') {
      if (!cur.empty()) spec.names.push_back(cur);
      cur.clear();
      if (*s == '\0') break;
    } else if (*s != ' ') {
      cur.push_back(*s);
    }
  }
  return spec;
}

bool listed(const Spec& spec, const std::string& name) {
  for (const std::string& n : spec.names) {
    if (spec.exact ? name == n : name.compare(0, n.size(), n) == 0) return true;
  }
  return false;
}

// First up interface accepted by `ok`, IPv4 addresses before IPv6 ones,
// only of `only` unless that is AF_UNSPEC.
template <class F>
int first(const std::vector<Iface>& all, int only, F&& ok) {
  for (int family : {AF_INET, AF_INET6}) {
    if (only != AF_UNSPEC && family != only) continue;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].up && all[i].family == family && ok(all[i])) return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

std::vector<Iface> list_ifaces() {
  std::vector<Iface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_name == nullptr) continue;
    int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Iface i;
    i.name = a->ifa_name;
    i.family = family;
    i.up = (a->ifa_flags & IFF_UP) != 0;
    i.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    if (family == AF_INET) {
      i.addr_len = sizeof(sockaddr_in);
    } else {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
      i.addr_len = sizeof(sockaddr_in6);
    }
    std::memcpy(&i.addr, a->ifa_addr, i.addr_len);
    out.push_back(i);
  }
  freeifaddrs(list);
  return out;
}

int pick_iface(const std::vector<Iface>& all, const char* spec_text, int family) {
  if (spec_text != nullptr && *spec_text != '\0') {
    Spec spec = parse_spec(spec_text);
    return first(all, family, [&](const Iface& i) { return listed(spec, i.name) != spec.exclude; });
  }
  int i = first(all, family == AF_UNSPEC ? AF_INET : family,
                [](const Iface& f) { return !f.loopback && f.name.compare(0, 6, "docker") != 0; });
  if (i >= 0) return i;
  return first(all, family, [](const Iface& f) { return f.loopback; });
}

std::string host_to_string(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  return buf;
}

std::string addr_to_string(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return host_to_string(sa) + ":" + std::to_string(ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port));
  if (sa->sa_family == AF_INET6) {
    std::string s = "[";
    s += host_to_string(sa);
    s += "]:";
    s += std::to_string(ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port));
    return s;
  }
  return host_to_string(sa);
}

std::string describe(const Iface& i) {
  return i.name + " " + host_to_string(reinterpret_cast<const sockaddr*>(&i.addr));
}

void tune_tcp(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 20, intvl = 5, cnt = 6;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

int listen_tcp(const Iface& ifc, int backlog, sockaddr_storage* bound) {
  int fd = ::socket(ifc.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  *bound = ifc.addr;
  socklen_t len = ifc.addr_len;
  if (bind(fd, reinterpret_cast<sockaddr*>(bound), len) != 0 || ::listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(bound), &len) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

}  // namespace meshccl::plugin::socket
