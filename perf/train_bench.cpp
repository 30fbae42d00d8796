// train_bench: meshtrain throughput.
//   1. sgemm rate (GFLOP/s) of the step's shapes and of a large square GEMM
//      (OpenBLAS's practical peak here), 1 and 2 threads;
//   2. one process, d_model 256, 4 layers, 4 heads, seq 128, batch 8: step time
//      against the time of the same step's GEMMs alone;
//   3. parallel layouts at 2, 4 and 8 ranks (one thread per rank over meshccl):
//      tokens/s and the share of rank time spent waiting on communication;
//   4. 1D against 3D tensor parallelism at tp = 8: bytes each rank sends per
//      step (measured, and from the formulas) and step time.
//   5. (--plan-validate, alone) the planner at 4 and 8 ranks: every layout's
//      predicted step time against the measured one, and the planner's choice
//      against the best of the exhaustive sweep.
// Usage: train_bench [--steps N] [--quick] [--json PATH] [--data PATH] [--skip-layouts] [--only-tp]
//                    [--plan-validate]
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "nccl_comm.h"
#include "plan_links.h"
#include "plan_profile.h"
#include "planner.h"

using namespace meshtrain;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of the calling thread: with one BLAS thread all work runs here, and
// unlike wall time it does not grow when other processes share the cores.
double thread_cpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Gemm {
  bool ta, tb;
  int M, N, K;
};

double gemm_seconds(const std::vector<Gemm>& gemms, int reps, double (*clock)() = now) {
  size_t most = 0;
  for (const auto& g : gemms) { most = std::max({most, size_t(g.M) * g.K, size_t(g.K) * g.N, size_t(g.M) * g.N}); }
  std::vector<float> a(most, 0.01f), b(most, 0.02f), c(most, 0.0f);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const double t0 = clock();
    for (const auto& g : gemms) {
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M, g.N, g.K,
                  1.0f, a.data(), g.ta ? g.M : g.K, b.data(), g.tb ? g.K : g.N, 0.0f, c.data(), g.N);
    }
    best = std::min(best, clock() - t0);
  }
  return best;
}

double flops(const std::vector<Gemm>& gemms) {
  double f = 0;
  for (const auto& g : gemms) f += 2.0 * g.M * g.N * g.K;
  return f;
}

// Every sgemm one training step of the single-rank model issues, with its shape.
std::vector<Gemm> step_gemms(const TrainConfig& c) {
  const int N = c.micro_batch * c.model.seq, C = c.model.d_model, T = c.model.seq;
  const int V = padded_vocab(c.model.vocab, 1), hs = C / c.model.heads;
  std::vector<Gemm> g;
  auto linear = [&](int IC, int OC) {
    g.push_back({false, true, N, OC, IC});   // forward  X W^T
    g.push_back({false, false, N, IC, OC});  // dX = dY W
    g.push_back({true, false, OC, IC, N});   // dW = dY^T X
  };
  for (int l = 0; l < c.model.layers; l++) {
    linear(C, 3 * C);
    linear(C, C);
    linear(C, 4 * C);
    linear(4 * C, C);
    for (int bh = 0; bh < c.micro_batch * c.model.heads; bh++) {
      g.push_back({false, true, T, T, hs});   // scores
      g.push_back({false, false, T, hs, T});  // P V
      g.push_back({false, true, T, T, hs});   // dP
      g.push_back({true, false, T, hs, T});   // dV
      g.push_back({false, false, T, hs, T});  // dQ
      g.push_back({true, false, T, hs, T});   // dK
    }
  }
  linear(C, V);
  return g;
}

struct LayoutResult {
  double tokens_per_s = 0, wait_share = 0, step_ms = 0;
  double tp_bytes = 0;  // tensor-parallel bytes sent per step, mean over ranks
  double best_ms = 0;   // rank 0's fastest step (the least disturbed by other load)
  float loss = 0;
  std::string error;
};

LayoutResult run_layout(TrainConfig cfg, const Corpus& corpus, int steps) {
  const int n = cfg.layout.world();
  cfg.steps = steps;
  cfg.optim.total_steps = steps;
  ncclUniqueId id{};
  if (n > 1) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::mutex mu;
  LayoutResult res;
  double wait = 0, busy = 0, rank0_time = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; r++) {
    threads.emplace_back([&, r] {
      try {
        RankComms rc;  // a single rank runs without meshccl, as meshtrain does
        if (n > 1) {
          ncclComm_t world = nullptr;
          check_nccl(ncclCommInitRank(&world, n, id, r), "ncclCommInitRank");
          rc = split_comms(world, cfg.layout, cfg.model.tied, cfg.comm_sched);
        }
        Engine e(cfg, r, rc.view(), corpus);
        e.train_step(0);  // warm-up: first touch of buffers, connections
        auto tp_sent = [&rc] {
          double b = rc.tp ? rc.tp->bytes_sent : 0.0;
          for (const auto& c : rc.cube) b += c ? c->bytes_sent : 0.0;
          return b;
        };
        const double sent0 = tp_sent();
        double w = 0, t = 0, best = 1e30;
        float loss = 0;
        for (int s = 1; s <= steps; s++) {
          const StepStats st = e.train_step(s);
          best = std::min(best, st.seconds);
          w += st.comm_wait;
          t += st.seconds;
          loss = st.loss;
        }
        std::lock_guard<std::mutex> lock(mu);
        wait += w;
        busy += t;
        res.tp_bytes += (tp_sent() - sent0) / steps / n;
        if (r == 0) rank0_time = t, res.loss = loss, res.best_ms = best * 1e3;
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(mu);
        res.error = ex.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (res.error.empty()) {
    res.step_ms = 1e3 * rank0_time / steps;
    res.tokens_per_s = cfg.global_batch() * double(cfg.model.seq) * steps / rank0_time;
    res.wait_share = wait / busy;
  }
  return res;
}

int validate_planner(const std::string& data, int steps, const std::string& json) {
  const Corpus corpus = Corpus::load(data, 64);
  openblas_set_num_threads(1);
  TrainConfig base;
  base.model = ModelConfig{256, 64, 4, 128, 8, true, 42};
  base.bucket_elems = size_t(1) << 16;
  PlanRequest req;
  req.model = base.model;
  req.global_batch = 32;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const Profile prof = profile_compute(base.model, {2, 4, 8}, 5, cores);
  std::string out = "{\n  \"planner\": [";
  for (int world : {4, 8}) {
    req.world = world;
    const LinkModel links = measure_links(world, 9);
    const auto all = search(req, prof, links);
    std::printf(
        "\n== planner, %d ranks: d_model 128, 4 layers, 8 heads, seq 64, global batch 32, "
        "%zu plans, %d timed steps each ==\n",
        world, all.size(), steps);
    std::printf("%-52s %10s %10s %7s\n", "plan", "predicted", "best step", "error");
    double best_measured = 1e30, chosen_measured = 0, abs_err = 0;
    int within = 0, n = 0;
    std::string best_name;
    for (size_t i = 0; i < all.size(); i++) {
      const Candidate& c = all[i];
      TrainConfig t = base;
      t.layout = c.layout;
      t.micro_batch = c.micro_batch;
      t.grad_accum = c.grad_accum;
      const LayoutResult r = run_layout(t, corpus, steps);
      if (!r.error.empty()) {
        std::printf("%-52s failed: %s\n", c.describe().c_str(), r.error.c_str());
        continue;
      }
      // The fastest step: other load on the machine only ever slows a step down.
      const double ms = r.best_ms;
      const double err = c.step_s * 1e3 / ms - 1;
      std::printf("%s%-51s %8.1f ms %8.1f ms %+6.1f%%\n", i == 0 ? "*" : " ", c.describe().c_str(), c.step_s * 1e3, ms,
                  100 * err);
      std::fflush(stdout);
      if (i == 0) chosen_measured = ms;
      if (ms < best_measured) best_measured = ms, best_name = c.describe();
      abs_err += std::fabs(err);
      within += std::fabs(err) <= 0.15;
      n++;
      char line[512];
      std::snprintf(line, sizeof line,
                    "%s\n    {\"ranks\": %d, \"plan\": \"%s\", \"predicted_ms\": %.2f, "
                    "\"measured_ms\": %.2f, \"chosen\": %s}",
                    out.back() == '[' ? "" : ",", world, c.describe().c_str(), c.step_s * 1e3, ms,
                    i == 0 ? "true" : "false");
      out += line;
    }
    if (n == 0) continue;
    std::printf(
        "%d ranks: %d of %d plans predicted within 15%% (mean |error| %.1f%%); the choice "
        "measured %.1f ms, the sweep's best %.1f ms (%s): %+.1f%%\n",
        world, within, n, 100 * abs_err / n, chosen_measured, best_measured, best_name.c_str(),
        100 * (chosen_measured / best_measured - 1));
  }
  out += "\n  ]\n}\n";
  if (!json.empty()) {
    std::ofstream f(json);
    f << out;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5;
  bool quick = false, skip_layouts = false, only_tp = false, plan_validate = false;
#ifdef MESHTRAIN_BUILD_CORPUS
  std::string json, data = MESHTRAIN_BUILD_CORPUS;
#else
  std::string json, data = "data/kjv.txt";
#endif
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--skip-layouts") {
      skip_layouts = true;
    } else if (a == "--only-tp") {
      only_tp = true;
    } else if (a == "--plan-validate") {
      plan_validate = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--data" && i + 1 < argc) {
      data = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: train_bench [--steps N] [--quick] [--json PATH] [--data PATH] "
                   "[--skip-layouts] [--only-tp] [--plan-validate]\n");
      return 2;
    }
  }
  std::string out = "{\n";
  char line[512];
  if (plan_validate) return validate_planner(data, steps, json);

  // 1. GEMM rates.
  TrainConfig one;
  one.model = ModelConfig{256, 128, 4, 256, 4, true, 42};
  one.micro_batch = 8;
  const auto gemms = step_gemms(one);
  const std::vector<Gemm> square = {{false, false, 1024, 1024, 1024}};
  std::printf("== sgemm (OpenBLAS) ==\n");
  double step_gemm_s[3] = {0, 0, 0};
  out += "  \"gemm\": [";
  for (int threads : {1, 2}) {
    if (only_tp) break;
    openblas_set_num_threads(threads);
    const double peak = flops(square) / gemm_seconds(square, quick ? 3 : 10) / 1e9;
    step_gemm_s[threads] = gemm_seconds(gemms, quick ? 2 : 5);
    const double rate = flops(gemms) / step_gemm_s[threads] / 1e9;
    std::printf(
        "%d thread(s): 1024^3 %.1f GFLOP/s (peak reference); the step's %zu GEMMs %.1f "
        "GFLOP/s, %.1f ms\n",
        threads, peak, gemms.size(), rate, step_gemm_s[threads] * 1e3);
    std::snprintf(line, sizeof line,
                  "%s{\"threads\": %d, \"peak_gflops\": %.2f, \"step_gemm_gflops\": %.2f, "
                  "\"step_gemm_ms\": %.2f}",
                  threads == 1 ? "" : ", ", threads, peak, rate, step_gemm_s[threads] * 1e3);
    out += line;
  }
  out += "],\n";

  Corpus corpus = [&] {
    try {
      return Corpus::load(data, 128);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train_bench: %s\n", e.what());
      std::exit(1);
    }
  }();

  // 2. One process, both cores. Steps and GEMM-only passes alternate so that
  // both see the same host load; the best of each is compared.
  if (!only_tp) {
    openblas_set_num_threads(2);
    Engine e(one, 0, Comms{}, corpus);
    e.train_step(0);
    double best = 1e30, total = 0, gemm_best = 1e30;
    const int n = quick ? 2 : std::max(3, steps);
    for (int s = 1; s <= n; s++) {
      gemm_best = std::min(gemm_best, gemm_seconds(gemms, 1));
      const double t = e.train_step(s).seconds;
      best = std::min(best, t);
      total += t;
    }
    std::printf("\n== one process, d_model 256, 4 layers, 4 heads, seq 128, batch 8, 2 threads ==\n");
    std::printf(
        "step: best %.1f ms, mean %.1f ms (%.0f tok/s); its GEMMs alone: best %.1f ms; "
        "best step / best GEMM-only = %.2fx\n",
        best * 1e3, total / n * 1e3, 1024 / (total / n), gemm_best * 1e3, best / gemm_best);
    std::snprintf(line, sizeof line,
                  "  \"single\": {\"best_ms\": %.2f, \"mean_ms\": %.2f, \"gemm_only_ms\": %.2f, "
                  "\"ratio\": %.3f},\n",
                  best * 1e3, total / n * 1e3, gemm_best * 1e3, best / gemm_best);
    out += line;
  }

  // 2b. The same on one BLAS thread, in CPU time of this thread.
  if (!only_tp) {
    openblas_set_num_threads(1);
    Engine e(one, 0, Comms{}, corpus);
    e.train_step(0);
    double best = 1e30, gemm_best = 1e30;
    const int n = quick ? 2 : std::max(3, steps);
    for (int s = 1; s <= n; s++) {
      gemm_best = std::min(gemm_best, gemm_seconds(gemms, 1, thread_cpu));
      const double t0 = thread_cpu();
      e.train_step(s);
      best = std::min(best, thread_cpu() - t0);
    }
    std::printf(
        "1 thread, CPU time: step best %.1f ms; its GEMMs alone %.1f ms (%.1f GFLOP/s); "
        "step / GEMM-only = %.2fx\n",
        best * 1e3, gemm_best * 1e3, flops(gemms) / gemm_best / 1e9, best / gemm_best);
    std::snprintf(line, sizeof line,
                  "  \"single_1thread_cpu\": {\"step_ms\": %.2f, \"gemm_only_ms\": %.2f, "
                  "\"ratio\": %.3f},\n",
                  best * 1e3, gemm_best * 1e3, best / gemm_best);
    out += line;
  }

  // 3. Layouts: one thread per rank, one BLAS thread each.
  openblas_set_num_threads(1);
  TrainConfig base;
  base.model = ModelConfig{256, 64, 4, 128, 4, true, 42};
  base.micro_batch = 4;
  base.bucket_elems = size_t(1) << 16;
  const int global = 32;  // dp x micro-batch divides it for every dp below
  struct Case {
    Layout l;
    PipeSchedule s;
    size_t bucket;
    const char* note;
  };
  std::vector<Case> cases = {
      {{1, 1, 1}, PipeSchedule::OneFOneB, 0, "one rank, 1 BLAS thread"},
      {{2, 1, 1}, PipeSchedule::OneFOneB, 0, "buckets overlapped with backward"},
      {{2, 1, 1}, PipeSchedule::OneFOneB, size_t(1) << 30, "one bucket after backward"},
      {{1, 2, 1}, PipeSchedule::OneFOneB, 0, ""},
      {{1, 2, 1}, PipeSchedule::GPipe, 0, ""},
      {{1, 1, 2}, PipeSchedule::OneFOneB, 0, ""},
      {{4, 1, 1}, PipeSchedule::OneFOneB, 0, ""},
      {{2, 2, 1}, PipeSchedule::OneFOneB, 0, ""},
      {{2, 1, 2}, PipeSchedule::OneFOneB, 0, ""},
      {{1, 2, 2}, PipeSchedule::OneFOneB, 0, ""},
      {{1, 4, 1}, PipeSchedule::OneFOneB, 0, ""},
      {{2, 2, 2}, PipeSchedule::OneFOneB, 0, ""},
      {{8, 1, 1}, PipeSchedule::OneFOneB, 0, ""},
      {{2, 4, 1}, PipeSchedule::OneFOneB, 0, ""},
  };
  if (quick) cases.resize(6);
  if (skip_layouts || only_tp) cases.clear();
  std::printf(
      "\n== layouts: d_model 128, 4 layers, seq 64, micro-batch 4, global batch %d, "
      "%d timed steps ==\n",
      global, steps);
  std::printf("%-8s %-6s %9s %9s %10s  %s\n", "layout", "sched", "ms/step", "tok/s", "comm wait", "note");
  out += "  \"layouts\": [";
  bool first = true;
  for (const Case& k : cases) {
    TrainConfig c = base;
    c.layout = k.l;
    c.schedule = k.s;
    if (k.bucket) c.bucket_elems = k.bucket;
    c.grad_accum = global / (k.l.dp * c.micro_batch);
    const LayoutResult r = run_layout(c, corpus, steps);
    char name[32];
    std::snprintf(name, sizeof name, "%dx%dx%d", k.l.dp, k.l.pp, k.l.tp);
    if (!r.error.empty()) {
      std::printf("%-8s %-6s failed: %s\n", name, schedule_name(k.s), r.error.c_str());
      continue;
    }
    std::printf("%-8s %-6s %9.1f %9.0f %9.1f%%  %s\n", name, schedule_name(k.s), r.step_ms, r.tokens_per_s,
                100 * r.wait_share, k.note);
    std::fflush(stdout);
    std::snprintf(line, sizeof line,
                  "%s\n    {\"layout\": \"%s\", \"schedule\": \"%s\", \"note\": \"%s\", "
                  "\"ms_per_step\": %.2f, \"tokens_per_s\": %.1f, \"comm_wait_share\": %.4f}",
                  first ? "" : ",", name, schedule_name(k.s), k.note, r.step_ms, r.tokens_per_s, r.wait_share);
    out += line;
    first = false;
  }
  out += "\n  ]";

  // 4. 1D against 3D tensor parallelism at tp = 8 (a 2 x 2 x 2 cube): bytes
  // each rank sends per step, measured and from the formulas, and step time.
  if (!skip_layouts) {
    TrainConfig t = base;
    t.model.heads = 8;  // 1D needs heads divisible by 8
    t.grad_accum = 2;
    const int L = t.model.layers, C = t.model.d_model, T = t.model.seq;
    const double N = double(t.micro_batch) * T, m = t.grad_accum, P = 8, q = 2;
    const double Vp = padded_vocab(t.model.vocab, 8);
    // 1D: per layer and micro-batch 2 all-reduces of N x C forward and 2
    // backward, one each for the embedding and the head's input gradient,
    // 3N scalars for the cross-entropy; one scalar for the norm.
    const double ar = 2 * (P - 1) / P;
    const double pred1 = 4 * (ar * (m * ((4 * L + 2) * N * C + 3 * N) + 1));
    // 3D: per linear 2(q-1)/q^3 (N IC + N OC + IC OC) (the paper's volume);
    // then LayerNorm statistics, the embedding's scatters and gathers, the
    // cross-entropy's reductions, and per step the plane sums of replicated
    // gradients and the norm.
    auto lin = [&](double IC, double OC) { return 2 * (q - 1) / (q * q * q) * (N * IC + N * OC + IC * OC); };
    const double linears = L * (lin(C, 3 * C) + lin(C, C) + lin(C, 4 * C) + lin(4 * C, C)) + lin(C, Vp);
    const double aq = 2 * (q - 1) / q, Nq = N / q, Nq2 = N / (q * q);
    const double other_micro = (2 * L + 1) * aq * 4 * Nq2 + 2 * (q - 1) * (Nq + Nq2) * C / q + aq * (3 * Nq2 + 2);
    const double per_step = aq * (C / q * 2 * 2 * (2 * L + 1) + 9 * C / q * L + 2 * T * C / q) + ar;
    const double pred3 = 4 * (m * (linears + other_micro) + per_step);
    const double paper3 = 4 * m * linears;
    std::printf(
        "\n== tensor parallelism at tp = 8: d_model %d, %d layers, 8 heads, seq %d, "
        "micro-batch %d x %d, one thread per rank ==\n",
        C, L, T, t.micro_batch, t.grad_accum);
    std::printf("%-4s %9s %9s %14s %14s %14s\n", "mode", "ms/step", "comm wait", "sent/rank/step", "predicted",
                "linears(paper)");
    out += ",\n  \"tp8\": [";
    for (TpMode mode : {TpMode::OneD, TpMode::ThreeD}) {
      TrainConfig c = t;
      c.layout = Layout{1, 1, 8};
      c.layout.tp_mode = mode;
      const LayoutResult r = run_layout(c, corpus, steps);
      if (!r.error.empty()) {
        std::printf("%-4s failed: %s\n", tp_mode_name(mode), r.error.c_str());
        continue;
      }
      const bool three = mode == TpMode::ThreeD;
      const double pred = three ? pred3 : pred1, paper = three ? paper3 : pred1;
      std::printf("%-4s %9.1f %8.1f%% %11.0f KiB %11.0f KiB %11.0f KiB\n", tp_mode_name(mode), r.step_ms,
                  100 * r.wait_share, r.tp_bytes / 1024, pred / 1024, paper / 1024);
      std::snprintf(line, sizeof line,
                    "%s\n    {\"mode\": \"%s\", \"ms_per_step\": %.2f, \"comm_wait_share\": %.4f, "
                    "\"bytes_per_rank_per_step\": %.0f, \"predicted_bytes\": %.0f, "
                    "\"paper_linear_bytes\": %.0f}",
                    three ? "," : "", tp_mode_name(mode), r.step_ms, r.wait_share, r.tp_bytes, pred, paper);
      out += line;
    }
    std::printf(
        "1D all-reduces carry 2(P-1)/P x N x C each; 3D linears 2(q-1)/q^3 x (N IC + N OC + "
        "IC OC): ratio of the two per layer here %.2f\n",
        (4 * ar * N * C) / (lin(C, 3 * C) + lin(C, C) + lin(C, 4 * C) + lin(4 * C, C)));
    out += "\n  ]";
  }
  out += "\n}\n";
  if (!json.empty()) {
    std::ofstream f(json);
    f << out;
  }
  return 0;
}
