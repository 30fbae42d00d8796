// meshtrain: trains a byte-level GPT with data x pipeline x tensor parallelism
// over meshccl. A single-rank run never initialises meshccl.
#include <cblas.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "engine.h"
#include "nccl_comm.h"

using namespace meshtrain;

namespace {

// The launcher's world size, read from the environment without touching
// meshccl (same variables meshcclCommInitFromEnv reads).
int launch_size() {
  for (const char* v : {"MESHCCL_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 1;
}

// Bytes a terminal would act on (an untrained model emits any of the 256)
// are shown as \xNN; newlines stay.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n' || (c >= 32 && c < 127)) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

// --data when given; else $MESHTRAIN_DATA, data/kjv.txt, or the copy the build
// extracted (scripts/get_corpus.sh run by meson), the first that exists.
std::string corpus_path(const std::string& given) {
  if (!given.empty()) return given;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MESHTRAIN_DATA")) candidates.push_back(env);
  candidates.push_back("data/kjv.txt");
#ifdef MESHTRAIN_BUILD_CORPUS
  candidates.push_back(MESHTRAIN_BUILD_CORPUS);
#endif
  for (const auto& c : candidates) {
    if (FILE* f = std::fopen(c.c_str(), "rb")) {
      std::fclose(f);
      return c;
    }
  }
  return candidates.front();
}

int run(const CliOptions& o) {
  const TrainConfig& cfg = o.train;
  const int world_size = launch_size();
  if (const std::string e = check_layout(cfg.model, cfg.layout, world_size, cfg.micro_batch,
                                         cfg.grad_accum);
      !e.empty()) {
    std::fprintf(stderr, "meshtrain: %s\n", e.c_str());
    return 2;
  }
  const std::string data = corpus_path(o.data);
  const Corpus corpus = Corpus::load(data, cfg.model.seq);

  RankComms rc;
  int rank = 0;
  if (world_size > 1) {
    ncclComm_t world = nullptr;
    check_nccl(meshcclCommInitFromEnv(&world, nullptr), "meshcclCommInitFromEnv");
    rc = split_comms(world, cfg.layout, cfg.model.tied);
    rank = rc.world->rank();
  }
  const int threads = o.blas_threads > 0
                          ? o.blas_threads
                          : (world_size > 1 ? 1 : static_cast<int>(std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads > 0 ? threads : 1);

  Engine engine(cfg, rank, rc.view(), corpus);
  const bool talk = rank == 0;
  int start = 0;
  if (!cfg.ckpt_dir.empty()) engine.prepare_checkpoints();  // before any step is spent
  if (o.resume) {
    start = engine.load_checkpoint();
    if (talk) std::printf("resumed from %s after step %d\n", cfg.ckpt_dir.c_str(), start);
  }
  if (talk) {
    size_t n = 0;
    for (const auto& s : engine.stage().specs()) n += s.size;
    std::printf("meshtrain: %d rank(s) = dp %d x pp %d x tp %d (%s, order %s), %s schedule; model L=%d d=%d "
                "heads=%d seq=%d vocab=%d (%s); global batch %d x %d tokens; rank 0 holds %zu "
                "parameters; corpus %s (%zu bytes)\n",
                world_size, cfg.layout.dp, cfg.layout.pp, cfg.layout.tp,
                tp_mode_name(cfg.layout.tp_mode), cfg.layout.order.c_str(),
                schedule_name(cfg.schedule), cfg.model.layers, cfg.model.d_model,
                cfg.model.heads, cfg.model.seq, cfg.model.vocab,
                cfg.model.tied ? "tied" : "untied", cfg.global_batch(), cfg.model.seq, n,
                data.c_str(), corpus.size());
    std::fflush(stdout);
  }

  double time_sum = 0, wait_sum = 0, tokens = 0;
  int timed = 0;
  float last_loss = 0, val = -1;
  for (int step = start; step < cfg.steps; step++) {
    const StepStats s = engine.train_step(step);
    last_loss = s.loss;
    if (step > start || cfg.steps - start == 1) {  // the first step pays one-off set-up
      time_sum += s.seconds;
      wait_sum += s.comm_wait;
      tokens += cfg.global_batch() * static_cast<double>(cfg.model.seq);
      timed++;
    }
    const bool val_now = cfg.val_every > 0 && ((step + 1) % cfg.val_every == 0 || step + 1 == cfg.steps);
    if (val_now) val = engine.validate();
    if (talk && ((step + 1) % o.log_every == 0 || step + 1 == cfg.steps)) {
      std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %7.0f tok/s | %6.1f ms "
                  "(compute %.1f, comm wait %.1f = %.1f%%)",
                  step + 1, cfg.steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s,
                  s.seconds * 1e3, (s.seconds - s.comm_wait) * 1e3, s.comm_wait * 1e3,
                  100.0 * s.comm_wait / s.seconds);
      if (val_now) std::printf(" | val %.4f", val);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (cfg.ckpt_every > 0 && ((step + 1) % cfg.ckpt_every == 0 || step + 1 == cfg.steps)) {
      engine.save_checkpoint(step);
    }
  }

  // Communication share averaged over ranks: each rank waits differently
  // (pipeline stages, the stage that holds the loss).
  float share[2] = {static_cast<float>(wait_sum), static_cast<float>(time_sum)};
  if (rc.world) {
    rc.world->all_reduce(&share[0], 1, ReduceOp::Sum);
    rc.world->all_reduce(&share[1], 1, ReduceOp::Sum);
  }
  if (talk && timed > 0) {
    std::printf("summary: %d step(s) timed, %.1f ms/step, %.0f tok/s, comm wait %.1f%% of step "
                "time (mean over ranks), final loss %.4f",
                timed, 1e3 * time_sum / timed, tokens / time_sum,
                share[1] > 0 ? 100.0 * share[0] / share[1] : 0.0, last_loss);
    if (val >= 0) std::printf(", val loss %.4f", val);
    std::printf("\n");
  }
  if (o.sample_chars > 0) {
    const std::string text = engine.sample(o.prompt, o.sample_chars, o.temperature, 7);
    if (talk) std::printf("sample: %s%s\n", o.prompt.c_str(), printable(text).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CliOptions o;
  const std::string err = parse_cli(argc, argv, &o);
  if (o.help) {
    std::fputs(cli_usage(), stdout);
    return 0;
  }
  if (!err.empty()) {
    std::fprintf(stderr, "meshtrain: %s\n%s", err.c_str(), cli_usage());
    return 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: %s\n", e.what());
    return 1;
  }
}
