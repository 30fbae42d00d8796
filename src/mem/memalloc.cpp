#include "mem/memalloc.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

#include "util/log.h"

namespace meshccl {

namespace {

struct Block {
  size_t size;
  int fd;
  uint64_t ino;
  uint64_t dev;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Block> blocks;  // base address -> block
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

constexpr size_t kPage = 4096;

}  // namespace

Status mem_alloc(void** ptr, size_t size) {
  if (ptr == nullptr) return MC_ERROR(ncclInvalidArgument, "ncclMemAlloc : ptr is NULL");
  *ptr = nullptr;
  size_t rounded = size == 0 ? kPage : (size + kPage - 1) / kPage * kPage;
  if (rounded < size) return MC_ERROR(ncclInvalidArgument, "ncclMemAlloc : size %zu too large", size);
  int fd = memfd_create("meshccl-buffer", MFD_CLOEXEC);
  if (fd < 0) return MC_ERROR(ncclSystemError, "ncclMemAlloc : memfd_create failed: %s", strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
    int e = errno;
    close(fd);
    return MC_ERROR(ncclSystemError, "ncclMemAlloc : cannot size %zu bytes: %s", rounded, strerror(e));
  }
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return MC_ERROR(ncclSystemError, "ncclMemAlloc : mmap of %zu bytes failed: %s", rounded, strerror(e));
  }
  struct stat st {};
  fstat(fd, &st);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.blocks[reinterpret_cast<uintptr_t>(p)] =
        Block{rounded, fd, static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_dev)};
  }
  MC_INFO(kAlloc, "ncclMemAlloc %zu bytes at %p (fd %d)", rounded, p, fd);
  *ptr = p;
  return kOk;
}

Status mem_free(void* ptr) {
  if (ptr == nullptr) return kOk;
  Block b{};
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.blocks.end())
      return MC_ERROR(ncclInvalidArgument, "ncclMemFree : %p was not returned by ncclMemAlloc (or was already freed)",
                      ptr);
    b = it->second;
    r.blocks.erase(it);
  }
  munmap(ptr, b.size);
  close(b.fd);
  return kOk;
}

bool mem_find_block(const void* ptr, size_t size, MemBlockRef* out) {
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.blocks.upper_bound(p);
  if (it == r.blocks.begin()) return false;
  --it;
  uintptr_t base = it->first;
  if (p < base || p + size > base + it->second.size || p + size < p) return false;
  if (out != nullptr) {
    out->pid = static_cast<int32_t>(getpid());
    out->fd = it->second.fd;
    out->ino = it->second.ino;
    out->dev = it->second.dev;
    out->offset = p - base;
    out->file_size = it->second.size;
  }
  return true;
}

bool mem_find_shared(const void* ptr, size_t size, meshccl_shared_region_v1_t* out) {
  MemBlockRef b;
  if (!mem_find_block(ptr, size, &b)) return false;
  if (out != nullptr) {
    out->pid = b.pid;
    out->fd = b.fd;
    out->offset = b.offset;
    out->size = b.file_size - b.offset;
  }
  return true;
}

}  // namespace meshccl
