// Single-rank engine: whole-model gradient check, learning, checkpoints and
// resume, command-line errors. Nothing here links meshccl.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <random>

#include "cli.h"
#include "engine.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

Corpus test_corpus(int seq) { return Corpus::load(MESHTRAIN_TEST_CORPUS, seq); }

TrainConfig tiny_config() {
  TrainConfig c;
  c.model.vocab = 256;
  c.model.seq = 16;
  c.model.layers = 2;
  c.model.d_model = 32;
  c.model.heads = 4;
  c.micro_batch = 2;
  c.grad_accum = 2;
  c.steps = 30;
  c.optim.lr = 3e-3f;
  c.optim.warmup = 3;
  c.optim.total_steps = c.steps;
  return c;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("meshtrain_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// d loss / d param against central differences for every tensor of a small model.
void gradient_check(bool tied) {
  ModelConfig m;
  m.vocab = 11;
  m.seq = 5;
  m.layers = 2;
  m.d_model = 8;
  m.heads = 2;
  m.tied = tied;
  const int B = 2, N = B * m.seq;
  Stage st(m, Layout{}, Coords{}, B, 1);
  std::mt19937 g(9);
  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; i++) tok[i] = static_cast<int32_t>(g() % m.vocab), tgt[i] = static_cast<int32_t>(g() % m.vocab);
  // Larger weights than the 0.02 init, so every path carries signal.
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (auto& p : st.params) p += d(g);
  st.zero_grads();
  st.forward(0, tok.data(), tgt.data());
  st.backward(0, 1.0f, {});
  const std::vector<float> analytic = st.grads;
  for (const auto& s : st.specs()) {
    const size_t stride = s.size > 24 ? s.size / 23 : 1;
    for (size_t i = 0; i < s.size; i += stride) {
      float& p = st.params[s.offset + i];
      const float old = p, eps = 1e-2f;
      p = old + eps;
      const double lp = st.forward(0, tok.data(), tgt.data());
      p = old - eps;
      const double lm = st.forward(0, tok.data(), tgt.data());
      p = old;
      const double num = (lp - lm) / (2 * eps);
      const double a = analytic[s.offset + i];
      EXPECT_NEAR(a, num, 2e-3 + 2e-2 * std::fabs(num)) << s.name << "[" << i << "]";
    }
  }
}

}  // namespace

TEST(Model, GradientCheckTied) { gradient_check(true); }
TEST(Model, GradientCheckUntied) { gradient_check(false); }

TEST(Model, InitialLossIsNearUniform) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  Engine e(c, 0, Comms{}, corpus);
  const float val = e.validate();
  EXPECT_NEAR(val, std::log(256.0f), 0.15f);
}

TEST(Engine, SingleRankLearns) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  Engine e(c, 0, Comms{}, corpus);
  const float val0 = e.validate();
  float first = 0, last = 0;
  for (int s = 0; s < c.steps; s++) {
    const StepStats r = e.train_step(s);
    ASSERT_TRUE(std::isfinite(r.loss));
    EXPECT_EQ(r.comm_wait, 0.0);
    if (s == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, first - 1.0f) << "first " << first << " last " << last;
  EXPECT_LT(e.validate(), val0 - 1.0f);
}

TEST(Engine, ResumeGivesTheSameLosses) {
  TrainConfig c = tiny_config();
  c.steps = 8;
  c.optim.total_steps = 8;
  const Corpus corpus = test_corpus(c.model.seq);
  std::vector<float> straight;
  std::vector<float> params;
  {
    Engine e(c, 0, Comms{}, corpus);
    for (int s = 0; s < c.steps; s++) straight.push_back(e.train_step(s).loss);
    params = e.stage().params;
  }
  const fs::path dir = fresh_dir("resume");
  c.ckpt_dir = dir.string();
  {
    Engine e(c, 0, Comms{}, corpus);
    EXPECT_EQ(e.load_checkpoint(), 0);  // nothing there yet
    for (int s = 0; s < 4; s++) ASSERT_EQ(e.train_step(s).loss, straight[s]);
    e.save_checkpoint(3);
  }
  EXPECT_TRUE(fs::exists(dir / "latest"));
  EXPECT_TRUE(fs::exists(dir / "step_00000003" / "rank_00000.bin"));
  for (const auto& f : fs::recursive_directory_iterator(dir)) {
    EXPECT_EQ(f.path().extension(), f.is_directory() ? "" : (f.path().filename() == "latest" ? "" : ".bin"))
        << f.path();
  }
  {
    Engine e(c, 0, Comms{}, corpus);
    const int start = e.load_checkpoint();
    ASSERT_EQ(start, 4);
    for (int s = start; s < c.steps; s++) EXPECT_EQ(e.train_step(s).loss, straight[s]) << "step " << s;
    EXPECT_EQ(e.stage().params, params);
  }
  fs::remove_all(dir);
}

TEST(Engine, CheckpointErrorsAreClear) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_err");
  c.ckpt_dir = dir.string();
  {
    Engine e(c, 0, Comms{}, corpus);
    e.train_step(0);
    e.save_checkpoint(0);
  }
  TrainConfig other = c;
  other.model.d_model = 64;
  {
    Engine e(other, 0, Comms{}, corpus);
    try {
      e.load_checkpoint();
      ADD_FAILURE() << "loaded a checkpoint of another model";
    } catch (const std::runtime_error& err) {
      EXPECT_NE(std::string(err.what()).find("different model configuration"), std::string::npos);
    }
  }
  // A shard cut short (a crash mid-write never renames, but a damaged disk might).
  const fs::path shard = dir / "step_00000000" / "rank_00000.bin";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  {
    Engine e(c, 0, Comms{}, corpus);
    EXPECT_THROW(e.load_checkpoint(), std::runtime_error);
  }
  fs::remove(shard);
  {
    Engine e(c, 0, Comms{}, corpus);
    EXPECT_THROW(e.load_checkpoint(), std::runtime_error);
  }
  fs::remove_all(dir);
}

TEST(Engine, ImpossibleLayoutIsRejectedBeforeAnyWork) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  c.layout = Layout{1, 1, 3};  // 4 heads
  try {
    Engine e(c, 0, Comms{}, corpus);
    ADD_FAILURE() << "accepted tp 3 with 4 heads";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("not divisible by tp 3"), std::string::npos);
  }
  c.layout = Layout{1, 3, 1};  // 2 layers
  EXPECT_THROW(Engine(c, 0, Comms{}, corpus), std::invalid_argument);
  c.layout = Layout{2, 1, 1};
  EXPECT_THROW(Engine(c, 5, Comms{}, corpus), std::invalid_argument);
}

TEST(Engine, CorpusTooShortIsAnError) {
  EXPECT_THROW(Corpus::from_bytes(std::vector<uint8_t>(50, 'a'), 16), std::runtime_error);
  EXPECT_THROW(Corpus::load("/nonexistent/kjv.txt", 16), std::runtime_error);
}

TEST(Engine, DataIsDeterministicAndSplit) {
  const Corpus corpus = test_corpus(16);
  std::vector<int32_t> a(16), b(16), ta(16), tb(16);
  corpus.train_sequence(1, 5, 3, 16, a.data(), ta.data());
  corpus.train_sequence(1, 5, 3, 16, b.data(), tb.data());
  EXPECT_EQ(a, b);
  for (int t = 0; t + 1 < 16; t++) EXPECT_EQ(ta[t], a[t + 1]);
  corpus.train_sequence(1, 6, 3, 16, b.data(), tb.data());
  EXPECT_NE(a, b);
  EXPECT_GT(corpus.split(), corpus.size() / 2);
}

TEST(Cli, ParsesAndRejects) {
  auto parse = [](std::vector<std::string> args, CliOptions* o) {
    std::vector<char*> argv;
    static std::string prog = "meshtrain";
    argv.push_back(prog.data());
    for (auto& a : args) argv.push_back(a.data());
    return parse_cli(static_cast<int>(argv.size()), argv.data(), o);
  };
  CliOptions o;
  EXPECT_EQ(parse({"--dp", "2", "--pp", "2", "--tp", "2", "--layers", "8", "--d-model", "256",
                   "--heads", "8", "--seq", "128", "--micro-batch", "4", "--grad-accum", "4",
                   "--steps", "200", "--schedule", "gpipe"},
                  &o),
            "");
  EXPECT_EQ(o.train.layout.world(), 8);
  EXPECT_EQ(o.train.global_batch(), 32);
  EXPECT_EQ(o.train.schedule, PipeSchedule::GPipe);
  CliOptions b;
  EXPECT_NE(parse({"--dp", "x"}, &b).find("needs an integer"), std::string::npos);
  CliOptions c;
  EXPECT_NE(parse({"--bogus"}, &c).find("unknown option"), std::string::npos);
  CliOptions d;
  EXPECT_NE(parse({"--schedule", "zigzag"}, &d).find("gpipe or 1f1b"), std::string::npos);
  CliOptions e;
  EXPECT_NE(parse({"--resume"}, &e).find("--ckpt-dir"), std::string::npos);
  CliOptions f;
  EXPECT_NE(parse({"--steps"}, &f).find("needs a value"), std::string::npos);
}

namespace {
// A one-rank communicator (every reduction is the identity, so the model's
// numbers are unchanged) that records what the model asks of it.
class CountingComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, size_t n, ReduceOp op) override { calls.push_back({n, op}); }
  void all_reduce_start(float*, size_t n, ReduceOp op) override {
    calls.push_back({n, op});
    pending++;
  }
  void all_reduce_finish() override { pending = 0; }
  void all_reduce_async(float*, size_t n, ReduceOp op) override {
    async.push_back({n, op});
    if (on_async) on_async();
  }
  void wait_async() override {}
  void exchange(const P2POp*, int) override {}
  std::vector<std::pair<size_t, ReduceOp>> calls, async;
  int pending = 0;
  std::function<void()> on_async;
};
}  // namespace

// Megatron 1D: per layer and micro-batch 2 all-reduces forward and 2 backward,
// each of B*T*C; plus the embedding (forward) and the vocab-parallel head:
// max and sum of per-token scalars forward, its input gradient backward.
TEST(Model, TensorParallelCollectivesWhereTheSpecPutsThem) {
  ModelConfig m;
  m.vocab = 256;
  m.seq = 8;
  m.layers = 3;
  m.d_model = 16;
  m.heads = 2;
  const int B = 2, N = B * m.seq;
  const size_t NC = static_cast<size_t>(N) * m.d_model;
  Stage st(m, Layout{}, Coords{}, B, 1);
  Stage plain(m, Layout{}, Coords{}, B, 1);
  CountingComm comm;
  st.set_tp_comm(&comm);
  std::vector<int32_t> tok(N, 65), tgt(N, 66);
  const float loss = st.forward(0, tok.data(), tgt.data());
  EXPECT_EQ(loss, plain.forward(0, tok.data(), tgt.data()));
  std::vector<std::pair<size_t, ReduceOp>> fwd = {{NC, ReduceOp::Sum}};
  for (int l = 0; l < m.layers; l++) {
    fwd.push_back({NC, ReduceOp::Sum});
    fwd.push_back({NC, ReduceOp::Sum});
  }
  fwd.push_back({static_cast<size_t>(N), ReduceOp::Max});
  fwd.push_back({2 * static_cast<size_t>(N), ReduceOp::Sum});
  EXPECT_EQ(comm.calls, fwd);
  comm.calls.clear();
  st.backward(0, 1.0f, {});
  EXPECT_EQ(comm.calls.size(), static_cast<size_t>(1 + 2 * m.layers));
  for (const auto& c : comm.calls) EXPECT_EQ(c, (std::pair<size_t, ReduceOp>{NC, ReduceOp::Sum}));
  EXPECT_EQ(comm.pending, 0) << "a started reduction was never finished";
  EXPECT_TRUE(comm.async.empty());
}

// Data-parallel buckets: several per step, each at least the bucket size but
// the last, averaged, covering every gradient exactly once, and the first one
// launched while backward has yet to reach the embedding (overlap).
TEST(Engine, DataParallelBucketsCoverTheGradientsOnce) {
  TrainConfig c = tiny_config();
  c.layout = Layout{1, 1, 1};
  c.model.layers = 4;
  c.bucket_elems = 5000;
  const Corpus corpus = test_corpus(c.model.seq);
  CountingComm dp;
  Comms comms;
  comms.dp = &dp;
  Engine e(c, 0, comms, corpus);
  // The position embedding's gradient as it stood at the first launch: the
  // last micro-batch's backward has not reached it yet, so it must still change.
  const ParamSpec wpe = e.stage().specs()[1];
  ASSERT_EQ(wpe.name, "wpe");
  std::vector<float> at_first_launch;
  dp.on_async = [&] {
    if (at_first_launch.empty()) {
      const auto& g = e.stage().grads;
      at_first_launch.assign(g.begin() + wpe.offset, g.begin() + wpe.offset + wpe.size);
    }
  };
  e.train_step(0);
  const auto& g = e.stage().grads;
  EXPECT_NE(at_first_launch, std::vector<float>(g.begin() + wpe.offset, g.begin() + wpe.offset + wpe.size))
      << "the first bucket was launched after backward had finished";
  ASSERT_GE(dp.async.size(), 3u);
  size_t total = 0;
  for (const auto& [n, op] : dp.async) {
    EXPECT_EQ(op, ReduceOp::Avg);
    total += n;
  }
  EXPECT_EQ(total, e.stage().params.size());
  for (size_t i = 0; i + 1 < dp.async.size(); i++) EXPECT_GE(dp.async[i].first, c.bucket_elems);
}
