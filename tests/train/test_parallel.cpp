// The equivalence test: every dp x pp x tp layout, run over meshccl with one
// thread per rank, gives the single-process losses and parameters; resume in a
// parallel layout; and a real multi-process job under meshrun.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "harness.h"
#include "nccl_comm.h"

using namespace meshtrain;
using namespace meshtrain::testing;
namespace fs = std::filesystem;

namespace {

// Small enough that all layouts together take a few minutes on 2 cores.
TrainConfig base_config() {
  TrainConfig c;
  c.model.vocab = 256;
  c.model.seq = 16;
  c.model.layers = 4;
  c.model.d_model = 32;
  c.model.heads = 4;
  c.micro_batch = 2;
  c.steps = 20;
  c.optim.lr = 2e-3f;
  c.optim.warmup = 4;
  c.optim.total_steps = c.steps;
  c.bucket_elems = 4096;  // several buckets per backward, to exercise the overlap path
  c.val_sequences = 12;
  return c;
}
constexpr int kGlobalBatch = 12;  // divisible by every dp used below (1, 2, 3) times 2

TrainConfig with_layout(Layout l, PipeSchedule s) {
  TrainConfig c = base_config();
  c.layout = l;
  c.schedule = s;
  // The same global batch for every layout; the sequences a rank reads depend
  // only on their global index, not on how they are cut into micro-batches.
  if ((kGlobalBatch / l.dp) % c.micro_batch != 0) c.micro_batch = kGlobalBatch / l.dp;
  c.grad_accum = kGlobalBatch / (l.dp * c.micro_batch);
  return c;
}

const Corpus& corpus() {
  static const Corpus c = Corpus::load(MESHTRAIN_TEST_CORPUS, 16);
  return c;
}

CommFactory meshccl_comms(const TrainConfig& cfg) {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const int n = cfg.layout.world();
  return [id, n, cfg](int rank, Comms* out) -> std::shared_ptr<void> {
    ncclComm_t world = nullptr;
    check_nccl(ncclCommInitRank(&world, n, id, rank), "ncclCommInitRank");
    auto rc = std::make_shared<RankComms>(
        split_comms(world, cfg.layout, cfg.model.tied, cfg.comm_sched,
                    static_cast<size_t>(cfg.micro_batch) * cfg.model.seq * cfg.model.d_model));
    *out = rc->view();
    return rc;
  };
}

// The word tokenizer's corpus and model: 256 bytes + 256 words.
constexpr int kWordVocab = 512;
const Corpus& word_corpus() {
  static const Corpus c = Corpus::load(MESHTRAIN_TEST_CORPUS, 16, kWordVocab);
  return c;
}

const RunResult& reference(bool tied, bool words = false) {
  static std::map<std::pair<bool, bool>, RunResult> cache;
  auto it = cache.find({tied, words});
  if (it == cache.end()) {
    TrainConfig c = with_layout({1, 1, 1}, PipeSchedule::OneFOneB);
    c.model.tied = tied;
    if (words) c.model.words = true, c.model.vocab = kWordVocab;
    it = cache.emplace(std::make_pair(tied, words), run_threads(c, words ? word_corpus() : corpus(), nullptr)).first;
  }
  return it->second;
}

// fp32 tolerances: reductions in a different order (tensor-parallel partial
// sums, data-parallel averages, micro-batch accumulation) differ in the last
// bits, and 20 AdamW steps carry that along.
constexpr double kLossTol = 2e-4;   // relative, per step
constexpr double kParamTol = 1e-3;  // relative Frobenius norm, per tensor

void expect_equivalent(const RunResult& got, const RunResult& ref, const char* what, int vocab = 256) {
  ASSERT_EQ(got.error, "") << what;
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  double worst = 0;
  for (size_t s = 0; s < ref.losses.size(); s++) {
    const double rel = std::fabs(got.losses[s] - ref.losses[s]) / std::fabs(ref.losses[s]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, kLossTol) << what << " step " << s << ": " << got.losses[s] << " vs " << ref.losses[s];
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5f) << "the reference run did not learn";
  ASSERT_EQ(got.params.size(), ref.params.size()) << what;
  double worst_p = 0;
  const size_t real_vocab = static_cast<size_t>(vocab) * base_config().model.d_model;
  for (const auto& [name, want] : ref.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << what << ": no tensor " << name;
    const auto& have = it->second;
    // Padded vocabulary rows depend on tp and never take part; compare real rows.
    const size_t n = (name == "wte" || name == "lm_head") ? real_vocab : want.size();
    ASSERT_GE(have.size(), n);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
      diff += (have[i] - want[i]) * static_cast<double>(have[i] - want[i]);
      norm += static_cast<double>(want[i]) * want[i];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    worst_p = std::max(worst_p, rel);
    EXPECT_LT(rel, kParamTol) << what << ": tensor " << name;
  }
  ASSERT_EQ(got.val.size(), 1u);
  EXPECT_NEAR(got.val[0], ref.val[0], 1e-3 * ref.val[0]) << what << " validation loss";
  // Greedy generation through the same layout (pipeline and vocab-parallel head).
  if (vocab == 256) EXPECT_EQ(got.sample.size(), 24u);  // 24 tokens: bytes, or words
  else EXPECT_GE(got.sample.size(), 24u);
  EXPECT_EQ(got.sample, ref.sample) << what;
  std::printf(
      "[ %s ] worst loss rel diff %.2e, worst param rel diff %.2e, comm wait %.0f%% of "
      "rank time\n",
      what, worst, worst_p, 100.0 * got.comm_wait / got.seconds);
}

struct LayoutCase {
  Layout layout;
  PipeSchedule schedule;
  bool tied = true;
  int layers = 4;
};

std::string case_name(const LayoutCase& c) {
  std::string sched = schedule_name(c.schedule);
  std::replace(sched.begin(), sched.end(), '-', '_');  // test names take no '-'
  return std::to_string(c.layout.dp) + "x" + std::to_string(c.layout.pp) + "x" + std::to_string(c.layout.tp) + "_" +
         sched + (c.tied ? "" : "_untied");
}

// --comm-sched: fifo runs meshccl's links FIFO, priority by priority (as
// meshtrain's main sets MESHCCL_PRIORITY), while the ranks' threads run.
struct CommSchedEnv {
  explicit CommSchedEnv(CommSched s) { setenv("MESHCCL_PRIORITY", s == CommSched::Priority ? "1" : "0", 1); }
  ~CommSchedEnv() { unsetenv("MESHCCL_PRIORITY"); }
};

class Equivalence : public ::testing::TestWithParam<std::tuple<LayoutCase, CommSched>> {
 protected:
  static void SetUpTestSuite() { openblas_set_num_threads(1); }
};

}  // namespace

TEST_P(Equivalence, MatchesSingleProcess) {
  const auto& [lc, sched] = GetParam();
  TrainConfig c = with_layout(lc.layout, lc.schedule);
  c.model.tied = lc.tied;
  c.comm_sched = sched;
  CommSchedEnv env(sched);
  const RunResult got = run_threads(c, corpus(), meshccl_comms(c));
  expect_equivalent(got, reference(lc.tied), (case_name(lc) + " " + comm_sched_name(sched)).c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Equivalence,
    ::testing::Combine(
        ::testing::Values(LayoutCase{{2, 1, 1}, PipeSchedule::OneFOneB}, LayoutCase{{1, 2, 1}, PipeSchedule::OneFOneB},
                          LayoutCase{{1, 2, 1}, PipeSchedule::GPipe}, LayoutCase{{1, 3, 1}, PipeSchedule::Eager1F1B},
                          LayoutCase{{1, 2, 2}, PipeSchedule::Eager1F1B}, LayoutCase{{1, 1, 2}, PipeSchedule::OneFOneB},
                          LayoutCase{{2, 2, 1}, PipeSchedule::GPipe}, LayoutCase{{2, 1, 2}, PipeSchedule::OneFOneB},
                          LayoutCase{{1, 2, 2}, PipeSchedule::OneFOneB}, LayoutCase{{2, 2, 2}, PipeSchedule::OneFOneB},
                          LayoutCase{{3, 1, 1}, PipeSchedule::OneFOneB},
                          LayoutCase{{1, 3, 1}, PipeSchedule::OneFOneB},  // 4 layers on 3 stages
                          LayoutCase{{4, 1, 1}, PipeSchedule::OneFOneB}, LayoutCase{{1, 4, 1}, PipeSchedule::OneFOneB},
                          LayoutCase{{1, 1, 4}, PipeSchedule::OneFOneB},
                          LayoutCase{{1, 2, 2}, PipeSchedule::GPipe, false}),
        ::testing::Values(CommSched::Fifo, CommSched::Priority)),
    [](const ::testing::TestParamInfo<std::tuple<LayoutCase, CommSched>>& i) {
      return case_name(std::get<0>(i.param)) + "_" + comm_sched_name(std::get<1>(i.param));
    });

// The word tokenizer: the first stage's token-embedding gradient goes through
// meshcclSparseAllReduce over data-parallel replicas (untied, or tied with
// pp > 1); tied with pp = 1 it stays dense.
class WordEquivalence : public ::testing::TestWithParam<LayoutCase> {
 protected:
  static void SetUpTestSuite() { openblas_set_num_threads(1); }
};

TEST_P(WordEquivalence, MatchesSingleProcess) {
  const LayoutCase& lc = GetParam();
  TrainConfig c = with_layout(lc.layout, lc.schedule);
  c.model.tied = lc.tied;
  c.model.words = true;
  c.model.vocab = kWordVocab;
  const RunResult got = run_threads(c, word_corpus(), meshccl_comms(c));
  expect_equivalent(got, reference(lc.tied, true), ("words " + case_name(lc)).c_str(), kWordVocab);
}

INSTANTIATE_TEST_SUITE_P(Layouts, WordEquivalence,
                         ::testing::Values(LayoutCase{{2, 1, 1}, PipeSchedule::OneFOneB, false},
                                           LayoutCase{{3, 1, 1}, PipeSchedule::OneFOneB, false},
                                           LayoutCase{{2, 2, 1}, PipeSchedule::OneFOneB, true},
                                           LayoutCase{{2, 1, 2}, PipeSchedule::OneFOneB, false},
                                           LayoutCase{{2, 1, 1}, PipeSchedule::OneFOneB, true}),
                         [](const ::testing::TestParamInfo<LayoutCase>& i) { return case_name(i.param); });

// Pipeline stages with different tensor-parallel degrees: activations and
// their gradients cross stages through meshccl reshard plans.
struct HeteroCase {
  int dp;
  std::vector<int> stage_tp;
  PipeSchedule schedule;
  bool tied;
};

class HeteroEquivalence : public ::testing::TestWithParam<std::tuple<HeteroCase, CommSched>> {
 protected:
  static void SetUpTestSuite() { openblas_set_num_threads(1); }
};

TEST_P(HeteroEquivalence, MatchesSingleProcess) {
  const auto& [hc, sched] = GetParam();
  Layout l{hc.dp, static_cast<int>(hc.stage_tp.size()), hc.stage_tp[0]};
  l.stage_tp = hc.stage_tp;
  TrainConfig c = with_layout(l, hc.schedule);
  c.model.tied = hc.tied;
  c.comm_sched = sched;
  CommSchedEnv env(sched);
  std::string name = "dp" + std::to_string(hc.dp) + " tp";
  for (int t : hc.stage_tp) name += std::to_string(t);
  name += std::string(" ") + schedule_name(hc.schedule) + " " + comm_sched_name(sched);
  const RunResult got = run_threads(c, corpus(), meshccl_comms(c));
  expect_equivalent(got, reference(hc.tied), name.c_str());
}

INSTANTIATE_TEST_SUITE_P(StageMeshes, HeteroEquivalence,
                         ::testing::Combine(::testing::Values(HeteroCase{1, {2, 1}, PipeSchedule::OneFOneB, false},
                                                              HeteroCase{1, {1, 2, 1}, PipeSchedule::Eager1F1B, true},
                                                              HeteroCase{2, {1, 2}, PipeSchedule::GPipe, false}),
                                            ::testing::Values(CommSched::Fifo, CommSched::Priority)));

// --overlap-update (per-tensor AdamW as buckets land, during the next
// forward) gives the bits of the schedule that updates after every bucket:
// AdamW is elementwise and the norm is summed in the same order. Clipping is
// off (the mode needs it), so the reference is the same layout with
// overlap_update off, under the same --comm-sched.
struct OverlapCase {
  int dp;
  std::vector<int> stage_tp;  // one entry per stage
  PipeSchedule schedule;
  bool tied = true;
  bool words = false;
};

class OverlapUpdate : public ::testing::TestWithParam<std::tuple<OverlapCase, CommSched>> {
 protected:
  static void SetUpTestSuite() { openblas_set_num_threads(1); }
};

void expect_same_bits(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.error, "") << what;
  ASSERT_EQ(want.error, "") << what;
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); s++) { EXPECT_EQ(got.losses[s], want.losses[s]) << what << " step " << s; }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [name, w] : want.params) {
    const auto& h = got.params.at(name);
    ASSERT_EQ(h.size(), w.size()) << what << " " << name;
    size_t differ = 0;
    for (size_t i = 0; i < w.size(); i++) differ += h[i] != w[i];
    EXPECT_EQ(differ, 0u) << what << ": tensor " << name << " differs in " << differ << " element(s)";
  }
  EXPECT_EQ(got.val, want.val) << what;
  EXPECT_EQ(got.sample, want.sample) << what;
}

TEST_P(OverlapUpdate, SameBitsAsUpdatingAfterEveryBucket) {
  const auto& [oc, sched] = GetParam();
  Layout l{oc.dp, static_cast<int>(oc.stage_tp.size()), oc.stage_tp[0]};
  if (std::any_of(oc.stage_tp.begin(), oc.stage_tp.end(), [&](int t) { return t != oc.stage_tp[0]; })) {
    l.stage_tp = oc.stage_tp;
  }
  TrainConfig c = with_layout(l, oc.schedule);
  c.model.tied = oc.tied;
  if (oc.words) c.model.words = true, c.model.vocab = kWordVocab;
  c.optim.clip = 0.0f;
  c.comm_sched = sched;
  CommSchedEnv env(sched);
  const Corpus& data = oc.words ? word_corpus() : corpus();
  std::string name = "dp" + std::to_string(oc.dp) + " tp";
  for (int t : oc.stage_tp) name += std::to_string(t);
  name += std::string(" ") + schedule_name(oc.schedule) + (oc.tied ? "" : " untied") + (oc.words ? " words" : "") +
          " " + comm_sched_name(sched);

  const RunResult after_all = run_threads(c, data, l.world() > 1 ? meshccl_comms(c) : nullptr);
  c.overlap_update = true;
  const RunResult overlapped = run_threads(c, data, l.world() > 1 ? meshccl_comms(c) : nullptr);
  expect_same_bits(overlapped, after_all, name);
  EXPECT_LT(after_all.losses.back(), after_all.losses.front() - 0.5f) << name << " did not learn";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OverlapUpdate,
    ::testing::Combine(::testing::Values(OverlapCase{1, {1}, PipeSchedule::OneFOneB},
                                         OverlapCase{2, {1}, PipeSchedule::OneFOneB},
                                         OverlapCase{2, {1, 1}, PipeSchedule::OneFOneB},  // tied: embedding sum
                                         OverlapCase{2, {1, 1}, PipeSchedule::GPipe, false},
                                         OverlapCase{2, {2}, PipeSchedule::OneFOneB},
                                         OverlapCase{2, {2, 2}, PipeSchedule::Eager1F1B},
                                         OverlapCase{2, {1, 2}, PipeSchedule::GPipe, false},        // reshard plans
                                         OverlapCase{2, {1}, PipeSchedule::OneFOneB, false, true},  // sparse
                                         OverlapCase{2, {1, 1}, PipeSchedule::OneFOneB, true, true}),
                       ::testing::Values(CommSched::Fifo, CommSched::Priority)),
    [](const ::testing::TestParamInfo<std::tuple<OverlapCase, CommSched>>& i) {
      const OverlapCase& oc = std::get<0>(i.param);
      std::string n = "dp" + std::to_string(oc.dp) + "_tp";
      for (int t : oc.stage_tp) n += std::to_string(t);
      std::string sched = schedule_name(oc.schedule);
      std::replace(sched.begin(), sched.end(), '-', '_');
      return n + "_" + sched + (oc.tied ? "" : "_untied") + (oc.words ? "_words" : "") + "_" +
             comm_sched_name(std::get<1>(i.param));
    });

TEST(OverlapUpdate, RefusedWithClippingOrThreeD) {
  TrainConfig c = with_layout({1, 1, 1}, PipeSchedule::OneFOneB);
  c.overlap_update = true;
  EXPECT_THROW(Engine(c, 0, Comms{}, corpus()), std::invalid_argument);  // clip 1 by default
  c.optim.clip = 0.0f;
  EXPECT_NO_THROW(Engine(c, 0, Comms{}, corpus()));
  c.layout.tp_mode = TpMode::ThreeD;
  EXPECT_THROW(Engine(c, 0, Comms{}, corpus()), std::invalid_argument);
}

TEST(HeteroLayout, RefusedWithTheReason) {
  ModelConfig m = base_config().model;
  Layout l{1, 2, 2};
  l.stage_tp = {2, 1};
  EXPECT_NE(check_layout(m, l, 3, 2, 6).find("tied"), std::string::npos);
  m.tied = false;
  EXPECT_EQ(check_layout(m, l, 3, 2, 6), "");
  EXPECT_NE(check_layout(m, l, 4, 2, 6).find("job has 4"), std::string::npos);
  l.stage_tp = {2, 1, 1};
  EXPECT_NE(check_layout(m, l, 4, 2, 6).find("per stage"), std::string::npos);
  l.stage_tp = {3, 1};
  EXPECT_NE(check_layout(m, l, 4, 2, 6).find("divisible"), std::string::npos);
  l.stage_tp = {2, 1};
  const Coords c = coords_of(2, l);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(rank_of(c, l), 2);
}

TEST(ParallelResume, SameLossesAsAnUninterruptedRun) {
  openblas_set_num_threads(1);
  TrainConfig c = with_layout({2, 2, 2}, PipeSchedule::OneFOneB);
  c.steps = 8;
  c.optim.total_steps = 8;
  const RunResult straight = run_threads(c, corpus(), meshccl_comms(c));
  ASSERT_EQ(straight.error, "");
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_presume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  c.ckpt_dir = dir.string();
  const RunResult first = run_threads(c, corpus(), meshccl_comms(c), 0, 4, {}, [](Engine& e, int s) {
    if (s == 3) e.save_checkpoint(s);
  });
  ASSERT_EQ(first.error, "");
  for (int r = 0; r < 8; r++) {
    char name[32];
    std::snprintf(name, sizeof name, "rank_%05d.bin", r);
    EXPECT_TRUE(fs::exists(dir / "step_00000004" / name)) << name;  // after step 4, as the log counts
  }
  int loaded = -1;
  std::mutex mu;
  const RunResult second = run_threads(c, corpus(), meshccl_comms(c), 4, 8, [&](Engine& e) {
    const int s = e.load_checkpoint();
    std::lock_guard<std::mutex> lock(mu);
    loaded = s;
  });
  ASSERT_EQ(second.error, "");
  EXPECT_EQ(loaded, 4);
  for (int s = 0; s < 4; s++) {
    EXPECT_EQ(first.losses[s], straight.losses[s]) << "step " << s;
    EXPECT_EQ(second.losses[s], straight.losses[s + 4]) << "step " << s + 4;
  }
  for (const auto& [name, p] : straight.params) EXPECT_EQ(second.params.at(name), p) << name;
  fs::remove_all(dir);
}

namespace {
int run_cmd(const std::string& cmd, std::string* out) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

TEST(Meshrun, FourProcessJobTrains) {
  std::string out;
  const std::string cmd = std::string(MESHTRAIN_MESHRUN) + " --tag-output -n 4 " + MESHTRAIN_BIN +
                          " --dp 2 --pp 2 --tp 1 --layers 2 --d-model 32 --heads 4 --seq 16"
                          " --micro-batch 2 --grad-accum 2 --steps 6 --val-every 3 --sample 16 --data " +
                          MESHTRAIN_TEST_CORPUS;
  ASSERT_EQ(run_cmd(cmd, &out), 0) << out;
  EXPECT_NE(out.find("step     6/6"), std::string::npos) << out;
  EXPECT_NE(out.find("summary:"), std::string::npos) << out;
  EXPECT_NE(out.find("comm wait"), std::string::npos) << out;
  EXPECT_NE(out.find("sample: And God said"), std::string::npos) << out;
}

TEST(Meshrun, ImpossibleLayoutIsRejected) {
  std::string out;
  const std::string cmd = std::string(MESHTRAIN_MESHRUN) + " -n 2 " + MESHTRAIN_BIN +
                          " --dp 2 --pp 2 --steps 1 --data " + MESHTRAIN_TEST_CORPUS;
  EXPECT_NE(run_cmd(cmd, &out), 0);
  EXPECT_NE(out.find("but the job has 2 rank(s)"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(
      run_cmd(std::string(MESHTRAIN_BIN) + " --tp 1 --heads 3 --d-model 32 --data " + MESHTRAIN_TEST_CORPUS, &out), 0);
  EXPECT_NE(out.find("not divisible by heads"), std::string::npos) << out;
}

// The grid order only moves ranks around: data-parallel peers as neighbours
// (dp fastest) gives the same run.
TEST(GridOrder, DataParallelFastestMatchesSingleProcess) {
  openblas_set_num_threads(1);
  TrainConfig c = with_layout({2, 2, 2}, PipeSchedule::OneFOneB);
  c.layout.order = "dp-tp-pp";
  const RunResult got = run_threads(c, corpus(), meshccl_comms(c));
  expect_equivalent(got, reference(true), "2x2x2 dp-tp-pp");
}

// The command line stops before training on what cannot work, with the reason.
TEST(Meshrun, CheckpointAndNumberErrorsStopAtStart) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_cli_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string base = std::string(MESHTRAIN_BIN) +
                           " --layers 1 --d-model 32 --heads 2 --seq 16 --micro-batch 2 --steps 2 --data " +
                           MESHTRAIN_TEST_CORPUS;
  std::string out;
  EXPECT_NE(run_cmd(base + " --resume --ckpt-dir " + dir.string(), &out), 0);
  EXPECT_NE(out.find("no checkpoint to resume from"), std::string::npos) << out;
  EXPECT_EQ(out.find("step "), std::string::npos) << out;
  out.clear();
  EXPECT_NE(run_cmd(base + " --lr inf", &out), 0);
  EXPECT_NE(out.find("--lr needs a finite number"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(run_cmd(base + " --ckpt-every 1 --ckpt-dir /proc/meshtrain_ckpt", &out), 0);
  EXPECT_NE(out.find("cannot be created"), std::string::npos) << out;
  EXPECT_EQ(out.find("step "), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(run_cmd(base + " --ckpt-every 1 --ckpt-keep 1 --ckpt-dir " + dir.string(), &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir / "step_00000002"));  // named as the log counts: "step 2/2"
  EXPECT_FALSE(fs::exists(dir / "step_00000001"));
  fs::remove_all(dir);
}

// One rank's damaged shard stops every rank (none waits for it in a collective).
TEST(ParallelResume, OneDamagedShardStopsEveryRank) {
  openblas_set_num_threads(1);
  TrainConfig c = with_layout({2, 1, 1}, PipeSchedule::OneFOneB);
  c.steps = 2;
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_pdamage_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  c.ckpt_dir = dir.string();
  const RunResult first =
      run_threads(c, corpus(), meshccl_comms(c), 0, 1, {}, [](Engine& e, int s) { e.save_checkpoint(s); });
  ASSERT_EQ(first.error, "");
  fs::resize_file(dir / "step_00000001" / "rank_00001.bin", 100);
  std::mutex mu;
  std::vector<std::string> errors;
  run_threads(c, corpus(), meshccl_comms(c), 1, 2, [&](Engine& e) {
    try {
      e.load_checkpoint();
    } catch (const std::exception& ex) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(ex.what());
      throw;
    }
  });
  ASSERT_EQ(errors.size(), 2u);
  std::sort(errors.begin(), errors.end());
  EXPECT_NE(errors[0].find("rank_00001.bin has 100 bytes"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 1 failed"), std::string::npos) << errors[1];
  fs::remove_all(dir);
}

// 3D tensor parallelism: a 2 x 2 x 2 cube alone and with data or pipeline
// parallelism, against one process with the same global batch of 8 sequences
// (3D cuts each micro-batch into q^2 = 4 blocks of whole sequences).
namespace {
struct CubeCase {
  int dp, pp;
  PipeSchedule schedule;
  bool tied;
  const char* order;
};

TrainConfig cube_config(const CubeCase& cc) {
  TrainConfig c = base_config();
  c.layout = Layout{cc.dp, cc.pp, 8};
  c.layout.tp_mode = TpMode::ThreeD;
  c.layout.order = cc.order;
  c.schedule = cc.schedule;
  c.model.tied = cc.tied;
  c.micro_batch = 4;
  c.grad_accum = 2 / cc.dp;
  c.val_sequences = 8;  // a whole number of micro-batches on every data-parallel rank
  return c;
}

const RunResult& cube_reference(bool tied) {
  static std::map<bool, RunResult> cache;
  auto it = cache.find(tied);
  if (it == cache.end()) {
    TrainConfig c = base_config();
    c.model.tied = tied;
    c.micro_batch = 4;
    c.grad_accum = 2;
    c.val_sequences = 8;
    it = cache.emplace(tied, run_threads(c, corpus(), nullptr)).first;
  }
  return it->second;
}

class Cube : public ::testing::TestWithParam<CubeCase> {
 protected:
  static void SetUpTestSuite() { openblas_set_num_threads(1); }
};
}  // namespace

TEST_P(Cube, MatchesSingleProcess) {
  const CubeCase& cc = GetParam();
  const TrainConfig c = cube_config(cc);
  const RunResult got = run_threads(c, corpus(), meshccl_comms(c));
  const std::string name = std::to_string(cc.dp) + "x" + std::to_string(cc.pp) + "x8 3d " + cc.order;
  expect_equivalent(got, cube_reference(cc.tied), name.c_str());
}

INSTANTIATE_TEST_SUITE_P(ThreeD, Cube,
                         ::testing::Values(CubeCase{1, 1, PipeSchedule::OneFOneB, true, "tp-pp-dp"},
                                           CubeCase{1, 1, PipeSchedule::OneFOneB, false, "tp-pp-dp"},
                                           CubeCase{2, 1, PipeSchedule::OneFOneB, true, "tp-pp-dp"},
                                           CubeCase{1, 2, PipeSchedule::OneFOneB, true, "tp-pp-dp"},
                                           CubeCase{1, 2, PipeSchedule::GPipe, true, "pp-tp-dp"}),
                         [](const ::testing::TestParamInfo<CubeCase>& i) {
                           return std::to_string(i.param.dp) + "x" + std::to_string(i.param.pp) + "x8_" +
                                  schedule_name(i.param.schedule) + (i.param.tied ? "" : "_untied") +
                                  (i.param.order[0] == 'p' ? "_ppfirst" : "");
                         });

TEST(Meshrun, EightProcessCubeTrains) {
  std::string out;
  const std::string cmd = std::string(MESHTRAIN_MESHRUN) + " -n 8 " + MESHTRAIN_BIN +
                          " --tp 8 --tp-mode 3d --layers 2 --d-model 32 --heads 4 --seq 16"
                          " --micro-batch 4 --steps 4 --sample 8 --data " +
                          MESHTRAIN_TEST_CORPUS;
  ASSERT_EQ(run_cmd(cmd, &out), 0) << out;
  EXPECT_NE(out.find("tp 8 (3d"), std::string::npos) << out;
  EXPECT_NE(out.find("step     4/4"), std::string::npos) << out;
  EXPECT_NE(out.find("sample: And God said"), std::string::npos) << out;
  out.clear();
  EXPECT_NE(run_cmd(std::string(MESHTRAIN_MESHRUN) + " --tag-output -n 4 " + MESHTRAIN_BIN +
                        " --tp-mode 3d --tp 4 --data " + MESHTRAIN_TEST_CORPUS,
                    &out),
            0);
  EXPECT_NE(out.find("tp to be a cube"), std::string::npos) << out;
}

// Stages of unequal size (as the planner may choose) change nothing either.
TEST(GridOrder, UnevenStagesMatchSingleProcess) {
  openblas_set_num_threads(1);
  TrainConfig c = with_layout({1, 2, 1}, PipeSchedule::OneFOneB);
  c.layout.stages = {3, 1};
  expect_equivalent(run_threads(c, corpus(), meshccl_comms(c)), reference(true), "1x2x1 stages 3,1");
  c = with_layout({2, 3, 1}, PipeSchedule::GPipe);
  c.layout.stages = {1, 1, 2};
  expect_equivalent(run_threads(c, corpus(), meshccl_comms(c)), reference(true), "2x3x1 stages 1,1,2");
}

// The planner end to end: `meshtrain plan` prints a choice; `--plan auto`
// under meshrun plans on rank 0, every rank takes the plan, and it trains.
TEST(Meshrun, PlannerChoosesAndTrains) {
  const std::string model =
      " --layers 2 --d-model 32 --heads 4 --seq 16 --global-batch 8 --data " + std::string(MESHTRAIN_TEST_CORPUS);
  std::string out;
  ASSERT_EQ(run_cmd(std::string(MESHTRAIN_BIN) + " plan --ranks 4" + model, &out), 0) << out;
  EXPECT_NE(out.find("plan: 4 rank(s), global batch 8"), std::string::npos) << out;
  EXPECT_NE(out.find("\n* dp "), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(
      run_cmd(std::string(MESHTRAIN_MESHRUN) + " --tag-output -n 4 " + MESHTRAIN_BIN + " --plan auto --steps 2" + model,
              &out),
      0)
      << out;
  EXPECT_NE(out.find("] * dp "), std::string::npos) << out;
  EXPECT_NE(out.find("meshtrain: 4 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("step     2/2"), std::string::npos) << out;
  EXPECT_NE(out.find("plan: predicted "), std::string::npos) << out;  // and what was measured
  EXPECT_NE(out.find(" ms/step, measured "), std::string::npos) << out;
  out.clear();
  EXPECT_NE(run_cmd(std::string(MESHTRAIN_BIN) +
                        " plan --ranks 4 --mem-limit 1 --layers 4 --d-model 128"
                        " --heads 4 --seq 32 --global-batch 8 --data " +
                        MESHTRAIN_TEST_CORPUS,
                    &out),
            0);
  EXPECT_NE(out.find("no layout of 4 rank(s) fits"), std::string::npos) << out;
}

// A 3D run resumes bit for bit, and its shards are refused by a 1D run of
// the same rank count.
TEST(ParallelResume, CubeResumesAndRefusesOneD) {
  openblas_set_num_threads(1);
  TrainConfig c = cube_config({1, 1, PipeSchedule::OneFOneB, true, "tp-pp-dp"});
  c.steps = 4;
  c.optim.total_steps = 4;
  const RunResult straight = run_threads(c, corpus(), meshccl_comms(c));
  ASSERT_EQ(straight.error, "");
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_cresume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  c.ckpt_dir = dir.string();
  const RunResult first = run_threads(c, corpus(), meshccl_comms(c), 0, 2, {}, [](Engine& e, int s) {
    if (s == 1) e.save_checkpoint(s);
  });
  ASSERT_EQ(first.error, "");
  const RunResult second =
      run_threads(c, corpus(), meshccl_comms(c), 2, 4, [](Engine& e) { EXPECT_EQ(e.load_checkpoint(), 2); });
  ASSERT_EQ(second.error, "");
  for (int s = 0; s < 2; s++) EXPECT_EQ(second.losses[s], straight.losses[s + 2]) << "step " << s + 2;
  TrainConfig one = c;
  one.layout.tp_mode = TpMode::OneD;
  one.model.heads = 8;
  const RunResult refused =
      run_threads(one, corpus(), meshccl_comms(one), 2, 3, [](Engine& e) { e.load_checkpoint(); });
  EXPECT_NE(refused.error.find("layout; this run cannot resume from it"), std::string::npos) << refused.error;
  fs::remove_all(dir);
}
