// Typed access to the settings declared in params.def.
//
// Each setting is read from the environment (its MESHCCL_ name, else its NCCL_
// alias) and parsed once per read, against the check params.def declares for
// it. A value that does not pass is refused: param_check() fails the
// communicator's creation with ncclInvalidArgument naming the variable the
// user set, and readers get the default meanwhile.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace meshccl {

enum class Param {
#define MESHCCL_PARAM(id, name, alias, def, check, help) id,
#include "util/params.def"
#undef MESHCCL_PARAM
  Count
};

struct ParamInfo {
  const char* name;
  const char* alias;  // nullptr when NCCL has no such knob
  const char* default_value;
  // What a value must be: "" any string; "bool" 0 or 1; "int LO HI" an
  // integer; "size LO HI" bytes, with K/M/G suffixes; "num LO HI" a number;
  // "enum A|B" one of the names (any case); "subsys" a MESHCCL_DEBUG_SUBSYS
  // list; "algo" checked by the tuner (MESHCCL_ALGO's grammar).
  const char* check;
  const char* help;
};

const ParamInfo& param_info(Param p);
// The values a setting accepts, in words ("integer 1..300", "0 or 1").
std::string param_accepts(const ParamInfo& info);
const std::vector<ParamInfo>& all_params();

// Values are read from the environment once and kept: the first use, and
// every param_refresh() (called when a communicator is created, so a setting
// changed before that applies to the new communicator, as with NCCL).
void param_refresh();
// Logs every setting found in the environment (INFO, subsystem ENV, once per
// value: "NCCL_DEBUG set by environment to INFO") and fails with
// ncclInvalidArgument on the first value its check refuses, naming the
// variable as it was set. Called where communicators and ids are made.
Status param_check();

// The environment value (name, then alias) or nullptr when neither is set.
const char* param_env(Param p);
// The variable that was set: the name, or the alias when only it was set;
// the name when neither was.
const char* param_set_name(Param p);
// The value as set in the environment ("" when unset), refused or not.
const std::string& param_raw(Param p);
// Why the value set is refused ("" when it is accepted or unset).
const std::string& param_problem(Param p);
// The value in force: environment, else default (also when refused). The
// reference stays valid.
const std::string& param_str(Param p);
// Integer value of an int, size or bool setting (the default when refused).
int64_t param_int(Param p);
// Changes exactly when the values in force change (a param_refresh that
// found a different environment): what a cache of derived values keys on.
uintptr_t param_generation();
// Floating-point value of a num setting; unset, empty or refused yields `unset`.
double param_double(Param p, double unset);
// Lookup by name or alias ("MESHCCL_X" / "NCCL_X"); unknown names fall back to
// getenv(name). For plugins (get_param).
const char* param_by_name(const char* name);

// NCCL settings meshccl accepts and does not act on, with the reason.
struct IgnoredNcclParam {
  const char* name;
  const char* why;
};
const std::vector<IgnoredNcclParam>& ignored_nccl_params();

}  // namespace meshccl
