#include "sched/trace.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "util/file_check.h"
#include "util/log.h"
#include "util/param.h"
#include "util/wait.h"

namespace meshccl {
namespace {

struct TraceFile {
  std::mutex mu;
  FILE* f = nullptr;
  bool first = true;
};

void close_trace();

TraceFile& trace_file() {
  static TraceFile* t = [] {
    auto* tf = new TraceFile;  // lives until exit, closed by close_trace
    std::string path = param_str(Param::Trace);
    // %p: this process's id, so the ranks of a job write files of their own.
    for (size_t at = path.find("%p"); at != std::string::npos; at = path.find("%p"))
      path.replace(at, 2, std::to_string(getpid()));
    if (!path.empty()) {
      // As the debug file: not through a planted link, into a FIFO or another user's file.
      std::string why;
      int fd = open_private_output(path, &why);
      if (fd >= 0 && (tf->f = fdopen(fd, "w")) == nullptr) {
        why = "fdopen failed";
        close(fd);
      }
      // On stderr whatever MESHCCL_DEBUG says: the user asked for a trace.
      if (tf->f == nullptr)
        warn_once("MESHCCL_TRACE", "MESHCCL_TRACE %s refused: %s; no trace is written", path.c_str(), why.c_str());
      else {
        std::fputs("[\n", tf->f);
        std::atexit(close_trace);
      }
    }
    return tf;
  }();
  return *t;
}

void close_trace() {
  TraceFile& t = trace_file();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.f == nullptr) return;
  std::fputs("\n]\n", t.f);
  std::fclose(t.f);
  t.f = nullptr;
}

void emit(const char* line) {
  TraceFile& t = trace_file();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.f == nullptr) return;
  if (!t.first) std::fputs(",\n", t.f);
  t.first = false;
  std::fputs(line, t.f);
}

}  // namespace

void trace_flush() {
  if (!trace_on()) return;
  TraceFile& t = trace_file();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.f != nullptr) std::fflush(t.f);
}

bool trace_on() {
  static const bool on = trace_file().f != nullptr;
  return on;
}

void trace_op(uint64_t comm, int rank, const char* name, int priority, double start_us) {
  if (!trace_on()) return;
  const double end = now_us();
  char line[384];
  std::snprintf(line, sizeof line,
                "{\"name\":\"%s\",\"cat\":\"op\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
                "\"args\":{\"priority\":%d,\"comm\":\"%" PRIx64 "\",\"rank\":%d}}",
                name, start_us, end - start_us, static_cast<int>(getpid()), rank * 1000, priority, comm, rank);
  emit(line);
}

void trace_chunk(int rank, int peer, bool send, size_t bytes, int level, uint64_t tag, double start_us) {
  if (!trace_on()) return;
  const double end = now_us();
  char line[384];
  std::snprintf(line, sizeof line,
                "{\"name\":\"%s %zu B\",\"cat\":\"chunk\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,"
                "\"tid\":%d,\"args\":{\"peer\":%d,\"level\":%d,\"tag\":\"%" PRIx64 "\"}}",
                send ? "send" : "recv", bytes, start_us, end - start_us, static_cast<int>(getpid()),
                rank * 1000 + 1 + 2 * peer + (send ? 1 : 0), peer, level, tag);
  emit(line);
}

}  // namespace meshccl
