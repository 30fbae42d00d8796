#include "cli.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

namespace meshtrain {

const char* cli_usage() {
  return R"(usage: meshtrain [options]       (multi-rank: meshrun -n N meshtrain ...)
layout:   --dp N --pp N --tp N          dp x pp x tp must equal the number of ranks
          --tp A,B,...                  one tp degree per stage (1D): dp x (A + B + ...) ranks,
                                        activations between stages through reshard plans
          --order tp-pp-dp              rank grid order, fastest dimension first
          --tp-mode 1d|3d               Megatron 1D, or Colossal-AI 3D with tp = q^3
          --stages 3,2,2,1              layers per pipeline stage (default: balanced)
          --schedule gpipe|1f1b|eager-1f1b  pipeline schedule (default 1f1b)
          --comm-sched fifo|priority    communication order: one priority for all, or by
                                        dependencies (pipeline, tensor, data-parallel
                                        buckets first layer first, embedding; default)
          --overlap-update              update each tensor as its bucket lands, during the
                                        next forward (needs --clip 0, 1D)
model:    --layers N --d-model N --heads N --seq N --vocab N --untied --seed N
batch:    --micro-batch N --grad-accum N  (global batch = dp x micro-batch x grad-accum)
optim:    --steps N --lr X --min-lr-ratio X --warmup N --weight-decay X --clip X
          --beta1 X --beta2 X
data:     --tokenizer bytes|word (word: the --vocab - 256 most frequent words + bytes)
          --data PATH (default: $MESHTRAIN_DATA, data/kjv.txt, or the build's copy)
          --data-seed N
          --val-every N --val-seqs N
ckpt:     --ckpt-dir DIR --ckpt-every N --ckpt-keep N (newest N kept; 0: all) --resume
          --elastic   when a rank dies, drop its data-parallel replica and go on from the
                      last checkpoint (needs --ckpt-every; run under meshrun --keep-going)
plan:     meshtrain plan [--ranks N] [options]   print the planner's choice and alternatives
          --plan auto                   plan the layout, stage split and micro-batch, then train
          --global-batch N --mem-limit MiB --profile PATH --plan-top K
other:    --bucket-kb N (data-parallel bucket) --blas-threads N --log-every N
          --sample N --prompt TEXT --temperature X --help --version

Inputs: --data and --profile must be regular files (a device or FIFO is refused); a --profile
that does not exist yet is measured and written there. Exit status: 0, 1 on an error while
running, 2 for bad options. docs/training.md explains every option.
)";
}

std::string parse_cli(int argc, char** argv, CliOptions* o) {
  TrainConfig& t = o->train;
  auto as_int = [](const char* v, int* out) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (!*v || *end || errno == ERANGE || x < INT_MIN || x > INT_MAX) return false;
    *out = static_cast<int>(x);
    return true;
  };
  // Finite numbers only: inf and nan are never a meaningful setting.
  auto as_float = [](const char* v, float* out) {
    char* end = nullptr;
    const float x = std::strtof(v, &end);
    if (!*v || *end || !std::isfinite(x)) return false;
    *out = x;
    return true;
  };
  // INT_MIN: not given (any value given is checked, -1 included).
  int bucket_kb = INT_MIN, seed = INT_MIN, data_seed = INT_MIN;
  std::string schedule, tp_mode, stages, plan, comm_sched, tokenizer;
  std::map<std::string, int*> ints = {{"--dp", &t.layout.dp},
                                      {"--pp", &t.layout.pp},
                                      {"--tp", &t.layout.tp},
                                      {"--layers", &t.model.layers},
                                      {"--d-model", &t.model.d_model},
                                      {"--heads", &t.model.heads},
                                      {"--seq", &t.model.seq},
                                      {"--vocab", &t.model.vocab},
                                      {"--micro-batch", &t.micro_batch},
                                      {"--grad-accum", &t.grad_accum},
                                      {"--steps", &t.steps},
                                      {"--warmup", &t.optim.warmup},
                                      {"--val-every", &t.val_every},
                                      {"--val-seqs", &t.val_sequences},
                                      {"--ckpt-every", &t.ckpt_every},
                                      {"--ckpt-keep", &t.ckpt_keep},
                                      {"--bucket-kb", &bucket_kb},
                                      {"--blas-threads", &o->blas_threads},
                                      {"--sample", &o->sample_chars},
                                      {"--log-every", &o->log_every},
                                      {"--seed", &seed},
                                      {"--data-seed", &data_seed},
                                      {"--ranks", &o->plan_ranks},
                                      {"--global-batch", &o->global_batch},
                                      {"--mem-limit", &o->mem_limit_mib},
                                      {"--plan-top", &o->plan_top}};
  std::map<std::string, float*> floats = {{"--lr", &t.optim.lr},
                                          {"--min-lr-ratio", &t.optim.min_lr_ratio},
                                          {"--weight-decay", &t.optim.weight_decay},
                                          {"--clip", &t.optim.clip},
                                          {"--beta1", &t.optim.beta1},
                                          {"--beta2", &t.optim.beta2},
                                          {"--temperature", &o->temperature}};
  std::map<std::string, std::string*> strings = {
      {"--data", &o->data},       {"--ckpt-dir", &t.ckpt_dir},   {"--prompt", &o->prompt},
      {"--schedule", &schedule},  {"--comm-sched", &comm_sched}, {"--order", &t.layout.order},
      {"--tp-mode", &tp_mode},    {"--stages", &stages},         {"--plan", &plan},
      {"--profile", &o->profile}, {"--tokenizer", &tokenizer}};
  int warmup_given = 0;
  int first = 1;
  if (argc > 1 && std::string(argv[1]) == "plan") {
    o->plan_only = true;
    first = 2;
  }
  for (int i = first; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      o->help = true;
      continue;
    }
    if (a == "--version" || a == "-V") {
      o->version = true;
      continue;
    }
    if (a == "--resume") {
      o->resume = true;
      continue;
    }
    if (a == "--elastic") {
      o->elastic = true;
      continue;
    }
    if (a == "--untied") {
      t.model.tied = false;
      continue;
    }
    if (a == "--overlap-update") {
      t.overlap_update = true;
      continue;
    }
    const bool known = ints.count(a) || floats.count(a) || strings.count(a);
    if (!known) return "unknown option '" + a + "' (see --help)";
    if (i + 1 >= argc) return "option " + a + " needs a value";
    const char* v = argv[++i];
    if (a == "--tp" && std::string(v).find(',') != std::string::npos) {
      // One tensor-parallel degree per pipeline stage.
      const std::string list = v;
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        int n = 0;
        if (!as_int(list.substr(pos, comma - pos).c_str(), &n) || n < 1) {
          return "--tp takes a degree or one per stage like 2,1; got '" + list + "'";
        }
        t.layout.stage_tp.push_back(n);
        pos = comma + 1;
      }
      t.layout.tp = t.layout.stage_tp[0];
      continue;
    }
    if (ints.count(a)) {
      if (!as_int(v, ints[a])) return "option " + a + " needs an integer, got '" + v + "'";
      if (a == "--warmup") warmup_given = 1;
    } else if (floats.count(a)) {
      if (!as_float(v, floats[a])) return "option " + a + " needs a finite number, got '" + v + "'";
    } else {
      *strings[a] = v;
    }
  }
  if (t.layout.hetero() && !t.ckpt_dir.empty()) {
    return "--ckpt-dir: checkpoints of per-stage tensor-parallel degrees (--tp a,b,...) are not supported";
  }
  if (t.layout.hetero() && !plan.empty()) {
    return "--plan: the planner does not choose per-stage tensor-parallel degrees (--tp a,b,...)";
  }
  if (!schedule.empty() && !parse_schedule(schedule, &t.schedule)) {
    return "--schedule must be gpipe, 1f1b or eager-1f1b, got '" + schedule + "'";
  }
  if (!comm_sched.empty() && !parse_comm_sched(comm_sched, &t.comm_sched)) {
    return "--comm-sched must be fifo or priority, got '" + comm_sched + "'";
  }
  if (!tp_mode.empty() && !parse_tp_mode(tp_mode, &t.layout.tp_mode)) {
    return "--tp-mode must be 1d or 3d, got '" + tp_mode + "'";
  }
  if (!stages.empty()) {
    // Comma-separated layer counts, one per pipeline stage.
    size_t pos = 0;
    while (pos <= stages.size()) {
      const size_t comma = std::min(stages.find(',', pos), stages.size());
      int n = 0;
      if (!as_int(stages.substr(pos, comma - pos).c_str(), &n) || n < 1) {
        return "--stages takes layer counts like 3,2,2,1; got '" + stages + "'";
      }
      t.layout.stages.push_back(n);
      pos = comma + 1;
    }
  }
  if (!plan.empty() && plan != "auto") return "--plan takes 'auto', got '" + plan + "'";
  o->plan_auto = plan == "auto";
  if (o->plan_ranks < 0 || o->global_batch < 0 || o->mem_limit_mib < 0 || o->plan_top < 1) {
    return "--ranks, --global-batch and --mem-limit must not be negative, --plan-top at least 1";
  }
  if (bucket_kb != INT_MIN && (bucket_kb < 1 || bucket_kb > (1 << 20)))
    return "--bucket-kb must be 1..1048576 (KiB), got " + std::to_string(bucket_kb);
  if (bucket_kb != INT_MIN) t.bucket_elems = static_cast<size_t>(bucket_kb) * 1024 / sizeof(float);
  if ((seed != INT_MIN && seed < 0) || (data_seed != INT_MIN && data_seed < 0))
    return "--seed and --data-seed must not be negative";
  if (seed != INT_MIN) t.model.seed = static_cast<uint64_t>(seed);
  if (data_seed != INT_MIN) t.data_seed = static_cast<uint64_t>(data_seed);
  if (t.steps < 1) return "--steps must be at least 1";
  if (!tokenizer.empty() && tokenizer != "bytes" && tokenizer != "word") {
    return "--tokenizer must be bytes or word, got '" + tokenizer + "'";
  }
  t.model.words = tokenizer == "word";
  if (!t.model.words && t.model.vocab > 256)
    return "--vocab is at most 256 with the byte tokenizer (--tokenizer word for more)";
  if (t.model.words && (t.model.vocab <= 256 || t.model.vocab > (1 << 22))) {
    return "--tokenizer word needs --vocab in (256, 4194304], e.g. 16384 (256 bytes + the most frequent words)";
  }
  if (t.ckpt_every > 0 && t.ckpt_dir.empty()) return "--ckpt-every needs --ckpt-dir";
  if (o->resume && t.ckpt_dir.empty()) return "--resume needs --ckpt-dir";
  if (o->elastic && t.ckpt_every <= 0)
    return "--elastic needs --ckpt-dir and --ckpt-every (it resumes from checkpoints)";
  if (!(t.optim.lr > 0)) return "--lr must be positive";
  if (t.optim.min_lr_ratio < 0 || t.optim.min_lr_ratio > 1) return "--min-lr-ratio must be in [0, 1]";
  if (t.optim.weight_decay < 0) return "--weight-decay must not be negative";
  if (t.optim.clip < 0) return "--clip must not be negative (0 turns clipping off)";
  if (t.overlap_update && t.optim.clip > 0) {
    return "--overlap-update needs --clip 0: clipping needs every gradient before the first update";
  }
  if (t.optim.beta1 < 0 || t.optim.beta1 >= 1 || t.optim.beta2 < 0 || t.optim.beta2 >= 1) {
    return "--beta1 and --beta2 must be in [0, 1)";
  }
  if (o->temperature < 0) return "--temperature must not be negative (0 is greedy)";
  if (t.optim.warmup < 0) return "--warmup must not be negative";
  if (t.val_every < 0 || t.ckpt_every < 0 || t.ckpt_keep < 0 || o->sample_chars < 0 || o->blas_threads < 0) {
    return "--val-every, --ckpt-every, --ckpt-keep, --sample and --blas-threads must not be negative";
  }
  if (t.val_sequences < 1) return "--val-seqs must be at least 1";
  if (o->log_every < 1) return "--log-every must be at least 1";
  t.optim.total_steps = t.steps;
  if (!warmup_given) t.optim.warmup = std::max(1, t.steps / 20);
  return "";
}

}  // namespace meshtrain
