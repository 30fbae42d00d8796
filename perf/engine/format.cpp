#include "format.h"

#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace perf {

namespace {

std::string Sprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

std::string Sprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[512];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (static_cast<size_t>(n) < sizeof small) return std::string(small, n);
  std::string big(n + 1, '\0');
  va_start(ap, fmt);
  vsnprintf(big.data(), big.size(), fmt, ap);
  va_end(ap);
  big.resize(n);
  return big;
}

}  // namespace

std::string FloatStr(double value, int width) {
  // Count integer digits as nccl-tests does (0 for values below 1). Infinite
  // and NaN values would never terminate that loop; print them directly.
  if (!std::isfinite(value)) return Sprintf("%*g", width, value);
  int power = 0;
  for (double v = 1; value >= v && power < 400; v *= 10) power++;
  if (power < width - 2) return Sprintf("%*.2f", width, value);
  if (power < width - 1) return Sprintf("%*.1f", width, value);
  if (power < width + 1) return Sprintf("%*.0f", width, value);
  if (width >= 7) return Sprintf("%*.1e", width, value);
  return Sprintf("%*.0e", width, value);
}

std::string Preamble(const PreambleInfo& p) {
  std::string s;
  s += Sprintf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", "2.19.6", p.nccl_headers, p.nccl_library);
  s += Sprintf("# Collective test starting: %s\n", p.program);
  s += Sprintf(
      "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d "
      "iters: %d agg iters: %d validation: %d graph: %d unalign: %d\n",
      p.nthreads, p.ngpus, static_cast<long>(p.min_bytes), static_cast<long>(p.max_bytes),
      static_cast<long>(p.step_factor > 1 ? p.step_factor : p.step_bytes), p.step_factor > 1 ? "factor" : "bytes",
      p.warmup_iters, p.iters, p.agg_iters, p.check, p.graph, p.unalign);
  if (p.blocking == 1) s += "# Blocking Enabled: wait for completion and barrier after each collective \n";
  if (p.blocking > 1) s += "# Blocking Enabled: wait for completion after each collective (no barrier) \n";
  if (p.per_iter_timing) s += "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows \n";
  if (p.parallel_init) s += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
  s += "#\n";
  return s;
}

std::string DeviceLine(int rank, int group, int pid, const char* host, int device, unsigned domain, unsigned bus,
                       unsigned dev, const char* name) {
  return Sprintf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", rank, group, pid, host,
                 device, domain, bus, dev, name);
}

std::string TableHeader(bool cputime, bool timestamps, bool per_iter) {
  const char* ts_label = timestamps ? "timestamp" : "";
  const int ts_pad = timestamps ? 19 : 0;
  const char* ts_fmt = timestamps ? "%Y-%m-%d %H:%M:%S" : "";
  const char* t = cputime ? "cputime" : "time";
  std::string s = "#\n";
  if (per_iter) {
    s += Sprintf(
        "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)        "
        "                        in-place (+ per-iteration)\n",
        "", "", "", "", "");
    s += Sprintf(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  "
        "%6s  %7s  %7s  %7s  %7s %*s\n",
        "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", t,
        "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%", ts_pad, ts_label);
    s += Sprintf(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  "
        "%6s  %7s  %7s  %7s  %7s %*s\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", "(us)",
        "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)", ts_pad, ts_fmt);
    return s;
  }
  s += Sprintf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place   "
      "       \n",
      "", "", "", "", "");
  s += Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count", "type",
               "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong", ts_pad, ts_label);
  s += Sprintf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)", "(elements)", "", "",
               "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ts_pad, ts_fmt);
  return s;
}

std::string RowStart(size_t bytes, size_t count, const char* type, const char* op, int root) {
  const std::string root_str = Sprintf("%6i", root);
  return Sprintf("%12li  %12li  %8s  %6s  %6s", static_cast<long>(bytes), static_cast<long>(count), type, op,
                 root_str.c_str());
}

std::string RowBody(double time_us, double algbw, double busbw, int64_t wrong) {
  const std::string t = FloatStr(time_us, 7);
  const std::string a = FloatStr(algbw, 6);
  const std::string b = FloatStr(busbw, 6);
  if (wrong < 0) return Sprintf("  %7s  %6s  %6s    N/A", t.c_str(), a.c_str(), b.c_str());
  return Sprintf("  %7s  %6s  %6s  %6g", t.c_str(), a.c_str(), b.c_str(), static_cast<double>(wrong));
}

std::string RowBodyNotRun() { return Sprintf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A"); }

std::string RowPerIter(double min_us, double max_us, double p99_us, double cv_pct) {
  return Sprintf("  %7s  %7s  %7s  %7s", FloatStr(min_us, 7).c_str(), FloatStr(max_us, 7).c_str(),
                 FloatStr(p99_us, 7).c_str(), FloatStr(cv_pct, 7).c_str());
}

std::string RowTimestamp(const char* stamp) { return Sprintf("%21s", stamp); }

std::string Footer(int oob, double avg_busbw, double min_bw, const char* program) {
  const char* status = min_bw < 0 ? "" : (avg_busbw < min_bw * 0.9 ? "FAILED" : "OK");
  std::string s;
  s += Sprintf("# %-20s : %d %s\n", "Out of bounds values", oob, oob ? "FAILED" : "OK");
  s += Sprintf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw, status);
  s += "#\n";
  s += Sprintf("# Collective test concluded: %s\n", program);
  return s;
}

std::string MemString(double amount) {
  const char* unit = " B";
  const double a = std::fabs(amount);
  if (a >= 1024.0 * 1024 * 1024) {
    unit = " GB";
    amount /= 1024.0 * 1024 * 1024;
  } else if (a >= 1024.0 * 1024) {
    unit = " MB";
    amount /= 1024.0 * 1024;
  } else if (a >= 1024.0) {
    unit = " KB";
    amount /= 1024.0;
  }
  const int precision = std::fabs(amount) < 10.0 ? 2 : std::fabs(amount) < 100.0 ? 1 : 0;
  return Sprintf("%.*f%s", precision, amount, unit);
}

std::string MemoryLine(double init, double user, double coll) {
  const std::string body = "Initialization " + MemString(init) + " | User-Allocated " + MemString(user) +
                           " | Collective " + MemString(coll) + " | Total  " + MemString(init + user + coll);
  return Sprintf("# %-20s : %s\n", "GPU memory usage", body.c_str());
}

bool ParseSize(const char* text, size_t* bytes) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const double v = strtod(text, &end);
  if (end == text || errno != 0 || !(v >= 0)) return false;
  double mult = 1;
  switch (*end) {
    case 'k':
    case 'K':
      mult = 1024.0;
      end++;
      break;
    case 'm':
    case 'M':
      mult = 1024.0 * 1024;
      end++;
      break;
    case 'g':
    case 'G':
      mult = 1024.0 * 1024 * 1024;
      end++;
      break;
    default: break;
  }
  if (*end != '\0') return false;
  const double total = v * mult;
  if (total >= 9.2e18) return false;
  *bytes = static_cast<size_t>(total);
  return true;
}

}  // namespace perf
