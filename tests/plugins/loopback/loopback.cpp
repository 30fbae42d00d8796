// The loopback transport's C entry points and connection setup: a listener
// per receiving endpoint on an abstract Unix socket, a non-blocking connect
// that presents the handle's nonce, and an accept that refuses (and logs)
// any connection that does not. See loopback_comm.h.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>

#include "plugins/common/entry.h"
#include "tests/plugins/loopback/loopback_comm.h"

namespace meshccl::plugin::loopback {
namespace {

ArgCheck g_check(kName);

// The socket address of an abstract name (its first byte NUL, not in the
// file system); false when the name does not fit.
bool abstract_addr(const char* name, sockaddr_un* sa, socklen_t* len) {
  const size_t n = strnlen(name, sizeof(Handle::path));
  if (n == 0 || n == sizeof(Handle::path) || n + 1 > sizeof(sa->sun_path)) return false;
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  std::memcpy(sa->sun_path + 1, name, n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return true;
}

int new_socket() { return ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0); }

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  MPLUG_INFO(host, "%s: unix seqpacket sockets, %s scope", kName,
             LOOPBACK_SCOPE == MESHCCL_SCOPE_HOST ? "node" : "network");
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

void props(Ctx*, meshccl_transport_props_v1_t* p) {
  *p = meshccl_transport_props_v1_t{
      .name = kName,
      .bandwidth_gbs = 2.0,
      .latency_us = 10.0,
      .scope = LOOPBACK_SCOPE,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** listen_comm) {
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = random_u64();
  std::snprintf(h.path, sizeof(h.path), "meshccl-%s-%d-%016" PRIx64, kName, static_cast<int>(getpid()), random_u64());
  sockaddr_un sa;
  socklen_t len = 0;
  if (!abstract_addr(h.path, &sa, &len)) return g_check.misuse(ctx->host, "listen", "the socket name does not fit");
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->nonce = h.nonce;
  lc->fd = new_socket();
  if (lc->fd < 0) return sys_fail(ctx->host, kName, "socket()");
  if (::bind(lc->fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || ::listen(lc->fd, 16) != 0) {
    meshccl_tresult_t r = sys_fail(ctx->host, kName, "listening");
    ::close(lc->fd);
    return r;
  }
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = lc.release();
  return MESHCCL_T_SUCCESS;
}

// Starts (first call) or advances the connect to h's listener: *fd is the
// connection once its hello is written, else -1 (under way).
meshccl_tresult_t dial(Ctx* ctx, const Handle& h, int* fd) {
  *fd = -1;
  size_t i = 0;
  while (i < ctx->dialing.size() && std::memcmp(&ctx->dialing[i].handle, &h, sizeof(h)) != 0) ++i;
  if (i == ctx->dialing.size()) ctx->dialing.push_back(Dialing{h, -1});
  Dialing& d = ctx->dialing[i];
  auto fail = [&](meshccl_tresult_t r, const char* why) {
    MPLUG_WARN(ctx->host, "%s: connecting to %s failed: %s", kName, h.path, why);
    if (d.fd >= 0) ::close(d.fd);
    ctx->dialing.erase(ctx->dialing.begin() + static_cast<long>(i));
    return r;
  };
  if (d.fd < 0) {
    sockaddr_un sa;
    socklen_t len = 0;
    abstract_addr(h.path, &sa, &len);  // checked by the caller
    d.fd = new_socket();
    if (d.fd < 0) return fail(MESHCCL_T_SYSTEM_ERROR, std::strerror(errno));
    if (::connect(d.fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
      const int err = errno;
      ::close(d.fd);
      d.fd = -1;
      if (err == EAGAIN || err == EINTR) return MESHCCL_T_SUCCESS;  // the listener's backlog is full: later
      return fail(err == ECONNREFUSED || err == ENOENT ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR,
                  std::strerror(err));
    }
  }
  const Hello hello{kHelloMagic, h.nonce};
  ssize_t w = ::send(d.fd, &hello, sizeof(hello), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w < 0 && (errno == EAGAIN || errno == EINTR)) return MESHCCL_T_SUCCESS;
  if (w != static_cast<ssize_t>(sizeof(hello)))
    return fail(MESHCCL_T_REMOTE_ERROR, w < 0 ? std::strerror(errno) : "the hello was cut");
  *fd = d.fd;
  ctx->dialing.erase(ctx->dialing.begin() + static_cast<long>(i));
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** send_comm) {
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  sockaddr_un sa;
  socklen_t len = 0;
  if (h.magic != kHandleMagic || !abstract_addr(h.path, &sa, &len))
    return g_check.misuse(ctx->host, "connect", "the handle is not a loopback handle");
  int fd = -1;
  MPLUG_CHECK(dial(ctx, h, &fd));
  if (fd < 0) return MESHCCL_T_SUCCESS;  // under way
  auto c = std::make_unique<SendComm>();
  c->ctx = ctx;
  c->fd = fd;
  *send_comm = c.release();
  return MESHCCL_T_SUCCESS;
}

void refuse(ListenComm* lc, size_t i, const char* why) {
  MPLUG_WARN(lc->ctx->host, "%s: refused a connection: %s", kName, why);
  ::close(lc->pending[i]);
  lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
}

meshccl_tresult_t do_accept(ListenComm* lc, void** recv_comm) {
  if (lc->accepted) return g_check.misuse(lc->ctx->host, "accept", "the listener already accepted its sender");
  for (;;) {
    int c = ::accept4(lc->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return sys_fail(lc->ctx->host, kName, "accept()");
    }
    if (lc->pending.size() >= 16) refuse(lc, 0, "too many unidentified connections");
    lc->pending.push_back(c);
  }
  for (size_t i = 0; i < lc->pending.size();) {
    Hello hello{};
    ssize_t n = ::recv(lc->pending[i], &hello, sizeof(hello), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      ++i;
      continue;
    }
    if (n != static_cast<ssize_t>(sizeof(hello)) || hello.magic != kHelloMagic || hello.nonce != lc->nonce) {
      refuse(lc, i, n == 0 ? "it closed before identifying itself" : "it did not present this listener's nonce");
      continue;
    }
    auto rc = std::make_unique<RecvComm>();
    rc->ctx = lc->ctx;
    rc->fd = lc->pending[i];
    lc->pending.erase(lc->pending.begin() + static_cast<long>(i));
    while (!lc->pending.empty()) refuse(lc, 0, "the listener already has its sender");
    ::close(lc->fd);  // one sender per listener
    lc->fd = -1;
    lc->accepted = true;
    *recv_comm = rc.release();
    return MESHCCL_T_SUCCESS;
  }
  return MESHCCL_T_SUCCESS;  // not yet
}

void close_send(SendComm* c) { ::close(c->fd); }

void close_recv(RecvComm* c) {
  ::close(c->fd);
  c->m.drain();
}

void close_listen(ListenComm* lc) {
  for (int fd : lc->pending) ::close(fd);
  lc->pending.clear();
  if (lc->fd >= 0) ::close(lc->fd);
}

bool finalize(Ctx* c) {
  for (Dialing& d : c->dialing)  // connects the host gave up on
    if (d.fd >= 0) ::close(d.fd);
  c->dialing.clear();
  return true;
}

constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kLoopback{
    .name = LOOPBACK_NAME,
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
    .close_send = close_send,
    .close_recv = close_recv,
    .close_listen = close_listen,
    .finalize = finalize,
};

}  // namespace
}  // namespace meshccl::plugin::loopback

extern "C" __attribute__((visibility("default"))) const meshccl_transport_v1_t meshccl_transport_v1 =
    meshccl::plugin::Entry<meshccl::plugin::loopback::kLoopback>::table();

// The optional probe (transport.h): a receive from any source needs it.
extern "C" __attribute__((visibility("default"))) int meshccl_transport_v1_probe(void* recv_comm, uint64_t tag,
                                                                                 int* found) {
  return meshccl::plugin::Entry<meshccl::plugin::loopback::kLoopback>::probe(recv_comm, tag, found);
}

// Optional description for meshccl_info (transport.h).
extern "C" __attribute__((visibility("default"))) const char* meshccl_transport_v1_describe(void) {
  return "test plugin: unix seqpacket";
}
