// ncclMemAlloc on host memory: page-aligned mappings of anonymous memfd files,
// so that a process on the same host can map the very same pages (through
// /proc/<pid>/fd/<fd>) and transports copy straight from a peer's buffer. Being
// anonymous files, they vanish with the last mapping: nothing outlives a crash.
#pragma once

#include <cstddef>

#include "meshccl/transport.h"
#include "util/status.h"

namespace meshccl {

Status mem_alloc(void** ptr, size_t size);
Status mem_free(void* ptr);
// True (and *out filled) when [ptr, ptr+size) lies inside one mem_alloc block.
bool mem_find_shared(const void* ptr, size_t size, meshccl_shared_region_v1_t* out);

// The same, with the file's identity (fd numbers are reused after close).
struct MemBlockRef {
  int32_t pid;
  int32_t fd;
  uint64_t ino;
  uint64_t dev;
  uint64_t offset;     // of ptr in the file
  uint64_t file_size;  // the whole block, to map it
};
bool mem_find_block(const void* ptr, size_t size, MemBlockRef* out);

}  // namespace meshccl
