// Single-rank engine: whole-model gradient check, learning, checkpoints and
// resume, command-line errors. Nothing here links meshccl.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <functional>
#include <filesystem>
#include <fstream>
#include <random>
#include <cstddef>
#include <limits>

#include "checkpoint.h"
#include "cli.h"
#include "data.h"
#include "engine.h"
#include "plan_profile.h"

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
void gradient_check(bool tied, TpMode mode = TpMode::OneD) {
  ModelConfig m;
  m.vocab = 11;
  m.seq = 5;
  m.layers = 2;
  m.d_model = 8;
  m.heads = 2;
  m.tied = tied;
  const int B = 2, N = B * m.seq;
  Layout layout;
  layout.tp_mode = mode;
  Stage st(m, layout, Coords{}, B, 1);
  std::mt19937 g(9);
  std::vector<int32_t> tok(N), tgt(N);
  for (int i = 0; i < N; i++)
    tok[i] = static_cast<int32_t>(g() % m.vocab), tgt[i] = static_cast<int32_t>(g() % m.vocab);
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
// The 3D scheme's own LayerNorm, embedding and cross-entropy code on a 1-rank cube.
TEST(Model, GradientCheckThreeDScheme) { gradient_check(true, TpMode::ThreeD); }

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
    // Nothing there yet: an error, never a silent start from scratch.
    try {
      e.load_checkpoint();
      ADD_FAILURE() << "resumed from an empty checkpoint directory";
    } catch (const std::runtime_error& err) {
      EXPECT_NE(std::string(err.what()).find("no checkpoint to resume from"), std::string::npos) << err.what();
    }
    for (int s = 0; s < 4; s++) ASSERT_EQ(e.train_step(s).loss, straight[s]);
    e.save_checkpoint(3);
  }
  EXPECT_TRUE(fs::exists(dir / "latest"));
  EXPECT_TRUE(fs::exists(dir / "step_00000004" / "rank_00000.bin"));  // after step 4, as the log counts
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
  // Another stage split of the same layout: found by the layers, not the size.
  {
    TrainConfig three = c;
    three.model.layers = 3;
    three.layout = Layout{1, 1, 1};
    const fs::path d3 = fresh_dir("ckpt_split");
    three.ckpt_dir = d3.string();
    ShardHeader h = make_shard_header(three.model, three.layout, 0, 0, 10, 0, 3);
    std::vector<float> z(10, 0.0f);
    fs::create_directories(d3 / "step_00000000");
    write_shard((d3 / "step_00000000" / "rank_00000.bin").string(), h, z.data(), z.data(), z.data());
    write_latest(d3.string(), 0);
    std::vector<float> p, m, v;
    ShardHeader want = make_shard_header(three.model, three.layout, 0, 0, 10, 1, 3);
    try {
      read_shard((d3 / "step_00000000" / "rank_00000.bin").string(), want, &p, &m, &v);
      ADD_FAILURE() << "read a shard of another stage split";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("stage split differs"), std::string::npos) << e.what();
    }
    // Another tokenizer (a word vocabulary where the shard has bytes, or another word list).
    for (uint64_t fp : {uint64_t{0x1234}, uint64_t{0x5678}}) {
      ModelConfig mc = three.model;
      mc.tokenizer = fp;
      if (fp == 0x5678) {
        ShardHeader hw = make_shard_header(mc, three.layout, 0, 0, 10, 0, 3);
        hw.tokenizer = 0x1234;
        write_shard((d3 / "step_00000000" / "rank_00000.bin").string(), hw, z.data(), z.data(), z.data());
      }
      try {
        read_shard((d3 / "step_00000000" / "rank_00000.bin").string(),
                   make_shard_header(mc, three.layout, 0, 0, 10, 0, 3), &p, &m, &v);
        ADD_FAILURE() << "read a shard of another tokenizer";
      } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("another tokenizer"), std::string::npos) << e.what();
      }
    }
    fs::remove_all(d3);
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
  const fs::path shard = dir / "step_00000001" / "rank_00000.bin";
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

// Words with a byte fallback: lossless, the most frequent words first, the
// same vocabulary (and fingerprint) from the same text.
TEST(Tokenizer, WordsRoundTripAndAreDeterministic) {
  const std::string text = "the cat and the dog, the end. Zebra! the cat's  tail\n\tthe";
  const std::vector<uint8_t> bytes(text.begin(), text.end());
  const Tokenizer tk = Tokenizer::words(bytes, 256 + 3);
  ASSERT_EQ(tk.size(), 259);
  EXPECT_EQ(tk.word_list()[0], " the");  // 3 times with its space, "the" twice
  const std::vector<int32_t> ids = tk.encode(text);
  std::string back;
  for (int32_t id : ids) back += tk.decode(id);
  EXPECT_EQ(back, text);
  EXPECT_LT(ids.size(), text.size());
  for (int32_t id : ids) EXPECT_LT(id, tk.size());
  EXPECT_EQ(Tokenizer::words(bytes, 259).fingerprint(), tk.fingerprint());
  EXPECT_NE(Tokenizer::words(bytes, 258).fingerprint(), tk.fingerprint());
  EXPECT_EQ(Tokenizer().fingerprint(), 0u);
  EXPECT_NE(tk.fingerprint(), 0u);
  // A vocabulary larger than the text's words: every word, no more.
  EXPECT_LT(Tokenizer::words(bytes, 100000).size(), 300);
  // The corpus: far fewer tokens than bytes, and training data of word ids.
  const Corpus words = Corpus::load(MESHTRAIN_TEST_CORPUS, 16, 4096);
  EXPECT_LT(words.size() * 2, words.text_bytes());
  EXPECT_EQ(words.tokenizer().size(), 4096);
  std::vector<int32_t> a(16), t(16);
  words.train_sequence(1, 0, 0, 16, a.data(), t.data());
  for (int32_t id : a) EXPECT_LT(id, 4096);
}

TEST(Tokenizer, ModelMustMatchTheCorpus) {
  const Corpus words = Corpus::load(MESHTRAIN_TEST_CORPUS, 16, 512);
  TrainConfig c;
  c.model.seq = 16, c.model.layers = 2, c.model.d_model = 16, c.model.heads = 2;
  EXPECT_THROW(Engine(c, 0, Comms{}, words), std::invalid_argument);  // bytes model, word corpus
  c.model.words = true;
  c.model.vocab = 300;
  EXPECT_THROW(Engine(c, 0, Comms{}, words), std::invalid_argument);  // vocabulary too small
  c.model.vocab = 512;
  Engine e(c, 0, Comms{}, words);
  EXPECT_GT(e.train_step(0).loss, 0.0f);
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
  EXPECT_EQ(parse({"--dp",         "2",   "--pp",    "2",   "--tp",       "2",    "--layers",      "8",
                   "--d-model",    "256", "--heads", "8",   "--seq",      "128",  "--micro-batch", "4",
                   "--grad-accum", "4",   "--steps", "200", "--schedule", "gpipe"},
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
  EXPECT_NE(parse({"--schedule", "zigzag"}, &d).find("gpipe, 1f1b or eager-1f1b"), std::string::npos);
  CliOptions e;
  EXPECT_NE(parse({"--resume"}, &e).find("--ckpt-dir"), std::string::npos);
  CliOptions f;
  EXPECT_NE(parse({"--steps"}, &f).find("needs a value"), std::string::npos);
  CliOptions g;
  EXPECT_EQ(parse({"--pp", "3", "--stages", "2,1,1", "--order", "dp-tp-pp", "--tp-mode", "3d"}, &g), "");
  EXPECT_EQ(g.train.layout.stages, (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(g.train.layout.order, "dp-tp-pp");
  EXPECT_EQ(g.train.layout.tp_mode, TpMode::ThreeD);
  CliOptions h;
  EXPECT_NE(parse({"--stages", "2,,1"}, &h).find("--stages"), std::string::npos);
  CliOptions i;
  EXPECT_NE(parse({"--tp-mode", "2d"}, &i).find("1d or 3d"), std::string::npos);
  CliOptions w;
  EXPECT_EQ(parse({"--tokenizer", "word", "--vocab", "16384"}, &w), "");
  EXPECT_TRUE(w.train.model.words);
  EXPECT_EQ(w.train.model.vocab, 16384);
  CliOptions w2;
  EXPECT_NE(parse({"--tokenizer", "word"}, &w2).find("--vocab"), std::string::npos);
  CliOptions w3;
  EXPECT_NE(parse({"--vocab", "1000"}, &w3).find("--tokenizer word"), std::string::npos);
  CliOptions w4;
  EXPECT_NE(parse({"--tokenizer", "bpe"}, &w4).find("bytes or word"), std::string::npos);
}

namespace {
// A one-rank communicator (every reduction is the identity, so the model's
// numbers are unchanged) that records what the model asks of it.
class CountingComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  // Critical reductions go to calls (pending until waited for), background
  // ones to async.
  Work all_reduce(float*, size_t n, ReduceOp op, Urgency u) override {
    if (u.in_background) {
      async.push_back({n, op});
      if (on_async) on_async();
      return Work();
    }
    calls.push_back({n, op});
    pending++;
    return Work([this] { pending--; });
  }
  Work sparse_all_reduce(float* buf, size_t rows, size_t row_len, ReduceOp op, Urgency u) override {
    return all_reduce(buf, rows * row_len, op, u);
  }
  Work all_gather(const float* in, float* out, size_t n, Urgency) override {
    std::copy(in, in + n, out);
    gathers++;
    return Work();
  }
  Work reduce_scatter(const float* in, float* out, size_t n, Urgency) override {
    std::copy(in, in + n, out);
    scatters++;
    return Work();
  }
  int gathers = 0, scatters = 0;
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
  EXPECT_EQ(comm.pending, 0) << "a started reduction was never waited for";
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

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) { return e.what(); }
  return "";
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}
}  // namespace

// A damaged shard is found on resume, with a message naming it, and the
// engine keeps its parameters: flipped bytes (checksum), extra or missing
// bytes (size), and non-finite values saved from a diverged run.
TEST(Checkpoint, DamagedShardsAreRefusedByName) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_damage");
  c.ckpt_dir = dir.string();
  {
    Engine e(c, 0, Comms{}, corpus);
    e.prepare_checkpoints();
    e.train_step(0);
    e.save_checkpoint(0);
  }
  const fs::path shard = dir / "step_00000001" / "rank_00000.bin";
  const auto size = fs::file_size(shard);
  std::vector<char> good(size);
  {
    std::ifstream f(shard, std::ios::binary);
    f.read(good.data(), static_cast<std::streamsize>(size));
  }
  auto put = [&](const std::vector<char>& bytes) {
    std::ofstream f(shard, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  Engine e(c, 0, Comms{}, corpus);
  const std::vector<float> before = e.stage().params;
  // One flipped bit in the payload.
  std::vector<char> bad = good;
  bad[sizeof(ShardHeader) + 1000] ^= 0x10;
  put(bad);
  std::string err = error_of([&] { e.load_checkpoint(); });
  EXPECT_NE(err.find("fails its checksum"), std::string::npos) << err;
  EXPECT_NE(err.find(shard.string()), std::string::npos) << err;
  // A flipped bit in the header's step.
  bad = good;
  bad[offsetof(ShardHeader, step)] ^= 0x01;
  put(bad);
  err = error_of([&] { e.load_checkpoint(); });
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  // Trailing bytes and a cut.
  bad = good;
  bad.push_back('x');
  put(bad);
  err = error_of([&] { e.load_checkpoint(); });
  EXPECT_NE(err.find("bytes where its header promises"), std::string::npos) << err;
  bad.resize(size - 4);
  put(bad);
  err = error_of([&] { e.load_checkpoint(); });
  EXPECT_NE(err.find("bytes where its header promises"), std::string::npos) << err;
  // A header that promises another payload size than the parameters take (the
  // file's size agrees with the parameters): both numbers, not one twice.
  bad = good;
  bad[offsetof(ShardHeader, payload_bytes)] ^= 0x04;
  put(bad);
  err = error_of([&] { e.load_checkpoint(); });
  ShardHeader h{};
  std::memcpy(&h, good.data(), sizeof h);
  EXPECT_NE(err.find("promises a payload of " + std::to_string(h.payload_bytes ^ 0x04) + " bytes"), std::string::npos)
      << err;
  EXPECT_NE(err.find("take " + std::to_string(h.payload_bytes)), std::string::npos) << err;
  EXPECT_EQ(e.stage().params, before) << "a refused shard changed the parameters";
  put(good);
  EXPECT_EQ(e.load_checkpoint(), 1);
  // NaNs written with a valid checksum (a diverged run that saved).
  {
    Engine n(c, 0, Comms{}, corpus);
    n.stage().params[5] = std::nanf("");
    n.save_checkpoint(1);
  }
  err = error_of([&] { e.load_checkpoint(); });
  EXPECT_NE(err.find("non-finite"), std::string::npos) << err;
  EXPECT_NE(err.find("step_00000002"), std::string::npos) << err;
  fs::remove_all(dir);
}

// `latest` must name a checkpoint directory in the checkpoint directory.
TEST(Checkpoint, LatestPointerIsValidated) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_latest");
  c.ckpt_dir = dir.string();
  Engine e(c, 0, Comms{}, corpus);
  e.prepare_checkpoints();
  e.save_checkpoint(2);
  for (const char* bad :
       {"../step_00000003", "step_00000003/../../x", "/etc", "step_3", "step_0000000x", "", "step_00000003 extra"}) {
    write_text(dir / "latest", std::string(bad) + "\n");
    const std::string err = error_of([&] { e.load_checkpoint(); });
    EXPECT_NE(err.find("not a checkpoint name"), std::string::npos) << bad << ": " << err;
  }
  write_text(dir / "latest", "step_00000003\n");
  EXPECT_EQ(e.load_checkpoint(), 3);
  EXPECT_EQ(parse_step_dir("step_00000002"), 2);
  EXPECT_EQ(parse_step_dir(".."), -1);
  fs::remove_all(dir);
}

// The directory is checked before training, with the OS's reason; temporary
// files of a killed save are removed at start and at the next save; old
// checkpoints beyond --ckpt-keep are removed.
TEST(Checkpoint, DirectoryTemporaryFilesAndRetention) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_dir");
  fs::create_directories(dir);
  write_text(dir / "file", "x");
  c.ckpt_dir = (dir / "file" / "sub").string();
  {
    Engine e(c, 0, Comms{}, corpus);
    const std::string err = error_of([&] { e.prepare_checkpoints(); });
    EXPECT_NE(err.find("cannot be created"), std::string::npos) << err;
    EXPECT_NE(err.find("Not a directory"), std::string::npos) << err;
  }
  c.ckpt_dir = (dir / "ck").string();
  c.ckpt_keep = 2;
  Engine e(c, 0, Comms{}, corpus);
  // What a save killed between write and rename leaves behind.
  fs::create_directories(dir / "ck" / "step_00000007");
  write_text(dir / "ck" / "step_00000007" / "rank_00000.bin.tmp", std::string(1000, 'z'));
  write_text(dir / "ck" / "latest.tmp", "step_0000");
  e.prepare_checkpoints();
  EXPECT_FALSE(fs::exists(dir / "ck" / "step_00000007" / "rank_00000.bin.tmp"));
  EXPECT_FALSE(fs::exists(dir / "ck" / "latest.tmp"));
  write_text(dir / "ck" / "step_00000007" / "rank_00000.bin.tmp", "z");
  for (int s = 0; s < 5; s++) e.save_checkpoint(s);
  EXPECT_FALSE(fs::exists(dir / "ck" / "step_00000007" / "rank_00000.bin.tmp"));
  std::vector<std::string> left;
  for (const auto& f : fs::recursive_directory_iterator(dir / "ck")) {
    left.push_back(fs::relative(f.path(), dir / "ck").string());
  }
  std::sort(left.begin(), left.end());
  // Step 7 (ahead of the run, from an earlier one) is not this run's to prune.
  EXPECT_EQ(left, (std::vector<std::string>{"latest", "step_00000004", "step_00000004/rank_00000.bin", "step_00000005",
                                            "step_00000005/rank_00000.bin", "step_00000007"}));
  EXPECT_EQ(e.load_checkpoint(), 5);
  fs::remove_all(dir);
}

// A non-finite loss or gradient norm stops training with a clear error before
// the update touches the parameters.
TEST(Engine, NonFiniteLossOrNormStops) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  Engine e(c, 0, Comms{}, corpus);
  e.train_step(0);
  e.stage().params[e.stage().specs()[1].offset] = std::numeric_limits<float>::infinity();
  const std::vector<float> before = e.stage().params;
  const std::string err = error_of([&] { e.train_step(1); });
  EXPECT_NE(err.find("step 2: the loss is not finite"), std::string::npos) << err;
  EXPECT_EQ(e.stage().params, before);
  // Gradients alone: a huge loss scale overflows the norm while the loss is finite.
  TrainConfig big = c;
  Engine g(big, 0, Comms{}, corpus);
  const auto& ln = g.stage().specs()[2];  // h0.ln1w
  ASSERT_EQ(ln.name, "h0.ln1w");
  for (size_t i = 0; i < ln.size; i++) g.stage().params[ln.offset + i] = 3e37f;
  const std::string err2 = error_of([&] { g.train_step(0); });
  EXPECT_NE(err2.find("not finite"), std::string::npos) << err2;
}

TEST(Cli, RejectsInvalidNumbers) {
  auto parse = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    static std::string prog = "meshtrain";
    argv.push_back(prog.data());
    for (auto& a : args) argv.push_back(a.data());
    CliOptions o;
    return parse_cli(static_cast<int>(argv.size()), argv.data(), &o);
  };
  for (const char* v : {"inf", "nan", "-inf", "1e40", "-1", "0"}) { EXPECT_NE(parse({"--lr", v}), "") << "--lr " << v; }
  EXPECT_EQ(parse({"--lr", "1e-3"}), "");
  EXPECT_NE(parse({"--beta2", "1"}), "");
  EXPECT_NE(parse({"--beta1", "-0.1"}), "");
  EXPECT_NE(parse({"--min-lr-ratio", "2"}), "");
  EXPECT_NE(parse({"--weight-decay", "-1"}), "");
  EXPECT_NE(parse({"--clip", "nan"}), "");
  EXPECT_NE(parse({"--clip", "-1"}), "");
  EXPECT_NE(parse({"--temperature", "inf"}), "");
  EXPECT_NE(parse({"--warmup", "-3"}), "");
  EXPECT_NE(parse({"--dp", "99999999999"}).find("needs an integer"), std::string::npos);
  EXPECT_NE(parse({"--log-every", "0"}), "");
  EXPECT_NE(parse({"--ckpt-keep", "-1"}), "");
  EXPECT_NE(parse({"--val-seqs", "0"}), "");
  EXPECT_NE(parse({"--seed", "-5"}), "");
  // -1 was the "not given" value: given, it is refused like any negative.
  EXPECT_NE(parse({"--seed", "-1"}), "");
  EXPECT_NE(parse({"--data-seed", "-1"}), "");
  EXPECT_NE(parse({"--bucket-kb", "-1"}), "");
  EXPECT_NE(parse({"--bucket-kb", "0"}), "");
  EXPECT_EQ(parse({"--bucket-kb", "64", "--seed", "0"}), "");
  EXPECT_EQ(parse({"--ckpt-dir", "/tmp/x", "--ckpt-keep", "3", "--clip", "0"}), "");
}

// Inputs are regular files of bounded size: a device or a FIFO given as the
// corpus or a planner profile would be read forever.
TEST(Inputs, DevicesAndFifosAreRefused) {
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    EXPECT_THROW(Corpus::load(dev, 16), std::runtime_error) << dev;
    Profile p;
    LinkModel l;
    EXPECT_THROW(load_profile(dev, &p, &l), std::runtime_error) << dev;
  }
  char dir[] = "/tmp/meshtrain-inputs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  try {
    Corpus::load(fifo, 16);
    ADD_FAILURE() << "a FIFO was read as a corpus";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  std::vector<uint8_t> small = read_input_file(MESHTRAIN_TEST_CORPUS, size_t{4} << 30, "corpus");
  EXPECT_GT(small.size(), 1000u);
  EXPECT_THROW(read_input_file(MESHTRAIN_TEST_CORPUS, 10, "corpus"), std::runtime_error);
  unlink(fifo.c_str());
  rmdir(dir);
}

// 3D: every linear is 3 collectives forward (gather X, gather W, reduce-scatter
// Y) and 3 backward (gather dY, reduce-scatter dX and dW); the embedding
// reduce-scatters twice forward and gathers twice backward. On a 1-rank cube
// every collective is the identity, so the numbers are the plain model's.
TEST(Model, ThreeDCollectivesPerLinear) {
  ModelConfig m;
  m.vocab = 256;
  m.seq = 8;
  m.layers = 3;
  m.d_model = 16;
  m.heads = 2;
  const int B = 2, N = B * m.seq;
  Layout cube;
  cube.tp_mode = TpMode::ThreeD;
  Stage st(m, cube, Coords{}, B, 1);
  Stage plain(m, Layout{}, Coords{}, B, 1);
  ASSERT_EQ(st.params, plain.params);
  CountingComm axis[3], group;
  TpComms tc;
  tc.group = &group;
  for (int a = 0; a < 3; a++) tc.axis[a] = &axis[a];
  st.set_tp_comms(tc);
  std::vector<int32_t> tok(N, 65), tgt(N, 66);
  EXPECT_EQ(st.forward(0, tok.data(), tgt.data()), plain.forward(0, tok.data(), tgt.data()));
  const int linears = 4 * m.layers + 1;
  int gathers = 0, scatters = 0;
  for (auto& a : axis) gathers += a.gathers, scatters += a.scatters;
  EXPECT_EQ(gathers, 2 * linears);
  EXPECT_EQ(scatters, linears + 2);
  // The weights are gathered along W only.
  EXPECT_EQ(axis[kAxisW].gathers, linears);
  for (auto& a : axis) a.gathers = a.scatters = 0;
  st.zero_grads();
  plain.zero_grads();
  st.backward(0, 1.0f, {});
  plain.backward(0, 1.0f, {});
  gathers = scatters = 0;
  for (auto& a : axis) gathers += a.gathers, scatters += a.scatters;
  EXPECT_EQ(gathers, linears + 2);
  EXPECT_EQ(scatters, 2 * linears);
  EXPECT_EQ(axis[kAxisW].scatters, linears);
  st.finish_grads();
  for (size_t i = 0; i < st.grads.size(); i++) {
    ASSERT_NEAR(st.grads[i], plain.grads[i], 1e-6f + 1e-4f * std::fabs(plain.grads[i])) << i;
  }
}

// Resuming loads what --ckpt-dir holds: a directory other users may write
// (or that belongs to another user) is refused before anything is saved.
TEST(Checkpoint, DirectoryOthersCanWriteIsRefused) {
  const fs::path dir = fresh_dir("ckpt_perm");
  fs::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  try {
    check_dir_usable(dir.string(), 0);
    ADD_FAILURE() << "a world-writable --ckpt-dir was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("writable by other users (mode 0777)"), std::string::npos) << e.what();
  }
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  EXPECT_NO_THROW(check_dir_usable(dir.string(), 0));
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    EXPECT_THROW(check_dir_usable(dir.string(), 0), CheckpointError);
  }
  fs::remove_all(dir);
}

// Resuming used to check nothing (the owner and mode checks ran only when
// saving): weights planted in a directory others could write were loaded, and
// a FIFO as `latest` or as a shard hung the run. Now the checkpoint
// directory, the step's directory, `latest` and the shard must each be this
// user's and closed to writes by others, and the files regular (opened
// without following a link or waiting on a FIFO).
TEST(Checkpoint, ResumeReadsOnlyTheUsersOwnFiles) {
  TrainConfig c = tiny_config();
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_trust");
  c.ckpt_dir = dir.string();
  {
    Engine e(c, 0, Comms{}, corpus);
    e.prepare_checkpoints();
    e.train_step(0);
    e.save_checkpoint(0);
  }
  Engine e(c, 0, Comms{}, corpus);
  ASSERT_EQ(e.load_checkpoint(), 1);
  const std::vector<float> before = e.stage().params;
  const fs::path step = dir / "step_00000001", shard = step / "rank_00000.bin", latest = dir / "latest";
  auto refused = [&](const std::string& what, const std::string& words) {
    const std::string err = error_of([&] { e.load_checkpoint(); });
    EXPECT_NE(err.find(words), std::string::npos) << what << ": " << err;
  };
  for (const fs::path& d : {dir, step}) {
    ASSERT_EQ(::chmod(d.c_str(), 0777), 0);
    refused(d.string(), "writable by other users (mode 0777)");
    ASSERT_EQ(::chmod(d.c_str(), 0755), 0);
  }
  for (const fs::path& f : {latest, shard}) {
    ASSERT_EQ(::chmod(f.c_str(), 0666), 0);
    refused(f.string(), "writable by other users (mode 0666)");
    ASSERT_EQ(::chmod(f.c_str(), 0644), 0);
  }
  // Symbolic links in place of `latest`, the step's directory, the shard.
  for (const fs::path& p : {latest, step, shard}) {
    const fs::path real = p.parent_path() / ("real_" + p.filename().string());
    fs::rename(p, real);
    fs::create_symlink(real, p);
    refused(p.string(), p == step ? "not a directory (a link" : "symbolic link");
    fs::remove(p);
    fs::rename(real, p);
  }
  // FIFOs in place of `latest` and the shard: refused at once.
  for (const fs::path& f : {latest, shard}) {
    const fs::path saved = f.string() + ".saved";
    fs::rename(f, saved);
    ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0);
    auto load = std::async(std::launch::async, [&] { return error_of([&] { e.load_checkpoint(); }); });
    if (load.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "resume waits on the FIFO " << f;
      const int w = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);  // lets the reader go
      if (w >= 0) ::close(w);
    }
    const std::string err = load.get();
    EXPECT_NE(err.find("not a regular file"), std::string::npos) << f << ": " << err;
    fs::remove(f);
    fs::rename(saved, f);
  }
  if (::geteuid() == 0) {  // only root can give files away
    for (const fs::path& p : {dir, step, latest, shard}) {
      ASSERT_EQ(::chown(p.c_str(), 65534, 65534), 0);
      refused(p.string(), "belongs to uid 65534");
      ASSERT_EQ(::chown(p.c_str(), 0, 0), 0);
    }
  }
  EXPECT_EQ(e.stage().params, before) << "a refused checkpoint changed the parameters";
  EXPECT_EQ(e.load_checkpoint(), 1);
  fs::remove_all(dir);
}

// Checkpoints are named after the steps done, as the progress lines count
// ("step 2/4" is saved as step_00000002; it was step_00000001). A checkpoint
// of format 3, named after the 0-based index of its last step, still resumes
// where it should.
TEST(Checkpoint, NamesCountStepsAsTheLogAndOldNamesStillResume) {
  TrainConfig c = tiny_config();
  c.steps = 4;
  c.optim.total_steps = 4;
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_names");
  c.ckpt_dir = dir.string();
  std::vector<float> straight;
  {
    Engine e(c, 0, Comms{}, corpus);
    e.prepare_checkpoints();
    for (int s = 0; s < 4; s++) {
      straight.push_back(e.train_step(s).loss);
      if (s == 1) e.save_checkpoint(s);
    }
  }
  EXPECT_TRUE(fs::exists(dir / "step_00000002" / "rank_00000.bin"));
  EXPECT_FALSE(fs::exists(dir / "step_00000001"));
  EXPECT_EQ(read_latest(dir.string()), 2);
  {
    Engine e(c, 0, Comms{}, corpus);
    ASSERT_EQ(e.load_checkpoint(), 2);
    EXPECT_EQ(e.train_step(2).loss, straight[2]);
  }
  // The same state as format 3 wrote it: no schedule in the header, named
  // after step index 1.
  std::vector<char> v4;
  {
    std::ifstream f(dir / "step_00000002" / "rank_00000.bin", std::ios::binary);
    v4.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t head3 = offsetof(ShardHeader, schedule) + 8;  // ... tokenizer, crc, pad
  std::vector<char> v3(v4.begin(), v4.begin() + static_cast<std::ptrdiff_t>(offsetof(ShardHeader, schedule)));
  v3.resize(head3, 0);
  v3.insert(v3.end(), v4.begin() + sizeof(ShardHeader), v4.end());
  const int32_t three = 3, index = 1;
  std::memcpy(v3.data() + offsetof(ShardHeader, version), &three, 4);
  std::memcpy(v3.data() + offsetof(ShardHeader, step), &index, 4);
  uLong crc = crc32(0, nullptr, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(v3.data()), static_cast<uInt>(v3.size()));
  const uint32_t crc32v = static_cast<uint32_t>(crc);
  std::memcpy(v3.data() + offsetof(ShardHeader, schedule), &crc32v, 4);
  fs::remove_all(dir);
  fs::create_directories(dir / "step_00000001");
  {
    std::ofstream f(dir / "step_00000001" / "rank_00000.bin", std::ios::binary);
    f.write(v3.data(), static_cast<std::streamsize>(v3.size()));
  }
  write_text(dir / "latest", "step_00000001\n");
  {
    Engine e(c, 0, Comms{}, corpus);
    ASSERT_EQ(e.load_checkpoint(), 2) << "a format-3 step_00000001 holds the state after 2 steps";
    EXPECT_EQ(e.train_step(2).loss, straight[2]);
  }
  fs::remove_all(dir);
}

// Resuming with another --steps (or warm-up, rate) silently changed the
// learning rate of every step to come. The checkpoint's schedule is kept, and
// the run says so: a resumed run with a longer --steps reproduces the
// checkpointed run's losses, then goes on at its final rate.
TEST(Checkpoint, ResumeKeepsTheSavedSchedule) {
  TrainConfig c = tiny_config();
  c.steps = 6;
  c.optim.total_steps = 6;
  const Corpus corpus = test_corpus(c.model.seq);
  const fs::path dir = fresh_dir("ckpt_sched");
  c.ckpt_dir = dir.string();
  std::vector<float> straight;
  {
    Engine e(c, 0, Comms{}, corpus);
    for (int s = 0; s < c.steps; s++) {
      straight.push_back(e.train_step(s).loss);
      if (s == 1) e.save_checkpoint(s);
    }
  }
  TrainConfig longer = c;
  longer.steps = 12;
  longer.optim.total_steps = 12;
  longer.optim.warmup = 1;
  Engine e(longer, 0, Comms{}, corpus);
  ASSERT_EQ(e.load_checkpoint(), 2);
  const std::string note = e.schedule_note();
  EXPECT_NE(note.find("kept, --steps 6 (warmup 3, lr 0.003"), std::string::npos) << note;
  EXPECT_NE(note.find("not this run's --steps 12 (warmup 1"), std::string::npos) << note;
  EXPECT_NE(note.find("steps after 6 run at its final rate"), std::string::npos) << note;
  for (int s = 2; s < c.steps; s++) EXPECT_EQ(e.train_step(s).loss, straight[s]) << "step " << s;
  const StepStats after = e.train_step(c.steps);
  EXPECT_FLOAT_EQ(after.lr, c.optim.lr * c.optim.min_lr_ratio);
  Engine same(c, 0, Comms{}, corpus);
  EXPECT_EQ(same.load_checkpoint(), 2);
  EXPECT_EQ(same.schedule_note(), "");
  fs::remove_all(dir);
}

// Sizes beyond what the tensors can count are refused by name, a model this
// machine cannot hold is refused before anything is allocated, and one whose
// allocation fails says how much it needed (--d-model 1000000 died with a
// bare std::bad_alloc).
TEST(Engine, OversizedModelsSayWhatTheyNeed) {
  ModelConfig m;
  m.d_model = 1000000;
  EXPECT_NE(check_layout(m, Layout{}, 1, 4, 1).find("--d-model 1000000"), std::string::npos);
  m.d_model = 256;
  m.seq = 1 << 21;
  EXPECT_NE(check_layout(m, Layout{}, 1, 4, 1).find("--seq 2097152"), std::string::npos);
  m.seq = 1 << 20;
  EXPECT_NE(check_layout(m, Layout{}, 1, 2048, 1).find("tokens per micro-batch"), std::string::npos);

  const Corpus corpus = test_corpus(16);
  TrainConfig huge = tiny_config();
  huge.model.d_model = 1 << 16;
  huge.model.layers = 1024;
  try {
    Engine e(huge, 0, Comms{}, corpus);
    ADD_FAILURE() << "a model of petabytes was accepted";
  } catch (const std::invalid_argument& err) {
    const std::string w = err.what();
    EXPECT_NE(w.find("rank 0 needs about "), std::string::npos) << w;
    EXPECT_NE(w.find(" GiB for its part of the model"), std::string::npos) << w;
    EXPECT_NE(w.find("this machine has"), std::string::npos) << w;
  }

  // Within this machine, but the allocation fails: a child process whose
  // address space is capped near what it already uses.
  TrainConfig big = tiny_config();
  big.model.d_model = 2048;
  big.model.heads = 8;
  big.model.layers = 4;
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t cap = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + (rlim_t{256} << 20);
    const rlimit lim{cap, cap};
    std::string what = "setrlimit failed";
    if (::setrlimit(RLIMIT_AS, &lim) == 0) what = error_of([&] { Engine e(big, 0, Comms{}, corpus); });
    (void)!::write(out[1], what.data(), what.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string what;
  char buf[1024];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) what.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int ws = 0;
  ASSERT_EQ(::waitpid(pid, &ws, 0), pid);
  EXPECT_NE(what.find("rank 0 needs about "), std::string::npos) << what;
  EXPECT_NE(what.find("allocating it failed"), std::string::npos) << what;
}
