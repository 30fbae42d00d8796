// libFuzzer: what a peer controls in the shm transport: the handle it sends
// over the bootstrap (checked before any /proc path is opened), and the
// records it writes into the ring of a shared segment (eager messages,
// rendezvous descriptors, streamed chunks, padding) and the write position.
// The records land in a real receiving end, with receives posted before and
// after. Descriptors that name other processes are streamed (no CMA, no
// region mapping here), so the harness reads no other process's memory.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "plugins/shm/shm_comm.h"

namespace {
using namespace meshccl::plugin::shm;
using meshccl::plugin::align_up;

constexpr uint64_t kRing = kMinRing;
constexpr size_t kTotal = sizeof(Segment) + kRing;

void check_handle_bytes(const uint8_t* data, size_t size) {
  uint8_t bytes[MESHCCL_TRANSPORT_HANDLE_BYTES] = {};
  std::memcpy(bytes, data, std::min(size, sizeof bytes));
  Handle h;
  if (check_handle(bytes, &h) != nullptr) return;
  if (h.pid <= 0 || h.fd < 0 || h.size < sizeof(Segment) + kMinRing || h.size > sizeof(Segment) + kMaxRing)
    __builtin_trap();
}

void drive(std::vector<void*>& reqs, const std::vector<size_t>& caps) {
  for (int round = 0; round < 1000; ++round) {
    bool pending = false;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == nullptr) continue;
      int done = 0;
      size_t n = 0;
      meshccl_tresult_t res = recv_test(static_cast<Request*>(reqs[i]), &done, &n);
      if (done == 0) {
        pending = true;
        continue;
      }
      if (res == MESHCCL_T_SUCCESS && n > caps[i]) __builtin_trap();
      reqs[i] = nullptr;
    }
    if (!pending) return;
  }
  __builtin_trap();  // the sender has closed: nothing may wait forever
}

// Input: [0] receives posted first, [1] receive size / 64, [2] write
// position adjustment, then the ring's bytes.
void check_ring(const uint8_t* data, size_t size) {
  if (size < 3) return;
  void* p = mmap(nullptr, kTotal, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  auto* seg = new (p) Segment;
  seg->hdr.magic = kSegMagic;
  seg->hdr.nonce = 0x5eed;
  seg->hdr.version = kSegVersion;
  seg->hdr.nslots = kSlots;
  seg->hdr.ring_bytes = kRing;
  seg->hdr.total_bytes = kTotal;
  seg->hdr.receiver_pid = getpid();
  seg->hdr.sender_pid.store(getpid());
  const size_t n = std::min<size_t>(size - 3, kRing);
  std::memcpy(seg->ring(), data + 3, n);
  static const meshccl_transport_host_v1_t host{};
  static Ctx ctx;
  ctx.host = &host;
  ctx.pid = getpid();
  ctx.cma = false;
  ctx.copy_chunk = 1u << 20;
  auto* c = new RecvComm;
  c->ctx = &ctx;
  c->seg = seg;
  c->map_bytes = kTotal;
  c->nonce = seg->hdr.nonce;
  c->ring = seg->ring();
  c->cap = kRing;
  c->peer_pid = getpid();
  c->regions_refused = true;
  const size_t cap = size_t{data[1]} * 64;
  const int before = data[0] % 5;
  std::vector<std::vector<unsigned char>> bufs(8 + static_cast<size_t>(before), std::vector<unsigned char>(cap + 1));
  std::vector<void*> reqs;
  std::vector<size_t> caps;
  size_t used = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int count = pass == 0 ? before : 8;
    for (int t = 0; t < count; ++t) {
      void* r = nullptr;
      if (recv_post(c, bufs[used++].data(), cap, static_cast<uint64_t>(t), &r) == MESHCCL_T_SUCCESS) {
        reqs.push_back(r);
        caps.push_back(cap);
      }
    }
    if (pass == 0) {  // now the sender publishes everything and closes
      seg->head.v.store(align_up(n, kLine) + static_cast<uint64_t>(static_cast<int8_t>(data[2])));
      seg->hdr.sender_closed.store(1);
    }
    drive(reqs, caps);
    reqs.clear();
    caps.clear();
  }
  recv_close(c);  // unmaps the segment
  delete c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check_handle_bytes(data, size);
  check_ring(data, size);
  return 0;
}
