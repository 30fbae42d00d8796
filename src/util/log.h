// Logging in NCCL's line format, controlled by MESHCCL_DEBUG (alias NCCL_DEBUG):
//   [time] host:pid:tid [dev] NCCL INFO <msg>
//   [time] host:pid:tid [dev] file:line NCCL WARN <msg>
// Every WARN also becomes the process's "last error" (ncclGetLastError).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace meshccl {

enum class LogLevel : int { None = 0, Version = 1, Warn = 2, Info = 3, Trace = 4 };

// Subsystems for MESHCCL_DEBUG_SUBSYS filtering of INFO/TRACE lines.
enum LogSubsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2P = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTune = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kBootstrap = 1u << 10,
  kReg = 1u << 11,
  kSched = 1u << 12,
  kAllSubsys = 0xffffffffu,
};

LogLevel log_level();
namespace detail {
// The level in force once the settings were read, -1 before: the common
// answer of log_enabled (nothing at this level) without a call.
extern std::atomic<int> g_log_level;
bool log_enabled_slow(LogLevel level, uint32_t subsys);
}  // namespace detail
// Every MC_INFO and MC_TRACE asks, on paths that run per call.
inline bool log_enabled(LogLevel level, uint32_t subsys) {
  const int l = detail::g_log_level.load(std::memory_order_relaxed);
  if (l >= 0 && l < static_cast<int>(level)) return false;
  return detail::log_enabled_slow(level, subsys);
}
void log_msg(LogLevel level, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Re-read the debug settings at the next log line (ncclResetDebugInit).
void log_reset();
// A warning about the process's settings: printed on stderr once per key
// (whatever MESHCCL_DEBUG says) and logged as a WARN.
void warn_once(const std::string& key, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// The first name in a MESHCCL_DEBUG_SUBSYS value that is no subsystem ("" if none).
std::string log_subsys_unknown(const std::string& spec);
// Text of the last WARN in this process ("" if none).
std::string last_error();
void set_last_error(const std::string& msg);
// Replaces the calling thread's last error (and the process's) with msg.
void amend_last_error(const std::string& msg);
// Text of the last WARN logged by the calling thread ("" if none): the message
// of a Status this thread just created, untouched by other threads' errors.
std::string thread_last_error();

// Keeps the calling thread's last error (and the process's) across
// best-effort work whose failures must not replace the error being reported.
class LastErrorScope {
 public:
  LastErrorScope() : saved_(thread_last_error()) {}
  ~LastErrorScope();
  LastErrorScope(const LastErrorScope&) = delete;
  LastErrorScope& operator=(const LastErrorScope&) = delete;

 private:
  std::string saved_;
};

}  // namespace meshccl

#define MC_WARN(...) \
  ::meshccl::log_msg(::meshccl::LogLevel::Warn, ::meshccl::kAllSubsys, __FILE__, __LINE__, __VA_ARGS__)
#define MC_INFO(subsys, ...)                                                                    \
  do {                                                                                          \
    if (::meshccl::log_enabled(::meshccl::LogLevel::Info, (subsys)))                            \
      ::meshccl::log_msg(::meshccl::LogLevel::Info, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define MC_TRACE(subsys, ...)                                                                    \
  do {                                                                                           \
    if (::meshccl::log_enabled(::meshccl::LogLevel::Trace, (subsys)))                            \
      ::meshccl::log_msg(::meshccl::LogLevel::Trace, (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
