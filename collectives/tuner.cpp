// Algorithm choice. MESHCCL_ALGO / NCCL_ALGO use NCCL's grammar: a list of
// names or ^list to exclude, optionally per collective, entries separated by
// ';' ("ring;broadcast:chain"). Otherwise the first algorithm registered for
// the collective is used.
#include <algorithm>
#include <cctype>
#include <string>

#include "collectives/algorithms.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string kind_key(OpKind k) { return lower(op_kind_name(k)); }

// The list that applies to this collective ("" = none).
Status rule_for(const std::string& spec, OpKind kind, std::string* out) {
  out->clear();
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
      if (!first) return MC_ERROR(ncclInvalidUsage, "MESHCCL_ALGO=\"%s\": only the first entry may omit the collective name", spec.c_str());
      *out = entry;
    } else if (entry.substr(0, colon) == kind_key(kind)) {
      *out = entry.substr(colon + 1);
    }
    first = false;
  }
  return kOk;
}

}  // namespace

Status make_plan(const OpDesc& op, std::unique_ptr<Plan>* out) {
  const auto& table = algorithm_table();
  const Algorithm* pick = nullptr;
  std::string spec = param_str(Param::Algo);
  if (!spec.empty() && op.kind != OpKind::Send && op.kind != OpKind::Recv) {
    std::string rule;
    MC_TRY(rule_for(spec, op.kind, &rule));
    bool exclude = !rule.empty() && rule[0] == '^';
    std::vector<std::string> names;
    size_t pos = exclude ? 1 : 0;
    while (!rule.empty() && pos <= rule.size()) {
      size_t end = rule.find(',', pos);
      if (end == std::string::npos) end = rule.size();
      std::string name = rule.substr(pos, end - pos);
      pos = end + 1;
      if (name.empty()) continue;
      bool known = std::any_of(table.begin(), table.end(), [&](const Algorithm& a) { return name == a.name; });
      if (!known) return MC_ERROR(ncclInvalidUsage, "MESHCCL_ALGO=\"%s\": unknown algorithm \"%s\"", spec.c_str(), name.c_str());
      names.push_back(name);
    }
    for (const Algorithm& a : table) {
      if (a.kind != op.kind) continue;
      bool listed = std::find(names.begin(), names.end(), a.name) != names.end();
      if (names.empty() || listed != exclude) {
        pick = &a;
        break;
      }
    }
    if (pick == nullptr)
      return MC_ERROR(ncclInvalidUsage, "MESHCCL_ALGO=\"%s\" leaves no algorithm for %s", spec.c_str(), op_kind_name(op.kind));
  } else {
    for (const Algorithm& a : table)
      if (a.kind == op.kind) {
        pick = &a;
        break;
      }
  }
  if (pick == nullptr) return MC_ERROR(ncclInternalError, "no algorithm for %s", op_kind_name(op.kind));
  auto plan = std::make_unique<Plan>();
  plan->kind = op.kind;
  plan->dtype = op.dtype;
  plan->op = op.op;
  plan->divisor = op.nranks;
  std::copy(std::begin(op.scalar), std::end(op.scalar), std::begin(plan->scalar));
  MC_TRY(pick->build(op, plan.get()));
  MC_INFO(kTune, "%s: %zu elements of %s -> algorithm %s (%zu steps)", op_kind_name(op.kind), op.count,
          kernels::dtype_name(op.dtype), pick->name, plan->size());
  *out = std::move(plan);
  return kOk;
}

}  // namespace meshccl
