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
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <new>

#include "plugins/builtin.h"
#include "plugins/common/entry.h"
#include "plugins/shm/shm_comm.h"

namespace meshccl::plugin::shm {

const char* check_handle(const void* bytes, Handle* h) {
  std::memcpy(h, bytes, sizeof(*h));
  if (h->magic != kHandleMagic) return "the handle is not an shm handle";
  if (h->size < sizeof(Segment) + kMinRing || h->size > sizeof(Segment) + kMaxRing ||
      (h->size - sizeof(Segment)) % kLine != 0)
    return "the handle names a segment of an impossible size";
  if (h->pid <= 0 || h->fd < 0) return "the handle names no process or no descriptor";
  return nullptr;
}

namespace {
std::mutex g_local_mu;
std::map<std::pair<uint64_t, uint32_t>, std::pair<uint64_t, uint64_t>> g_local_rdv;  // (nonce, slot) -> (addr, size)
}  // namespace

void local_rdv_add(uint64_t nonce, uint32_t slot, uint64_t addr, uint64_t size) {
  std::lock_guard<std::mutex> lock(g_local_mu);
  g_local_rdv[{nonce, slot}] = {addr, size};
}

void local_rdv_remove(uint64_t nonce, uint32_t slot) {
  std::lock_guard<std::mutex> lock(g_local_mu);
  g_local_rdv.erase({nonce, slot});
}

bool local_rdv_check(uint64_t nonce, uint32_t slot, uint64_t addr, uint64_t size) {
  std::lock_guard<std::mutex> lock(g_local_mu);
  auto it = g_local_rdv.find({nonce, slot});
  return it != g_local_rdv.end() && it->second.first == addr && it->second.second == size;
}

namespace {

constexpr uint64_t kDefaultRing = 1u << 20;
constexpr uint64_t kDefaultEager = 64u << 10;
constexpr uint64_t kCopyChunk = 1u << 20;

struct ListenComm {
  uint32_t magic = kListenMagic;
  Ctx* ctx = nullptr;
  int fd = -1;
  Segment* seg = nullptr;
  size_t map_bytes = 0;
  uint64_t nonce = 0;
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
  MPLUG_INFO(host, "shm: ring %" PRIu64 " bytes, eager up to %" PRIu64 " bytes, cma %s", ctx->ring_bytes, ctx->eager,
             ctx->cma ? "on" : "off");
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
  lc->nonce = seg->hdr.nonce;
  Handle h{kHandleMagic, ctx->pid, fd, total, seg->hdr.nonce};
  std::memset(handle, 0, MESHCCL_TRANSPORT_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  *listen_comm = lc;
  return MESHCCL_T_SUCCESS;
}

meshccl_tresult_t do_connect(Ctx* ctx, const void* handle, void** send_comm) {
  const meshccl_transport_host_v1_t* host = ctx->host;
  Handle h;
  if (const char* why = check_handle(handle, &h)) return g_check.misuse(host, "connect", why);
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
      seg->hdr.nslots != kSlots || seg->hdr.total_bytes != h.size || seg->hdr.ring_bytes != h.size - sizeof(Segment) ||
      seg->hdr.ring_bytes % kLine != 0) {
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
  c->nonce = h.nonce;
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
  c->nonce = lc->nonce;
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

void props(Ctx* c, meshccl_transport_props_v1_t* props) {
  (void)c;
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
}

void close_listen(ListenComm* lc) {
  if (lc->seg != nullptr) {
    // A sender may have attached already: tell it nobody will read.
    seg_release(lc->seg);
    lc->seg->hdr.receiver_closed.store(1, std::memory_order_release);
    munmap(lc->seg, lc->map_bytes);
  }
  if (lc->fd >= 0) close(lc->fd);
}

constexpr char kName[] = "shm";
constexpr Binding<Ctx, ListenComm, SendComm, RecvComm, Request> kShm{
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
    .close_send = send_close,
    .close_recv = recv_close,
    .close_listen = close_listen,
    .finalize = nullptr,
};

}  // namespace
}  // namespace meshccl::plugin::shm

extern "C" const meshccl_transport_v1_t meshccl_transport_shm =
    meshccl::plugin::Entry<meshccl::plugin::shm::kShm>::table();
extern "C" const meshccl_transport_v1_probe_t meshccl_transport_shm_probe =
    meshccl::plugin::Entry<meshccl::plugin::shm::kShm>::probe;
