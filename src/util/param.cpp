#include "util/param.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <mutex>
#include <string>

#include "util/log.h"

namespace meshccl {

namespace {
const std::vector<ParamInfo>& table() {
  static const std::vector<ParamInfo> t = {
#define MESHCCL_PARAM(id, name, alias, def, help) {name, alias, def, help},
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
  std::vector<std::string> value;  // environment value, else the default
  std::vector<char> set;           // found in the environment
  std::vector<int64_t> num;        // value as an integer (default when malformed)
  std::vector<char> malformed;     // (bytes, not bits: read on every call's path)
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
// set for each rank, and the build, test and cluster scripts' own.
bool known_other(const std::string& name) {
  static const char* const names[] = {"MESHCCL_RANK", "MESHCCL_NRANKS", "MESHCCL_LOCAL_RANK", "MESHCCL_LOCAL_SIZE",
                                      "MESHCCL_BUILD_DIR", "MESHCCL_PACKAGES"};
  for (const char* n : names)
    if (name == n) return true;
  return name.rfind("MESHCCL_TEST_", 0) == 0 || name.rfind("MESHCCL_CLUSTER_", 0) == 0;
}

// A MESHCCL_ variable that names no setting is most likely a typo.
void warn_unknown(const std::vector<ParamInfo>& t) {
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, "MESHCCL_", 8) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    std::string name = eq != nullptr ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    bool found = known_other(name);
    for (size_t i = 0; i < t.size() && !found; ++i) found = name == t[i].name;
    if (!found)
      warn_once("unknown " + name, "%s is not a meshccl setting (a typo?); ignored. meshccl_info lists them all",
                name.c_str());
  }
}

const char* read_env(const ParamInfo& info) {
  const char* v = std::getenv(info.name);
  if (v == nullptr && info.alias != nullptr) v = std::getenv(info.alias);
  return v;
}

int64_t parse_int(const char* v, int64_t def, bool* malformed) {
  *malformed = false;
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || (end != nullptr && *end != '\0')) {
    *malformed = true;
    return def;
  }
  return x;
}

const Snapshot& snapshot() {
  const Snapshot* s = g_snapshot.load(std::memory_order_acquire);
  if (s == nullptr) {
    param_refresh();
    s = g_snapshot.load(std::memory_order_acquire);
  }
  return *s;
}

}  // namespace

void param_refresh() {
  auto fresh = std::make_unique<Snapshot>();
  const size_t n = table().size();
  fresh->value.resize(n);
  fresh->set.resize(n);
  fresh->num.resize(n);
  fresh->malformed.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const ParamInfo& info = table()[i];
    const char* v = read_env(info);
    fresh->set[i] = v != nullptr;
    fresh->value[i] = v != nullptr ? v : info.default_value;
    bool bad = false;
    const int64_t def = parse_int(info.default_value, 0, &bad);
    fresh->num[i] = parse_int(v, def, &bad);
    fresh->malformed[i] = bad;
  }
  // A timeout must be a positive number of seconds: 0 or a negative value
  // would mean "wait forever", which no wait in meshccl may do.
  const size_t ti = static_cast<size_t>(Param::Timeout);
  if (fresh->set[ti] && (fresh->malformed[ti] || fresh->num[ti] <= 0)) {
    warn_once("MESHCCL_TIMEOUT=" + fresh->value[ti],
              "MESHCCL_TIMEOUT=\"%s\" is not a positive number of seconds; using the default %s",
              fresh->value[ti].c_str(), table()[ti].default_value);
    bool unused = false;
    fresh->num[ti] = parse_int(table()[ti].default_value, 300, &unused);
    fresh->malformed[ti] = false;
  }
  warn_unknown(table());
  std::lock_guard<std::mutex> lock(g_refresh_mu);
  const Snapshot* cur = g_snapshot.load(std::memory_order_acquire);
  if (cur != nullptr && cur->value == fresh->value && cur->set == fresh->set) return;
  g_snapshot.store(fresh.get(), std::memory_order_release);  // the old one stays valid for readers
  kept().push_back(std::move(fresh));
}

const char* param_env(Param p) {
  const Snapshot& s = snapshot();
  const size_t i = static_cast<size_t>(p);
  return s.set[i] ? s.value[i].c_str() : nullptr;
}

const std::string& param_str(Param p) { return snapshot().value[static_cast<size_t>(p)]; }

uintptr_t param_generation() { return reinterpret_cast<uintptr_t>(&snapshot()); }

int64_t param_int(Param p) {
  const Snapshot& s = snapshot();
  const size_t i = static_cast<size_t>(p);
  if (s.malformed[i]) [[unlikely]] {
    const ParamInfo& info = param_info(p);
    warn_once(std::string(info.name) + "=" + s.value[i], "%s=\"%s\" is not an integer; using the default %s",
              info.name, s.value[i].c_str(), info.default_value);
  }
  return s.num[i];
}

double param_double(Param p, double unset) {
  const ParamInfo& info = param_info(p);
  const char* v = param_env(p);
  if (v == nullptr || *v == '\0') v = info.default_value;
  if (*v == '\0') return unset;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || (end != nullptr && *end != '\0')) {
    warn_once(std::string(info.name) + "=" + v, "%s=\"%s\" is not a number; ignored", info.name, v);
    return unset;
  }
  return x;
}

const char* param_by_name(const char* name) {
  if (name == nullptr) return nullptr;
  for (size_t i = 0; i < table().size(); ++i) {
    const ParamInfo& info = table()[i];
    if (std::strcmp(info.name, name) == 0 || (info.alias && std::strcmp(info.alias, name) == 0)) {
      const char* v = param_env(static_cast<Param>(i));
      return v != nullptr ? v : info.default_value;
    }
  }
  return std::getenv(name);
}

}  // namespace meshccl
