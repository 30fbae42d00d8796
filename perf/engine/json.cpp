#include "json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <string>

extern char** environ;

namespace perf {

namespace {

std::string Now() {
  char buf[64];
  const time_t t = time(nullptr);
  struct tm tmv;
  localtime_r(&t, &tmv);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tmv);
  return JsonWriter::Quote(buf);
}

std::string Num(double v) {
  if (std::isnan(v)) return "\"nan\"";
  char buf[64];
  snprintf(buf, sizeof buf, "%lf", v);
  return buf;
}

std::string Int(long long v) { return std::to_string(v); }

// The environment is recorded as nccl-tests records it, except the values of
// variables whose names say they hold a secret (MESHCCL_COMM_SECRET, tokens,
// passwords, keys): a results file is shared, a secret is not.
bool secret_name(const std::string& name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char* word : {"SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "KEY", "AUTH"})
    if (up.find(word) != std::string::npos) return true;
  return false;
}

std::string EnvEntry(const char* entry) {
  const char* eq = std::strchr(entry, '=');
  if (eq == nullptr || !secret_name(std::string(entry, static_cast<size_t>(eq - entry)))) return entry;
  return std::string(entry, static_cast<size_t>(eq - entry + 1)) + "<redacted>";
}

std::string Mode(double time, double algbw, double busbw, int64_t wrong, bool cputime) {
  return std::string("{\"") + (cputime ? "cpu_time" : "time") + "\":" + Num(time) + ",\"alg_bw\":" + Num(algbw) +
         ",\"bus_bw\":" + Num(busbw) +
         ",\"nwrong\":" + (wrong < 0 ? std::string("null") : Num(static_cast<double>(wrong))) + "}";
}

}  // namespace

JsonWriter::~JsonWriter() {
  if (f_) fclose(f_);
}

std::string JsonWriter::Quote(const char* s) {
  std::string out = "\"";
  for (; s && *s; s++) {
    const unsigned char c = static_cast<unsigned char>(*s);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '/': out += "\\/"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char esc[8];
          snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

bool JsonWriter::Open(const std::string& path, int argc, char** argv, int nccl_version) {
  std::string attempt = path;
  for (int i = 0;; i++) {
    f_ = fopen(attempt.c_str(), "wx");
    if (f_) break;
    if (errno != EEXIST || i > 1000) {
      printf("# skipping json output; %s not accessible\n", attempt.c_str());
      return false;
    }
    attempt = path + "." + std::to_string(i);
  }
  printf("# Writing JSON output to %s\n", attempt.c_str());
  doc_ = "{\"version\":3,\"start_time\":" + Now() + ",\"args\":[";
  for (int i = 0; i < argc; i++) {
    if (i) doc_ += ',';
    doc_ += Quote(argv[i]);
  }
  doc_ += "],\"env\":[";
  bool first = true;
  for (char** e = environ; e && *e; e++, first = false) {
    if (!first) doc_ += ',';
    doc_ += Quote(EnvEntry(*e).c_str());
  }
  doc_ += "],\"nccl_version\":" + Int(nccl_version);
  return true;
}

void JsonWriter::Config(const Options& o) {
  doc_ += ",\"config\":{\"nthreads\":" + Int(o.nthreads) + ",\"ngpus\":" + Int(o.ngpus) +
          ",\"minimum_bytes\":" + Int(static_cast<long long>(o.min_bytes)) +
          ",\"maximum_bytes\":" + Int(static_cast<long long>(o.max_bytes));
  if (o.step_factor > 1) doc_ += ",\"step_factor\":" + Int(static_cast<long long>(o.step_factor));
  else doc_ += ",\"step_bytes\":" + Int(static_cast<long long>(o.step_bytes));
  doc_ += ",\"warmup_iters\":" + Int(o.warmup_iters) + ",\"iterations\":" + Int(o.iters) +
          ",\"aggregated_iterations\":" + Int(o.agg_iters) + ",\"validation\":" + Int(o.check) +
          ",\"graph\":" + Int(o.graph) + ",\"blocking_collectives\":" + Quote(o.blocking ? "true" : "false") +
          ",\"per_iter_timing\":" + Quote(o.per_iter_timing ? "true" : "false") +
          ",\"per_iter_skip\":" + Int(o.per_iter_skip) +
          ",\"parallel_init\":" + Quote(o.parallel_init ? "true" : "false");
}

void JsonWriter::Devices(const char* lines) {
  const char* p = lines;
  while (p && *p) {
    const char* eol = strchr(p, '\n');
    std::string line = eol ? std::string(p, eol) : std::string(p);
    p = eol ? eol + 1 : nullptr;
    int rank = 0, group = 0, pid = 0, device = 0, end = 0;
    char host[256] = "", hex[128] = "", info[1024] = "";
    if (sscanf(line.c_str(), "#  Rank %d Group %d Pid %d on %255s device %d [%127[^]]] %1023[^\n]%n", &rank, &group,
               &pid, host, &device, hex, info, &end) < 7)
      continue;
    if (!devices_.empty()) devices_ += ",";
    devices_ += "{\"rank\":" + Int(rank) + ",\"group\":" + Int(group) + ",\"pid\":" + Int(pid) +
                ",\"hostname\":" + Quote(host) + ",\"device\":" + Int(device) + ",\"device_hex\":" + Quote(hex) +
                ",\"device_info\":" + Quote(info) + "}";
  }
}

void JsonWriter::EndConfig() { doc_ += ",\"devices\":[" + devices_ + "]}"; }

void JsonWriter::Row(size_t bytes, size_t count, const char* type, const char* op, int root, double ot, double oa,
                     double ob, int64_t ow, double it, double ia, double ib, int64_t iw, bool cputime, int iters,
                     const char* name) {
  char root_str[32];
  snprintf(root_str, sizeof root_str, "%6i", root);
  if (!rows_.empty()) rows_ += ",";
  rows_ += "{\"size\":" + Int(static_cast<long long>(bytes)) + ",\"count\":" + Int(static_cast<long long>(count)) +
           ",\"type\":" + Quote(type) + ",\"redop\":" + Quote(op) + ",\"root\":" + Quote(root_str) +
           ",\"out_of_place\":" + Mode(ot, oa, ob, ow, cputime) + ",\"in_place\":" + Mode(it, ia, ib, iw, cputime) +
           ",\"actual_iterations\":" + Int(iters) + ",\"experiment_name\":" + Quote(name) + "}";
}

void JsonWriter::Finish(int oob, double avg_bw, double min_bw, const char* error) {
  if (!f_) return;
  doc_ += ",\"results\":[" + rows_ + "]";
  doc_ += ",\"out_of_bounds\":{\"count\":" + Int(oob) + ",\"okay\":" + Quote(oob ? "false" : "true") + "}";
  doc_ += ",\"average_bus_bandwidth\":{\"bandwidth\":" + Num(avg_bw) +
          ",\"okay\":" + (min_bw < 0 ? Quote("unchecked") : Quote(avg_bw >= 0.9 * min_bw ? "true" : "false")) + "}";
  doc_ += ",\"errors\":[" + (error && *error ? Quote(error) : std::string()) + "]";
  doc_ += ",\"end_time\":" + Now() + "}\n";
  fputs(doc_.c_str(), f_);
  fclose(f_);
  f_ = nullptr;
}

}  // namespace perf
