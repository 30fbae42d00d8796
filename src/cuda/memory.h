// Device memory: telling device buffers from host ones, ncclMemAlloc on a
// GPU, and the description meshccl_info prints.
#pragma once

#include <cstddef>
#include <string>

#include "util/status.h"

namespace meshccl::cuda {

enum class MemKind {
  Host,    // ordinary or pinned host memory, or managed memory: the CPU reads it
  Device,  // device memory: only the GPU (and copies) reach it
};

// The kind of the memory at p (cuPointerGetAttribute); Host when the driver
// is not loaded or does not know the pointer.
MemKind classify(const void* p);

// ncclMemAlloc while a CUDA context is current on this thread: device memory
// of that context's device. *handled = false (nothing done) when no context
// is current, so the caller makes host memory as in the CPU build.
Status device_alloc(void** ptr, size_t size, bool* handled);
// Frees what device_alloc made; *handled = false when ptr is not such memory.
Status device_free(void* ptr, bool* handled);

// Lines for meshccl_info: driver and runtime versions and every GPU, or why
// there is none.
std::string describe();

}  // namespace meshccl::cuda
