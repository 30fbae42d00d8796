#include "plugins/common/plugin_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace meshccl::plugin {

meshccl_tresult_t check_host(const meshccl_transport_host_v1_t* host, const char* plugin) {
  if (host == nullptr) return MESHCCL_T_INTERNAL_ERROR;
  if (host->version != MESHCCL_TRANSPORT_V1) {
    MPLUG_WARN(host, "%s: host speaks transport interface version %u, plugin needs %d", plugin, host->version,
               MESHCCL_TRANSPORT_V1);
    return MESHCCL_T_INTERNAL_ERROR;
  }
  return MESHCCL_T_SUCCESS;
}

bool parse_size(const char* text, uint64_t* out) {
  if (text == nullptr) return false;
  while (*text == ' ' || *text == '\t') ++text;
  if (*text < '0' || *text > '9') return false;  // also refuses "-1", which strtoull accepts
  errno = 0;
  char* end = nullptr;
  // Base 10 unless "0x": a leading zero must not turn "010" into octal.
  int base = (text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) ? 16 : 10;
  unsigned long long v = std::strtoull(text, &end, base);
  if (errno != 0 || end == text) return false;
  int shift = 0;
  switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    default: break;
  }
  if (shift != 0 && (*end == 'i' || *end == 'I')) ++end;  // "64Ki"
  if (shift != 0 && (*end == 'b' || *end == 'B')) ++end;  // "64KB", "64KiB"
  while (*end == ' ' || *end == '\t') ++end;
  if (*end != '\0') return false;
  if (shift != 0 && v > (UINT64_MAX >> shift)) return false;
  *out = static_cast<uint64_t>(v) << shift;
  return true;
}

const char* param_str(const meshccl_transport_host_v1_t* host, const char* name) {
  if (host == nullptr || host->get_param == nullptr) return nullptr;
  const char* v = host->get_param(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

meshccl_tresult_t param_size(const meshccl_transport_host_v1_t* host, const char* name, uint64_t lo, uint64_t hi,
                             uint64_t* out) {
  const char* v = param_str(host, name);
  if (v == nullptr) return MESHCCL_T_SUCCESS;
  uint64_t parsed = 0;
  if (!parse_size(v, &parsed)) {
    MPLUG_WARN(host, "%s=\"%s\" is not a byte size (examples: 65536, 64K, 1M)", name, v);
    return MESHCCL_T_INVALID_USAGE;
  }
  if (parsed < lo || parsed > hi) {
    MPLUG_WARN(host, "%s=%" PRIu64 " is outside [%" PRIu64 ", %" PRIu64 "]", name, parsed, lo, hi);
    return MESHCCL_T_INVALID_USAGE;
  }
  *out = parsed;
  return MESHCCL_T_SUCCESS;
}

namespace {
uint64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}
}  // namespace

uint64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }

uint64_t coarse_now_ns() { return clock_ns(CLOCK_MONOTONIC_COARSE); }

uint64_t random_u64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(v)) && v != 0) return v;
  // No entropy yet (early boot): still unique enough to tell handles apart.
  static uint64_t counter = 0;
  v = now_ns() ^ (static_cast<uint64_t>(getpid()) << 32) ^ (++counter * 0x9e3779b97f4a7c15ull);
  return v != 0 ? v : 1;
}

namespace {
// The state letter of /proc/<pid>/stat, '?' when it cannot be read (e.g.
// hidepid), 0 when the process is gone.
char pid_state(int32_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT ? '?' : 0;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return 0;  // the process vanished while we read
  buf[n] = '\0';
  // "pid (comm) S ...": comm may contain ')' so take the last one.
  const char* rp = std::strrchr(buf, ')');
  if (rp == nullptr || rp[1] != ' ') return '?';
  return rp[2];
}
}  // namespace

bool pid_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  const char state = pid_state(pid);  // '?': cannot tell, trust kill()
  return state != 0 && state != 'Z' && state != 'X' && state != 'x';
}

bool pid_stopped(int32_t pid) {
  if (pid <= 0) return false;
  const char state = pid_state(pid);
  return state == 'T' || state == 't';
}

meshccl_tresult_t sys_fail(const meshccl_transport_host_v1_t* host, const char* plugin, const char* what) {
  MPLUG_WARN(host, "%s: %s: %s", plugin, what, std::strerror(errno));
  return MESHCCL_T_SYSTEM_ERROR;
}

}  // namespace meshccl::plugin
