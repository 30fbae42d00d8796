// Public entry points: the real code is the strong symbol pnccl<X>; ncclX is a
// weak alias of it (NCCL's profiling-interposition convention). Every body runs
// inside api_guard so no C++ exception crosses the C boundary.
#pragma once

#include <new>

#include "util/log.h"
#include "util/status.h"

#define MESHCCL_EXPORT extern "C" __attribute__((visibility("default")))

#define MESHCCL_WEAK_ALIAS(name) MESHCCL_EXPORT __attribute__((weak, alias("p" #name))) decltype(p##name) name;

namespace meshccl {

template <typename F>
ncclResult_t api_guard(const char* fn, F&& body) {
  try {
    return body().code();
  } catch (const std::bad_alloc&) {
    return MC_ERROR(ncclSystemError, "%s : out of memory", fn).code();
  } catch (const std::exception& e) {
    return MC_ERROR(ncclInternalError, "%s : internal error: %s", fn, e.what()).code();
  } catch (...) { return MC_ERROR(ncclInternalError, "%s : internal error", fn).code(); }
}

}  // namespace meshccl
