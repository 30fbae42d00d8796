// The socket transport's C entry points, interface choice, and connection
// setup: a listener per receiving endpoint, a non-blocking connect that
// presents the handle's nonce, and an accept that refuses (and logs) any
// connection that does not.
//
// Settings: MESHCCL_SOCKET_IFNAME, MESHCCL_SOCKET_FAMILY (see socket_iface.h).
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "plugins/builtin.h"
#include "plugins/common/entry.h"
#include "plugins/socket/socket_comm.h"

namespace meshccl::plugin::socket {

const char* parse_handle(const void* bytes, Handle* h, sockaddr_storage* sa, socklen_t* len) {
  std::memcpy(h, bytes, sizeof(*h));
  *sa = sockaddr_storage{};
  *len = 0;
  if (h->magic != kHandleMagic) return "the handle is not a socket handle";
  if (h->port == 0) return "the socket handle names port 0";
  if (h->family == AF_INET) {
    static const uint8_t zero[sizeof(h->addr) - sizeof(in_addr)] = {};
    if (h->scope_id != 0 || std::memcmp(h->addr + sizeof(in_addr), zero, sizeof(zero)) != 0)
      return "the socket handle's IPv4 address has stray bytes";
    auto* in = reinterpret_cast<sockaddr_in*>(sa);
    in->sin_family = AF_INET;
    in->sin_port = h->port;
    std::memcpy(&in->sin_addr, h->addr, sizeof(in->sin_addr));
    *len = sizeof(sockaddr_in);
    return nullptr;
  }
  if (h->family != AF_INET6) return "the socket handle's address family is neither IPv4 nor IPv6";
  auto* in6 = reinterpret_cast<sockaddr_in6*>(sa);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = h->port;
  in6->sin6_scope_id = h->scope_id;
  std::memcpy(&in6->sin6_addr, h->addr, sizeof(in6->sin6_addr));
  *len = sizeof(sockaddr_in6);
  return nullptr;
}

namespace {

// Connections that have not identified themselves yet; beyond this the
// oldest is dropped so that a flood of strays cannot exhaust descriptors.
constexpr size_t kMaxPending = TcpGate::kMaxPending;

ArgCheck g_check("socket");

void estimate_link(Ctx* ctx) {
  ctx->latency_us = ctx->iface.loopback ? 15.0 : 30.0;
  ctx->bandwidth_gbs = ctx->iface.loopback ? 3.0 : 1.25;  // unknown NIC: assume 10 Gb/s
  char path[128];
  std::snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ctx->iface.name.c_str());
  if (FILE* f = std::fopen(path, "r")) {
    long mbps = 0;
    if (std::fscanf(f, "%ld", &mbps) == 1 && mbps > 0) ctx->bandwidth_gbs = static_cast<double>(mbps) / 8000.0;
    std::fclose(f);
  }
}

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  const char* spec = param_str(host, "MESHCCL_SOCKET_IFNAME");
  int family = AF_UNSPEC;
  if (const char* fam = param_str(host, "MESHCCL_SOCKET_FAMILY")) {
    if (std::strcmp(fam, "AF_INET") == 0) {
      family = AF_INET;
    } else if (std::strcmp(fam, "AF_INET6") == 0) {
      family = AF_INET6;
    } else {
      MPLUG_WARN(host, "MESHCCL_SOCKET_FAMILY=\"%s\" must be AF_INET or AF_INET6", fam);
      return MESHCCL_T_INVALID_USAGE;
    }
  }
  std::vector<Iface> all = list_ifaces();
  int i = pick_iface(all, spec, family);
  if (i < 0) {
    MPLUG_WARN(host, "socket: no interface that is up matches MESHCCL_SOCKET_IFNAME=%s%s%s",
               spec != nullptr ? spec : "(unset)", family == AF_UNSPEC ? "" : " and MESHCCL_SOCKET_FAMILY=",
               family == AF_INET    ? "AF_INET"
               : family == AF_INET6 ? "AF_INET6"
                                    : "");
    return MESHCCL_T_SYSTEM_ERROR;
  }
  ctx->iface = all[static_cast<size_t>(i)];
  estimate_link(ctx.get());
  MPLUG_INFO(host, "socket: using %s", describe(ctx->iface).c_str());
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** listen_comm) {
  const Iface& ifc = ctx->iface;
  sockaddr_storage sa;
  int fd = listen_tcp(ifc, static_cast<int>(kMaxPending), &sa);
  if (fd < 0) return sys_fail(ctx->host, "socket", ("listening on " + describe(ifc)).c_str());
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->gate.open(ctx->host, "socket", fd, kHelloMagic, random_u64());
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = lc->gate.nonce();
  h.family = static_cast<uint16_t>(sa.ss_family);
  if (sa.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&sa);
    h.port = in->sin_port;
    std::memcpy(h.addr, &in->sin_addr, sizeof(in->sin_addr));
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    h.port = in6->sin6_port;
    h.scope_id = in6->sin6_scope_id;
    std::memcpy(h.addr, &in6->sin6_addr, sizeof(in6->sin6_addr));
  }
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  MPLUG_TRACE(ctx->host, "socket: listening on %s", addr_to_string(reinterpret_cast<sockaddr*>(&sa)).c_str());
  *listen_comm = lc.release();
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** send_comm) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  Handle h;
  sockaddr_storage sa;
  socklen_t len = 0;
  if (const char* why = parse_handle(handle, &h, &sa, &len)) return g_check.misuse(host, "connect", why);
  std::string peer = addr_to_string(reinterpret_cast<sockaddr*>(&sa));

  int fd = -1;
  meshccl_tresult_t r =
      dial_handle(ctx->connecting, h, host, "socket", sa, len, peer, Hello{kHelloMagic, h.nonce}, &fd);
  if (r != MESHCCL_T_SUCCESS || fd < 0) return r;  // failed (said why), or under way
  auto c = std::make_unique<SendComm>();
  c->ctx = ctx;
  c->fd = fd;
  c->peer = peer;
  MPLUG_TRACE(host, "socket: connected to %s", peer.c_str());
  ctx->sends.push_back(c.get());
  *send_comm = c.release();
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_accept(ListenComm* lc, void** recv_comm) {
  const meshccl_transport_host_v1_t* host = lc->ctx->host;
  if (lc->accepted) return g_check.misuse(host, "accept", "the listener already accepted its sender");
  int fd = -1;
  std::string peer;
  MPLUG_CHECK(lc->gate.poll(&fd, &peer));
  if (fd < 0) return MESHCCL_T_SUCCESS;  // not yet
  auto c = std::make_unique<RecvComm>();
  c->ctx = lc->ctx;
  c->fd = fd;
  c->peer = peer;
  tune_tcp(c->fd);
  lc->accepted = true;
  lc->ctx->recvs.push_back(c.get());
  MPLUG_TRACE(host, "socket: accepted %s", c->peer.c_str());
  *recv_comm = c.release();
  return MESHCCL_T_SUCCESS;
}

void props(Ctx* c, meshccl_transport_props_v1_t* props) {
  *props = meshccl_transport_props_v1_t{
      .name = c->iface.name.c_str(),
      .bandwidth_gbs = c->bandwidth_gbs,
      .latency_us = c->latency_us,
      .scope = MESHCCL_SCOPE_NETWORK,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
}

template <class T>
void forget(std::vector<T*>* v, T* c) {
  for (size_t i = 0; i < v->size(); ++i)
    if ((*v)[i] == c) {
      (*v)[i] = v->back();
      v->pop_back();
      return;
    }
}

// Level-triggered: a receiving connection is watched for bytes and for its
// sender's close always; a sending one for room only while it has frames
// queued (an error or hang-up is always reported).
bool watch(int epfd, int fd, uint32_t events, bool added) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  return epoll_ctl(epfd, added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) == 0;
}

meshccl_tresult_t wait_fd(Ctx* ctx, int* fd) {
  if (ctx->epfd < 0) ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (ctx->epfd < 0) return MESHCCL_T_SUCCESS;  // *fd = -1: the host keeps polling
  // The host blocks on the set next and tests at once when it wakes: the
  // connections' calls are due again.
  for (RecvComm* r : ctx->recvs) r->calls.wake();
  for (SendComm* s : ctx->sends) s->calls.wake();
  for (RecvComm* r : ctx->recvs) {
    if (r->watched || r->fd < 0) continue;
    if (!watch(ctx->epfd, r->fd, EPOLLIN | EPOLLRDHUP, false)) return MESHCCL_T_SUCCESS;
    r->watched = true;
  }
  for (SendComm* s : ctx->sends) {
    if (s->fd < 0) continue;
    const int64_t want = s->queue.empty() || s->broken != MESHCCL_T_SUCCESS ? 0 : int64_t{EPOLLOUT};
    if (want == s->watched) continue;
    if (!watch(ctx->epfd, s->fd, static_cast<uint32_t>(want), s->watched >= 0)) return MESHCCL_T_SUCCESS;
    s->watched = want;
  }
  *fd = ctx->epfd;
  return MESHCCL_T_SUCCESS;
}

void close_recv(RecvComm* c) {
  forget(&c->ctx->recvs, c);
  close(c->fd);
  c->m.drain();
}

void close_listen(ListenComm* lc) { lc->gate.close_all(); }

void close_send(SendComm* c) {
  forget(&c->ctx->sends, c);
  close(c->fd);
}

bool finalize(Ctx* c) {
  c->connecting.clear();  // connects the host gave up on
  if (c->epfd >= 0) close(c->epfd);
  c->epfd = -1;
  return true;
}

constexpr char kName[] = "socket";
constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kSocket{
    .name = kName,
    .check = &g_check,
    .magic = {kCtxMagic, kListenMagic, kSendMagic, kRecvMagic, kReqMagic},
    .init = do_init,
    .props = props,
    .listen = do_listen,
    .connect = do_connect,
    .accept = do_accept,
    .send_post = send_post,
    .recv_post = recv_post,
    .send_test = send_test,
    .recv_test = recv_test,
    .recv_probe = recv_probe,
    .wait_fd = wait_fd,
    .close_send = close_send,
    .close_recv = close_recv,
    .close_listen = close_listen,
    .finalize = finalize,
};

}  // namespace
}  // namespace meshccl::plugin::socket

extern "C" const meshccl_transport_v1_t meshccl_transport_socket =
    meshccl::plugin::Entry<meshccl::plugin::socket::kSocket>::table();
extern "C" const meshccl_transport_v1_probe_t meshccl_transport_socket_probe =
    meshccl::plugin::Entry<meshccl::plugin::socket::kSocket>::probe;
extern "C" const meshccl_transport_v1_wait_fd_t meshccl_transport_socket_wait_fd =
    meshccl::plugin::Entry<meshccl::plugin::socket::kSocket>::wait_fd;
