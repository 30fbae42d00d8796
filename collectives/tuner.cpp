// Algorithm choice. MESHCCL_ALGO / NCCL_ALGO use NCCL's grammar: a list of
// names or ^list to exclude, optionally per collective, entries separated by
// ';' ("ring;broadcast:chain"). The first entry may name no collective: it
// then restricts every collective that has one of the algorithms it lists
// (MESHCCL_ALGO=tree leaves AllGather, which has no tree, to the tuner); a
// per-collective entry must leave that collective an algorithm.
// Among the plan algorithms allowed, the one with the lowest estimated cost
// under the communicator's model wins; the direct shared-memory algorithm is
// taken first when allowed and the operation fits its slots (make_run).
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "collectives/algo_rule.h"
#include "collectives/algorithms.h"
#include "sched/engine.h"
#include "sched/launch.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

// Parsed once per rules text and collective (the last text seen, per thread
// and collective): a communicator's frozen text parses once, not per call.
struct Rule {
  bool parsed = false;
  std::string spec;  // the text this was parsed from
  Status status;
  std::vector<std::string> names;
  bool exclude = false;
};

const Rule& rule_of(OpKind kind, const std::string& spec) {
  thread_local Rule cache[static_cast<int>(OpKind::SparseAllReduce) + 1];
  Rule& c = cache[static_cast<int>(kind)];
  if (!c.parsed || c.spec != spec) {
    static const std::vector<AlgoName> known = [] {
      std::vector<AlgoName> v;
      for (const Algorithm& a : algorithm_table()) v.push_back({a.name, a.kind});
      return v;
    }();
    c.status = parse_algo_rule(spec, kind, known, &c.names, &c.exclude, param_set_name(Param::Algo));
    c.spec = spec;
    c.parsed = true;
  }
  return c;
}

bool allowed_by(const std::vector<std::string>& names, bool exclude, const char* name) {
  bool listed = std::find(names.begin(), names.end(), name) != names.end();
  return names.empty() || listed != exclude;
}

}  // namespace

PlanSettings plan_settings_from_params() {
  PlanSettings s;
  s.algo = param_str(Param::Algo);
  s.chunk_bytes = static_cast<size_t>(param_int(Param::ChunkSize));
  if (s.chunk_bytes == 0) s.chunk_bytes = 512 * 1024;
  s.direct_max_bytes = param_int(Param::DirectMaxBytes);
  s.hier_channels = static_cast<int>(param_int(Param::HierChannels));
  s.sparse_algo = param_str(Param::SparseAlgo);
  s.p2p_eager = param_int(Param::P2pEager);
  return s;
}

const PlanSettings& settings_of(const OpDesc& op) {
  if (op.settings != nullptr) return *op.settings;
  thread_local PlanSettings now;
  thread_local uintptr_t gen = 0;
  thread_local bool have = false;
  if (!have || gen != param_generation()) {
    now = plan_settings_from_params();
    gen = param_generation();
    have = true;
  }
  return now;
}

bool algorithm_allowed(OpKind kind, const char* name, const std::string& rules) {
  const Rule& r = rule_of(kind, rules);
  return r.status.ok() && allowed_by(r.names, r.exclude, name);
}
bool algorithm_allowed(OpKind kind, const char* name) { return algorithm_allowed(kind, name, param_str(Param::Algo)); }

bool algorithm_forced(OpKind kind, const char* name, const std::string& rules) {
  const Rule& r = rule_of(kind, rules);
  return r.status.ok() && !r.exclude && std::find(r.names.begin(), r.names.end(), name) != r.names.end();
}
bool algorithm_forced(OpKind kind, const char* name) { return algorithm_forced(kind, name, param_str(Param::Algo)); }

std::vector<Candidate> estimate_candidates(const TuneModel& tune, const OpDesc& op) {
  const BuildCtx ctx = BuildCtx::whole(tune, op);
  const Rule& rule = rule_of(op.kind, settings_of(op).algo);
  std::vector<Candidate> out;
  for (const Algorithm& a : algorithm_table()) {
    if (a.kind != op.kind || a.build == nullptr || a.cost == nullptr) continue;
    out.push_back({&a, a.cost(ctx, op), rule.status.ok() && allowed_by(rule.names, rule.exclude, a.name)});
  }
  return out;
}

namespace {

Status check_rule(OpKind kind, const std::string& rules) {
  const Rule& rule = rule_of(kind, rules);
  MC_TRY(rule.status);
  bool any_allowed = false;  // algorithms that are not plans (direct_shm) count
  bool any = false;
  for (const Algorithm& a : algorithm_table()) {
    any |= a.kind == kind;
    any_allowed |= a.kind == kind && allowed_by(rule.names, rule.exclude, a.name);
  }
  if (any && !any_allowed)
    return MC_ERROR(ncclInvalidArgument, "%s=\"%s\" leaves no algorithm for %s", param_set_name(Param::Algo),
                    rules.c_str(), op_kind_name(kind));
  return kOk;
}

}  // namespace

Status check_algo_setting() {
  for (int k = 0; k <= static_cast<int>(OpKind::SparseAllReduce); ++k)
    MC_TRY(check_rule(static_cast<OpKind>(k), param_str(Param::Algo)));
  return kOk;
}

Status choose_algorithm(const TuneModel& tune, const OpDesc& op, const Algorithm** out, double* cost_us) {
  MC_TRY(check_rule(op.kind, settings_of(op).algo));
  // The cheapest plan the rule allows (ties: the earlier entry; across hosts
  // near ties as prefer() says); if it allows
  // only algorithms that are not plans (direct_shm, which could not take this
  // op), the cheapest plan.
  const Candidate* best = nullptr;
  const Candidate* best_any = nullptr;
  const std::vector<Candidate> all = estimate_candidates(tune, op);
  const bool net = tune.network;
  for (const Candidate& c : all) {
    if (!std::isfinite(c.cost_us)) continue;  // does not apply here
    if (best_any == nullptr || prefer(*c.algorithm, c.cost_us, best_any->algorithm, best_any->cost_us, net))
      best_any = &c;
    if (c.allowed && (best == nullptr || prefer(*c.algorithm, c.cost_us, best->algorithm, best->cost_us, net)))
      best = &c;
  }
  if (best == nullptr) {
    if (best_any == nullptr) return MC_ERROR(ncclInternalError, "no algorithm for %s", op_kind_name(op.kind));
    MC_INFO(kTune, "%s: the algorithm MESHCCL_ALGO allows cannot run %zu elements here; using %s",
            op_kind_name(op.kind), op.count, best_any->algorithm->name);
    best = best_any;
  }
  *out = best->algorithm;
  if (cost_us != nullptr) *cost_us = best->cost_us;
  return kOk;
}

Status build_in(const BuildCtx& ctx, BuildFn build, const OpDesc& op, Plan* plan) {
  const PlanGroup outer = plan->set_group(ctx.group());
  Status s = build(ctx, op, plan);
  plan->set_group(outer);
  return s;
}

Status make_plan(const TuneModel& tune, const OpDesc& op, std::unique_ptr<Plan>* out) {
  const Algorithm* pick = nullptr;
  double cost = 0;
  MC_TRY(choose_algorithm(tune, op, &pick, &cost));
  return make_plan_with(tune, op, pick, cost, out);
}

Status make_plan_with(const TuneModel& tune, const OpDesc& op, const Algorithm* pick, double cost,
                      std::unique_ptr<Plan>* out) {
  auto plan = std::make_unique<Plan>();
  plan->kind = op.kind;
  if (!is_p2p(op.kind)) plan->call = op.signature();
  plan->dtype = op.dtype;
  plan->op = op.op;
  plan->divisor = op.nranks;
  std::copy(std::begin(op.scalar), std::end(op.scalar), std::begin(plan->scalar));
  plan->scalar_src = op.scalar_src;
  MC_TRY(build_in(BuildCtx::whole(tune, op), pick->build, op, plan.get()));
  MC_TRY(add_signature_check(op, plan.get()));
  if (log_enabled(LogLevel::Info, kTune)) {
    // Every candidate's estimate, so that a surprising pick can be explained.
    std::string all;
    for (const Candidate& c : estimate_candidates(tune, op)) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%s%s %.1f", all.empty() ? "" : ", ", c.algorithm->name, c.cost_us);
      all += buf;
    }
    MC_INFO(kTune, "%s: %zu elements of %s -> algorithm %s, estimated %.1f us (%s; %zu steps%s)", op_kind_name(op.kind),
            op.count, dtype_name(op.dtype), pick->name, cost, all.c_str(), plan->size(),
            plan->signatures.empty() ? ""
            : plan->check_gates_data ? ", call signatures compared before data moves"
                                     : ", call signatures compared while data moves");
  }
  *out = std::move(plan);
  return kOk;
}

size_t direct_max_bytes(OpKind kind, const PlanSettings& settings) {
  if (kind == OpKind::Send || kind == OpKind::Recv || kind == OpKind::SparseAllReduce ||
      !algorithm_allowed(kind, kDirectShm, settings.algo))
    return 0;
  const int64_t limit = settings.direct_max_bytes;
  if (algorithm_forced(kind, kDirectShm, settings.algo) || limit <= 0) return SIZE_MAX;
  return static_cast<size_t>(limit);
}

namespace {

std::string size_str(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%s", bytes, units[u]);
  return buf;
}

// "8B-64KiB tree, 128KiB-1GiB ring": the pick for float32 data at each
// power-of-two size, for every collective that has a choice.
void log_picks(const TuneModel& t, const PlanSettings& settings) {
  for (OpKind kind : {OpKind::AllReduce, OpKind::Broadcast, OpKind::Reduce, OpKind::AllGather, OpKind::ReduceScatter}) {
    const auto& table = algorithm_table();
    if (std::count_if(table.begin(), table.end(), [&](const Algorithm& a) { return a.kind == kind && a.cost; }) < 2)
      continue;
    std::string line;
    const char* run = nullptr;
    double run_lo = 0, prev = 0;
    auto flush = [&] {
      if (run == nullptr) return;
      line += (line.empty() ? "" : ", ") + size_str(run_lo) + "-" + size_str(prev) + " " + run;
    };
    for (double bytes = 8; bytes <= double(size_t{1} << 30); bytes *= 2) {
      OpDesc op;
      op.kind = kind;
      op.dtype = ncclFloat32;
      op.count = static_cast<size_t>(bytes) / 4;
      op.nranks = t.nranks;
      op.chunk_bytes = settings.chunk_bytes;
      op.settings = &settings;
      const Algorithm* a = nullptr;
      if (!choose_algorithm(t, op, &a).ok()) return;
      if (run == nullptr || std::string(run) != a->name) {
        flush();
        run = a->name;
        run_lo = bytes;
      }
      prev = bytes;
    }
    flush();
    MC_INFO(kTune, "%s on %d ranks: %s", op_kind_name(kind), t.nranks, line.c_str());
  }
}

// A communicator's algorithms: its agreed cost model and, on a single host,
// its shared region.
class CommAlgorithms final : public RunMaker {
 public:
  CommAlgorithms(const TuneModel& tune, NodeRegion* node, const WaitPolicy& wait, const PlanSettings& settings)
      : tune_(tune), node_(node), wait_(wait), settings_(settings) {
    for (size_t k = 0; k < kKinds; ++k) limits_[k] = direct_max_bytes(static_cast<OpKind>(k), settings_);
  }

  // The one decision: the direct shared-memory algorithm when the
  // communicator has a shared region, the rules allow it and the operation
  // fits its slots (run here at once when the caller allows and nothing
  // direct is pending), else the cheapest plan.
  Status make_run(const OpDesc& op, uint64_t tag_base, double inline_budget_us, bool* ran_here,
                  std::unique_ptr<Run>* out) override {
    *ran_here = false;
    if (op.kind == OpKind::SparseAllReduce) {
      *out = make_sparse_allreduce_run(tune_, op, tag_base);
      return kOk;
    }
    const size_t max_bytes = node_ != nullptr ? direct_limit(op.kind) : 0;
    if (max_bytes > 0) {
      if (inline_budget_us > 0) {
        bool taken = false;
        Status s = run_direct_now(node_, op, max_bytes, inline_budget_us, wait_, &taken, out);
        if (taken || !s.ok()) {
          *ran_here = true;
          return s;
        }
      }
      *out = make_direct_run(node_, op, max_bytes);
      if (*out != nullptr) {
        MC_INFO(kTune, "%s: %zu elements of %s -> algorithm %s", op_kind_name(op.kind), op.count, dtype_name(op.dtype),
                kDirectShm);
        return kOk;
      }
    }
    std::unique_ptr<Plan> plan;
    MC_TRY(plan_for(op, &plan));
    *out = make_plan_run(std::move(plan), tag_base);
    return kOk;
  }

  Status estimate(const OpDesc& op, double* us) override {
    // The nnz of the other ranks is not known here: as if all had this rank's
    if (op.kind == OpKind::SparseAllReduce) {
      *us = sparse_allreduce_cost(tune_, op);
      return kOk;
    }
    const Algorithm* pick = nullptr;
    return choose(op, &pick, us);
  }

 private:
  // The tuner's pick for an operation's shape, worked out once: the estimates
  // are pure functions of the communicator's model and the shape, and
  // estimating every candidate at every call was a third of a small plan's
  // instructions (21,000 of 66,000 per 8-byte AllReduce over sockets). A
  // small table indexed by the shape; a shape that maps to a taken entry
  // replaces it. Stream threads of one communicator may ask at once.
  struct Shape {
    OpKind kind;
    ncclDataType_t dtype;
    uint8_t redop;
    int root;
    size_t count;
    size_t chunk_bytes;
    const PlanSettings* settings;
    bool operator==(const Shape&) const = default;
  };
  struct Pick {
    Shape shape;
    const Algorithm* algorithm = nullptr;
    double cost_us = 0;
  };
  static Shape shape_of(const OpDesc& op) {
    const OpSignature sig = op.signature();
    return Shape{op.kind, op.dtype, sig.redop, op.root, op.count, op.chunk_bytes, op.settings};
  }
  Status choose(const OpDesc& op, const Algorithm** pick, double* cost_us) {
    const Shape shape = shape_of(op);
    const size_t slot = (shape.count * 0x9E3779B97F4A7C15ull + static_cast<size_t>(shape.kind) * 31 +
                         static_cast<size_t>(shape.root)) >>
                        (64 - kPickBits);
    {
      std::lock_guard<std::mutex> lk(picks_mu_);
      const Pick& p = picks_[slot];
      if (p.algorithm != nullptr && p.shape == shape) {
        *pick = p.algorithm;
        *cost_us = p.cost_us;
        return kOk;
      }
    }
    MC_TRY(choose_algorithm(tune_, op, pick, cost_us));
    std::lock_guard<std::mutex> lk(picks_mu_);
    picks_[slot] = Pick{shape, *pick, *cost_us};
    return kOk;
  }

  static constexpr int kPickBits = 6;
  std::mutex picks_mu_;
  std::array<Pick, size_t{1} << kPickBits> picks_{};

  // The plans of the latest calls, each run on a copy: a call that repeats
  // one of them (same shape, same buffers, as a training step's or a
  // benchmark's do) copies the plan instead of building it. Building an
  // 8-byte AllReduce's plan (steps, dependencies, the signature check) took
  // more instructions than copying it. Collectives only; a plan depends on
  // nothing of the call outside this key.
  struct PlanKey {
    Shape shape;
    const void* sendbuff;
    void* recvbuff;
    const void* scalar_src;
    uint64_t scalar;
    bool checks;
    bool operator==(const PlanKey&) const = default;
  };
  struct CachedPlan {
    PlanKey key{};
    std::unique_ptr<Plan> plan;
  };
  static PlanKey key_of(const OpDesc& op) {
    PlanKey k{shape_of(op), op.sendbuff, op.recvbuff, op.scalar_src, 0, op.checks};
    std::memcpy(&k.scalar, op.scalar, sizeof(k.scalar));
    return k;
  }
  // A plan is kept from the second call with its key on (a loop over ever
  // new buffers pays no copies), and not while TUNE logging is on (each
  // plan then logs its pick).
  Status plan_for(const OpDesc& op, std::unique_ptr<Plan>* out) {
    const bool cacheable = !is_p2p(op.kind) && !log_enabled(LogLevel::Info, kTune);
    const PlanKey key = key_of(op);
    const size_t slot =
        (reinterpret_cast<uintptr_t>(op.recvbuff) / 64 + op.count * 31 + static_cast<size_t>(op.kind)) % kPlans;
    bool seen = false;
    if (cacheable) {
      std::lock_guard<std::mutex> lk(picks_mu_);
      const CachedPlan& c = plans_[slot];
      if (c.key == key) {
        if (c.plan != nullptr) {
          *out = c.plan->clone();
          return kOk;
        }
        seen = true;
      }
    }
    const Algorithm* pick = nullptr;
    double cost = 0;
    MC_TRY(choose(op, &pick, &cost));
    MC_TRY(make_plan_with(tune_, op, pick, cost, out));
    if (cacheable) {
      std::unique_ptr<Plan> copy = seen ? (*out)->clone() : nullptr;
      std::lock_guard<std::mutex> lk(picks_mu_);
      plans_[slot] = CachedPlan{key, std::move(copy)};
    }
    return kOk;
  }
  static constexpr size_t kPlans = 16;
  std::array<CachedPlan, kPlans> plans_{};

  // direct_max_bytes for the communicator's frozen settings, worked out once.
  size_t direct_limit(OpKind kind) const {
    const size_t k = static_cast<size_t>(kind);
    return k < kKinds ? limits_[k] : direct_max_bytes(kind, settings_);  // kinds past Recv
  }

  static constexpr size_t kKinds = static_cast<size_t>(OpKind::Recv) + 1;  // the collectives and point-to-point
  TuneModel tune_;
  NodeRegion* node_;
  WaitPolicy wait_;
  PlanSettings settings_;
  size_t limits_[kKinds] = {};
};

}  // namespace

std::unique_ptr<RunMaker> make_algorithms(int rank, const TuneModel& tune, NodeRegion* node, const WaitPolicy& wait,
                                          const PlanSettings* settings) {
  const PlanSettings s = settings != nullptr ? *settings : plan_settings_from_params();
  if (rank == 0 && log_enabled(LogLevel::Info, kTune)) log_picks(tune, s);
  return std::make_unique<CommAlgorithms>(tune, node, wait, s);
}

}  // namespace meshccl
