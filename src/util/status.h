// Internal error handling: functions return a [[nodiscard]] Status wrapping an
// ncclResult_t; errors are created once with a message (which becomes a WARN
// line and the text of ncclGetLastError) and propagated with MC_TRY.
#pragma once

#include "nccl.h"

namespace meshccl {

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(ncclResult_t code) : code_(code) {}  // NOLINT: implicit by design
  constexpr bool ok() const { return code_ == ncclSuccess; }
  constexpr explicit operator bool() const { return ok(); }
  constexpr ncclResult_t code() const { return code_; }
  constexpr bool operator==(ncclResult_t c) const { return code_ == c; }

 private:
  ncclResult_t code_ = ncclSuccess;
};

constexpr Status kOk{};

// Logs a WARN (file:line of the caller), records it as the last error, and
// returns code.
Status error_at(const char* file, int line, ncclResult_t code, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace meshccl

#define MC_ERROR(code, ...) ::meshccl::error_at(__FILE__, __LINE__, (code), __VA_ARGS__)

// Propagate a failed Status to the caller. Never hides control flow beyond a return.
#define MC_TRY(expr)                       \
  do {                                     \
    ::meshccl::Status mc_try_s_ = (expr);  \
    if (!mc_try_s_.ok()) return mc_try_s_; \
  } while (0)
