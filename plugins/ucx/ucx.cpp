// The UCX transport: libmeshccl-transport-ucx.so, loaded by the runtime.
// This file: the C entry points, UCX status messages, the worker, and
// connection setup (control socket handshake, then a UCP endpoint made from
// the receiver's worker address). ucx_io.cpp moves the messages; the design is
// in ucx_comm.h.
//
// One UCP worker per context, driven only inside isend, irecv, test, connect
// and accept. Endpoints use UCP_ERR_HANDLING_MODE_PEER so that a dead
// receiver fails sends with REMOTE_ERROR; the control socket tells a receiver
// that its sender died (EOF without a goodbye).
//
// Settings: MESHCCL_SOCKET_IFNAME / MESHCCL_SOCKET_FAMILY pick the control
// socket's interface (as for socket); UCX's own (UCX_TLS, UCX_NET_DEVICES,
// ...) pick the data path. Without an RDMA device the plugin chooses some
// of UCX's settings for TCP when the user did not (choose_defaults).
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ucs/config/parser.h>
#include <ucs/debug/log_def.h>

#include "plugins/common/entry.h"
#include "plugins/ucx/ucx_comm.h"

namespace meshccl::plugin::ucx {

namespace {

constexpr uint64_t kCloseWaitNs = 2'000'000'000;  // how long finalize waits for endpoint closes
ArgCheck g_check("ucx");
constexpr size_t kMaxPending = TcpGate::kMaxPending;

// What a failing UCX status most likely means for the user.
const char* status_hint(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT: return "the peer exited or the network between the two failed";
    case UCS_ERR_UNREACHABLE: return "no UCX transport reaches the peer (check UCX_TLS and UCX_NET_DEVICES)";
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE: return "no usable UCX device or transport here (check UCX_TLS and UCX_NET_DEVICES)";
    case UCS_ERR_REJECTED: return "the peer refused the connection";
    case UCS_ERR_MESSAGE_TRUNCATED: return "a message was longer than its receive buffer";
    case UCS_ERR_NO_MEMORY: return "out of memory";
    case UCS_ERR_TIMED_OUT: return "the peer did not answer in time";
    case UCS_ERR_CANCELED: return "the operation was cancelled (its connection closed)";
    case UCS_ERR_IO_ERROR:
      return "moving the data to or from the peer failed (on one host: the peer most likely exited)";
    case UCS_ERR_INVALID_PARAM: return "UCX refused a parameter (check the UCX_* environment variables)";
    case UCS_ERR_UNSUPPORTED: return "UCX does not support this here";
    default: return "see UCX's own messages (UCX_LOG_LEVEL=info)";
  }
}

// Destroying a worker, UCX warns about every request it still holds
// ("object ... was not returned to mpool ucp_requests"): after a peer on
// this host died, the sends to it that UCX never completes (no peer error
// handling there). They are expected after a failure and go with the
// worker, so the plugin counts them into one INFO line instead of a screen
// of warnings at every abort. With UCX_LOG_LEVEL set, UCX's output is left
// as the user asked. The filter is installed once and passes everything
// but those lines of this thread's destroy.
//
// UCX also warns about every message that arrived and was never received
// ("tag_match.c: unexpected tag-receive descriptor ... was not matched").
// What is left there once the library has received everything it expects
// are stall probes a peer sent as this rank finished: after its last look
// at that connection or after it closed it (docs/transports.md). Those are
// counted into one INFO line as well.
thread_local int t_unreturned = -1;  // counting while >= 0
thread_local int t_unmatched = 0;

ucs_log_func_rc_t count_unreturned(const char* file, unsigned line, const char* function, ucs_log_level_t level,
                                   const ucs_log_component_config_t* comp, const char* message, va_list ap) {
  (void)file, (void)line, (void)function, (void)comp, (void)ap;
  if (t_unreturned < 0 || level != UCS_LOG_LEVEL_WARN) return UCS_LOG_FUNC_RC_CONTINUE;
  if (std::strstr(message, "was not returned to mpool") != nullptr) ++t_unreturned;
  else if (std::strstr(message, "unexpected tag-receive descriptor") != nullptr) ++t_unmatched;
  else return UCS_LOG_FUNC_RC_CONTINUE;
  return UCS_LOG_FUNC_RC_STOP;
}

void destroy_worker(Ctx* c) {
  static const bool filtered = [] {
    if (std::getenv("UCX_LOG_LEVEL") != nullptr) return false;
    ucs_log_push_handler(count_unreturned);
    return true;
  }();
  t_unreturned = 0;
  t_unmatched = 0;
  if (c->worker != nullptr) ucp_worker_destroy(c->worker);
  if (c->context != nullptr) ucp_cleanup(c->context);
  c->worker = nullptr;
  c->context = nullptr;
  if (filtered && t_unreturned > 0)
    MPLUG_INFO(c->host, "ucx: the destroyed worker still held %d request(s) of transfers that failed; freed with it",
               t_unreturned);
  if (filtered && t_unmatched > 0)
    MPLUG_INFO(c->host,
               "ucx: %d message(s) that arrived were never received (sent by a peer as this side finished or "
               "closed); dropped with the worker",
               t_unmatched);
  t_unreturned = -1;
}

// Whether this machine has an RDMA device UCX could carry data on. Without
// one, UCX's only transport between hosts is TCP.
bool has_rdma_device() {
  DIR* d = opendir("/sys/class/infiniband");
  if (d == nullptr) return false;
  bool any = false;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') any = true;
  closedir(d);
  return any;
}

// Every setting of UCX (its own and its transports', such as UCX_TCP_*) as
// the user configured it, through variables and ucx.conf files, the way
// ucx_info -c prints them: "UCX_TLS" -> "all".
std::vector<std::pair<std::string, std::string>> user_config() {
  std::vector<std::pair<std::string, std::string>> out;
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return out;
  ucs_config_parser_print_all_opts(f, "UCX_", UCS_CONFIG_PRINT_CONFIG, &ucs_config_global_list);
  std::fclose(f);
  for (char *line = text, *next = nullptr; line != nullptr && *line != 0; line = next) {
    next = std::strchr(line, '\n');
    if (next != nullptr) *next++ = 0;
    const char* eq = std::strchr(line, '=');
    if (line[0] != '#' && eq != nullptr) out.emplace_back(std::string(line, static_cast<size_t>(eq - line)), eq + 1);
  }
  std::free(text);
  return out;
}

// UCX's settings that the plugin chooses when the user did not set them,
// on a machine with no RDMA device, where UCX's only way between hosts is
// TCP (with one, UCX's own choices are its zero-copy paths and are left
// alone). A setting counts as the user's when its variable is set or a
// ucx.conf gave it a value other than UCX's default.
//
// - UCX_TLS=tcp,sm,self: the transports that carry host memory here (the
//   plugin declares host pointers only). UCX's default (all) also opens
//   transports for GPU memory where UCX was built with them (cuda_copy,
//   cuda_ipc, gdr_copy, rocm_*), which load the GPU libraries and probe the
//   GPUs as each context starts.
// - UCX_RNDV_THRESH=inf: UCX 1.13's rendezvous over TCP (a request, then the
//   payload as put or get on a second connection) leaves the link idle
//   between its messages and makes two TCP flows compete: a 16 MiB message
//   reached 0.53-1.0 of a 200 Mbit/s link, most runs 0.70, against
//   0.97-1.0 with the payload sent eagerly on one connection, for the same
//   CPU time (docs/transports.md).
// - UCX_NET_DEVICES=<interface>: when MESHCCL_SOCKET_IFNAME (or
//   NCCL_SOCKET_IFNAME) names the network to use, UCX's TCP traffic goes
//   over the interface the plugin picked from it for its control socket,
//   as the socket and ofi transports' traffic does; unset, UCX picks
//   among the interfaces itself.
//
// Not chosen: larger TCP segments (UCX_TCP_TX_SEG_SIZE / RX_SEG_SIZE, 8 KiB
// and 64 KiB by default). 256 KiB made 16 MiB send/recv faster where the
// cores bind (8.7-13.2 ms against 13.5-22.1 ms unshaped), but with them a
// 4-rank ring AllReduce between two hosts at 200 Mbit/s stopped for good in
// 4 of 11 runs of 1-16 MiB: bytes sat unread in a UCX connection's socket
// while every rank polled (0 of 18 runs with UCX's defaults).
void choose_defaults(const Ctx* ctx, ucp_config_t* cfg) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  if (has_rdma_device()) {
    MPLUG_INFO(host, "ucx: an RDMA device is present: UCX chooses its transports and protocols itself");
    return;
  }
  std::string net_dev;
  const char* spec = param_str(host, "MESHCCL_SOCKET_IFNAME");
  if (spec != nullptr && *spec != 0) net_dev = ctx->iface.name.substr(0, ctx->iface.name.find(':'));  // no alias
  struct Choice {
    const char* name;  // without UCX_
    const char* ucx_default;
    std::string value;
  } choices[] = {{"TLS", "all", "tcp,sm,self"}, {"RNDV_THRESH", "auto", "inf"}, {"NET_DEVICES", "all", net_dev}};
  const auto current = user_config();
  std::string chosen, kept;
  for (const Choice& c : choices) {
    const std::string var = std::string("UCX_") + c.name;
    std::string now = c.ucx_default;
    for (const auto& [k, v] : current)
      if (k == var) now = v;
    if (std::getenv(var.c_str()) != nullptr || now != c.ucx_default) {
      kept += " " + var + "=" + now;
      continue;
    }
    if (c.value.empty()) continue;
    ucs_status_t s = ucp_config_modify(cfg, c.name, c.value.c_str());
    if (s == UCS_OK) chosen += " " + var + "=" + c.value;
    else MPLUG_WARN(host, "ucx: setting %s=%s failed: %s", var.c_str(), c.value.c_str(), ucs_status_string(s));
  }
  MPLUG_INFO(host, "ucx: no RDMA device, so TCP between hosts: chose%s%s%s",
             chosen.empty() ? " nothing" : chosen.c_str(), kept.empty() ? "" : "; kept the user's", kept.c_str());
}

meshccl_tresult_t make_worker(Ctx* ctx) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  ucp_config_t* cfg = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
  if (s != UCS_OK) return fail(host, "reading the UCX configuration (UCX_* variables)", s);
  choose_defaults(ctx, cfg);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  // WAKEUP for the wait descriptor (wait_fd); a UCX whose transports cannot
  // wake a sleeper refuses it, and the context goes without.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, cfg, &ctx->context);
  ctx->wakeup = s == UCS_OK;
  if (s != UCS_OK) {
    params.features = UCP_FEATURE_TAG;
    s = ucp_init(&params, cfg, &ctx->context);
  }
  ucp_config_release(cfg);
  if (s != UCS_OK) return fail(host, "ucp_init", s);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(ctx->context, &wp, &ctx->worker);
  if (s != UCS_OK) return fail(host, "creating the UCP worker", s);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(ctx->worker, &addr, &len);
  if (s != UCS_OK) return fail(host, "querying the worker address", s);
  const auto* bytes = reinterpret_cast<const unsigned char*>(addr);
  ctx->address.assign(bytes, bytes + len);
  ucp_worker_release_address(ctx->worker, addr);
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  const char* spec = param_str(host, "MESHCCL_SOCKET_IFNAME");
  const char* fam = param_str(host, "MESHCCL_SOCKET_FAMILY");
  int family = fam == nullptr                      ? AF_UNSPEC
               : std::strcmp(fam, "AF_INET6") == 0 ? AF_INET6
               : std::strcmp(fam, "AF_INET") == 0  ? AF_INET
                                                   : -1;
  if (family < 0) {
    MPLUG_WARN(host, "ucx: MESHCCL_SOCKET_FAMILY=%s is neither AF_INET nor AF_INET6", fam);
    return MESHCCL_T_INVALID_USAGE;
  }
  std::vector<socket::Iface> all = socket::list_ifaces();
  int i = socket::pick_iface(all, spec, family);
  if (i < 0) {
    MPLUG_WARN(host, "ucx: no interface that is up matches MESHCCL_SOCKET_IFNAME=%s",
               spec != nullptr ? spec : "(unset)");
    return MESHCCL_T_SYSTEM_ERROR;
  }
  ctx->iface = all[static_cast<size_t>(i)];
  ctx->next_conn = static_cast<uint32_t>(random_u64());
  ctx->host_id = host_key();
  meshccl_tresult_t r = make_worker(ctx.get());
  if (r != MESHCCL_T_SUCCESS) {
    destroy_worker(ctx.get());
    return r;
  }
  MPLUG_INFO(host, "ucx: UCX %s, worker address %zu bytes, control socket on %s", ucp_get_version_string(),
             ctx->address.size(), socket::describe(ctx->iface).c_str());
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

void props(Ctx* c, meshccl_transport_props_v1_t* p) {
  *p = meshccl_transport_props_v1_t{
      .name = "ucx",
      .bandwidth_gbs = c->iface.loopback ? 3.0 : 1.25,
      .latency_us = c->iface.loopback ? 10.0 : 20.0,
      .scope = MESHCCL_SCOPE_NETWORK,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
}

// ---- listen / connect / accept ---------------------------------------------

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** out) {
  const socket::Iface& ifc = ctx->iface;
  sockaddr_storage sa;
  int fd = socket::listen_tcp(ifc, static_cast<int>(kMaxPending), &sa);
  if (fd < 0) return sys_fail(ctx->host, "ucx", ("listening on " + socket::describe(ifc)).c_str());
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->gate.open(ctx->host, "ucx", fd, kHelloMagic, random_u64());
  lc->conn = ctx->next_conn++;
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = lc->gate.nonce();
  h.conn = lc->conn;
  h.family = static_cast<uint16_t>(sa.ss_family);
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    h.port = in->sin_port;
    std::memcpy(h.addr, &in->sin_addr, sizeof(in->sin_addr));
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    h.port = in6->sin6_port;
    h.scope_id = in6->sin6_scope_id;
    std::memcpy(h.addr, &in6->sin6_addr, sizeof(in6->sin6_addr));
  }
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *out = lc.release();
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

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** out) {
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || (h.family != AF_INET && h.family != AF_INET6))
    return g_check.misuse(ctx->host, "connect", "the handle is not a ucx handle");
  sockaddr_storage sa;
  const socklen_t len = handle_addr(h, &sa);
  std::string peer = socket::addr_to_string(reinterpret_cast<sockaddr*>(&sa));
  int fd = -1;
  meshccl_tresult_t r =
      dial_handle(ctx->connecting, h, ctx->host, "ucx", sa, len, peer, Hello{kHelloMagic, h.nonce}, &fd);
  if (r != MESHCCL_T_SUCCESS || fd < 0) return r;  // failed (said why), or under way
  auto c = std::make_unique<SendComm>();
  c->ctx = ctx;
  c->fd = fd;
  c->peer = peer;
  c->conn = h.conn;
  MPLUG_TRACE(ctx->host, "ucx: connected to %s (connection %u)", peer.c_str(), c->conn);
  r = advance_setup(c.get());  // the address may be there already
  if (r != MESHCCL_T_SUCCESS) {
    close_send(c.get());
    return r;
  }
  *out = c.release();
  return MESHCCL_T_SUCCESS;
}

// The sender proved itself: send it this worker's address. A fresh socket's
// buffer takes it whole (worker addresses are well below its size).
meshccl_tresult_t send_address(ListenComm* lc, int fd) {
  const std::vector<unsigned char>& a = lc->ctx->address;
  AddrMsg m{kAddrMagic, lc->ctx->host_id, a.size()};
  std::vector<unsigned char> msg(sizeof(m) + a.size());
  std::memcpy(msg.data(), &m, sizeof(m));
  std::memcpy(msg.data() + sizeof(m), a.data(), a.size());
  ssize_t w = send(fd, msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w == static_cast<ssize_t>(msg.size())) return MESHCCL_T_SUCCESS;
  if (w < 0) return sys_fail(lc->ctx->host, "ucx", "sending the worker address to the sender");
  MPLUG_WARN(lc->ctx->host, "ucx: the control socket took only %zd of %zu address bytes", w, msg.size());
  return MESHCCL_T_SYSTEM_ERROR;
}

meshccl_tresult_t do_accept(ListenComm* lc, void** out) {
  const meshccl_transport_host_v1_t* host = lc->ctx->host;
  if (lc->accepted) return g_check.misuse(host, "accept", "the listener already accepted its sender");
  int fd = -1;
  std::string peer;
  MPLUG_CHECK(lc->gate.poll(&fd, &peer));
  if (fd < 0) return MESHCCL_T_SUCCESS;  // not yet
  lc->accepted = true;
  socket::tune_tcp(fd);
  meshccl_tresult_t r = send_address(lc, fd);
  if (r != MESHCCL_T_SUCCESS) {
    close(fd);
    return r;
  }
  auto c = std::make_unique<RecvComm>();
  c->ctx = lc->ctx;
  c->fd = fd;
  c->peer = peer;
  c->conn = lc->conn;
  MPLUG_TRACE(host, "ucx: accepted %s (connection %u)", c->peer.c_str(), c->conn);
  lc->ctx->recvs.push_back(c.get());
  *out = c.release();
  return MESHCCL_T_SUCCESS;
}

void close_listen(ListenComm* lc) { lc->gate.close_all(); }

void send_ep_error(void* arg, ucp_ep_h ep, ucs_status_t s) {
  (void)ep;
  SendComm* c = static_cast<EpLink*>(arg)->comm;
  if (c == nullptr) return;  // closed meanwhile
  if (c->broken == MESHCCL_T_SUCCESS) {
    MPLUG_INFO(c->ctx->host, "ucx: connection to %s failed: %s", c->peer.c_str(), ucs_status_string(s));
    c->ep_status = s;
    c->broken = MESHCCL_T_REMOTE_ERROR;
  }
  c->ctx->peer_failed = true;
}

// Another host: peer error handling, so that UCX reports a dead or
// unreachable receiver. The same host: none, which lets UCX pick its
// shared-memory transports; the control socket reports a dead receiver.
meshccl_tresult_t create_ep(SendComm* c) {
  const bool same_host = !to_other_host(c);
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(c->addr.data());
  ep.err_mode = same_host ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  auto link = std::make_unique<EpLink>();
  link->comm = c;
  ep.err_handler.cb = send_ep_error;
  ep.err_handler.arg = link.get();
  ucs_status_t s = ucp_ep_create(c->ctx->worker, &ep, &c->ep);
  if (s == UCS_OK) c->link = link.release();
  if (s != UCS_OK) {
    c->ep = nullptr;
    return fail(c->ctx->host, ("creating the endpoint to " + c->peer).c_str(), s);
  }
  MPLUG_TRACE(c->ctx->host, "ucx: endpoint to %s (%s, error handling %s)", c->peer.c_str(),
              same_host ? "same host" : "another host", same_host ? "none" : "peer");
  return MESHCCL_T_SUCCESS;
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

meshccl_tresult_t broken_result(SendComm* c) {
  if (c->ep_status != UCS_OK && !c->ep_warned) {
    c->ep_warned = true;
    MPLUG_WARN(c->ctx->host, "ucx: connection to %s failed: %s (%s)", c->peer.c_str(), ucs_status_string(c->ep_status),
               status_hint(c->ep_status));
  }
  return c->broken;
}

uint64_t host_key() {
  uint64_t h = 0xcbf29ce484222325ull;
  char boot[64] = {};
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    size_t n = std::fread(boot, 1, sizeof(boot) - 1, f);
    std::fclose(f);
    h = fnv(h, boot, n);
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) h = fnv(h, host, std::strlen(host));
  struct stat st {};
  if (stat("/proc/self/ns/net", &st) == 0) h = fnv(h, &st.st_ino, sizeof(st.st_ino));
  return h;
}

meshccl_tresult_t status_result(ucs_status_t s) {
  switch (s) {
    case UCS_OK: return MESHCCL_T_SUCCESS;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_IO_ERROR:  // shared-memory transports reading a peer that is gone (peer error handling is off there)
    case UCS_ERR_TIMED_OUT: return MESHCCL_T_REMOTE_ERROR;
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_INVALID_PARAM: return MESHCCL_T_INVALID_USAGE;
    default: return MESHCCL_T_SYSTEM_ERROR;
  }
}

meshccl_tresult_t fail(const meshccl_transport_host_v1_t* host, const char* what, ucs_status_t s) {
  MPLUG_WARN(host, "ucx: %s failed: %s (UCX status %d): %s", what, ucs_status_string(s), static_cast<int>(s),
             status_hint(s));
  return status_result(s);
}

ucs_status_t check(void* req) {
  if (req == nullptr) return UCS_OK;
  if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
  return ucp_request_check_status(req);
}

bool drop(ucp_worker_h w, void*& req) {
  bool running = false;
  if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
    running = ucp_request_check_status(req) == UCS_INPROGRESS;
    if (running) ucp_request_cancel(w, req);
    ucp_request_free(req);
  }
  req = nullptr;
  return running;
}

meshccl_tresult_t advance_setup(SendComm* c) {
  if (c->ep != nullptr || c->broken != MESHCCL_T_SUCCESS) return broken_result(c);
  for (;;) {
    bool head = c->agot < sizeof(AddrMsg);
    char* dst = head ? reinterpret_cast<char*>(&c->amsg) + c->agot
                     : reinterpret_cast<char*>(c->addr.data()) + (c->agot - sizeof(AddrMsg));
    size_t want = head ? sizeof(AddrMsg) - c->agot : sizeof(AddrMsg) + c->amsg.len - c->agot;
    if (want == 0) break;
    ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return MESHCCL_T_SUCCESS;  // not yet
    if (n <= 0) {
      MPLUG_WARN(c->ctx->host, "ucx: the receiver at %s closed the connection before sending its address: %s",
                 c->peer.c_str(), n == 0 ? "end of stream" : std::strerror(errno));
      return c->broken = MESHCCL_T_REMOTE_ERROR;
    }
    c->agot += static_cast<uint32_t>(n);
    if (c->agot == sizeof(AddrMsg)) {
      if (c->amsg.magic != kAddrMagic || c->amsg.len == 0 || c->amsg.len > kMaxAddr) {
        MPLUG_WARN(c->ctx->host, "ucx: the receiver at %s sent no valid worker address", c->peer.c_str());
        return c->broken = MESHCCL_T_REMOTE_ERROR;
      }
      c->addr.resize(c->amsg.len);
    }
  }
  if (meshccl_tresult_t r = create_ep(c); r != MESHCCL_T_SUCCESS) return c->broken = r;
  while (Request* r = c->waiting.pop_front()) start_send(c, r);
  return MESHCCL_T_SUCCESS;
}

namespace {

// Endpoint closes still in flight get a bounded wait. UCX (1.13) destroys a
// worker's endpoints with it and, after an endpoint failed with requests in
// flight, can find one still holding requests and abort the process
// (ucp_ep_destroy_base's assertion); destroying such a worker is not safe.
// The same holds for a send or flush to another host given up on while UCX
// still ran it (an abort after MESHCCL_TIMEOUT on a link that is down or a
// peer that is stopped: UCX itself has not seen a failure yet; the process
// aborted in ucp_worker_destroy's endpoint cleanup). So a worker that saw an
// endpoint fail, gave up on a request in flight, or whose closes did not
// finish, is kept, with the context's memory its callbacks reach: one per
// communicator that lost a peer, until the process exits. One that gave up
// on a receive UCX had matched (see may_progress) is not even progressed, so
// nothing more lands in memory the caller may have freed.
// The worker's event descriptor, armed: readable once the worker has events
// to progress. ucp_worker_arm says busy while some are pending already: the
// host polls test() (which progresses the worker) instead of blocking.
meshccl_tresult_t wait_fd(Ctx* c, int* fd) {
  // (freeze.frozen(), not may_progress: that check freezes a context whose
  // receives are merely running, which only a closing comm may ask.)
  if (!c->wakeup || c->worker == nullptr || c->freeze.frozen()) return MESHCCL_T_SUCCESS;
  if (c->efd < 0) {
    if (ucp_worker_get_efd(c->worker, &c->efd) != UCS_OK) c->efd = -1;
    c->epfd = c->efd >= 0 ? epoll_create1(EPOLL_CLOEXEC) : -1;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = c->efd;
    if (c->epfd < 0 || epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->efd, &ev) != 0) {
      c->wakeup = false;
      return MESHCCL_T_SUCCESS;
    }
  }
  for (RecvComm* r : c->recvs) {
    if (r->watched || r->fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = r->fd;
    if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, r->fd, &ev) != 0) return MESHCCL_T_SUCCESS;
    r->watched = true;
  }
  c->progress_calls.wake();                                           // the host tests at once after it blocked
  if (ucp_worker_arm(c->worker) != UCS_OK) return MESHCCL_T_SUCCESS;  // UCS_ERR_BUSY: progress first
  *fd = c->epfd;
  return MESHCCL_T_SUCCESS;
}

bool finalize(Ctx* c) {
  if (c->epfd >= 0) ::close(c->epfd);  // the worker's own efd goes with the worker
  c->epfd = -1;
  c->connecting.clear();  // connects the host gave up on
  const uint64_t until = now_ns() + kCloseWaitNs;
  while (!c->closing.empty() && may_progress(c) && now_ns() < until) {
    ucp_worker_progress(c->worker);
    for (size_t k = 0; k < c->closing.size();) {
      if (ucp_request_check_status(c->closing[k]) != UCS_INPROGRESS) {
        ucp_request_free(c->closing[k]);
        c->closing.erase(c->closing.begin() + static_cast<long>(k));
      } else {
        ++k;
      }
    }
  }
  const bool frozen = c->freeze.frozen();
  if (!c->closing.empty() || c->peer_failed || c->abandoned || frozen) {
    MPLUG_INFO(c->host, "ucx: %s; the UCX worker is kept",
               frozen ? "a receive was given up on while UCX still wrote it (the worker is no longer progressed)"
               : c->peer_failed ? "an endpoint of this context failed"
               : c->abandoned   ? "a send was given up on while UCX still ran it"
                                : "endpoint closes did not finish in time");
    return false;
  }
  destroy_worker(c);
  c->closed_links.clear();  // no endpoint is left to report through them
  return true;
}

constexpr char kName[] = "ucx";
constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kUcx{
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
}  // namespace meshccl::plugin::ucx

extern "C" __attribute__((visibility("default"))) const meshccl_transport_v1_t meshccl_transport_v1 =
    meshccl::plugin::Entry<meshccl::plugin::ucx::kUcx>::table();

// The optional wait descriptor (see transport.h).
extern "C" __attribute__((visibility("default"))) int meshccl_transport_v1_wait_fd(void* ctx, int* fd) {
  return meshccl::plugin::Entry<meshccl::plugin::ucx::kUcx>::wait_fd(ctx, fd);
}

// The optional probe (see transport.h).
extern "C" __attribute__((visibility("default"))) int meshccl_transport_v1_probe(void* recv_comm, uint64_t tag,
                                                                                 int* found) {
  return meshccl::plugin::Entry<meshccl::plugin::ucx::kUcx>::probe(recv_comm, tag, found);
}

// Optional description for meshccl_info (see transport.h).
extern "C" __attribute__((visibility("default"))) const char* meshccl_transport_v1_describe(void) {
  static char text[64];
  std::snprintf(text, sizeof(text), "UCX %s", ucp_get_version_string());
  return text;
}
