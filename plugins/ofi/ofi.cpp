// The libfabric transport: opening the fabric, progress and errors, the
// connection handshake, and the C entry table. Messages: ofi_msg.cpp. Layout
// of the state and the wire: ofi_comm.h.
//
// Settings: MESHCCL_OFI_PROVIDER (else libfabric's FI_PROVIDER, else
// tcp;ofi_rxm, then shm) picks the provider, MESHCCL_SOCKET_IFNAME the domain
// (network interface) of a network provider, MESHCCL_OFI_MAX_MSG caps the
// size of one libfabric message (longer payloads are split). Over
// tcp;ofi_rxm the plugin raises rxm's eager limit to that size unless
// FI_OFI_RXM_EAGER_LIMIT is set (EagerLimit).
#include <fcntl.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugins/common/entry.h"
#include "plugins/ofi/ofi_comm.h"

namespace meshccl::plugin::ofi {

ArgCheck g_check("ofi");

namespace {

meshccl_tresult_t err_result(int err) {
  switch (err) {
    case FI_ECONNRESET:
    case FI_ECONNREFUSED:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENOTCONN:
    case FI_ETIMEDOUT:
    case FI_ECANCELED:
    case EPIPE:
    case FI_EIO: return MESHCCL_T_REMOTE_ERROR;
    case FI_ETRUNC: return MESHCCL_T_INVALID_USAGE;
    default: return MESHCCL_T_SYSTEM_ERROR;
  }
}

// Which kernel this process runs on: processes with the same key can check
// each other's pid.
uint64_t host_key() {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const char* s, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ull;
  };
  char buf[128] = {};
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) mix(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf));
  if (n > 0) mix(buf, static_cast<size_t>(n));
  return h;
}

// MESHCCL_SOCKET_IFNAME as NCCL reads it: "^a,b" excludes, "=a" is exact,
// anything else a list of prefixes.
bool iface_matches(const char* spec, const char* name) {
  if (spec == nullptr || *spec == 0) return true;
  bool exclude = *spec == '^', exact = *spec == '=';
  if (exclude || exact) ++spec;
  bool hit = false;
  for (const char* p = spec; *p != 0 && !hit;) {
    const char* e = std::strchr(p, ',');
    size_t n = e != nullptr ? static_cast<size_t>(e - p) : std::strlen(p);
    hit = exact ? std::strlen(name) == n && std::strncmp(p, name, n) == 0 : std::strncmp(p, name, n) == 0;
    p += n + (e != nullptr ? 1 : 0);
  }
  return exclude ? !hit : hit;
}

// The provider stacks this plugin is made and tested for, in order of
// preference. Unless MESHCCL_OFI_PROVIDER or FI_PROVIDER names one, libfabric
// is asked for these only, one at a time: asked for any provider, it also
// runs the others' discovery (psm, psm2, verbs, ...), which may open devices
// and load their libraries.
constexpr const char* kProviders[] = {"tcp;ofi_rxm", "shm"};

fi_info* make_hints(const char* prov) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return nullptr;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
  hints->mode = 0;  // no FI_CONTEXT: several operations share one context
  // Buffers are not registered: FI_MR_LOCAL stays out.
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (prov != nullptr) hints->fabric_attr->prov_name = strdup(prov);
  return hints;
}

// What to ask libfabric for: MESHCCL_OFI_PROVIDER; else nothing named when
// FI_PROVIDER is set (libfabric applies it); else this plugin's providers.
std::vector<const char*> providers_to_ask(const meshccl_transport_host_v1_t* host) {
  const char* prov = param_str(host, "MESHCCL_OFI_PROVIDER");
  if (prov != nullptr && *prov != 0) return {prov};
  const char* env = std::getenv("FI_PROVIDER");
  if (env != nullptr && *env != 0) return {nullptr};
  return std::vector<const char*>(std::begin(kProviders), std::end(kProviders));
}

// The first provider asked for that offers reliable tagged messages: its
// entries, for every domain; nullptr after a warning when none does.
fi_info* provider_entries(const meshccl_transport_host_v1_t* host) {
  const std::vector<const char*> asked = providers_to_ask(host);
  int rc = -FI_ENODATA;
  for (const char* prov : asked) {
    fi_info* hints = make_hints(prov);
    if (hints == nullptr) return nullptr;
    fi_info* all = nullptr;
    rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &all);
    fi_freeinfo(hints);
    if (rc == 0) return all;
  }
  std::string names;
  for (const char* prov : asked)
    names += std::string(names.empty() ? "" : " or ") + (prov != nullptr ? prov : std::getenv("FI_PROVIDER"));
  MPLUG_WARN(host, "ofi: no libfabric provider named %s offers reliable tagged messages (FI_EP_RDM, FI_TAGGED): %s",
             names.c_str(), fi_strerror(-rc));
  return nullptr;
}

// The provider's entries: the first whose domain passes MESHCCL_SOCKET_IFNAME.
meshccl_tresult_t pick_info(Ctx* ctx) {
  fi_info* all = provider_entries(ctx->host);
  if (all == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  const char* spec = param_str(ctx->host, "MESHCCL_SOCKET_IFNAME");
  fi_info* pick = all;
  for (fi_info* i = all; i != nullptr && spec != nullptr; i = i->next) {
    if (iface_matches(spec, i->domain_attr->name)) {
      pick = i;
      break;
    }
  }
  ctx->info = fi_dupinfo(pick);
  fi_freeinfo(all);
  if (ctx->info == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  ctx->dev_name = std::string("ofi:") + ctx->info->fabric_attr->prov_name + ":" + ctx->info->domain_attr->name;
  ctx->host_only = std::strncmp(ctx->info->fabric_attr->prov_name, "shm", 3) == 0;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t open_endpoint(Ctx* ctx) {
  const meshccl_transport_host_v1_t* h = ctx->host;
  int rc = fi_fabric(ctx->info->fabric_attr, &ctx->fabric, nullptr);
  if (rc != 0) return fi_fail(h, "opening the fabric (fi_fabric)", rc);
  rc = fi_domain(ctx->fabric, ctx->info, &ctx->domain, nullptr);
  if (rc != 0) return fi_fail(h, "opening the domain (fi_domain)", rc);
  fi_av_attr av{};
  av.type = FI_AV_UNSPEC;
  rc = fi_av_open(ctx->domain, &av, &ctx->av, nullptr);
  if (rc != 0) return fi_fail(h, "opening the address vector (fi_av_open)", rc);
  fi_cq_attr cq{};
  cq.format = FI_CQ_FORMAT_TAGGED;
  // A descriptor to block on (wait_fd) where the provider has one; else none.
  cq.wait_obj = FI_WAIT_FD;
  rc = fi_cq_open(ctx->domain, &cq, &ctx->cq, nullptr);
  ctx->cq_waits = rc == 0;
  if (rc != 0) {
    cq.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(ctx->domain, &cq, &ctx->cq, nullptr);
  }
  if (rc != 0) return fi_fail(h, "opening the completion queue (fi_cq_open)", rc);
  rc = fi_endpoint(ctx->domain, ctx->info, &ctx->ep, nullptr);
  if (rc != 0) return fi_fail(h, "opening the endpoint (fi_endpoint)", rc);
  rc = fi_ep_bind(ctx->ep, &ctx->av->fid, 0);
  if (rc == 0) rc = fi_ep_bind(ctx->ep, &ctx->cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return fi_fail(h, "binding the endpoint (fi_ep_bind)", rc);
  rc = fi_enable(ctx->ep);
  if (rc != 0) return fi_fail(h, "enabling the endpoint (fi_enable)", rc);
  size_t len = 0;
  rc = fi_getname(&ctx->ep->fid, nullptr, &len);
  if (rc != 0 && rc != -FI_ETOOSMALL) return fi_fail(h, "reading the endpoint name (fi_getname)", rc);
  if (len == 0 || len > kNameMax) {
    MPLUG_WARN(h, "ofi: the %s endpoint name has %zu bytes; a handle carries at most %zu", ctx->dev_name.c_str(), len,
               kNameMax);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  ctx->name.resize(len);
  rc = fi_getname(&ctx->ep->fid, ctx->name.data(), &len);
  if (rc != 0) return fi_fail(h, "reading the endpoint name (fi_getname)", rc);
  ctx->name.resize(len);
  return MESHCCL_T_SUCCESS;
}

// The completion queue's descriptor, armed: fi_trywait says whether the
// host may block on it now (FI_EAGAIN: completions or provider work are
// pending, progress first). Close notices still to post need progress too.
meshccl_tresult_t wait_fd(Ctx* c, int* fd) {
  if (!c->cq_waits || c->cq == nullptr || !c->notices.empty()) return MESHCCL_T_SUCCESS;
  if (c->cq_fd < 0 && fi_control(&c->cq->fid, FI_GETWAIT, &c->cq_fd) != 0) {
    c->cq_waits = false;
    c->cq_fd = -1;
    return MESHCCL_T_SUCCESS;
  }
  fid* f = &c->cq->fid;
  if (fi_trywait(c->fabric, &f, 1) != FI_SUCCESS) return MESHCCL_T_SUCCESS;
  *fd = c->cq_fd;
  return MESHCCL_T_SUCCESS;
}

bool close_fabric(Ctx* c) {
  bool clean = true;
  auto close = [c, &clean](fid* f, const char* what) {
    int rc = f != nullptr ? fi_close(f) : 0;
    if (rc == 0) return;
    clean = false;
    MPLUG_INFO(c->host, "ofi: closing the %s (fi_close): %s", what, fi_strerror(-rc));
  };
  close(c->ep != nullptr ? &c->ep->fid : nullptr, "endpoint");
  close(c->av != nullptr ? &c->av->fid : nullptr, "address vector");
  close(c->cq != nullptr ? &c->cq->fid : nullptr, "completion queue");
  close(c->domain != nullptr ? &c->domain->fid : nullptr, "domain");
  close(c->fabric != nullptr ? &c->fabric->fid : nullptr, "fabric");
  if (c->info != nullptr) fi_freeinfo(c->info);
  c->ep = nullptr;
  c->av = nullptr;
  c->cq = nullptr;
  c->domain = nullptr;
  c->fabric = nullptr;
  c->info = nullptr;
  return clean;
}

bool rxm_over_tcp(const fi_info* info) {
  const char* prov = info->fabric_attr->prov_name;
  return std::strstr(prov, "ofi_rxm") != nullptr && std::strncmp(prov, "tcp", 3) == 0;
}

// A byte count from libfabric's own variable `name`, or 0 when unset or not
// a plain number of at least 1 KiB.
uint64_t fi_env_size(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr) return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(env, &end, 10);
  return end != env && *end == 0 && v >= 1024 ? v : 0;
}

// Payload messages over tcp;ofi_rxm. libfabric 1.17's rxm over tcp sends
// a message above its eager limit (FI_OFI_RXM_EAGER_LIMIT, 16 KiB unless
// set) by rendezvous: a request, the receiver's read, the sender's answer
// and a completion notice, each moved only while the process that must
// act polls (rxm's SAR protocol is off over tcp: its dynamic receive
// buffers set the SAR limit to the eager limit). The link then idles
// whenever either rank sleeps between polls: 16 MiB send/recv at 1 Gbit/s
// took 0.14-0.23 s. Sent eagerly (the plugin raises the eager limit to its
// message size, see EagerLimit), a message streams on the connection like
// the socket transport's: written as the socket takes it, placed straight
// into the posted receive (or into a buffer rxm allocates when it arrives
// first); 0.14-0.145 s. Other providers (verbs, efa) read with RDMA and
// keep one message per payload.
constexpr uint64_t kRxmMaxMsg = 128 << 10;
// Eager messages that arrive before their receive are held in a buffer rxm
// allocates at their size; larger chunks stay rendezvous.
constexpr uint64_t kRxmEagerMax = 4 << 20;

uint64_t default_network_max_msg(const fi_info* info) {
  if (!rxm_over_tcp(info)) return kDefaultMaxMsg;
  const uint64_t user = fi_env_size("FI_OFI_RXM_EAGER_LIMIT");
  return user != 0 ? user : kRxmMaxMsg;
}

// While it lives, FI_OFI_RXM_EAGER_LIMIT is the context's message size
// (at most kRxmEagerMax) for tcp;ofi_rxm, unless the user set it: libfabric
// takes its settings only from the environment, and rxm reads this one when
// an endpoint opens. The variable is put back (removed) right after, so the
// program and what it starts see their environment as they left it. One
// context opens at a time for this (mu); a thread of the program that reads
// the environment in that moment may see the variable.
class EagerLimit {
 public:
  EagerLimit(Ctx* ctx, std::string* note) {
    if (ctx->host_only || !rxm_over_tcp(ctx->info)) return;
    lock_ = std::unique_lock<std::mutex>(mu());
    if (const char* user = std::getenv(kName)) {
      *note = std::string(", ") + kName + "=" + user + " (set by the user)";
      return;
    }
    const uint64_t v = std::min(ctx->chunk, kRxmEagerMax);
    set_ = setenv(kName, std::to_string(v).c_str(), 0) == 0;
    const std::string how = v == ctx->chunk ? ", sent eagerly (" : ", sent eagerly up to " + std::to_string(v) + " (";
    *note = set_ ? how + kName + "=" + std::to_string(v) +
                       " chosen: above rxm's default of 16384, messages go by rendezvous)"
                 : std::string(", ") + kName + " could not be set: " + std::strerror(errno);
  }
  ~EagerLimit() {
    if (set_) unsetenv(kName);
  }
  EagerLimit(const EagerLimit&) = delete;
  EagerLimit& operator=(const EagerLimit&) = delete;

 private:
  static constexpr const char* kName = "FI_OFI_RXM_EAGER_LIMIT";
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  std::unique_lock<std::mutex> lock_;
  bool set_ = false;
};

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  ctx->host_key = host_key();
  ctx->pid = static_cast<int32_t>(::getpid());
  meshccl_tresult_t r = pick_info(ctx.get());
  if (r != MESHCCL_T_SUCCESS) {
    close_fabric(ctx.get());
    return r;
  }
  // shm copies a whole posted receive in one progress call: 1 MiB pieces keep
  // a poll short. Network providers are fastest with one message per payload,
  // except rxm over tcp (above).
  uint64_t limit = ctx->host_only ? kDefaultShmMaxMsg : default_network_max_msg(ctx->info);
  const char* max_msg = param_str(host, "MESHCCL_OFI_MAX_MSG");  // "" = the registry's unset
  if (max_msg != nullptr && *max_msg != 0) r = param_size(host, "MESHCCL_OFI_MAX_MSG", 1024, 1ull << 40, &limit);
  ctx->chunk = std::min<uint64_t>(ctx->info->ep_attr->max_msg_size, limit);
  std::string note;
  if (r == MESHCCL_T_SUCCESS) {
    EagerLimit eager(ctx.get(), &note);
    r = open_endpoint(ctx.get());
  }
  if (r != MESHCCL_T_SUCCESS) {
    close_fabric(ctx.get());
    return r;
  }
  MPLUG_INFO(host, "ofi: %s, messages of up to %" PRIu64 " bytes%s", ctx->dev_name.c_str(), ctx->chunk, note.c_str());
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

void props(Ctx* c, meshccl_transport_props_v1_t* p) {
  const char* dom = c->info->domain_attr->name;
  double bw = c->host_only ? 10.0 : 1.25, lat = c->host_only ? 1.0 : 30.0;
  if (!c->host_only && std::strcmp(dom, "lo") == 0) {
    bw = 3.0;
    lat = 15.0;
  } else if (!c->host_only) {
    char path[128];
    std::snprintf(path, sizeof(path), "/sys/class/net/%s/speed", dom);
    if (FILE* f = std::fopen(path, "r")) {
      long mbps = 0;
      if (std::fscanf(f, "%ld", &mbps) == 1 && mbps > 0) bw = static_cast<double>(mbps) / 8000.0;
      std::fclose(f);
    }
  }
  // The plugin as a whole is a network transport; with a host-only provider
  // a connect to another host is refused with a message (do_connect).
  *p = meshccl_transport_props_v1_t{.name = c->dev_name.c_str(),
                                    .bandwidth_gbs = bw,
                                    .latency_us = lat,
                                    .scope = MESHCCL_SCOPE_NETWORK,
                                    .ptr_support = MESHCCL_PTR_HOST,
                                    .max_requests = 0};
}

meshccl_tresult_t lookup_addr(Ctx* ctx, const uint8_t* name, size_t len, fi_addr_t* out) {
  for (const Peer& p : ctx->peers) {
    if (p.name.size() == len && std::memcmp(p.name.data(), name, len) == 0) {
      *out = p.addr;
      return MESHCCL_T_SUCCESS;
    }
  }
  fi_addr_t a = FI_ADDR_UNSPEC;
  int n = fi_av_insert(ctx->av, name, 1, &a, 0, nullptr);
  if (n != 1) {
    MPLUG_WARN(ctx->host, "ofi: the peer's address is not valid for %s (fi_av_insert: %s)", ctx->dev_name.c_str(),
               n < 0 ? fi_strerror(-n) : "not inserted");
    return MESHCCL_T_SYSTEM_ERROR;
  }
  ctx->peers.push_back(Peer{std::vector<uint8_t>(name, name + len), a});
  *out = a;
  return MESHCCL_T_SUCCESS;
}

// ---- handshake ---------------------------------------------------------------

// While a hello waits to be posted or delivered: a connection may need this
// side's progress while the host polls only the other side.
void helper_loop(Ctx* ctx) {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::lock_guard<std::mutex> g(ctx->mu);
    auto& cn = ctx->connecting;
    if (!ctx->stopping) {
      (void)progress(ctx);
      for (size_t i = 0; i < cn.size();) {
        SendComm* c = cn[i];
        meshccl_tresult_t r = advance_sends(c);
        if (r != MESHCCL_T_SUCCESS && c->broken == MESHCCL_T_SUCCESS) c->broken = r;
        bool waiting = c->broken == MESHCCL_T_SUCCESS && c->hello != nullptr &&
                       (c->hello->state == State::kQueued || busy(c->hello->hdr));
        if (waiting) ++i;
        else cn.erase(cn.begin() + static_cast<long>(i));
      }
    }
    if (ctx->stopping || cn.empty()) {
      ctx->helper_running = false;
      return;
    }
  }
}

void start_helper(Ctx* ctx) {
  if (ctx->helper_running) return;
  if (ctx->helper.joinable()) ctx->helper.join();  // it has left its loop
  ctx->helper_running = true;
  ctx->helper = std::thread(helper_loop, ctx);
}

void stop_helper(Ctx* ctx) {
  {
    std::lock_guard<std::mutex> g(ctx->mu);
    ctx->stopping = true;
  }
  if (ctx->helper.joinable()) ctx->helper.join();
}

// ---- connections------------------------------------------------------------

meshccl_tresult_t post_hello_recv(ListenComm* lc) {
  Request* r = lc->hello;
  r->hdr = Op{r, 0, 0, 0, 0, 0};
  return post_trecv(lc->ctx, r->buf, sizeof(Hello), FI_ADDR_UNSPEC, ftag(kHello, lc->conn, 0, 0), &r->hdr);
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** out) {
  if (ctx->next_conn >= (1u << kConnBits)) {
    MPLUG_WARN(ctx->host, "ofi: this context ran out of connection ids (%u)", 1u << kConnBits);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  auto lc = std::make_unique<ListenComm>();
  lc->ctx = ctx;
  lc->conn = ctx->next_conn++;
  lc->nonce = random_u64();
  lc->hello = new_request(ctx, Kind::kCtl, lc.get());
  if (lc->hello == nullptr) return MESHCCL_T_SYSTEM_ERROR;
  meshccl_tresult_t r = post_hello_recv(lc.get());
  if (r != MESHCCL_T_SUCCESS) {
    release(ctx, lc->hello);
    return r;
  }
  Handle h{};
  h.magic = kHandleMagic;
  h.nonce = lc->nonce;
  h.host_key = ctx->host_key;
  h.conn = lc->conn;
  h.pid = ctx->pid;
  h.name_len = static_cast<uint16_t>(ctx->name.size());
  std::memcpy(h.name, ctx->name.data(), ctx->name.size());
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *out = lc.release();
  return MESHCCL_T_SUCCESS;
}

// The send comm is usable at once: the hello and every message after it are
// queued in libfabric, and the receiver takes messages in only after the
// hello proved the nonce.
meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** out) {
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || h.name_len == 0 || h.name_len > kNameMax)
    return g_check.misuse(ctx->host, "connect", "the handle is not an ofi handle");
  if (ctx->host_only && h.host_key != ctx->host_key) {
    MPLUG_WARN(ctx->host, "ofi: provider %s reaches only processes of this host, and the listener is on another",
               ctx->info->fabric_attr->prov_name);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  auto c = std::make_unique<SendComm>();
  c->ctx = ctx;
  c->conn = h.conn;
  c->peer_pid = h.host_key == ctx->host_key ? h.pid : 0;
  MPLUG_CHECK(lookup_addr(ctx, h.name, h.name_len, &c->peer));
  c->back = new_request(ctx, Kind::kCtl, c.get());
  c->hello = new_request(ctx, Kind::kCtl, c.get());
  if (c->back == nullptr || c->hello == nullptr) {
    close_send(c.get());
    return MESHCCL_T_SYSTEM_ERROR;
  }
  Hello he{};
  he.magic = kHelloMagic;
  he.nonce = h.nonce;
  he.host_key = ctx->host_key;
  he.pid = ctx->pid;
  he.name_len = static_cast<uint16_t>(ctx->name.size());
  std::memcpy(he.name, ctx->name.data(), ctx->name.size());
  std::memcpy(c->hello->buf, &he, sizeof(he));
  c->hello->state = State::kQueued;
  meshccl_tresult_t r =
      post_trecv(ctx, c->back->buf, sizeof(WireHdr), c->peer, ftag(kBack, c->conn, 0, 0), &c->back->hdr);
  if (r == MESHCCL_T_SUCCESS) r = advance_sends(c.get());
  if (r != MESHCCL_T_SUCCESS) {
    close_send(c.get());
    return r;
  }
  ctx->connecting.push_back(c.get());
  start_helper(ctx);
  *out = c.release();
  return MESHCCL_T_SUCCESS;
}

// True when the hello presents this listener's nonce in a well-formed message.
bool hello_ok(const ListenComm* lc, const Request* r) {
  Hello he;
  std::memcpy(&he, r->buf, sizeof(he));
  return r->hdr.bytes == sizeof(Hello) && he.magic == kHelloMagic && he.nonce == lc->nonce && he.name_len > 0 &&
         he.name_len <= sizeof(he.name);
}

meshccl_tresult_t do_accept(ListenComm* lc, void** out) {
  Ctx* ctx = lc->ctx;
  if (lc->accepted) return g_check.misuse(ctx->host, "accept", "the listener already accepted its sender");
  MPLUG_CHECK(progress(ctx));
  Request* r = lc->hello;
  if (busy(r->hdr)) return MESHCCL_T_SUCCESS;  // not yet
  if (r->hdr.err != 0) return op_fail(ctx, "receiving the hello", r->hdr);
  if (!hello_ok(lc, r)) {
    // Someone who does not hold the handle: refuse, keep waiting for the sender.
    MPLUG_WARN(ctx->host, "ofi: refused a connection to listener %u: it did not present this listener's nonce",
               lc->conn);
    return post_hello_recv(lc);
  }
  Hello he;
  std::memcpy(&he, r->buf, sizeof(he));
  auto c = std::make_unique<RecvComm>(ctx);
  c->conn = lc->conn;
  c->peer_pid = he.host_key == ctx->host_key ? he.pid : 0;
  MPLUG_CHECK(lookup_addr(ctx, he.name, he.name_len, &c->peer));
  meshccl_tresult_t res = start_slots(c.get());
  if (res != MESHCCL_T_SUCCESS) {
    close_recv(c.get());
    return res;
  }
  release(ctx, r);
  lc->hello = nullptr;
  lc->accepted = true;
  ctx->recvs.push_back(c.get());
  *out = c.release();
  return MESHCCL_T_SUCCESS;
}

void close_listen(ListenComm* lc) {
  if (lc->hello == nullptr) return;
  if (busy(lc->hello->hdr)) fi_cancel(&lc->ctx->ep->fid, &lc->hello->hdr);
  release(lc->ctx, lc->hello);
  lc->hello = nullptr;
}

// libfabric's tcp;ofi_rxm stack refuses to close a domain after a peer
// failed with operations outstanding (EBUSY) and keeps the requests and
// buffers posted from this context: they must not be freed and reused then,
// so the context's memory is kept (one context per communicator that saw
// a peer fail).
bool finalize(Ctx* c) {
  stop_helper(c);
  const bool live = may_progress(c);
  if (c->freeze.frozen()) {
    MPLUG_INFO(c->host,
               "ofi: a receive was given up on while libfabric may still write it; the context is kept and no longer "
               "progressed");
    return false;
  }
  if (live) {
    drain_notices(c);   // close notices still in flight get a bounded wait
    (void)progress(c);  // reports what finished; the rest goes with the endpoint
  }
  if (close_fabric(c)) return true;
  MPLUG_INFO(c->host, "ofi: libfabric still holds resources of this context; its memory is kept");
  return false;
}

constexpr char kName[] = "ofi";
constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kOfi{
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
    .serialized = true,  // the helper thread progresses the context too
};

}  // namespace

// ---- progress and errors (shared with ofi_msg.cpp) -----------------------------

meshccl_tresult_t fi_fail(const meshccl_transport_host_v1_t* host, const char* what, ssize_t rc) {
  int e = rc < 0 ? static_cast<int>(-rc) : static_cast<int>(rc);
  MPLUG_WARN(host, "ofi: %s failed: %s (%d)", what, fi_strerror(e), -e);
  return err_result(e);
}

meshccl_tresult_t op_fail(Ctx* ctx, const char* what, const Op& op) {
  MPLUG_WARN(ctx->host, "ofi: %s failed: %s (provider error %d)", what, fi_strerror(op.err), op.prov_errno);
  return err_result(op.err);
}

Request* new_request(Ctx* ctx, Kind kind, void* comm) {
  Request* r = ctx->reqs.get();
  if (r == nullptr) return nullptr;
  r->magic = kind == Kind::kSend || kind == Kind::kRecv ? kReqMagic : 0;
  r->kind = kind;
  r->comm = comm;
  r->result = MESHCCL_T_SUCCESS;
  r->hdr.owner = r->body.owner = r;
  return r;
}

void release(Ctx* ctx, Request* r) {
  r->magic = 0;
  if (busy(r->hdr) || busy(r->body)) {
    r->orphan = true;
    ctx->orphans.push_back(r);
  } else {
    ctx->reqs.put(r);
  }
}

namespace {
void finished(Ctx* ctx, Op* op) {
  ++op->finished;
  Request* r = op->owner;
  if (r->orphan && !busy(r->hdr) && !busy(r->body)) {
    ctx->orphans.remove(r);
    ctx->reqs.put(r);
  }
}

meshccl_tresult_t read_error(Ctx* ctx) {
  fi_cq_err_entry e{};
  ssize_t n = fi_cq_readerr(ctx->cq, &e, 0);
  if (n == -FI_EAGAIN) return MESHCCL_T_SUCCESS;
  if (n < 0) return fi_fail(ctx->host, "reading a completion error (fi_cq_readerr)", n);
  auto* op = static_cast<Op*>(e.op_context);
  if (op == nullptr) return MESHCCL_T_SUCCESS;
  if (op->err == 0) {
    op->err = e.err != 0 ? e.err : FI_EOTHER;
    op->prov_errno = e.prov_errno;
  }
  if (!op->owner->orphan && e.err != FI_ECANCELED) {
    char text[256];
    const char* s = fi_cq_strerror(ctx->cq, e.prov_errno, e.err_data, text, sizeof(text));
    MPLUG_INFO(ctx->host, "ofi: %s reports %s: %s", ctx->dev_name.c_str(), fi_strerror(e.err), s != nullptr ? s : "");
  }
  finished(ctx, op);
  return MESHCCL_T_SUCCESS;
}
}  // namespace

namespace {
meshccl_tresult_t read_completions(Ctx* ctx) {
  constexpr int kBatch = 16;
  fi_cq_tagged_entry e[kBatch];
  for (int round = 0; round < 64; ++round) {
    ssize_t n = fi_cq_read(ctx->cq, e, kBatch);
    if (n == -FI_EAGAIN) return MESHCCL_T_SUCCESS;
    if (n == -FI_EAVAIL) {
      MPLUG_CHECK(read_error(ctx));
      continue;
    }
    if (n < 0) return fi_fail(ctx->host, "reading the completion queue (fi_cq_read)", n);
    for (ssize_t i = 0; i < n; ++i) {
      auto* op = static_cast<Op*>(e[i].op_context);
      op->bytes += e[i].len;
      finished(ctx, op);
    }
    if (n < kBatch) return MESHCCL_T_SUCCESS;
  }
  return MESHCCL_T_SUCCESS;
}
}  // namespace

meshccl_tresult_t progress(Ctx* ctx) {
  MPLUG_CHECK(read_completions(ctx));
  if (!ctx->notices.empty()) advance_notices(ctx);
  return MESHCCL_T_SUCCESS;
}

bool peer_dead(const meshccl_transport_host_v1_t* host, int32_t pid, PeerWatch& watch) {
  if (pid <= 0 || !watch.due() || pid_alive(pid)) return false;
  MPLUG_WARN(host, "ofi: the peer process %d exited", pid);
  return true;
}

}  // namespace meshccl::plugin::ofi

extern "C" __attribute__((visibility("default"))) const meshccl_transport_v1_t meshccl_transport_v1 =
    meshccl::plugin::Entry<meshccl::plugin::ofi::kOfi>::table();

// The optional wait descriptor (see transport.h).
extern "C" __attribute__((visibility("default"))) int meshccl_transport_v1_wait_fd(void* ctx, int* fd) {
  return meshccl::plugin::Entry<meshccl::plugin::ofi::kOfi>::wait_fd(ctx, fd);
}

// The optional probe (see transport.h).
extern "C" __attribute__((visibility("default"))) int meshccl_transport_v1_probe(void* recv_comm, uint64_t tag,
                                                                                 int* found) {
  return meshccl::plugin::Entry<meshccl::plugin::ofi::kOfi>::probe(recv_comm, tag, found);
}
