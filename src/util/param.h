// Typed access to the settings declared in params.def.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshccl {

enum class Param {
#define MESHCCL_PARAM(id, name, alias, def, help) id,
#include "util/params.def"
#undef MESHCCL_PARAM
  Count
};

struct ParamInfo {
  const char* name;
  const char* alias;  // nullptr when NCCL has no such knob
  const char* default_value;
  const char* help;
};

const ParamInfo& param_info(Param p);
const std::vector<ParamInfo>& all_params();

// Values are read from the environment once and kept: the first use, and
// every param_refresh() (called when a communicator is created, so a setting
// changed before that applies to the new communicator, as with NCCL).
void param_refresh();

// The environment value (name, then alias) or nullptr when neither is set.
const char* param_env(Param p);
// The value in force: environment, else default. The reference stays valid.
const std::string& param_str(Param p);
// Integer value; a malformed value logs a WARN once and yields the default.
int64_t param_int(Param p);
// Changes exactly when the values in force change (a param_refresh that
// found a different environment): what a cache of derived values keys on.
uintptr_t param_generation();
// Floating-point value; unset, empty or malformed (WARN once) yields `unset`.
double param_double(Param p, double unset);
// Lookup by name or alias ("MESHCCL_X" / "NCCL_X"); unknown names fall back to
// getenv(name). For plugins (get_param).
const char* param_by_name(const char* name);

}  // namespace meshccl
