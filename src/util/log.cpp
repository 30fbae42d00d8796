#include "util/log.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <set>
#include <string>

#include "util/file_check.h"
#include "util/param.h"
#include "util/status.h"

namespace meshccl {

namespace detail {
std::atomic<int> g_log_level{-1};  // cached level; -1 = not initialized
}  // namespace detail

namespace {

struct LogState {
  std::mutex mu;
  bool initialized = false;
  LogLevel level = LogLevel::None;
  uint32_t subsys = 0;
  FILE* out = stdout;
  char host[64] = "";
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::string last_error;
};

LogState& state() {
  static LogState* s = new LogState();  // never destroyed: logging works during exit
  return *s;
}

// The calling thread's last error, in storage with no destructor: code that
// runs after the thread's thread_local objects are destroyed (another
// library's exit handlers destroying a communicator, say) may still set it.
struct ThreadError {
  char text[4096];
  size_t len;
  void set(const std::string& msg) {
    len = std::min(msg.size(), sizeof(text));
    std::memcpy(text, msg.data(), len);
  }
  std::string get() const { return std::string(text, len); }
};
thread_local ThreadError t_last_error;
thread_local bool t_in_log = false;  // this thread holds the log lock (settings are read under it)
std::atomic<uint32_t> g_subsys{0};

struct SubsysName {
  const char* name;
  uint32_t bit;
};
constexpr SubsysName kSubsysNames[] = {
    {"INIT", kInit},   {"COLL", kColl},           {"P2P", kP2P},     {"SHM", kShm},     {"NET", kNet},
    {"GRAPH", kGraph}, {"TUNE", kTune},           {"TUNING", kTune}, {"ENV", kEnv},     {"ALLOC", kAlloc},
    {"CALL", kCall},   {"BOOTSTRAP", kBootstrap}, {"REG", kReg},     {"SCHED", kSched}, {"ALL", kAllSubsys},
};

// The mask a MESHCCL_DEBUG_SUBSYS value selects; *unknown gets the first
// name that is not a subsystem ("" when every name is one).
uint32_t parse_subsys(const std::string& spec, std::string* unknown) {
  bool invert = !spec.empty() && spec[0] == '^';
  uint32_t mask = 0;
  unknown->clear();
  size_t pos = invert ? 1 : 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string tok = spec.substr(pos, end - pos);
    for (auto& c : tok) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    bool found = false;
    for (const SubsysName& n : kSubsysNames) {
      if (tok != n.name) continue;
      mask |= n.bit;
      found = true;
    }
    if (!found && !tok.empty() && unknown->empty()) *unknown = spec.substr(pos, end - pos);
    pos = end + 1;
  }
  return invert ? ~mask : mask;
}

void init_locked(LogState& s) {
  if (s.initialized) return;
  s.initialized = true;
  std::string lvl = param_str(Param::Debug);
  for (auto& c : lvl) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (lvl == "VERSION") s.level = LogLevel::Version;
  else if (lvl == "WARN") s.level = LogLevel::Warn;
  else if (lvl == "INFO") s.level = LogLevel::Info;
  else if (lvl == "TRACE") s.level = LogLevel::Trace;
  else s.level = LogLevel::None;
  std::string unknown;
  s.subsys = parse_subsys(param_str(Param::DebugSubsys), &unknown);
  if (gethostname(s.host, sizeof(s.host) - 1) != 0) std::strcpy(s.host, "unknown");
  if (char* dot = std::strchr(s.host, '.')) *dot = '\0';
  std::string file = param_str(Param::DebugFile);
  if (!file.empty() && s.level > LogLevel::None) {
    std::string path;
    for (size_t i = 0; i < file.size(); ++i) {
      if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'h') {
        path += s.host;
        ++i;
      } else if (file[i] == '%' && i + 1 < file.size() && file[i + 1] == 'p') {
        path += std::to_string(getpid());
        ++i;
      } else {
        path += file[i];
      }
    }
    // Never through a symbolic link planted at that name, into a FIFO or
    // another user's file: such a name is refused and logging stays on stderr.
    std::string why;
    int fd = open_private_output(path, &why);
    if (fd >= 0) {
      if (FILE* f = ::fdopen(fd, "w")) s.out = f;
      else ::close(fd);
    } else {
      std::fprintf(stderr, "meshccl: MESHCCL_DEBUG_FILE %s refused: %s; logging to stderr\n", path.c_str(),
                   why.c_str());
    }
  }
  g_subsys.store(s.subsys);
  detail::g_log_level.store(static_cast<int>(s.level));
}

}  // namespace

LogLevel log_level() {
  int l = detail::g_log_level.load(std::memory_order_relaxed);
  if (l < 0) {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    t_in_log = true;
    init_locked(s);
    t_in_log = false;
    l = static_cast<int>(s.level);
  }
  return static_cast<LogLevel>(l);
}

bool detail::log_enabled_slow(LogLevel level, uint32_t subsys) {
  if (log_level() < level) return false;
  return level <= LogLevel::Warn || (g_subsys.load(std::memory_order_relaxed) & subsys) != 0;
}

void log_reset() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.out != stdout && s.out != nullptr) std::fclose(s.out);
  s.out = stdout;
  s.initialized = false;
  detail::g_log_level.store(-1);
}

void log_msg(LogLevel level, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);

  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  t_in_log = true;
  init_locked(s);
  t_in_log = false;
  if (level == LogLevel::Warn) {
    s.last_error = msg;
    t_last_error.set(msg);
  }
  if (s.level < level) return;
  if (level > LogLevel::Warn && (s.subsys & subsys) == 0) return;
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  long tid = syscall(SYS_gettid);
  if (level == LogLevel::Warn) {
    char ts[64];
    std::time_t now = std::time(nullptr);
    std::tm tm;
    localtime_r(&now, &tm);
    std::strftime(ts, sizeof(ts), "[%F %T] ", &tm);
    std::fprintf(s.out, "\n%s%s:%d:%ld [0] %s:%d NCCL WARN %s\n", ts, s.host, getpid(), tid, base, line, msg);
  } else if (level == LogLevel::Trace) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.start).count();
    std::fprintf(s.out, "%s:%d:%ld [0] %f %s:%d NCCL TRACE %s\n", s.host, getpid(), tid, ms, base, line, msg);
  } else if (level == LogLevel::Version) {
    std::fprintf(s.out, "%s\n", msg);
  } else {
    std::fprintf(s.out, "%s:%d:%ld [0] NCCL INFO %s\n", s.host, getpid(), tid, msg);
  }
  std::fflush(s.out);
}

void warn_once(const std::string& key, const char* fmt, ...) {
  static std::mutex* mu = new std::mutex();
  static auto* seen = new std::set<std::string>();  // never freed: warnings may come during exit
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> lock(*mu);
    if (!seen->insert(key).second) return;
  }
  std::fprintf(stderr, "meshccl: warning: %s\n", msg);
  if (!t_in_log) log_msg(LogLevel::Warn, kEnv, __FILE__, __LINE__, "%s", msg);
}

std::string log_subsys_unknown(const std::string& spec) {
  std::string unknown;
  (void)parse_subsys(spec, &unknown);
  return unknown;
}

std::string last_error() {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.last_error;
}

std::string thread_last_error() { return t_last_error.get(); }

LastErrorScope::~LastErrorScope() {
  if (saved_.empty() || saved_ == t_last_error.get()) return;
  t_last_error.set(saved_);
  set_last_error(saved_);
}

void amend_last_error(const std::string& msg) {
  t_last_error.set(msg);
  set_last_error(msg);
}

void set_last_error(const std::string& msg) {
  LogState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.last_error = msg;
}

Status error_at(const char* file, int line, ncclResult_t code, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  log_msg(LogLevel::Warn, kAllSubsys, file, line, "%s", msg);
  return Status(code);
}

}  // namespace meshccl
