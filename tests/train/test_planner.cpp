// The planner's pure parts: stage splits, the cost model against an event
// simulation of the pipeline schedule, memory limits, the search's order and
// the profile file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "plan_profile.h"
#include "planner.h"
#include "schedule.h"

using namespace meshtrain;

namespace {

Profile uniform_profile(double layer_f, double layer_b, double embed = 0, double head = 0) {
  Profile p;
  for (int b : {1, 2, 4, 8}) {
    MicroProfile m;
    m.micro_batch = b;
    m.layer_fwd = layer_f * b;
    m.layer_bwd = layer_b * b;
    m.embed_fb = embed * b;
    m.head_fb = head * b;
    p.micro.push_back(m);
  }
  p.cores = 64;  // no oversubscription
  return p;
}

PlanRequest request(int world, int layers = 8) {
  PlanRequest r;
  r.model.layers = layers;
  r.model.d_model = 64;
  r.model.heads = 8;
  r.model.seq = 16;
  r.world = world;
  r.global_batch = 16;
  return r;
}

// Makespan of one stage list per stage under 1F1B or GPipe with the given
// per-stage forward and backward times, no communication: an op starts when
// its stage is free and its input exists (forward of micro i on stage s-1,
// backward of micro i on stage s+1).
double simulate(PipeSchedule sched, int pp, int m, const std::vector<double>& F, const std::vector<double>& B) {
  std::vector<std::vector<PipeOp>> ops(pp);
  for (int s = 0; s < pp; s++) ops[s] = stage_ops(sched, pp, s, m);
  std::map<std::tuple<int, int, bool>, double> done;  // (stage, micro, forward) -> end
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; s++) {
      if (next[s] == ops[s].size()) continue;
      const PipeOp& op = ops[s][next[s]];
      double ready = free_at[s];
      if (op.forward && s > 0) {
        auto it = done.find({s - 1, op.micro, true});
        if (it == done.end()) continue;
        ready = std::max(ready, it->second);
      }
      if (!op.forward) {
        auto key = s < pp - 1 ? std::make_tuple(s + 1, op.micro, false) : std::make_tuple(s, op.micro, true);
        auto it = done.find(key);
        if (it == done.end()) continue;
        ready = std::max(ready, it->second);
      }
      const double end = ready + (op.forward ? F[s] : B[s]);
      done[{s, op.micro, op.forward}] = end;
      free_at[s] = end;
      next[s]++;
      progress = true;
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

TEST(Planner, UniformLayersGiveEqualStages) {
  for (int pp = 1; pp <= 8; pp++) {
    const auto split = best_split(16, pp, 1.0, 0, 0);
    ASSERT_EQ(static_cast<int>(split.size()), pp);
    int total = 0;
    for (int n : split) total += n;
    EXPECT_EQ(total, 16);
    const auto [lo, hi] = std::minmax_element(split.begin(), split.end());
    EXPECT_LE(*hi - *lo, 1) << "pp " << pp;
  }
  // A heavy head (3 layers' worth) moves layers off the last stage.
  EXPECT_EQ(best_split(9, 3, 1.0, 0, 3.0), (std::vector<int>{4, 4, 1}));
  EXPECT_EQ(best_split(9, 3, 1.0, 3.0, 0), (std::vector<int>{1, 4, 4}));
}

// With no communication, DAPPLE's latency equals the simulated 1F1B and GPipe
// makespan for equal stages; for unequal ones it is an upper bound (stages
// other than the slowest overlap part of their work), 12% over at worst here.
TEST(Planner, LatencyAgreesWithEventSimulation) {
  for (int pp : {1, 2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      std::vector<double> F(pp, 1.0), B(pp, 2.0);
      double sum = 0, mx = 0;
      for (int s = 0; s < pp; s++) sum += F[s] + B[s], mx = std::max(mx, F[s] + B[s]);
      const double L = sum + (m - 1) * mx;
      for (PipeSchedule sched : {PipeSchedule::OneFOneB, PipeSchedule::GPipe}) {
        EXPECT_NEAR(simulate(sched, pp, m, F, B), L, 1e-9) << pp << " " << m;
      }
    }
  }
  // Unequal stages: the slowest stage paces the steady phase.
  for (int m : {1, 4, 8}) {
    const std::vector<double> F = {1, 2, 1, 1.5}, B = {2, 4, 2, 3};
    const double L = 3 + 6 + 3 + 4.5 + (m - 1) * 6.0;
    const double sim = simulate(PipeSchedule::OneFOneB, 4, m, F, B);
    EXPECT_LE(sim, L + 1e-9) << m;
    EXPECT_GE(sim, 0.85 * L) << m;
  }
  // The same through predict(): no links, no update cost, one stage per layer.
  PlanRequest r = request(4, 4);
  Profile p = uniform_profile(1e-3, 2e-3);
  LinkModel none;
  Candidate c;
  c.layout = Layout{1, 4, 1};
  c.micro_batch = 2;
  c.grad_accum = 8;
  predict(r, p, none, &c);
  const std::vector<double> F(4, 2e-3), B(4, 4e-3);
  EXPECT_NEAR(c.step_s, simulate(PipeSchedule::OneFOneB, 4, 8, F, B), 1e-9);
}

TEST(Planner, MemoryLimitAndOrder) {
  PlanRequest r = request(4);
  const Profile p = uniform_profile(1e-3, 2e-3, 1e-4, 5e-4);
  LinkModel links;
  links.collective = {{2, 2e-5, 1e-9}, {4, 4e-5, 1e-9}};
  links.p2p = {2, 1e-5, 1e-10};
  const auto all = search(r, p, links);
  ASSERT_FALSE(all.empty());
  for (size_t i = 1; i < all.size(); i++) EXPECT_LE(all[i - 1].step_s, all[i].step_s);
  double least = 1e30;
  for (const auto& c : all) {
    EXPECT_EQ(c.layout.world(), 4);
    EXPECT_EQ(c.layout.dp * c.micro_batch * c.grad_accum, r.global_batch);
    EXPECT_EQ(check_layout(r.model, c.layout, 4, c.micro_batch, c.grad_accum), "") << c.describe();
    least = std::min(least, c.mem_bytes);
  }
  r.mem_limit = least * 1.01;
  const auto fit = search(r, p, links);
  ASSERT_FALSE(fit.empty());
  for (const auto& c : fit) EXPECT_LE(c.mem_bytes, r.mem_limit);
  EXPECT_LT(fit.size(), all.size());
  r.mem_limit = least / 2;
  EXPECT_TRUE(search(r, p, links).empty());
  // 3D appears at 8 ranks when allowed.
  PlanRequest r8 = request(8);
  const auto with3d = search(r8, p, links);
  EXPECT_TRUE(
      std::any_of(with3d.begin(), with3d.end(), [](const Candidate& c) { return c.layout.tp_mode == TpMode::ThreeD; }));
  r8.allow_3d = false;
  const auto without = search(r8, p, links);
  EXPECT_TRUE(std::none_of(without.begin(), without.end(),
                           [](const Candidate& c) { return c.layout.tp_mode == TpMode::ThreeD; }));
}

// Slow links push the plan towards fewer communicating dimensions; free links
// and a large model towards more parallelism per layer.
TEST(Planner, LinksMoveTheChoice) {
  PlanRequest r = request(4);
  const Profile p = uniform_profile(1e-3, 2e-3, 1e-4, 5e-4);
  LinkModel slow;
  slow.collective = {{2, 1e-2, 1e-7}, {4, 2e-2, 1e-7}};
  slow.p2p = {2, 1e-3, 1e-8};
  const Candidate best = search(r, p, slow).front();
  EXPECT_EQ(best.layout.tp, 1) << best.describe();
}

// Fits measured on the job's ranks carry the stride of their groups: with two
// ranks per host (tp-pp-dp order), groups of ranks 1 apart stay on a host and
// groups 2 apart cross the network. The planner keeps the heavy tensor-parallel
// traffic on the host and sends the rest across.
TEST(Planner, StridedLinksKeepTrafficOnTheHost) {
  PlanRequest r = request(4);
  const Profile p = uniform_profile(1e-3, 2e-3, 1e-4, 5e-4);
  const double fast = 1e-10, slow = 1e-7;  // seconds per byte: shm, 80 Mbit/s
  LinkModel links;
  links.collective = {{2, 2e-5, fast, 1}, {2, 2e-3, slow, 2}, {4, 4e-3, slow, 1}};
  links.p2p = {2, 1e-5, fast, 1, 0};
  links.p2p_strided = {links.p2p, {2, 1e-3, slow, 1, 1}, {2, 1e-3, slow, 2, 0}};
  EXPECT_EQ(links.coll(2, 1).beta, fast);
  EXPECT_EQ(links.coll(2, 2).beta, slow);
  EXPECT_EQ(links.coll(2).beta, fast);  // no stride: the old rule, nearest count
  EXPECT_EQ(links.pair(2).beta, slow);
  EXPECT_EQ(links.pair(2, 1).beta, slow);  // phase 1 not measured at stride 2: phase 0's
  EXPECT_EQ(links.pair(1, 1).beta, slow);  // ranks 1 and 2 are on two hosts
  EXPECT_EQ(links.pair(4).beta, fast);     // not measured: the default pair
  // pp 4 over two hosts: the middle boundary crosses the network.
  Candidate pp4;
  pp4.layout = Layout{1, 4, 1};
  pp4.micro_batch = 2, pp4.grad_accum = 8;
  LinkModel flat = links;
  flat.p2p_strided.clear();
  Candidate pp4_flat = pp4;
  predict(r, p, links, &pp4);
  predict(r, p, flat, &pp4_flat);
  EXPECT_GT(pp4.step_s, pp4_flat.step_s);
  Candidate tp_dp;  // tp 2 on a host, dp 2 across
  tp_dp.layout = Layout{2, 1, 2};
  tp_dp.micro_batch = 2, tp_dp.grad_accum = 4;
  Candidate dp_tp = tp_dp;  // the same sizes numbered dp first: tp crosses hosts
  dp_tp.layout.order = "dp-pp-tp";
  r.order = "tp-pp-dp";
  predict(r, p, links, &tp_dp);
  predict(r, p, links, &dp_tp);
  EXPECT_LT(tp_dp.tp_comm_s * 10, dp_tp.tp_comm_s);
  const auto all = search(r, p, links);
  ASSERT_FALSE(all.empty());
  for (const auto& c : all) EXPECT_EQ(c.layout.order, "tp-pp-dp");
  // With every group on the fast fit the choice differs from the strided one's
  // when tensor parallelism crosses the slow link: tp 4 spans both hosts.
  for (const auto& c : all) {
    if (c.layout.tp == 4) { EXPECT_GT(c.tp_comm_s, tp_dp.tp_comm_s) << c.describe(); }
  }
}

TEST(Planner, ProfileFileRoundTripsAndRejectsJunk) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / ("meshtrain_profile_" + std::to_string(::getpid()))).string();
  Profile p = uniform_profile(1e-3, 2e-3, 1e-4, 5e-4);
  p.update_per_param = 3e-9;
  LinkModel links;
  links.collective = {{2, 2e-5, 1e-9}};
  links.p2p = {2, 1e-5, 1e-10};
  save_profile(path, p, links);
  Profile q;
  LinkModel l2;
  load_profile(path, &q, &l2);
  ASSERT_EQ(q.micro.size(), p.micro.size());
  EXPECT_NEAR(q.micro[2].layer_bwd, p.micro[2].layer_bwd, 1e-12);
  EXPECT_EQ(l2.collective.size(), 1u);
  EXPECT_NEAR(l2.p2p.beta, 1e-10, 1e-18);
  // Strided fits (measured on a job's ranks) keep their strides.
  links.collective = {{2, 2e-5, 1e-9, 1}, {2, 3e-3, 1e-7, 2, 0, 0.25}};
  links.p2p = {2, 1e-5, 1e-10, 1, 0};
  links.p2p_strided = {links.p2p, {2, 2e-3, 1e-7, 1, 1}, {2, 2e-3, 1e-7, 2, 0}};
  save_profile(path, p, links);
  load_profile(path, &q, &l2);
  ASSERT_EQ(l2.collective.size(), 2u);
  EXPECT_EQ(l2.collective[1].stride, 2);
  EXPECT_NEAR(l2.coll(2, 2).alpha, 3e-3, 1e-12);
  EXPECT_NEAR(l2.coll(2, 2).cpu, 0.25, 1e-9);
  // Measured points: the curve through them, extended by its end segments.
  LinkModel::Fit curved = {2, 1.0, 1.0, 1, 0, 0.5, {1000, 2000, 4000}, {1e-3, 1.5e-3, 5.5e-3}};
  EXPECT_NEAR(curved.time(1500), 1.25e-3, 1e-12);
  EXPECT_NEAR(curved.time(3000), 3.5e-3, 1e-12);
  EXPECT_NEAR(curved.time(8000), 13.5e-3, 1e-12);
  EXPECT_NEAR(curved.time(0), 0.5e-3, 1e-12);
  EXPECT_NEAR(LinkModel::Fit({2, 1e-3, 1e-6}).time(1000), 2e-3, 1e-12);
  links.collective.push_back(curved);
  save_profile(path, p, links);
  load_profile(path, &q, &l2);
  ASSERT_EQ(l2.collective.size(), 3u);
  EXPECT_EQ(l2.collective[2].at_bytes, curved.at_bytes);
  EXPECT_NEAR(l2.collective[2].time(3000), 3.5e-3, 1e-9);
  EXPECT_EQ(l2.coll(2, 1).cpu, 1.0);
  ASSERT_EQ(l2.p2p_strided.size(), 3u);
  EXPECT_NEAR(l2.pair(2).beta, 1e-7, 1e-15);
  EXPECT_NEAR(l2.pair(1, 1).alpha, 2e-3, 1e-12);
  EXPECT_EQ(l2.p2p.stride, 1);
  for (const char* junk : {"collective 2 1e-5 1e-9 stride=0\n", "collective 2 1e-5 1e-9 stride=2x\n",
                           "collective 2 1e-5 1e-9 phase=1\n", "collective 2 1e-5 1e-9 2\n", "p2p 1e-5 1e-9 phase=1\n",
                           "p2p 1e-5 1e-9 stride=1 phase=7\n", "p2p 1e-5 1e-9 cpu=-1\n", "p2p 1e-5 1e-9 cpu=nan\n",
                           "p2p 1e-5 1e-9 cpu=\n", "p2p 1e-5 1e-9 speed=1\n", "p2p 1e-5 1e-9 at=1:1\n",
                           "p2p 1e-5 1e-9 at=2:1,1:2\n", "p2p 1e-5 1e-9 at=1:1,2:x\n", "p2p 1e-5 1e-9 at=1:1,2:-1\n"}) {
    save_profile(path, p, links);
    {
      std::ofstream f(path, std::ios::app);
      f << junk;
    }
    EXPECT_THROW(load_profile(path, &q, &l2), std::runtime_error) << junk;
  }
  save_profile(path, p, links);
  {
    std::ofstream f(path, std::ios::app);
    f << "micro 4 nan 1 1 1\n";
  }
  try {
    load_profile(path, &q, &l2);
    ADD_FAILURE() << "accepted nan";
  } catch (const std::runtime_error& e) { EXPECT_NE(std::string(e.what()).find(":"), std::string::npos); }
  std::remove(path.c_str());
  EXPECT_THROW(load_profile(path, &q, &l2), std::runtime_error);
}

// The measured profile is sane: positive times growing with the micro-batch.
TEST(Planner, ComputeProfileOfThisMachine) {
  ModelConfig m;
  m.layers = 2;
  m.d_model = 32;
  m.heads = 4;
  m.seq = 16;
  const Profile p = profile_compute(m, {1, 4}, 2, 2);
  ASSERT_EQ(p.micro.size(), 2u);
  for (const auto& mp : p.micro) {
    EXPECT_GT(mp.layer_fwd, 0);
    EXPECT_GT(mp.layer_bwd, 0);
  }
  EXPECT_GT(p.micro[1].layer_fwd + p.micro[1].layer_bwd, p.micro[0].layer_fwd + p.micro[0].layer_bwd);
  EXPECT_GT(p.update_per_param, 0);
}

// --plan auto ends with the prediction next to the measured step time, and a
// warning when they differ by more than a quarter (110 ms predicted and 339 ms
// measured once passed without a word).
TEST(Planner, PredictionIsComparedWithTheMeasuredStep) {
  const std::string far = plan_check(0.110, 0.339);
  EXPECT_NE(far.find("plan: predicted 110.0 ms/step, measured 339.0 ms/step (+208%)"), std::string::npos) << far;
  EXPECT_NE(far.find("warning: the measured step time is above the plan's prediction by more than 25%"),
            std::string::npos)
      << far;
  EXPECT_NE(plan_check(0.2, 0.1).find("below the plan's prediction"), std::string::npos);
  const std::string near = plan_check(0.100, 0.120);
  EXPECT_NE(near.find("(+20%)"), std::string::npos) << near;
  EXPECT_EQ(near.find("warning"), std::string::npos) << near;
}

// The memory the planner predicts is what meshtrain names when a model does
// not fit: it grows with the model and shrinks with tensor parallelism.
TEST(Planner, MemoryOfALayout) {
  ModelConfig m;
  m.d_model = 256;
  m.layers = 4;
  m.heads = 4;
  Layout one, two;
  two.tp = 2;
  const double base = memory_bytes(m, one, 4, 2);
  EXPECT_GT(base, 16.0 * 4 * 12 * 256 * 256);  // at least parameters, gradients and both moments
  EXPECT_LT(memory_bytes(m, two, 4, 2), base);
  m.d_model = 512;
  EXPECT_GT(memory_bytes(m, one, 4, 2), 3 * base);
}
