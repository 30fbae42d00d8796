// Parsing MESHCCL_ALGO / NCCL_ALGO, apart from the tuner so that it can be
// tested and fuzzed alone.
#pragma once

#include <string>
#include <vector>

#include "base/op.h"
#include "util/status.h"

namespace meshccl {

// An algorithm the rule may name, and the collective it implements.
struct AlgoName {
  const char* name;
  OpKind kind;
};

// The algorithm names the setting lists for this collective (empty: no
// rule); *exclude for a ^list. The first entry may name no collective: it
// then restricts every collective that has one of the algorithms it lists; a
// name not in `table` is ncclInvalidArgument with a message that names the
// setting as `var` (the variable the user set).
Status parse_algo_rule(const std::string& spec, OpKind kind, const std::vector<AlgoName>& table,
                       std::vector<std::string>* names, bool* exclude, const char* var = "MESHCCL_ALGO");

}  // namespace meshccl
