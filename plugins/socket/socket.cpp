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
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "plugins/builtin.h"
#include "plugins/socket/socket_comm.h"

namespace meshccl::plugin::socket {
namespace {

// Connections that have not identified themselves yet; beyond this the
// oldest is dropped so that a flood of strays cannot exhaust descriptors.
constexpr size_t kMaxPending = 16;

ArgCheck g_check("socket");

meshccl_tresult_t sys_fail(const meshccl_transport_host_v1_t* host, const char* what) {
  MPLUG_WARN(host, "socket: %s: %s", what, std::strerror(errno));
  return MESHCCL_T_SYSTEM_ERROR;
}

// Latency over throughput for small frames; keepalive so that a peer host
// that vanishes without a FIN is noticed within a minute.
void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 20, intvl = 5, cnt = 6;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

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
               family == AF_INET ? "AF_INET" : family == AF_INET6 ? "AF_INET6" : "");
    return MESHCCL_T_SYSTEM_ERROR;
  }
  ctx->iface = all[static_cast<size_t>(i)];
  estimate_link(ctx.get());
  MPLUG_INFO(host, "socket: using %s", describe(ctx->iface).c_str());
  g_check.remember(host);
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** listen_comm) {
  const Iface& ifc = ctx->iface;
  int fd = ::socket(ifc.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return sys_fail(ctx->host, "socket()");
  sockaddr_storage sa = ifc.addr;
  socklen_t len = ifc.addr_len;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(fd, static_cast<int>(kMaxPending)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    meshccl_tresult_t r = sys_fail(ctx->host, ("listening on " + describe(ifc)).c_str());
    close(fd);
    return r;
  }
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->fd = fd;
  lc->nonce = random_u64();
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = lc->nonce;
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

socklen_t handle_addr(const Handle& h, sockaddr_storage* sa) {
  *sa = sockaddr_storage{};
  if (h.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(sa);
    in->sin_family = AF_INET;
    in->sin_port = h.port;
    std::memcpy(&in->sin_addr, h.addr, sizeof(in->sin_addr));
    return sizeof(sockaddr_in);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(sa);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = h.port;
  in6->sin6_scope_id = h.scope_id;
  std::memcpy(&in6->sin6_addr, h.addr, sizeof(in6->sin6_addr));
  return sizeof(sockaddr_in6);
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** send_comm) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || (h.family != AF_INET && h.family != AF_INET6))
    return g_check.misuse(host, "connect", "the handle is not a socket handle");
  sockaddr_storage sa;
  socklen_t len = handle_addr(h, &sa);
  std::string peer = addr_to_string(reinterpret_cast<sockaddr*>(&sa));

  size_t idx = 0;
  while (idx < ctx->connecting.size() && std::memcmp(&ctx->connecting[idx].handle, &h, sizeof(h)) != 0) ++idx;
  if (idx == ctx->connecting.size()) {
    int fd = ::socket(h.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return sys_fail(host, "socket()");
    tune(fd);
    Connecting cn;
    cn.handle = h;
    cn.fd = fd;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      cn.connected = true;
    } else if (errno != EINPROGRESS) {
      int err = errno;
      close(fd);
      MPLUG_WARN(host, "socket: connecting to %s failed: %s", peer.c_str(), std::strerror(err));
      return err == ECONNREFUSED ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR;
    }
    ctx->connecting.push_back(cn);
  }
  Connecting& cn = ctx->connecting[idx];
  auto drop = [&](meshccl_tresult_t r, const char* why) {
    MPLUG_WARN(host, "socket: connecting to %s failed: %s", peer.c_str(), why);
    close(cn.fd);
    ctx->connecting.erase(ctx->connecting.begin() + static_cast<long>(idx));
    return r;
  };
  if (!cn.connected) {
    pollfd p{cn.fd, POLLOUT, 0};
    if (poll(&p, 1, 0) <= 0) return MESHCCL_T_SUCCESS;  // not yet
    int err = 0;
    socklen_t elen = sizeof(err);
    if (getsockopt(cn.fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) err = errno;
    if (err != 0)
      return drop(err == ECONNREFUSED ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR, std::strerror(err));
    cn.connected = true;
  }
  Hello hello{kHelloMagic, h.nonce};
  while (cn.sent < sizeof(hello)) {
    ssize_t w = send(cn.fd, reinterpret_cast<char*>(&hello) + cn.sent, sizeof(hello) - cn.sent,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return MESHCCL_T_SUCCESS;
      return drop(MESHCCL_T_REMOTE_ERROR, std::strerror(errno));
    }
    cn.sent += static_cast<uint32_t>(w);
  }
  auto c = std::make_unique<SendComm>();
  c->ctx = ctx;
  c->fd = cn.fd;
  c->peer = peer;
  ctx->connecting.erase(ctx->connecting.begin() + static_cast<long>(idx));
  MPLUG_TRACE(host, "socket: connected to %s", peer.c_str());
  *send_comm = c.release();
  return MESHCCL_T_SUCCESS;
}

void refuse(ListenComm* lc, size_t i, const char* why) {
  MPLUG_WARN(lc->ctx->host, "socket: refused connection from %s: %s", lc->pending[i].peer.c_str(), why);
  close(lc->pending[i].fd);
  lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
}

meshccl_tresult_t do_accept(ListenComm* lc, void** recv_comm) {
  const meshccl_transport_host_v1_t* host = lc->ctx->host;
  if (lc->accepted) return g_check.misuse(host, "accept", "the listener already accepted its sender");
  for (;;) {
    sockaddr_storage sa;
    socklen_t len = sizeof(sa);
    int fd = accept4(lc->fd, reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return sys_fail(host, "accept()");
    }
    if (lc->pending.size() >= kMaxPending) refuse(lc, 0, "too many unidentified connections");
    Pending p;
    p.fd = fd;
    p.peer = addr_to_string(reinterpret_cast<sockaddr*>(&sa));
    lc->pending.push_back(std::move(p));
  }
  for (size_t i = 0; i < lc->pending.size();) {
    Pending& p = lc->pending[i];
    ssize_t n = recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
    if (n == 0) {
      refuse(lc, i, "closed before identifying itself");
      continue;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        ++i;
        continue;
      }
      refuse(lc, i, std::strerror(errno));
      continue;
    }
    p.got += static_cast<uint32_t>(n);
    if (p.got < sizeof(Hello)) continue;  // read the rest right away
    if (p.hello.magic != kHelloMagic || p.hello.nonce != lc->nonce) {
      refuse(lc, i, "it did not present this listener's nonce");
      continue;
    }
    auto c = std::make_unique<RecvComm>();
    c->ctx = lc->ctx;
    c->fd = p.fd;
    c->peer = p.peer;
    tune(c->fd);
    lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
    while (!lc->pending.empty()) refuse(lc, 0, "the listener already has its sender");
    // One sender per listener: later connection attempts are refused by the
    // kernel instead of queueing up behind a socket nobody reads.
    close(lc->fd);
    lc->fd = -1;
    lc->accepted = true;
    MPLUG_TRACE(host, "socket: accepted %s", c->peer.c_str());
    *recv_comm = c.release();
    return MESHCCL_T_SUCCESS;
  }
  return MESHCCL_T_SUCCESS;  // not yet
}

// ---- C entry points --------------------------------------------------------

int sock_init(const meshccl_transport_host_v1_t* host, void** ctx) {
  if (ctx == nullptr) return g_check.misuse(host, "init", "ctx is NULL");
  *ctx = nullptr;
  MPLUG_CHECK(check_host(host, "socket"));
  return guarded(host, "socket init", [&] { return do_init(host, ctx); });
}

int sock_devices(void* ctx, int* ndev) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "devices");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (ndev == nullptr) return g_check.misuse(c->host, "devices", "ndev is NULL");
  *ndev = 1;
  return MESHCCL_T_SUCCESS;
}

int sock_properties(void* ctx, int dev, meshccl_transport_props_v1_t* props) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "properties");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (props == nullptr || dev != 0) return g_check.misuse(c->host, "properties", "bad device or NULL props");
  *props = meshccl_transport_props_v1_t{
      .name = c->iface.name.c_str(),
      .bandwidth_gbs = c->bandwidth_gbs,
      .latency_us = c->latency_us,
      .scope = MESHCCL_SCOPE_NETWORK,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
  return MESHCCL_T_SUCCESS;
}

int sock_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "listen");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (handle == nullptr || listen_comm == nullptr || dev != 0)
    return g_check.misuse(c->host, "listen", "bad device or NULL handle/listen_comm");
  *listen_comm = nullptr;
  return guarded(c->host, "socket listen", [&] { return do_listen(c, handle, listen_comm); });
}

int sock_connect(void* ctx, int dev, const void* handle, void** send_comm) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "connect");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (handle == nullptr || send_comm == nullptr || dev != 0)
    return g_check.misuse(c->host, "connect", "bad device or NULL handle/send_comm");
  *send_comm = nullptr;
  return guarded(c->host, "socket connect", [&] { return do_connect(c, handle, send_comm); });
}

int sock_accept(void* listen_comm, void** recv_comm) {
  ListenComm* lc = g_check.as<ListenComm>(listen_comm, kListenMagic, "listen comm", "accept");
  if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (recv_comm == nullptr) return g_check.misuse(lc->ctx->host, "accept", "recv_comm is NULL");
  *recv_comm = nullptr;
  return guarded(lc->ctx->host, "socket accept", [&] { return do_accept(lc, recv_comm); });
}

int sock_reg_mr(void* comm, void* data, size_t size, void** mhandle) {
  (void)comm;
  (void)data;
  (void)size;
  if (mhandle != nullptr) *mhandle = nullptr;  // the kernel copies; nothing to pin
  return MESHCCL_T_SUCCESS;
}

int sock_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  (void)mhandle;
  return MESHCCL_T_SUCCESS;
}

int sock_isend(void* send_comm, const void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
  (void)mhandle;
  SendComm* c = g_check.as<SendComm>(send_comm, kSendMagic, "send comm", "isend");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (request == nullptr) return g_check.misuse(c->ctx->host, "isend", "request is NULL");
  *request = nullptr;
  if (data == nullptr && size != 0) return g_check.misuse(c->ctx->host, "isend", "NULL buffer with a non-zero size");
  return guarded(c->ctx->host, "socket isend", [&] { return send_post(c, data, size, tag, request); });
}

int sock_irecv(void* recv_comm, void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
  (void)mhandle;
  RecvComm* c = g_check.as<RecvComm>(recv_comm, kRecvMagic, "recv comm", "irecv");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (request == nullptr) return g_check.misuse(c->ctx->host, "irecv", "request is NULL");
  *request = nullptr;
  if (data == nullptr && size != 0) return g_check.misuse(c->ctx->host, "irecv", "NULL buffer with a non-zero size");
  return guarded(c->ctx->host, "socket irecv", [&] { return recv_post(c, data, size, tag, request); });
}

int sock_test(void* request, int* done, size_t* size) {
  Request* r = g_check.as<Request>(request, kReqMagic, "request", "test");
  if (r == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (done == nullptr) return g_check.misuse(g_check.host(), "test", "done is NULL");
  if (r->kind == Kind::kSend) {
    auto* c = static_cast<SendComm*>(r->comm);
    return guarded(c->ctx->host, "socket test", [&] { return send_test(r, done, size); });
  }
  auto* c = static_cast<RecvComm*>(r->comm);
  return guarded(c->ctx->host, "socket test", [&] { return recv_test(r, done, size); });
}

int sock_close_send(void* send_comm) {
  SendComm* c = g_check.as<SendComm>(send_comm, kSendMagic, "send comm", "close_send");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  close(c->fd);
  c->magic = 0;
  delete c;
  return MESHCCL_T_SUCCESS;
}

int sock_close_recv(void* recv_comm) {
  RecvComm* c = g_check.as<RecvComm>(recv_comm, kRecvMagic, "recv comm", "close_recv");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  close(c->fd);
  for (Unexpected* u; (u = c->unexpected.pop_front()) != nullptr;) c->bufs.put(u->buf);
  c->magic = 0;
  delete c;
  return MESHCCL_T_SUCCESS;
}

int sock_close_listen(void* listen_comm) {
  ListenComm* lc = g_check.as<ListenComm>(listen_comm, kListenMagic, "listen comm", "close_listen");
  if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  for (Pending& p : lc->pending) close(p.fd);
  if (lc->fd >= 0) close(lc->fd);
  lc->magic = 0;
  delete lc;
  return MESHCCL_T_SUCCESS;
}

int sock_finalize(void* ctx) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "finalize");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  for (Connecting& cn : c->connecting) close(cn.fd);  // connects the host gave up on
  g_check.forget(c->host);
  c->magic = 0;
  delete c;
  return MESHCCL_T_SUCCESS;
}

}  // namespace
}  // namespace meshccl::plugin::socket

namespace sock = meshccl::plugin::socket;

extern "C" const meshccl_transport_v1_t meshccl_transport_socket = {
    .name = "socket",
    .version = MESHCCL_TRANSPORT_V1,
    .init = sock::sock_init,
    .devices = sock::sock_devices,
    .properties = sock::sock_properties,
    .listen = sock::sock_listen,
    .connect = sock::sock_connect,
    .accept = sock::sock_accept,
    .reg_mr = sock::sock_reg_mr,
    .dereg_mr = sock::sock_dereg_mr,
    .isend = sock::sock_isend,
    .irecv = sock::sock_irecv,
    .test = sock::sock_test,
    .close_send = sock::sock_close_send,
    .close_recv = sock::sock_close_recv,
    .close_listen = sock::sock_close_listen,
    .finalize = sock::sock_finalize,
};
