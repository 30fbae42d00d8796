#include "util/param.h"

#include <cstdlib>
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

const char* param_env(Param p) {
  const ParamInfo& info = param_info(p);
  const char* v = std::getenv(info.name);
  if (v == nullptr && info.alias != nullptr) v = std::getenv(info.alias);
  return v;
}

std::string param_str(Param p) {
  const char* v = param_env(p);
  return v != nullptr ? std::string(v) : std::string(param_info(p).default_value);
}

int64_t param_int(Param p) {
  const ParamInfo& info = param_info(p);
  const char* v = param_env(p);
  int64_t def = std::strtoll(info.default_value, nullptr, 0);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 0);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == v || (end != nullptr && *end != '\0')) {
    static std::once_flag warned[static_cast<size_t>(Param::Count)];
    std::call_once(warned[static_cast<size_t>(p)], [&] {
      MC_WARN("%s=\"%s\" is not an integer; using the default %s", info.name, v, info.default_value);
    });
    return def;
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
