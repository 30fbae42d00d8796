#include "cli.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

namespace meshtrain {

const char* cli_usage() {
  return R"(usage: meshtrain [options]       (multi-rank: meshrun -n N meshtrain ...)
layout:   --dp N --pp N --tp N          dp x pp x tp must equal the number of ranks
          --order tp-pp-dp              rank grid order, fastest dimension first
          --schedule gpipe|1f1b         pipeline schedule (default 1f1b)
model:    --layers N --d-model N --heads N --seq N --vocab N --untied --seed N
batch:    --micro-batch N --grad-accum N  (global batch = dp x micro-batch x grad-accum)
optim:    --steps N --lr X --min-lr-ratio X --warmup N --weight-decay X --clip X
          --beta1 X --beta2 X
data:     --data PATH (default: $MESHTRAIN_DATA, data/kjv.txt, or the build's copy)
          --data-seed N
          --val-every N --val-seqs N
ckpt:     --ckpt-dir DIR --ckpt-every N --resume
other:    --bucket-kb N (data-parallel bucket) --blas-threads N --log-every N
          --sample N --prompt TEXT --temperature X --help
)";
}

std::string parse_cli(int argc, char** argv, CliOptions* o) {
  TrainConfig& t = o->train;
  auto as_int = [](const char* v, int* out) {
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (!*v || *end) return false;
    *out = static_cast<int>(x);
    return true;
  };
  auto as_float = [](const char* v, float* out) {
    char* end = nullptr;
    *out = std::strtof(v, &end);
    return *v && !*end;
  };
  int bucket_kb = -1, seed = -1, data_seed = -1;
  std::string schedule;
  std::map<std::string, int*> ints = {
      {"--dp", &t.layout.dp}, {"--pp", &t.layout.pp}, {"--tp", &t.layout.tp},
      {"--layers", &t.model.layers}, {"--d-model", &t.model.d_model},
      {"--heads", &t.model.heads}, {"--seq", &t.model.seq}, {"--vocab", &t.model.vocab},
      {"--micro-batch", &t.micro_batch}, {"--grad-accum", &t.grad_accum}, {"--steps", &t.steps},
      {"--warmup", &t.optim.warmup}, {"--val-every", &t.val_every},
      {"--val-seqs", &t.val_sequences}, {"--ckpt-every", &t.ckpt_every},
      {"--bucket-kb", &bucket_kb}, {"--blas-threads", &o->blas_threads},
      {"--sample", &o->sample_chars}, {"--log-every", &o->log_every}, {"--seed", &seed},
      {"--data-seed", &data_seed}};
  std::map<std::string, float*> floats = {
      {"--lr", &t.optim.lr}, {"--min-lr-ratio", &t.optim.min_lr_ratio},
      {"--weight-decay", &t.optim.weight_decay}, {"--clip", &t.optim.clip},
      {"--beta1", &t.optim.beta1}, {"--beta2", &t.optim.beta2},
      {"--temperature", &o->temperature}};
  std::map<std::string, std::string*> strings = {
      {"--data", &o->data}, {"--ckpt-dir", &t.ckpt_dir}, {"--prompt", &o->prompt},
      {"--schedule", &schedule}, {"--order", &t.layout.order}};
  int warmup_given = 0;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      o->help = true;
      continue;
    }
    if (a == "--resume") {
      o->resume = true;
      continue;
    }
    if (a == "--untied") {
      t.model.tied = false;
      continue;
    }
    const bool known = ints.count(a) || floats.count(a) || strings.count(a);
    if (!known) return "unknown option '" + a + "' (see --help)";
    if (i + 1 >= argc) return "option " + a + " needs a value";
    const char* v = argv[++i];
    if (ints.count(a)) {
      if (!as_int(v, ints[a])) return "option " + a + " needs an integer, got '" + v + "'";
      if (a == "--warmup") warmup_given = 1;
    } else if (floats.count(a)) {
      if (!as_float(v, floats[a])) return "option " + a + " needs a number, got '" + v + "'";
    } else {
      *strings[a] = v;
    }
  }
  if (!schedule.empty() && !parse_schedule(schedule, &t.schedule)) {
    return "--schedule must be gpipe or 1f1b, got '" + schedule + "'";
  }
  if (bucket_kb == 0 || bucket_kb < -1) return "--bucket-kb must be positive";
  if (bucket_kb > 0) t.bucket_elems = static_cast<size_t>(bucket_kb) * 1024 / sizeof(float);
  if (seed >= 0) t.model.seed = static_cast<uint64_t>(seed);
  if (data_seed >= 0) t.data_seed = static_cast<uint64_t>(data_seed);
  if (t.steps < 1) return "--steps must be at least 1";
  if (t.model.vocab > 256) return "--vocab is at most 256 (byte-level model)";
  if (t.ckpt_every > 0 && t.ckpt_dir.empty()) return "--ckpt-every needs --ckpt-dir";
  if (o->resume && t.ckpt_dir.empty()) return "--resume needs --ckpt-dir";
  if (!(t.optim.lr > 0)) return "--lr must be positive";
  if (o->log_every < 1) o->log_every = 1;
  t.optim.total_steps = t.steps;
  if (!warmup_given) t.optim.warmup = std::max(1, t.steps / 20);
  return "";
}

}  // namespace meshtrain
