#include "util/param.h"

#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cctype>
#include <memory>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "plugins/common/plugin_util.h"
#include "util/log.h"

namespace meshccl {

namespace {
const std::vector<ParamInfo>& table() {
  static const std::vector<ParamInfo> t = {
#define MESHCCL_PARAM(id, name, alias, def, check, help) {name, alias, def, check, help},
#include "util/params.def"
#undef MESHCCL_PARAM
  };
  return t;
}
}  // namespace

const ParamInfo& param_info(Param p) { return table()[static_cast<size_t>(p)]; }
const std::vector<ParamInfo>& all_params() { return table(); }

namespace {

// The environment as last read. Snapshots are immutable and never freed (a
// new one is made only when a value changed), so readers need no lock.
struct Snapshot {
  std::vector<std::string> raw;       // environment value, "" when unset
  std::vector<std::string> value;     // in force: the environment value, else (unset or refused) the default
  std::vector<char> set;              // found in the environment
  std::vector<const char*> set_name;  // the variable found (name or alias)
  std::vector<int64_t> num;           // value as an integer (default when refused)
  std::vector<double> dbl;            // value as a number (NaN when unset or refused)
  std::vector<std::string> problem;   // why the value is refused, "" if it is not
};

std::atomic<const Snapshot*> g_snapshot{nullptr};
std::mutex g_refresh_mu;
// Every snapshot made, kept reachable (readers may still hold an old one;
// a new one is made only when the environment changed).
std::vector<std::unique_ptr<const Snapshot>>& kept() {
  static auto* v = new std::vector<std::unique_ptr<const Snapshot>>();
  return *v;
}

// Variables with the MESHCCL_ prefix that are not settings: what launchers
// set for each rank, and the build, test, perf tool and cluster scripts' own
// (MESHCCL_PERF_NETDEV, MESHCCL_PERF_MPI: perf/).
bool known_other(const std::string& name) {
  static const char* const names[] = {"MESHCCL_RANK",       "MESHCCL_NRANKS",    "MESHCCL_LOCAL_RANK",
                                      "MESHCCL_LOCAL_SIZE", "MESHCCL_BUILD_DIR", "MESHCCL_PACKAGES"};
  for (const char* n : names)
    if (name == n) return true;
  return name.rfind("MESHCCL_TEST_", 0) == 0 || name.rfind("MESHCCL_CLUSTER_", 0) == 0 ||
         name.rfind("MESHCCL_PERF_", 0) == 0;
}

std::string env_name(const char* entry) {
  const char* eq = std::strchr(entry, '=');
  return eq != nullptr ? std::string(entry, static_cast<size_t>(eq - entry)) : std::string(entry);
}

bool names_setting(const std::vector<ParamInfo>& t, const std::string& name) {
  for (const ParamInfo& p : t)
    if (name == p.name || (p.alias != nullptr && name == p.alias)) return true;
  return false;
}

// A MESHCCL_ variable that names no setting is most likely a typo.
void warn_unknown(const std::vector<ParamInfo>& t) {
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "MESHCCL_", 8) != 0) continue;
    std::string name = env_name(*e);
    if (!known_other(name) && !names_setting(t, name))
      warn_once("unknown " + name, "%s is not a meshccl setting (a typo?); ignored. meshccl_info lists them all",
                name.c_str());
  }
}

// The check's words: "int 1 300" -> {"int", "1", "300"}.
std::vector<std::string> words(const char* check) {
  std::vector<std::string> w;
  std::string cur;
  for (const char* c = check; *c != '\0'; ++c) {
    if (*c != ' ') {
      cur += *c;
    } else if (!cur.empty()) {
      w.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}

bool whole_integer(const char* v, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || *end != '\0' || errno == ERANGE) return false;
  *out = x;
  return true;
}

bool whole_number(const char* v, double* out) {
  char* end = nullptr;
  double x = std::strtod(v, &end);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || *end != '\0' || !std::isfinite(x)) return false;
  *out = x;
  return true;
}

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string printf_string(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string printf_string(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// Parses v (non-empty) by the setting's check into *num / *dbl; "" when it
// passes, else why not (without the variable's name).
std::string parse_checked(const ParamInfo& info, const char* v, int64_t* num, double* dbl) {
  const std::vector<std::string> w = words(info.check);
  const std::string kind = w.empty() ? "" : w[0];
  if (kind == "bool") {
    if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) return "must be 0 or 1";
    *num = v[0] - '0';
  } else if (kind == "int" || kind == "size") {
    const int64_t lo = std::strtoll(w.at(1).c_str(), nullptr, 10), hi = std::strtoll(w.at(2).c_str(), nullptr, 10);
    const char* unit = kind == "size" ? " bytes" : "";
    int64_t x = 0;
    uint64_t bytes = 0;
    if (kind == "int" && !whole_integer(v, &x))
      return printf_string("is not an integer (accepted: %" PRId64 "..%" PRId64 ")", lo, hi);
    if (kind == "size") {
      if (v[0] == '-' || !plugin::parse_size(v, &bytes))
        return printf_string("is not a byte size such as 65536, 64K or 1M (accepted: %" PRId64 "..%" PRId64 ")", lo,
                             hi);
      x = bytes > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(bytes);
    }
    if (x < lo || x > hi) return printf_string("is outside %" PRId64 "..%" PRId64 "%s", lo, hi, unit);
    *num = x;
  } else if (kind == "num") {
    const double lo = std::strtod(w.at(1).c_str(), nullptr), hi = std::strtod(w.at(2).c_str(), nullptr);
    double x = 0;
    if (!whole_number(v, &x)) return printf_string("is not a number (accepted: %g..%g)", lo, hi);
    if (x < lo || x > hi) return printf_string("is outside %g..%g", lo, hi);
    *dbl = x;
  } else if (kind == "enum") {
    const std::string list = w.at(1);
    const std::string want = upper(v);
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t end = list.find('|', pos);
      if (end == std::string::npos) end = list.size();
      if (upper(list.substr(pos, end - pos)) == want) return "";
      pos = end + 1;
    }
    std::string names = list;
    for (auto& c : names)
      if (c == '|') c = ',';
    return "is not one of " + names;
  } else if (kind == "subsys") {
    const std::string bad = log_subsys_unknown(v);
    if (!bad.empty()) return "names no subsystem \"" + bad + "\" (see meshccl_info)";
  }
  return "";
}

const Snapshot& snapshot() {
  const Snapshot* s = g_snapshot.load(std::memory_order_acquire);
  if (s == nullptr) {
    param_refresh();
    s = g_snapshot.load(std::memory_order_acquire);
  }
  return *s;
}

// Echoes one variable once per value (INFO, ENV).
void echo_once(const std::string& name, const std::string& value, const char* note) {
  static std::mutex* mu = new std::mutex();
  static auto* seen = new std::set<std::string>();  // never freed: init may run during exit
  {
    std::lock_guard<std::mutex> lock(*mu);
    if (!seen->insert(name + "=" + value).second) return;
  }
  MC_INFO(kEnv, "%s set by environment to %s%s", name.c_str(), value.c_str(), note);
}

}  // namespace

void param_refresh() {
  auto fresh = std::make_unique<Snapshot>();
  const size_t n = table().size();
  fresh->raw.resize(n);
  fresh->value.resize(n);
  fresh->set.resize(n);
  fresh->set_name.resize(n);
  fresh->num.resize(n);
  fresh->dbl.resize(n);
  fresh->problem.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const ParamInfo& info = table()[i];
    const char* v = std::getenv(info.name);
    fresh->set_name[i] = info.name;
    if (v == nullptr && info.alias != nullptr && (v = std::getenv(info.alias)) != nullptr)
      fresh->set_name[i] = info.alias;
    fresh->set[i] = v != nullptr;
    fresh->raw[i] = v != nullptr ? v : "";
    fresh->value[i] = v != nullptr ? v : info.default_value;
    int64_t def_num = 0;
    double def_dbl = std::nan("");
    if (*info.default_value != '\0') (void)parse_checked(info, info.default_value, &def_num, &def_dbl);
    fresh->num[i] = def_num;
    fresh->dbl[i] = def_dbl;
    if (v != nullptr && *v != '\0') {
      fresh->problem[i] = parse_checked(info, v, &fresh->num[i], &fresh->dbl[i]);
      if (!fresh->problem[i].empty()) {
        fresh->value[i] = info.default_value;
        fresh->num[i] = def_num;
        fresh->dbl[i] = def_dbl;
      }
    }
  }
  warn_unknown(table());
  std::lock_guard<std::mutex> lock(g_refresh_mu);
  const Snapshot* cur = g_snapshot.load(std::memory_order_acquire);
  if (cur != nullptr && cur->raw == fresh->raw && cur->set == fresh->set && cur->set_name == fresh->set_name) return;
  g_snapshot.store(fresh.get(), std::memory_order_release);  // the old one stays valid for readers
  kept().push_back(std::move(fresh));
}

Status param_check() {
  const Snapshot& s = snapshot();
  for (size_t i = 0; i < s.value.size(); ++i)
    if (s.set[i]) echo_once(s.set_name[i], s.raw[i], s.problem[i].empty() ? "" : " (refused)");
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "NCCL_", 5) != 0) continue;
    const std::string name = env_name(*e);
    if (names_setting(table(), name)) continue;
    const char* value = std::strchr(*e, '=') != nullptr ? std::strchr(*e, '=') + 1 : "";
    const char* why = "not a setting meshccl knows";
    for (const IgnoredNcclParam& p : ignored_nccl_params())
      if (name == p.name) why = p.why;
    echo_once(name, value, (std::string(": no effect in meshccl (") + why + ")").c_str());
  }
  for (size_t i = 0; i < s.value.size(); ++i) {
    if (s.problem[i].empty()) continue;
    const std::string text = std::string(s.set_name[i]) + "=\"" + s.raw[i] + "\" " + s.problem[i];
    warn_once(text, "%s", text.c_str());
    return MC_ERROR(ncclInvalidArgument, "%s", text.c_str());
  }
  return kOk;
}

const char* param_env(Param p) {
  const Snapshot& s = snapshot();
  const size_t i = static_cast<size_t>(p);
  return s.set[i] && s.problem[i].empty() ? s.value[i].c_str() : nullptr;
}

const char* param_set_name(Param p) { return snapshot().set_name[static_cast<size_t>(p)]; }

const std::string& param_problem(Param p) { return snapshot().problem[static_cast<size_t>(p)]; }

const std::string& param_str(Param p) { return snapshot().value[static_cast<size_t>(p)]; }

const std::string& param_raw(Param p) { return snapshot().raw[static_cast<size_t>(p)]; }

uintptr_t param_generation() { return reinterpret_cast<uintptr_t>(&snapshot()); }

int64_t param_int(Param p) { return snapshot().num[static_cast<size_t>(p)]; }

double param_double(Param p, double unset) {
  const double x = snapshot().dbl[static_cast<size_t>(p)];
  return std::isnan(x) ? unset : x;
}

const char* param_by_name(const char* name) {
  if (name == nullptr) return nullptr;
  for (size_t i = 0; i < table().size(); ++i) {
    const ParamInfo& info = table()[i];
    if (std::strcmp(info.name, name) == 0 || (info.alias && std::strcmp(info.alias, name) == 0))
      return param_str(static_cast<Param>(i)).c_str();
  }
  return std::getenv(name);
}

std::string param_accepts(const ParamInfo& info) {
  const std::vector<std::string> w = words(info.check);
  const std::string kind = w.empty() ? "" : w[0];
  if (kind == "bool") return "0 or 1";
  if (kind == "int") return "integer " + w.at(1) + ".." + w.at(2);
  if (kind == "size") return "bytes " + w.at(1) + ".." + w.at(2) + " (K, M, G suffixes)";
  if (kind == "num") return "number " + w.at(1) + ".." + w.at(2);
  if (kind == "enum") {
    std::string names = w.at(1);
    for (auto& c : names)
      if (c == '|') c = ',';
    return "one of " + names + " (any case)";
  }
  if (kind == "subsys") return "subsystem names, commas, ^ prefix";
  if (kind == "algo") return "NCCL_ALGO's grammar";
  return "text";
}

const std::vector<IgnoredNcclParam>& ignored_nccl_params() {
  static const std::vector<IgnoredNcclParam> v = {
      {"NCCL_P2P_DISABLE",
       "no GPU peer-to-peer transport: ranks on one host always use shared memory unless MESHCCL_SHM_DISABLE=1"},
      {"NCCL_P2P_LEVEL", "no GPU peer-to-peer transport"},
      {"NCCL_PROTO", "one protocol per transport; MESHCCL_ALGO chooses algorithms"},
      {"NCCL_NTHREADS", "no GPU kernels with thread counts"},
      {"NCCL_MIN_NCHANNELS", "channels are chosen per algorithm"},
      {"NCCL_MAX_NCHANNELS", "channels are chosen per algorithm"},
      {"NCCL_IB_DISABLE", "no InfiniBand verbs transport; MESHCCL_NET picks ucx, ofi or socket"},
      {"NCCL_IB_HCA", "no InfiniBand verbs transport; UCX_NET_DEVICES or FI_PROVIDER select devices"},
      {"NCCL_NET_GDR_LEVEL", "no GPUDirect RDMA"},
      {"NCCL_NET_PLUGIN", "transports are meshccl plugins: MESHCCL_PLUGIN_PATH, MESHCCL_NET"},
      {"NCCL_TUNER_PLUGIN", "the tuner is built in: MESHCCL_ALGO, MESHCCL_TUNE_*"},
      {"NCCL_LAUNCH_MODE", "no GPU kernel launches to group"},
      {"NCCL_CUMEM_ENABLE", "ncclMemAlloc chooses its allocator itself"},
      {"NCCL_NVLS_ENABLE", "no NVLink SHARP"},
      {"NCCL_COLLNET_ENABLE", "no CollNet"},
      {"NCCL_GRAPH_FILE", "MESHCCL_TOPO_FILE describes the topology"},
  };
  return v;
}

}  // namespace meshccl
