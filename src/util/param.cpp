#include "util/param.h"

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
  std::vector<bool> set;           // found in the environment
  std::vector<int64_t> num;        // value as an integer (default when malformed)
  std::vector<bool> malformed;
};

std::atomic<const Snapshot*> g_snapshot{nullptr};
std::mutex g_refresh_mu;

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
  std::lock_guard<std::mutex> lock(g_refresh_mu);
  const Snapshot* cur = g_snapshot.load(std::memory_order_acquire);
  if (cur != nullptr && cur->value == fresh->value && cur->set == fresh->set) return;
  g_snapshot.store(fresh.release(), std::memory_order_release);  // the old one stays valid for readers
}

const char* param_env(Param p) {
  const Snapshot& s = snapshot();
  const size_t i = static_cast<size_t>(p);
  return s.set[i] ? s.value[i].c_str() : nullptr;
}

const std::string& param_str(Param p) { return snapshot().value[static_cast<size_t>(p)]; }

int64_t param_int(Param p) {
  const Snapshot& s = snapshot();
  const size_t i = static_cast<size_t>(p);
  if (s.malformed[i]) {
    static std::once_flag warned[static_cast<size_t>(Param::Count)];
    const ParamInfo& info = param_info(p);
    std::call_once(warned[i], [&] {
      MC_WARN("%s=\"%s\" is not an integer; using the default %s", info.name, s.value[i].c_str(), info.default_value);
    });
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
    static std::once_flag warned[static_cast<size_t>(Param::Count)];
    std::call_once(warned[static_cast<size_t>(p)], [&] { MC_WARN("%s=\"%s\" is not a number; ignored", info.name, v); });
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
