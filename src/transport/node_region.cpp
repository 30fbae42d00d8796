#include "transport/node_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "transport/select.h"
#include "util/log.h"

namespace meshccl {

namespace {

struct Desc {
  int32_t ok;
  int32_t pid;
  int32_t fd;
  int32_t pad;
  uint64_t ino;
  uint64_t dev;
  uint64_t bytes;
};

char* map_file(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

}  // namespace

NodeRegion::~NodeRegion() {
  // A peer waiting in a round for this rank learns that it will not come
  // (unless this rank found a mismatch, which its flag then keeps saying).
  if (rank_ >= 0 && rank_ < static_cast<int>(bases_.size()) && bases_[rank_] != nullptr) {
    uint64_t none = 0;
    failed(rank_).value.compare_exchange_strong(none, kLeft, std::memory_order_acq_rel);
  }
  for (char* b : bases_)
    if (b != nullptr) munmap(b, map_bytes_);
  for (int l = 0; lane_ != nullptr && l < lanes_; ++l)
    for (const Mapping& m : lane_[l].buffers) munmap(m.base, m.ref.file_size);
  if (fd_ >= 0) close(fd_);
}

Status NodeRegion::create(Bootstrap& bs, const std::vector<PeerInfo>& peers, size_t slot_bytes, int lanes,
                          std::unique_ptr<NodeRegion>* out) {
  out->reset();
  const int n = bs.nranks(), me = bs.rank();
  if (n < 2 || slot_bytes == 0 || lanes < 1) return kOk;
  if (lanes > kPriorityLanes)
    return MC_ERROR(ncclInternalError, "a node region has at most %d lanes, not %d", kPriorityLanes, lanes);
  // The topology test gives the same answer on every rank; what depends on
  // this process (transport settings, memory) is agreed below.
  for (const PeerInfo& p : peers)
    if (p.machine_hash != peers[me].machine_hash || p.host_hash != peers[me].host_hash) return kOk;

  std::unique_ptr<NodeRegion> region(new NodeRegion());
  region->rank_ = me;
  region->lanes_ = lanes;
  region->lane_ = std::make_unique<Lane[]>(static_cast<size_t>(lanes));
  region->slot_bytes_ = (slot_bytes + kLine - 1) / kLine * kLine;
  const size_t page = 4096;
  region->map_bytes_ =
      (region->control_bytes() + static_cast<size_t>(lanes) * region->lane_bytes() + page - 1) / page * page;
  region->bases_.assign(n, nullptr);
  region->nranks_ = n;
  for (int l = 0; l < lanes; ++l) region->lane_offsets_[l] = region->lane_offset(l);

  Desc mine{};
  bool usable = true;
  for (int p = 0; p < n; ++p)
    if (p != me && !node_local(peers, me, p)) usable = false;
  if (usable) {
    region->fd_ = memfd_create("meshccl-node", MFD_CLOEXEC);
    struct stat st {};
    if (region->fd_ >= 0 && ftruncate(region->fd_, static_cast<off_t>(region->map_bytes_)) == 0 &&
        fstat(region->fd_, &st) == 0 && (region->bases_[me] = map_file(region->fd_, region->map_bytes_)) != nullptr) {
      mine = Desc{1,
                  static_cast<int32_t>(getpid()),
                  region->fd_,
                  0,
                  static_cast<uint64_t>(st.st_ino),
                  static_cast<uint64_t>(st.st_dev),
                  region->map_bytes_};
    } else {
      MC_WARN("rank %d: no shared region for the direct algorithms: %s", me, strerror(errno));
    }
  }
  std::vector<Desc> all(n);
  all[me] = mine;
  MC_TRY(bs.allgather(all.data(), sizeof(Desc)));
  bool everyone = true;
  for (const Desc& d : all) everyone = everyone && d.ok && d.bytes == region->map_bytes_;

  // Attach to every peer's region; the file's identity guards against a
  // reused descriptor number.
  int32_t mapped = everyone ? 1 : 0;
  for (int p = 0; p < n && mapped; ++p) {
    if (p == me) continue;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", all[p].pid, all[p].fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != all[p].ino ||
        static_cast<uint64_t>(st.st_dev) != all[p].dev ||
        (region->bases_[p] = map_file(fd, region->map_bytes_)) == nullptr) {
      MC_WARN("rank %d: cannot map rank %d's shared region (%s): %s; direct algorithms off", me, p, path,
              strerror(errno));
      mapped = 0;
    }
    if (fd >= 0) close(fd);
  }
  if (everyone) {
    std::vector<int32_t> oks(n);
    oks[me] = mapped;
    MC_TRY(bs.allgather(oks.data(), sizeof(int32_t)));
    for (int32_t ok : oks) everyone = everyone && ok;
  }
  if (!everyone) return kOk;
  // Every peer has mapped this region: the descriptor is no longer needed.
  close(region->fd_);
  region->fd_ = -1;
  MC_INFO(kInit, "rank %d: shared region for direct algorithms, %zu-byte slots, %d lane%s, %d ranks", me,
          region->slot_bytes_, lanes, lanes == 1 ? "" : "s", n);
  *out = std::move(region);
  return kOk;
}

void NodeRegion::activate(int lane, uint64_t first, uint64_t last) {
  Lane& l = lane_[lane];
  std::lock_guard<std::mutex> lock(l.active_mu);
  if (first == l.active_upto + 1 && l.active_later.empty()) {  // in order: the common case
    l.active_upto = last;
    control(rank_, lane).announced.value.store(last, std::memory_order_release);
    return;
  }
  l.active_later.emplace_back(first, last);
  // Operations of one lane may start in any order (on different streams);
  // only a gap-free prefix counts.
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < l.active_later.size(); ++i) {
      if (l.active_later[i].first != l.active_upto + 1) continue;
      l.active_upto = l.active_later[i].second;
      l.active_later.erase(l.active_later.begin() + static_cast<std::ptrdiff_t>(i));
      grew = true;
      break;
    }
  }
  control(rank_, lane).announced.value.store(l.active_upto, std::memory_order_release);
}

const char* NodeRegion::map_peer_buffer(int lane, int peer, const BufferRef& ref) {
  std::vector<Mapping>& buffers = lane_[lane].buffers;
  for (size_t i = buffers.size(); i-- > 0;) {
    const Mapping& m = buffers[i];
    if (m.peer == peer && m.ref.pid == ref.pid && m.ref.fd == ref.fd && m.ref.ino == ref.ino && m.ref.dev == ref.dev &&
        m.ref.file_size == ref.file_size)
      return m.base + ref.offset;
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", ref.pid, ref.fd);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  char* base = nullptr;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == ref.ino &&
      static_cast<uint64_t>(st.st_dev) == ref.dev) {
    void* p = mmap(nullptr, ref.file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) base = static_cast<char*>(p);
  }
  close(fd);
  if (base == nullptr) return nullptr;
  // A bounded cache: buffers freed by a peer stay mapped here until evicted.
  constexpr size_t kMaxMappings = 64;
  if (buffers.size() >= kMaxMappings) {
    munmap(buffers.front().base, buffers.front().ref.file_size);
    buffers.erase(buffers.begin());
  }
  buffers.push_back({peer, ref, base});
  MC_INFO(kReg, "rank %d: mapped rank %d's buffer (pid %d fd %d, %llu bytes) to read it in place", rank_, peer, ref.pid,
          ref.fd, static_cast<unsigned long long>(ref.file_size));
  return base + ref.offset;
}

}  // namespace meshccl
