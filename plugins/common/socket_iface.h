// Which network interface the socket transport listens on.
//
// MESHCCL_SOCKET_IFNAME uses NCCL's syntax: a comma-separated list of name
// prefixes ("eth,ib"); a leading '^' excludes the listed ones instead
// ("^docker,lo"); a leading '=' (after any '^') asks for exact names
// ("=eth0", "^=docker0"). Without a setting: the first interface that is up,
// not loopback and not docker, with an IPv4 address; else loopback.
// MESHCCL_SOCKET_FAMILY=AF_INET or AF_INET6 restricts either choice to that
// address family (the default rule then looks for that family instead).
#ifndef MESHCCL_PLUGINS_SOCKET_SOCKET_IFACE_H_
#define MESHCCL_PLUGINS_SOCKET_SOCKET_IFACE_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <vector>

namespace meshccl::plugin::socket {

struct Iface {
  std::string name;
  int family = AF_UNSPEC;  // AF_INET or AF_INET6
  bool up = false;
  bool loopback = false;
  sockaddr_storage addr{};  // port 0
  socklen_t addr_len = 0;
};

// One entry per (interface, usable address) in the system's order;
// link-local IPv6 addresses are left out (they need a scope to be reached).
std::vector<Iface> list_ifaces();

// Index into `all` of the interface to use, or -1 when none matches. `spec`
// is the value of MESHCCL_SOCKET_IFNAME, NULL or "" when unset; `family`
// (MESHCCL_SOCKET_FAMILY) restricts the address family unless AF_UNSPEC.
int pick_iface(const std::vector<Iface>& all, const char* spec, int family = AF_UNSPEC);

// Text for logs: "eth0 192.0.2.2", "192.0.2.2", "192.0.2.2:4242".
std::string describe(const Iface& i);
std::string host_to_string(const sockaddr* sa);
std::string addr_to_string(const sockaddr* sa);

// A connected TCP socket tuned for latency over throughput (no Nagle), with
// keepalive so that a peer host that vanishes without a FIN is noticed
// within a minute.
void tune_tcp(int fd);

// A non-blocking listening TCP socket on `ifc` (port chosen by the kernel)
// with room for `backlog` connections; `*bound` gets the address it listens
// on. Returns the descriptor, or -1 with errno set.
int listen_tcp(const Iface& ifc, int backlog, sockaddr_storage* bound);

}  // namespace meshccl::plugin::socket

#endif  // MESHCCL_PLUGINS_SOCKET_SOCKET_IFACE_H_
