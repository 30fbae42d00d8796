// MESHCCL_ALGO / NCCL_ALGO: NCCL's grammar, a list of names or ^list to
// exclude, optionally per collective, entries separated by ';'
// ("ring;broadcast:chain"). Pure string work on bytes from the environment
// (fuzzed: tests/fuzz/fuzz_algo.cpp).
#include "collectives/algo_rule.h"

#include <algorithm>
#include <cctype>

#include "util/log.h"

namespace meshccl {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string kind_key(OpKind k) { return lower(op_kind_name(k)); }

// The list that applies to this collective ("" = none); *global: it came
// from the entry without a collective name.
Status rule_for(const std::string& spec, OpKind kind, const char* var, std::string* out, bool* global) {
  out->clear();
  *global = false;
  size_t pos = 0;
  bool first = true;
  while (pos <= spec.size()) {
    size_t end = spec.find(';', pos);
    if (end == std::string::npos) end = spec.size();
    std::string entry = lower(spec.substr(pos, end - pos));
    pos = end + 1;
    if (entry.empty()) continue;
    size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      if (!first)
        return MC_ERROR(ncclInvalidArgument, "%s=\"%s\": only the first entry may omit the collective name", var,
                        spec.c_str());
      *out = entry;
      *global = true;
    } else if (entry.substr(0, colon) == kind_key(kind)) {
      *out = entry.substr(colon + 1);
      *global = false;
    }
    first = false;
  }
  return kOk;
}

}  // namespace

Status parse_algo_rule(const std::string& spec, OpKind kind, const std::vector<AlgoName>& table,
                       std::vector<std::string>* names, bool* exclude, const char* var) {
  names->clear();
  *exclude = false;
  if (spec.empty() || kind == OpKind::Send || kind == OpKind::Recv) return kOk;
  std::string rule;
  bool global = false;
  MC_TRY(rule_for(spec, kind, var, &rule, &global));
  *exclude = !rule.empty() && rule[0] == '^';
  size_t pos = *exclude ? 1 : 0;
  while (!rule.empty() && pos <= rule.size()) {
    size_t end = rule.find(',', pos);
    if (end == std::string::npos) end = rule.size();
    std::string name = rule.substr(pos, end - pos);
    pos = end + 1;
    if (name.empty()) continue;
    bool known = std::any_of(table.begin(), table.end(), [&](const AlgoName& a) { return name == a.name; });
    if (!known)
      return MC_ERROR(ncclInvalidArgument, "%s=\"%s\": unknown algorithm \"%s\"", var, spec.c_str(), name.c_str());
    names->push_back(name);
  }
  // A list for every collective says nothing about one with none of its
  // algorithms.
  const bool any_here = std::any_of(table.begin(), table.end(), [&](const AlgoName& a) {
    return a.kind == kind && std::find(names->begin(), names->end(), a.name) != names->end();
  });
  if (global && !*exclude && !any_here) names->clear();
  return kOk;
}

}  // namespace meshccl
