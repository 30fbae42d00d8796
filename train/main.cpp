// meshtrain: trains a byte-level GPT with data x pipeline x tensor parallelism
// over meshccl. A single-rank run never initialises meshccl.
#include <cblas.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "engine.h"
#include "elastic.h"
#include "nccl_comm.h"
#include "plan_links.h"
#include "plan_profile.h"
#include "planner.h"

using namespace meshtrain;

namespace {

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

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

// Whether --profile names a saved profile (throws when it cannot be checked).
bool profile_saved(const std::string& path) {
  if (path.empty()) return false;
  // An existing profile is read (refused when it is not a regular file); a
  // missing one is measured and written there.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno != ENOENT) throw std::runtime_error("--profile " + path + ": " + std::strerror(errno));
  return false;
}

// Profiles this machine (or reads --profile), searches every layout for
// `world` ranks and prints the best few; returns the best (throws if none fits).
// `measured`: links measured on the job's ranks (measure_links_on), used
// unless a saved profile is read; without them the links are measured with
// threads of this process. `saved`: whether --profile names a saved profile,
// as the caller found it (so that the ranks' choice to measure and this
// function's choice to read agree even if the file appears or goes meanwhile).
Candidate plan_layout(const CliOptions& o, int world, bool saved, const LinkModel* measured = nullptr) {
  const TrainConfig& cfg = o.train;
  PlanRequest req;
  req.model = cfg.model;
  req.world = world;
  req.order = cfg.layout.order;
  req.global_batch = o.global_batch > 0 ? o.global_batch : cfg.global_batch();
  req.mem_limit = o.mem_limit_mib * 1048576.0;
  Profile prof;
  LinkModel links;
  if (saved) {
    load_profile(o.profile, &prof, &links);
  } else if (!o.profile.empty()) {
    std::printf("plan: no profile at %s yet: measuring this machine and writing it there\n", o.profile.c_str());
  }
  if (!saved) {
    std::vector<int> mbs;
    for (int b = 1; b <= std::min(req.global_batch, 64); b++) {
      if (req.global_batch % b == 0) mbs.push_back(b);
    }
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    openblas_set_num_threads(1);
    prof = profile_compute(cfg.model, mbs, 3, cores);
    links = measured ? *measured : world > 1 ? measure_links(world, 7) : LinkModel();
    if (!o.profile.empty()) save_profile(o.profile, prof, links);
  }
  const std::vector<Candidate> all = search(req, prof, links);
  if (all.empty()) {
    throw std::runtime_error("no layout of " + std::to_string(world) + " rank(s) fits this model, a global batch of " +
                             std::to_string(req.global_batch) + (req.mem_limit > 0 ? " and --mem-limit" : ""));
  }
  std::printf("plan: %d rank(s), global batch %d, %zu feasible plans (%s profile; %d core(s))\n", world,
              req.global_batch, all.size(), saved ? "saved" : "measured", prof.cores);
  std::printf("  %-52s %9s %9s %8s %8s %8s %8s\n", "layout", "step ms", "compute", "tp comm", "pp+bubl", "dp exp",
              "MiB");
  for (size_t i = 0; i < all.size() && i < static_cast<size_t>(o.plan_top); i++) {
    const Candidate& c = all[i];
    std::printf("%s %-52s %9.2f %9.2f %8.2f %8.2f %8.2f %8.1f\n", i == 0 ? "*" : " ", c.describe().c_str(),
                c.step_s * 1e3, c.compute_s * 1e3, c.tp_comm_s * 1e3, (c.pp_comm_s + c.bubble_s) * 1e3,
                c.dp_exposed_s * 1e3, c.mem_bytes / 1048576.0);
  }
  std::fflush(stdout);
  return all.front();
}

// The plan travels from rank 0 as small integers in floats (exact below 2^24).
constexpr int kPlanFloats = 8 + 256;

void encode_plan(const Candidate& c, float* v) {
  const Layout& l = c.layout;
  v[0] = l.dp, v[1] = l.pp, v[2] = l.tp, v[3] = static_cast<float>(l.tp_mode);
  v[4] = c.micro_batch, v[5] = c.grad_accum, v[6] = static_cast<float>(l.stages.size());
  for (size_t i = 0; i < l.stages.size() && i < 256; i++) v[8 + i] = l.stages[i];
}

void apply_plan(const float* v, TrainConfig* cfg) {
  Layout& l = cfg->layout;
  l.dp = static_cast<int>(v[0]), l.pp = static_cast<int>(v[1]), l.tp = static_cast<int>(v[2]);
  l.tp_mode = static_cast<TpMode>(static_cast<int>(v[3]));
  cfg->micro_batch = static_cast<int>(v[4]);
  cfg->grad_accum = static_cast<int>(v[5]);
  l.stages.assign(static_cast<size_t>(v[6]), 0);
  for (size_t i = 0; i < l.stages.size(); i++) l.stages[i] = static_cast<int>(v[8 + i]);
}

int run(const CliOptions& opts) {
  CliOptions o = opts;
  TrainConfig& cfg = o.train;
  if (o.plan_only) {
    plan_layout(o, o.plan_ranks > 0 ? o.plan_ranks : launch_size(), profile_saved(o.profile));
    return 0;
  }
  const int world_size = launch_size();
  // meshccl's link scheduling follows --comm-sched (chunk by chunk, most
  // urgent first; or whole transfers in order) unless the environment sets it;
  // the communicators split from the world keep it.
  meshcclConfig_t world_cfg;
  meshcclConfigInit(&world_cfg);
  if (std::getenv("MESHCCL_PRIORITY") == nullptr) world_cfg.priority = cfg.comm_sched == CommSched::Priority ? 1 : 0;
  ncclComm_t world = nullptr;
  double predicted_s = 0;  // --plan auto, on rank 0: the plan's step time
  if (o.plan_auto) {
    // Rank 0 plans (the others wait in the broadcast), then all take its plan.
    if (world_size > 1) check_nccl(meshcclCommInitFromEnv(&world, &world_cfg.nccl), "meshcclCommInitFromEnv");
    int me = 0;
    if (world) check_nccl(ncclCommUserRank(world, &me), "ncclCommUserRank", world);
    // The links are measured on the job's own ranks (which groups cross
    // hosts, how many share a link) unless rank 0 reads a saved profile.
    LinkModel links;
    bool measured = false;
    const bool saved = me == 0 && profile_saved(o.profile);  // looked at once, by the rank that plans
    if (world) {
      float need = me == 0 && !saved ? 1.0f : 0.0f;
      check_nccl(ncclAllReduce(&need, &need, 1, ncclFloat32, ncclSum, world, nullptr), "ncclAllReduce", world);
      if (need > 0) {
        // Besides 1 KiB and 1 MiB, the links are measured at the size of one
        // micro-batch's activations for every micro-batch the planner may pick.
        std::vector<size_t> acts;
        const int gb = o.global_batch > 0 ? o.global_batch : cfg.global_batch();
        for (int b = 1; b <= std::min(gb, 64); b++) {
          if (gb % b == 0) acts.push_back(static_cast<size_t>(b) * cfg.model.seq * cfg.model.d_model);
        }
        links = measure_links_on(world, 7, acts);
        measured = true;
      }
    }
    std::vector<float> v(kPlanFloats, 0.0f);
    if (me == 0) {
      const Candidate plan = plan_layout(o, world_size, saved, measured ? &links : nullptr);
      predicted_s = plan.step_s;
      encode_plan(plan, v.data());
    }
    if (world) {
      check_nccl(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat32, ncclSum, world, nullptr), "ncclAllReduce",
                 world);
    }
    apply_plan(v.data(), &cfg);
    cfg.optim.total_steps = cfg.steps;
  }
  if (const std::string e = check_layout(cfg.model, cfg.layout, world_size, cfg.micro_batch, cfg.grad_accum);
      !e.empty()) {
    std::fprintf(stderr, "meshtrain: %s\n", e.c_str());
    return 2;
  }
  const std::string data = corpus_path(o.data);
  const Corpus corpus = Corpus::load(data, cfg.model.seq, cfg.model.words ? cfg.model.vocab : 0);

  RankComms rc;
  int rank = 0;
  if (world_size > 1) {
    if (!world) check_nccl(meshcclCommInitFromEnv(&world, &world_cfg.nccl), "meshcclCommInitFromEnv");
    rc = split_comms(world, cfg.layout, cfg.model.tied, cfg.comm_sched,
                     static_cast<size_t>(cfg.micro_batch) * cfg.model.seq * cfg.model.d_model);
    rank = rc.world->rank();
  }
  const int threads = o.blas_threads > 0 ? o.blas_threads
                                         : (world_size > 1 ? 1 : static_cast<int>(std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads > 0 ? threads : 1);

  auto engine = std::make_unique<Engine>(cfg, rank, rc.view(), corpus);
  bool talk = rank == 0;
  int start = 0;
  // A run that will save checks the directory before any step is spent (a
  // run that only resumes may read from a directory it cannot write).
  if (cfg.ckpt_every > 0) engine->prepare_checkpoints();
  // --elastic: the job's original ranks of the current world's members, and
  // the layout the newest checkpoint was saved under.
  std::vector<int> orig;
  for (int r = 0; r < world_size; ++r) orig.push_back(r);
  Layout saved_layout = cfg.layout;
  if (o.elastic) {
    if (cfg.layout.hetero()) {
      std::fprintf(stderr, "meshtrain: --elastic does not support per-stage tensor-parallel degrees\n");
      return 2;
    }
    if (world_size < 2 || cfg.layout.dp < 2) {
      std::fprintf(stderr, "meshtrain: --elastic needs at least two data-parallel replicas (dp %d)\n", cfg.layout.dp);
      return 2;
    }
    elastic_register(cfg.ckpt_dir, rank);
  }
  if (o.resume) {
    start = engine->load_checkpoint();
    if (talk) std::printf("resumed from %s after step %d\n", cfg.ckpt_dir.c_str(), start);
    if (talk && !engine->schedule_note().empty()) std::printf("%s\n", engine->schedule_note().c_str());
  }
  if (talk) {
    size_t n = 0;
    for (const auto& s : engine->stage().specs()) n += s.size;
    std::string tp_text = std::to_string(cfg.layout.tp);
    if (cfg.layout.hetero()) {
      tp_text.clear();
      for (int t : cfg.layout.stage_tp) tp_text += (tp_text.empty() ? "" : ",") + std::to_string(t);
    }
    std::printf(
        "meshtrain: %d rank(s) = dp %d x pp %d x tp %s (%s, order %s), %s schedule; model L=%d d=%d "
        "heads=%d seq=%d vocab=%d (%s); global batch %d x %d tokens; rank 0 holds %zu "
        "parameters; corpus %s (%zu bytes, %zu %s tokens)\n",
        world_size, cfg.layout.dp, cfg.layout.pp, tp_text.c_str(), tp_mode_name(cfg.layout.tp_mode),
        cfg.layout.order.c_str(), schedule_name(cfg.schedule), cfg.model.layers, cfg.model.d_model, cfg.model.heads,
        cfg.model.seq, cfg.model.vocab, cfg.model.tied ? "tied" : "untied", cfg.global_batch(), cfg.model.seq, n,
        data.c_str(), corpus.text_bytes(), corpus.size(), cfg.model.words ? "word" : "byte");
    std::fflush(stdout);
  }

  double time_sum = 0, wait_sum = 0, tokens = 0, cpu_sum = 0;
  int timed = 0;
  float last_loss = 0, val = -1;
  for (int step = start; step < cfg.steps; step++) {
    try {
      const double cpu0 = process_cpu_seconds();
      const StepStats s = engine->train_step(step);
      last_loss = s.loss;
      if (step > start || cfg.steps - start == 1) {  // the first step pays one-off set-up
        time_sum += s.seconds;
        wait_sum += s.comm_wait;
        cpu_sum += process_cpu_seconds() - cpu0;
        tokens += cfg.global_batch() * static_cast<double>(cfg.model.seq);
        timed++;
      }
      const bool val_now = cfg.val_every > 0 && ((step + 1) % cfg.val_every == 0 || step + 1 == cfg.steps);
      if (val_now) val = engine->validate();
      if (talk && ((step + 1) % o.log_every == 0 || step + 1 == cfg.steps)) {
        std::printf(
            "step %5d/%d | loss %.4f | lr %.2e | norm%s %.3f | %7.0f tok/s | %6.1f ms "
            "(compute %.1f, comm wait %.1f = %.1f%%)",
            step + 1, cfg.steps, s.loss, s.lr, s.norm_step == step ? "" : "(prev)", s.grad_norm, s.tokens_per_s,
            s.seconds * 1e3, (s.seconds - s.comm_wait) * 1e3, s.comm_wait * 1e3, 100.0 * s.comm_wait / s.seconds);
        if (val_now) std::printf(" | val %.4f", val);
        std::printf("\n");
        std::fflush(stdout);
      }
      if (cfg.ckpt_every > 0 && ((step + 1) % cfg.ckpt_every == 0 || step + 1 == cfg.steps)) {
        engine->save_checkpoint(step);
        saved_layout = cfg.layout;
      }
    } catch (const CommError& e) {
      if (!o.elastic) throw;
      // A rank died (or the job failed otherwise): find the dead, drop their
      // replicas, shrink, and go on from the last checkpoint.
      const int me = rank;
      std::fprintf(stderr, "meshtrain: rank %d (job rank %d): step %d failed: %s\n", me, orig[me], step + 1, e.what());
      const char* t = std::getenv("MESHCCL_TIMEOUT");
      const double wait_s = t ? std::max(1.0, std::atof(t)) : 30.0;
      const ElasticPlan plan = elastic_find_dead(cfg.ckpt_dir, orig, cfg.layout, wait_s);
      if (plan.dead.empty()) throw CommError(std::string(e.what()) + " (--elastic: no rank of this job has died)");
      std::string dead;
      for (int r : plan.dead) dead += (dead.empty() ? "" : ", ") + std::to_string(orig[r]);
      if (std::binary_search(plan.excluded.begin(), plan.excluded.end(), me)) {
        std::fprintf(stderr, "meshtrain: rank %d (job rank %d) leaves: its data-parallel replica lost job rank(s) %s\n",
                     me, orig[me], dead.c_str());
        elastic_leave(cfg.ckpt_dir, orig[me]);
        elastic_abandon(&rc);
        rc.world->abandon();
        return 0;
      }
      if (cfg.layout.dp - plan.lost_replicas < 1) throw CommError("--elastic: every data-parallel replica lost a rank");
      engine.reset();
      ncclComm_t nw = elastic_shrink(&rc, plan.excluded);
      std::vector<int> kept;
      for (int r = 0; r < static_cast<int>(orig.size()); ++r)
        if (!std::binary_search(plan.excluded.begin(), plan.excluded.end(), r)) kept.push_back(orig[r]);
      orig = kept;
      const int old_dp = cfg.layout.dp;
      cfg.layout.dp -= plan.lost_replicas;
      predicted_s = 0;  // the plan's layout is gone
      rc = split_comms(nw, cfg.layout, cfg.model.tied, cfg.comm_sched,
                       static_cast<size_t>(cfg.micro_batch) * cfg.model.seq * cfg.model.d_model);
      rank = rc.world->rank();
      talk = rank == 0;
      engine = std::make_unique<Engine>(cfg, rank, rc.view(), corpus);
      start = engine->load_checkpoint(saved_layout);
      if (talk) {
        std::printf(
            "elastic: job rank(s) %s died at step %d; dropped %d data-parallel replica(s) (%zu rank(s)): "
            "dp %d -> %d, %zu rank(s), global batch %d; resumed from the checkpoint after step %d\n",
            dead.c_str(), step + 1, plan.lost_replicas, plan.excluded.size(), old_dp, cfg.layout.dp, orig.size(),
            cfg.global_batch(), start);
        std::fflush(stdout);
      }
      step = start - 1;  // the loop's ++ makes it start
    }
  }

  engine->settle();  // --overlap-update: the last step's update

  // Communication share averaged over ranks: each rank waits differently
  // (pipeline stages, the stage that holds the loss).
  float share[2] = {static_cast<float>(wait_sum), static_cast<float>(time_sum)};
  // The most activation memory any rank holds (its schedule's slots).
  float act_mib = static_cast<float>(engine->stage().activation_bytes() / 1048576.0);
  float act_slots = static_cast<float>(engine->stage().slots());
  // CPU use of the timed steps ((user + sys) / wall, all threads): above 1 a
  // rank needs more than a core.
  float cpu_mean = time_sum > 0 ? static_cast<float>(cpu_sum / time_sum) : 0.0f, cpu_max = cpu_mean;
  if (rc.world) {
    rc.world->all_reduce(&share[0], 1, ReduceOp::Sum, Urgency::critical()).wait();
    rc.world->all_reduce(&share[1], 1, ReduceOp::Sum, Urgency::critical()).wait();
    rc.world->all_reduce(&act_mib, 1, ReduceOp::Max, Urgency::critical()).wait();
    rc.world->all_reduce(&act_slots, 1, ReduceOp::Max, Urgency::critical()).wait();
    rc.world->all_reduce(&cpu_max, 1, ReduceOp::Max, Urgency::critical()).wait();
    rc.world->all_reduce(&cpu_mean, 1, ReduceOp::Avg, Urgency::critical()).wait();
  }
  if (talk && timed > 0) {
    std::printf(
        "summary: %d step(s) timed, %.1f ms/step, %.0f tok/s, comm wait %.1f%% of step "
        "time (mean over ranks), final loss %.4f",
        timed, 1e3 * time_sum / timed, tokens / time_sum, share[1] > 0 ? 100.0 * share[0] / share[1] : 0.0, last_loss);
    if (val >= 0) std::printf(", val loss %.4f", val);
    std::printf(
        ", activations %.1f MiB (%d micro-batch slot(s); most on any rank), cpu %.2f of wall per rank (mean; max "
        "%.2f)\n",
        act_mib, static_cast<int>(act_slots), cpu_mean, cpu_max);
    if (predicted_s > 0) std::printf("%s\n", plan_check(predicted_s, time_sum / timed).c_str());
  }
  if (o.sample_chars > 0) {
    const std::string text = engine->sample(o.prompt, o.sample_chars, o.temperature, 7);
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
  if (o.version) {
    std::printf("meshtrain (meshccl) %s\n", MESHTRAIN_VERSION);
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
