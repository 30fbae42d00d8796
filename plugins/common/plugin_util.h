// Helpers every transport plugin shares: logging through the host's logger,
// settings, time, peer liveness. Only transport.h, the C/C++ standard library
// and POSIX, so that a plugin can also be built as a loadable module.
#ifndef MESHCCL_PLUGINS_COMMON_PLUGIN_UTIL_H_
#define MESHCCL_PLUGINS_COMMON_PLUGIN_UTIL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "meshccl/transport.h"

namespace meshccl::plugin {

// The host's logger may be absent (a minimal host); never crash on that.
#define MPLUG_LOG(host, level, fmt, ...)                                          \
  do {                                                                            \
    const meshccl_transport_host_v1_t* mplug_h_ = (host);                         \
    if (mplug_h_ != nullptr && mplug_h_->log != nullptr)                          \
      mplug_h_->log((level), __FILE__, __LINE__, fmt __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
#define MPLUG_WARN(host, fmt, ...) MPLUG_LOG(host, MESHCCL_LOG_WARN, fmt __VA_OPT__(, ) __VA_ARGS__)
#define MPLUG_INFO(host, fmt, ...) MPLUG_LOG(host, MESHCCL_LOG_INFO, fmt __VA_OPT__(, ) __VA_ARGS__)
#define MPLUG_TRACE(host, fmt, ...) MPLUG_LOG(host, MESHCCL_LOG_TRACE, fmt __VA_OPT__(, ) __VA_ARGS__)

// Propagates a failed meshccl_tresult_t; no hidden control flow beyond return.
#define MPLUG_CHECK(expr)                                              \
  do {                                                                 \
    meshccl_tresult_t mplug_r_ = static_cast<meshccl_tresult_t>(expr); \
    if (mplug_r_ != MESHCCL_T_SUCCESS) return mplug_r_;                \
  } while (0)

// Validates what init receives; logs and returns INTERNAL_ERROR on misuse.
[[nodiscard]] meshccl_tresult_t check_host(const meshccl_transport_host_v1_t* host, const char* plugin);

// Reads a byte-size setting ("65536", "64K", "1M", "2G"). Unset leaves *out
// alone; a malformed value or one outside [lo, hi] is logged and refused.
[[nodiscard]] meshccl_tresult_t param_size(const meshccl_transport_host_v1_t* host, const char* name, uint64_t lo,
                                           uint64_t hi, uint64_t* out);
// Pure parser behind param_size; false on malformed input.
bool parse_size(const char* text, uint64_t* out);

const char* param_str(const meshccl_transport_host_v1_t* host, const char* name);

uint64_t now_ns();
// CLOCK_MONOTONIC_COARSE: the time at the last scheduler tick (1-4 ms
// resolution) for a few ns a read, against about 25 ns for now_ns here; for
// intervals of tens of milliseconds read on every test of a transfer.
uint64_t coarse_now_ns();

// 64 random bits for handle nonces (getrandom, with a time/pid fallback).
uint64_t random_u64();

// True while the process exists and has not exited. kill(pid, 0) alone is not
// enough: an exited child that its parent has not reaped yet is a zombie that
// still answers kill, so /proc/<pid>/stat is read as well.
bool pid_alive(int32_t pid);
// Whether a process of this kernel is stopped (SIGSTOP, a debugger).
bool pid_stopped(int32_t pid);

// Rate limiter for liveness checks: a stalled request checks its peer at most
// once per interval, because the check costs syscalls. Asked at every test of
// a stalled transfer, so it reads the coarse clock: the interval is far
// longer than its resolution.
class PeerWatch {
 public:
  static constexpr uint64_t kIntervalNs = 50'000'000;
  // True when a check is due now (and records that one happened).
  bool due() {
    uint64_t t = coarse_now_ns();
    if (t - last_ns_ < kIntervalNs) return false;
    last_ns_ = t;
    return true;
  }

 private:
  uint64_t last_ns_ = 0;
};

// Spaces out the system calls of a connection (or a worker) that keeps
// finding nothing to do: a receive with no bytes waiting, a send whose socket
// buffer is full, a progress call with no events. An engine's pass tests
// every transfer in flight, each test asking its connection, and on a link
// that binds those calls come back empty almost every time (2 hosts x 2 ranks
// at 200 Mbit/s over socket: 150,000 sendmsg and 165,000 recv a second, most
// of them EAGAIN). Once the calls have come up empty for kFreeNs, the next
// waits an eighth of that time, up to kMaxNs (at least min_ns always), so
// that bytes arriving meanwhile wait at most about an eighth of the wait
// longer (a quarter cost 1 MiB AllReduces over loopback sockets 10%). A call
// that moved something ends the stretch, and may space the next by a fixed
// moved_ns; so does the host's blocking on the wait descriptor (wake), after
// which it tests at once. Relaxed atomics: threads that test transfers of
// one worker at once may share one; a lost update costs one call too many or
// too few.
class EmptyCalls {
 public:
  static constexpr uint64_t kMaxNs = 50000;
  // An empty stretch shorter than this is not spaced beyond min_ns: the
  // bytes of a transfer over loopback, or a small message's answer, come
  // within it, and spacing there cost bulk transfers over loopback sockets
  // 7-13% (sendrecv_perf, 256 KiB-4 MiB).
  static constexpr uint64_t kFreeNs = 20000;
  explicit EmptyCalls(uint64_t min_ns = 0, uint64_t moved_ns = 0) : min_ns_(min_ns), moved_ns_(moved_ns) {}
  // Whether a call is due at `now`.
  bool due(uint64_t now) const { return now >= next_ns_.load(std::memory_order_relaxed); }
  void empty(uint64_t now) {
    uint64_t since = since_ns_.load(std::memory_order_relaxed);
    if (since == 0) since_ns_.store(since = now, std::memory_order_relaxed);
    const uint64_t empty_ns = now - since;
    uint64_t gap = empty_ns < kFreeNs ? 0 : empty_ns / 8;
    gap = gap < min_ns_ ? min_ns_ : gap > kMaxNs ? kMaxNs : gap;
    next_ns_.store(now + gap, std::memory_order_relaxed);
  }
  void moved(uint64_t now) {
    since_ns_.store(0, std::memory_order_relaxed);
    next_ns_.store(moved_ns_ == 0 ? 0 : now + moved_ns_, std::memory_order_relaxed);
  }
  void wake() {
    since_ns_.store(0, std::memory_order_relaxed);
    next_ns_.store(0, std::memory_order_relaxed);
  }

 private:
  const uint64_t min_ns_;
  const uint64_t moved_ns_;
  std::atomic<uint64_t> since_ns_{0};  // the first empty call of the current stretch; 0: none
  std::atomic<uint64_t> next_ns_{0};   // no call before this
};

// Checks what the host hands back to a plugin. Objects carry a magic value
// so that garbage, a freed object or the wrong kind of comm becomes
// INTERNAL_ERROR with a log line instead of a crash. Such pointers carry no
// context to log through, so the logger of the latest context is kept.
class ArgCheck {
 public:
  explicit ArgCheck(const char* plugin) : plugin_(plugin) {}
  void remember(const meshccl_transport_host_v1_t* h) { host_.store(h, std::memory_order_relaxed); }
  void forget(const meshccl_transport_host_v1_t* h) {
    host_.compare_exchange_strong(h, nullptr, std::memory_order_relaxed);
  }
  const meshccl_transport_host_v1_t* host() const { return host_.load(std::memory_order_relaxed); }

  template <class T>
  T* as(void* p, uint32_t magic, const char* what, const char* fn) const {
    auto* t = static_cast<T*>(p);
    if (t != nullptr && t->magic == magic) return t;
    MPLUG_WARN(host(), "%s: %s: %s %p is not a live %s %s", plugin_, fn, what, p, plugin_, what);
    return nullptr;
  }
  meshccl_tresult_t misuse(const meshccl_transport_host_v1_t* h, const char* fn, const char* what) const {
    MPLUG_WARN(h, "%s: %s: %s", plugin_, fn, what);
    return MESHCCL_T_INTERNAL_ERROR;
  }

 private:
  const char* plugin_;
  std::atomic<const meshccl_transport_host_v1_t*> host_{nullptr};
};

// Runs a C entry point's body so that no C++ exception crosses the C
// boundary: running out of memory is an OS failure, anything else a bug.
template <class F>
int guarded(const meshccl_transport_host_v1_t* host, const char* plugin, const char* fn, F&& body) noexcept {
  try {
    return static_cast<int>(body());
  } catch (const std::bad_alloc&) {
    MPLUG_WARN(host, "%s %s: out of memory", plugin, fn);
    return MESHCCL_T_SYSTEM_ERROR;
  } catch (...) {
    MPLUG_WARN(host, "%s %s: unexpected exception", plugin, fn);
    return MESHCCL_T_INTERNAL_ERROR;
  }
}

// Logs "<plugin>: <what>: <strerror(errno)>" and returns the system-error code.
meshccl_tresult_t sys_fail(const meshccl_transport_host_v1_t* host, const char* plugin, const char* what);

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace meshccl::plugin

#endif  // MESHCCL_PLUGINS_COMMON_PLUGIN_UTIL_H_
