// The shm transport's C entry points, its settings, and connection setup.
//
// Settings (read through the host's get_param at init):
//   MESHCCL_SHM_BUFFSIZE  ring bytes per connection (default 1 MiB)
//   MESHCCL_SHM_EAGER     largest message copied through the ring; larger
//                         ones use a one-copy rendezvous (default 64 KiB)
//   MESHCCL_SHM_CMA       0 forbids process_vm_readv; rendezvous payloads of
//                         other processes are then streamed through the ring
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "plugins/builtin.h"
#include "plugins/shm/shm_comm.h"

namespace meshccl::plugin::shm {
namespace {

constexpr uint64_t kDefaultRing = 1u << 20;
constexpr uint64_t kDefaultEager = 64u << 10;
constexpr uint64_t kCopyChunk = 1u << 20;
constexpr uint64_t kMinRing = 64u << 10;
constexpr uint64_t kMaxRing = 1u << 30;

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  Segment* seg = nullptr;
  size_t map_bytes = 0;
  bool accepted = false;
};

ArgCheck g_check("shm");

meshccl_tresult_t do_init(const meshccl_transport_host_v1_t* host, void** out) {
  auto ctx = std::make_unique<Ctx>();
  ctx->host = host;
  ctx->pid = getpid();
  ctx->copy_chunk = kCopyChunk;
  uint64_t ring = kDefaultRing;
  MPLUG_CHECK(param_size(host, "MESHCCL_SHM_BUFFSIZE", kMinRing, kMaxRing, &ring));
  ctx->ring_bytes = align_up(ring, kLine);
  // Eager records must stay within a quarter of the ring so that the ring
  // always has room for the next one once the receiver catches up.
  uint64_t max_eager = ctx->ring_bytes / 4 - sizeof(RecHdr);
  uint64_t eager = kDefaultEager < max_eager ? kDefaultEager : max_eager;
  MPLUG_CHECK(param_size(host, "MESHCCL_SHM_EAGER", 0, max_eager, &eager));
  ctx->eager = eager;
  if (const char* cma = param_str(host, "MESHCCL_SHM_CMA")) {
    if (std::strcmp(cma, "0") != 0 && std::strcmp(cma, "1") != 0) {
      MPLUG_WARN(host, "MESHCCL_SHM_CMA=\"%s\" must be 0 or 1", cma);
      return MESHCCL_T_INVALID_USAGE;
    }
    ctx->cma = cma[0] == '1';
  }
  // Let peers read our memory with process_vm_readv and open our memfds
  // through /proc even under Yama's ptrace restrictions. Without Yama the
  // call fails harmlessly: there is nothing to relax.
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  MPLUG_INFO(host, "shm: ring %" PRIu64 " bytes, eager up to %" PRIu64 " bytes, cma %s", ctx->ring_bytes,
             ctx->eager, ctx->cma ? "on" : "off");
  g_check.remember(host);
  *out = ctx.release();
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_listen(Ctx* ctx, void* handle, void** listen_comm) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  size_t total = sizeof(Segment) + ctx->ring_bytes;
  int fd = memfd_create("meshccl-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    MPLUG_WARN(host, "shm: memfd_create failed: %s", std::strerror(errno));
    return MESHCCL_T_SYSTEM_ERROR;
  }
  void* p = MAP_FAILED;
  // Sealing the size means no one can shrink the file under a mapping, which
  // would turn accesses into SIGBUS. MAP_POPULATE takes the first-touch cost
  // of the ring here instead of on the first messages.
  if (ftruncate(fd, static_cast<off_t>(total)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    MPLUG_WARN(host, "shm: cannot create a %zu-byte segment: %s", total, std::strerror(errno));
    close(fd);
    return MESHCCL_T_SYSTEM_ERROR;
  }
  auto* seg = new (p) Segment;
  seg->hdr.nonce = random_u64();
  seg->hdr.version = kSegVersion;
  seg->hdr.nslots = kSlots;
  seg->hdr.ring_bytes = ctx->ring_bytes;
  seg->hdr.total_bytes = total;
  seg->hdr.receiver_pid = ctx->pid;
  seg->hdr.sender_pid.store(0, std::memory_order_relaxed);
  seg->hdr.sender_closed.store(0, std::memory_order_relaxed);
  seg->hdr.receiver_closed.store(0, std::memory_order_relaxed);
  seg->head.v.store(0, std::memory_order_relaxed);
  seg->tail.v.store(0, std::memory_order_relaxed);
  for (LineU32& s : seg->slots) s.v.store(kSlotFree, std::memory_order_relaxed);
  seg->hdr.magic = kSegMagic;

  auto* lc = new ListenComm;
  lc->ctx = ctx;
  lc->fd = fd;
  lc->seg = seg;
  lc->map_bytes = total;
  Handle h{kHandleMagic, ctx->pid, fd, total, seg->hdr.nonce};
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = lc;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** send_comm) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic) return g_check.misuse(host, "connect", "the handle is not an shm handle");
  if (h.size < sizeof(Segment) + kMinRing || h.size > sizeof(Segment) + kMaxRing)
    return g_check.misuse(host, "connect", "the handle names a segment of an impossible size");
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    MPLUG_WARN(host, "shm: cannot open the receiver's segment %s: %s", path, std::strerror(err));
    // Gone: the receiver closed its listener or exited.
    return err == ENOENT || err == ESRCH ? MESHCCL_T_REMOTE_ERROR : MESHCCL_T_SYSTEM_ERROR;
  }
  struct stat st;
  void* p = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) == h.size)
    p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    MPLUG_WARN(host, "shm: %s is not the receiver's segment (stale handle?)", path);
    return MESHCCL_T_INTERNAL_ERROR;
  }
  auto* seg = static_cast<Segment*>(p);
  int32_t expected = 0;
  if (seg->hdr.magic != kSegMagic || seg->hdr.nonce != h.nonce || seg->hdr.version != kSegVersion ||
      seg->hdr.nslots != kSlots || seg->hdr.total_bytes != h.size ||
      seg->hdr.ring_bytes != h.size - sizeof(Segment) || seg->hdr.ring_bytes % kLine != 0) {
    munmap(p, h.size);
    MPLUG_WARN(host, "shm: %s does not carry the handle's nonce (stale handle?)", path);
    return MESHCCL_T_INTERNAL_ERROR;
  }
  seg_release(seg);
  const bool attached = seg->hdr.sender_pid.compare_exchange_strong(expected, ctx->pid, std::memory_order_acq_rel);
  seg_acquire(seg);
  if (!attached) {
    munmap(p, h.size);
    MPLUG_WARN(host, "shm: the listener behind %s already has a sender (pid %d)", path, expected);
    return MESHCCL_T_INTERNAL_ERROR;
  }
  auto* c = new SendComm;
  c->ctx = ctx;
  c->seg = seg;
  c->map_bytes = h.size;
  c->ring = seg->ring();
  c->cap = seg->hdr.ring_bytes;
  c->eager = std::min<uint64_t>(ctx->eager, c->cap / 4 - sizeof(RecHdr));
  c->peer_pid = h.pid;
  for (uint32_t i = 0; i < kSlots; ++i) c->free_slots[i] = kSlots - 1 - i;
  c->nfree = kSlots;
  *send_comm = c;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_accept(ListenComm* lc, void** recv_comm) {
  if (lc->accepted) return g_check.misuse(lc->ctx->host, "accept", "the listener already accepted its sender");
  Segment* seg = lc->seg;
  const bool attached = seg->hdr.sender_pid.load(std::memory_order_acquire) != 0;
  seg_acquire(seg);
  if (!attached) return MESHCCL_T_SUCCESS;  // not yet
  auto* c = new RecvComm;
  c->ctx = lc->ctx;
  c->seg = seg;
  c->map_bytes = lc->map_bytes;
  c->ring = seg->ring();
  c->cap = seg->hdr.ring_bytes;
  c->peer_pid = seg->hdr.sender_pid.load(std::memory_order_relaxed);
  // Both ends have it mapped now; the fd has done its job.
  close(lc->fd);
  lc->fd = -1;
  lc->seg = nullptr;
  lc->accepted = true;
  *recv_comm = c;
  return MESHCCL_T_SUCCESS;
}

// ---- C entry points --------------------------------------------------------

int shm_init(const meshccl_transport_host_v1_t* host, void** ctx) {
  if (ctx == nullptr) return g_check.misuse(host, "init", "ctx is NULL");
  *ctx = nullptr;
  MPLUG_CHECK(check_host(host, "shm"));
  return guarded(host, "shm init", [&] { return do_init(host, ctx); });
}

int shm_devices(void* ctx, int* ndev) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "devices");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (ndev == nullptr) return g_check.misuse(c->host, "devices", "ndev is NULL");
  *ndev = 1;
  return MESHCCL_T_SUCCESS;
}

int shm_properties(void* ctx, int dev, meshccl_transport_props_v1_t* props) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "properties");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (props == nullptr || dev != 0) return g_check.misuse(c->host, "properties", "bad device or NULL props");
  // Estimates from transport_pingpong on a 2-core VM; a cost model only needs
  // the order of magnitude next to socket's.
  *props = meshccl_transport_props_v1_t{
      .name = "shm",
      .bandwidth_gbs = 5.0,
      .latency_us = 1.0,
      .scope = MESHCCL_SCOPE_HOST,
      .ptr_support = MESHCCL_PTR_HOST,
      .max_requests = 0,
  };
  return MESHCCL_T_SUCCESS;
}

int shm_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "listen");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (handle == nullptr || listen_comm == nullptr || dev != 0)
    return g_check.misuse(c->host, "listen", "bad device or NULL handle/listen_comm");
  *listen_comm = nullptr;
  return guarded(c->host, "shm listen", [&] { return do_listen(c, handle, listen_comm); });
}

int shm_connect(void* ctx, int dev, const void* handle, void** send_comm) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "connect");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (handle == nullptr || send_comm == nullptr || dev != 0)
    return g_check.misuse(c->host, "connect", "bad device or NULL handle/send_comm");
  *send_comm = nullptr;
  return guarded(c->host, "shm connect", [&] { return do_connect(c, handle, send_comm); });
}

int shm_accept(void* listen_comm, void** recv_comm) {
  ListenComm* lc = g_check.as<ListenComm>(listen_comm, kListenMagic, "listen comm", "accept");
  if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (recv_comm == nullptr) return g_check.misuse(lc->ctx->host, "accept", "recv_comm is NULL");
  *recv_comm = nullptr;
  return guarded(lc->ctx->host, "shm accept", [&] { return do_accept(lc, recv_comm); });
}

int shm_reg_mr(void* comm, void* data, size_t size, void** mhandle) {
  (void)comm;
  (void)data;
  (void)size;
  if (mhandle != nullptr) *mhandle = nullptr;  // nothing to register: memory is read where it lies
  return MESHCCL_T_SUCCESS;
}

int shm_dereg_mr(void* comm, void* mhandle) {
  (void)comm;
  (void)mhandle;
  return MESHCCL_T_SUCCESS;
}

int shm_isend(void* send_comm, const void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
  (void)mhandle;
  SendComm* c = g_check.as<SendComm>(send_comm, kSendMagic, "send comm", "isend");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (request == nullptr) return g_check.misuse(c->ctx->host, "isend", "request is NULL");
  *request = nullptr;
  if (data == nullptr && size != 0) return g_check.misuse(c->ctx->host, "isend", "NULL buffer with a non-zero size");
  return guarded(c->ctx->host, "shm isend", [&] { return send_post(c, data, size, tag, request); });
}

int shm_irecv(void* recv_comm, void* data, size_t size, uint64_t tag, void* mhandle, void** request) {
  (void)mhandle;
  RecvComm* c = g_check.as<RecvComm>(recv_comm, kRecvMagic, "recv comm", "irecv");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (request == nullptr) return g_check.misuse(c->ctx->host, "irecv", "request is NULL");
  *request = nullptr;
  if (data == nullptr && size != 0) return g_check.misuse(c->ctx->host, "irecv", "NULL buffer with a non-zero size");
  return guarded(c->ctx->host, "shm irecv", [&] { return recv_post(c, data, size, tag, request); });
}

int shm_test(void* request, int* done, size_t* size) {
  Request* r = g_check.as<Request>(request, kReqMagic, "request", "test");
  if (r == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (done == nullptr) return g_check.misuse(g_check.host(), "test", "done is NULL");
  if (r->kind == Kind::kSend) {
    auto* c = static_cast<SendComm*>(r->comm);
    return guarded(c->ctx->host, "shm test", [&] { return send_test(r, done, size); });
  }
  auto* c = static_cast<RecvComm*>(r->comm);
  return guarded(c->ctx->host, "shm test", [&] { return recv_test(r, done, size); });
}

int shm_close_send(void* send_comm) {
  SendComm* c = g_check.as<SendComm>(send_comm, kSendMagic, "send comm", "close_send");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  send_close(c);
  return MESHCCL_T_SUCCESS;
}

int shm_close_recv(void* recv_comm) {
  RecvComm* c = g_check.as<RecvComm>(recv_comm, kRecvMagic, "recv comm", "close_recv");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  recv_close(c);
  return MESHCCL_T_SUCCESS;
}

int shm_close_listen(void* listen_comm) {
  ListenComm* lc = g_check.as<ListenComm>(listen_comm, kListenMagic, "listen comm", "close_listen");
  if (lc == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (lc->seg != nullptr) {
    // A sender may have attached already: tell it nobody will read.
    seg_release(lc->seg);
    lc->seg->hdr.receiver_closed.store(1, std::memory_order_release);
    munmap(lc->seg, lc->map_bytes);
  }
  if (lc->fd >= 0) close(lc->fd);
  lc->magic = 0;
  delete lc;
  return MESHCCL_T_SUCCESS;
}

int shm_finalize(void* ctx) {
  Ctx* c = g_check.as<Ctx>(ctx, kCtxMagic, "context", "finalize");
  if (c == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  g_check.forget(c->host);
  c->magic = 0;
  delete c;
  return MESHCCL_T_SUCCESS;
}

}  // namespace
}  // namespace meshccl::plugin::shm

namespace shm = meshccl::plugin::shm;

extern "C" const meshccl_transport_v1_t meshccl_transport_shm = {
    .name = "shm",
    .version = MESHCCL_TRANSPORT_V1,
    .init = shm::shm_init,
    .devices = shm::shm_devices,
    .properties = shm::shm_properties,
    .listen = shm::shm_listen,
    .connect = shm::shm_connect,
    .accept = shm::shm_accept,
    .reg_mr = shm::shm_reg_mr,
    .dereg_mr = shm::shm_dereg_mr,
    .isend = shm::shm_isend,
    .irecv = shm::shm_irecv,
    .test = shm::shm_test,
    .close_send = shm::shm_close_send,
    .close_recv = shm::shm_close_recv,
    .close_listen = shm::shm_close_listen,
    .finalize = shm::shm_finalize,
};
