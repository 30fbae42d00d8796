#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels.h"

namespace meshtrain {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// N(0, 1) as a pure function of (seed, key, index): every layout computes the
// same value for the same logical element, whoever owns it.
float normal_at(uint64_t seed, uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(seed ^ splitmix64(key ^ splitmix64(index)));
  const uint64_t b = splitmix64(a);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

enum Kind : uint64_t {
  kWte = 1, kWpe, kLnfW, kLnfB, kHead,
  kLn1W = 16, kLn1B, kQkvW, kQkvB, kAttProjW, kAttProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
};

uint64_t key_of(uint64_t kind, int layer) { return (kind << 32) | static_cast<uint32_t>(layer + 1); }

}  // namespace

size_t global_index(const ParamSpec& s, size_t local, int tp_rank, int tp) {
  const size_t r = local / s.local_cols, c = local % s.local_cols;
  switch (s.split) {
    case Split::None:
      return local;
    case Split::Rows:
      return (static_cast<size_t>(tp_rank) * s.local_rows + r) * s.cols + c;
    case Split::Cols:
      return r * s.cols + static_cast<size_t>(tp_rank) * s.local_cols + c;
    case Split::QkvRows: {
      const size_t block = s.rows / 3 / tp;  // rows of one of Q, K, V on one rank
      const size_t part = r / block, within = r % block;
      return (part * (s.rows / 3) + tp_rank * block + within) * s.cols + c;
    }
  }
  return local;
}

Stage::Stage(const ModelConfig& cfg, const Layout& layout, const Coords& me, int micro_batch,
             int slots)
    : cfg_(cfg), layout_(layout), me_(me) {
  range_ = stage_layers(cfg.layers, layout.pp, me.pp);
  B_ = micro_batch;
  T_ = cfg.seq;
  C_ = cfg.d_model;
  const int tp = layout.tp;
  Cl_ = C_ / tp;
  NHl_ = cfg.heads / tp;
  Fl_ = 4 * C_ / tp;
  const int Vp = padded_vocab(cfg.vocab, tp);
  Vl_ = Vp / tp;
  vocab_lo_ = me.tp * Vl_;
  vocab_valid_ = std::max(0, std::min(Vl_, cfg.vocab - vocab_lo_));

  const float std_w = 0.02f;
  const float std_proj = 0.02f / std::sqrt(2.0f * cfg.layers);
  const bool rep_norm = me.tp == 0;  // replicated tensors count once per tp group
  if (first()) {
    add_param("wte", key_of(kWte, -1), Vp, C_, Split::Rows, std_w, 0, true, true);
    add_param("wpe", key_of(kWpe, -1), T_, C_, Split::None, std_w, 0, true, rep_norm);
  }
  for (int l = range_.lo; l < range_.hi; l++) {
    layer_offset_.push_back(params.size());
    // snprintf rather than string concatenation: GCC 12 at -O3 warns
    // (-Wrestrict, a false positive) on the inlined operator+.
    auto p = [l](const char* field) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "h%d.%s", l, field);
      return std::string(buf);
    };
    add_param(p("ln1w"), key_of(kLn1W, l), C_, 1, Split::None, 0, 1, false, rep_norm);
    add_param(p("ln1b"), key_of(kLn1B, l), C_, 1, Split::None, 0, 0, false, rep_norm);
    add_param(p("qkvw"), key_of(kQkvW, l), 3 * C_, C_, Split::QkvRows, std_w, 0, true, true);
    add_param(p("qkvb"), key_of(kQkvB, l), 3 * C_, 1, Split::QkvRows, 0, 0, false, true);
    add_param(p("attprojw"), key_of(kAttProjW, l), C_, C_, Split::Cols, std_proj, 0, true, true);
    add_param(p("attprojb"), key_of(kAttProjB, l), C_, 1, Split::None, 0, 0, false, rep_norm);
    add_param(p("ln2w"), key_of(kLn2W, l), C_, 1, Split::None, 0, 1, false, rep_norm);
    add_param(p("ln2b"), key_of(kLn2B, l), C_, 1, Split::None, 0, 0, false, rep_norm);
    add_param(p("fcw"), key_of(kFcW, l), 4 * C_, C_, Split::Rows, std_w, 0, true, true);
    add_param(p("fcb"), key_of(kFcB, l), 4 * C_, 1, Split::Rows, 0, 0, false, true);
    add_param(p("fcprojw"), key_of(kFcProjW, l), C_, 4 * C_, Split::Cols, std_proj, 0, true, true);
    add_param(p("fcprojb"), key_of(kFcProjB, l), C_, 1, Split::None, 0, 0, false, rep_norm);
  }
  final_offset_ = params.size();
  if (last()) {
    add_param("lnfw", key_of(kLnfW, -1), C_, 1, Split::None, 0, 1, false, rep_norm);
    add_param("lnfb", key_of(kLnfB, -1), C_, 1, Split::None, 0, 0, false, rep_norm);
    if (!cfg.tied) {
      add_param("lm_head", key_of(kHead, -1), Vp, C_, Split::Rows, std_w, 0, true, true);
    } else if (!first()) {
      // The last stage's copy of the tied embedding: same values as stage 0's,
      // its gradient summed with stage 0's; counted in the norm only there.
      add_param("wte", key_of(kWte, -1), Vp, C_, Split::Rows, std_w, 0, true, false);
    }
  }
  grads.assign(params.size(), 0.0f);

  // Resolve pointers now that the arenas no longer move.
  auto P = [&](size_t i) { return params.data() + specs_[i].offset; };
  auto G = [&](size_t i) { return grads.data() + specs_[i].offset; };
  size_t i = 0;
  if (first()) {
    wte_ = P(0), gwte_ = G(0), wpe_ = P(1), gwpe_ = G(1);
    i = 2;
  }
  for (int l = range_.lo; l < range_.hi; l++, i += 12) {
    LayerParams p{P(i), P(i + 1), P(i + 2), P(i + 3), P(i + 4), P(i + 5),
                  P(i + 6), P(i + 7), P(i + 8), P(i + 9), P(i + 10), P(i + 11)};
    LayerParams g{G(i), G(i + 1), G(i + 2), G(i + 3), G(i + 4), G(i + 5),
                  G(i + 6), G(i + 7), G(i + 8), G(i + 9), G(i + 10), G(i + 11)};
    lp_.push_back(p);
    lg_.push_back(g);
  }
  if (last()) {
    lnfw_ = P(i), glnfw_ = G(i), lnfb_ = P(i + 1), glnfb_ = G(i + 1);
    if (!cfg.tied || !first()) {
      head_ = P(i + 2), ghead_ = G(i + 2);
    } else {
      head_ = wte_, ghead_ = gwte_;
    }
  }
  init_params();

  slots_.resize(slots);
  for (auto& s : slots_) build_slot(s);
  const size_t N = static_cast<size_t>(B_) * T_;
  dres_.assign(N * C_, 0.0f);
  grad_in_.assign(N * C_, 0.0f);
  dln_.assign(N * C_, 0.0f);
  tmp_.assign(N * C_, 0.0f);
  dqkv_.assign(N * 3 * Cl_, 0.0f);
  datt_.assign(static_cast<size_t>(T_) * T_, 0.0f);
  datty_.assign(N * Cl_, 0.0f);
  dfch_.assign(N * Fl_, 0.0f);
  dfg_.assign(N * Fl_, 0.0f);
  if (last()) dlogits_.assign(N * Vl_, 0.0f);
}

void Stage::add_param(const std::string& name, uint64_t key, int rows, int cols, Split split,
                      float std, float value, bool decay, bool in_norm) {
  ParamSpec s;
  s.name = name;
  s.key = key;
  s.rows = rows;
  s.cols = cols;
  s.split = split;
  s.init_std = std;
  s.init_value = value;
  s.decay = decay;
  s.in_norm = in_norm;
  const int tp = layout_.tp;
  s.local_rows = (split == Split::Rows || split == Split::QkvRows) ? rows / tp : rows;
  s.local_cols = split == Split::Cols ? cols / tp : cols;
  s.offset = params.size();
  s.size = static_cast<size_t>(s.local_rows) * s.local_cols;
  params.resize(params.size() + s.size);
  specs_.push_back(s);
}

void Stage::init_params() {
  for (const auto& s : specs_) {
    float* p = params.data() + s.offset;
    for (size_t i = 0; i < s.size; i++) {
      p[i] = s.init_std > 0
                 ? s.init_std * normal_at(cfg_.seed, s.key, global_index(s, i, me_.tp, layout_.tp))
                 : s.init_value;
    }
  }
}

void Stage::build_slot(Slot& s) {
  const size_t N = static_cast<size_t>(B_) * T_;
  const size_t att = static_cast<size_t>(B_) * NHl_ * T_ * T_;
  const size_t per_layer = N * (C_ * 4 + 3 * Cl_ + Cl_ + 2 * Fl_) + 4 * N + att;
  size_t total = N * C_ + per_layer * range_.count();
  if (last()) total += N * C_ + 2 * N + N * Vl_ + 4 * N;
  s.mem.assign(total, 0.0f);
  float* p = s.mem.data();
  auto take = [&](size_t n) { float* r = p; p += n; return r; };
  s.input = take(N * C_);
  for (int l = 0; l < range_.count(); l++) {
    LayerActs a;
    a.ln1 = take(N * C_);
    a.ln1_mean = take(N);
    a.ln1_rstd = take(N);
    a.qkv = take(N * 3 * Cl_);
    a.att = take(att);
    a.atty = take(N * Cl_);
    a.res2 = take(N * C_);
    a.ln2 = take(N * C_);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(N * Fl_);
    a.fch_gelu = take(N * Fl_);
    a.out = take(N * C_);
    s.layers.push_back(a);
  }
  if (last()) {
    s.lnf = take(N * C_);
    s.lnf_mean = take(N);
    s.lnf_rstd = take(N);
    s.logits = take(N * Vl_);
    s.rowmax = take(N);
    s.ce = take(2 * N);  // sumexp then target logit: reduced together
    s.losses = take(N);
  }
  s.tokens.assign(N, 0);
  s.targets.assign(N, 0);
}

void Stage::tp_sum(float* buf, size_t n) {
  if (tp_comm) tp_comm->all_reduce(buf, n, ReduceOp::Sum);
}

const float* Stage::output(int slot) const {
  const Slot& s = slots_[slot];
  return s.layers.empty() ? s.input : s.layers.back().out;
}

const float* Stage::logits(int slot, int b, int t) const {
  return slots_[slot].logits + (static_cast<size_t>(b) * T_ + t) * Vl_;
}

void Stage::zero_grads() { std::fill(grads.begin(), grads.end(), 0.0f); }

float Stage::forward(int slot, const int32_t* tokens, const int32_t* targets) {
  Slot& s = slots_[slot];
  const int N = B_ * T_;
  if (first()) {
    std::memcpy(s.tokens.data(), tokens, sizeof(int32_t) * N);
    // g on the vocab-parallel lookup: rows outside this slice are zero.
    embedding_forward(s.input, tokens, wte_, N, C_, vocab_lo_, Vl_);
    tp_sum(s.input, static_cast<size_t>(N) * C_);
    position_forward(s.input, wpe_, B_, T_, C_);
  }
  const float* x = s.input;
  for (int l = 0; l < range_.count(); l++) {
    const LayerParams& p = lp_[l];
    LayerActs& a = s.layers[l];
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, N, C_);
    matmul_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, N, C_, 3 * Cl_);            // column-parallel
    attention_forward(a.atty, a.att, a.qkv, B_, T_, Cl_, NHl_);               // local heads
    matmul_forward(tmp_.data(), a.atty, p.attprojw, nullptr, N, Cl_, C_);    // row-parallel
    tp_sum(tmp_.data(), static_cast<size_t>(N) * C_);                        // g
    add_bias(tmp_.data(), p.attprojb, N, C_);
    residual_forward(a.res2, x, tmp_.data(), static_cast<size_t>(N) * C_);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, N, C_);
    matmul_forward(a.fch, a.ln2, p.fcw, p.fcb, N, C_, Fl_);                  // column-parallel
    gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(N) * Fl_);
    matmul_forward(tmp_.data(), a.fch_gelu, p.fcprojw, nullptr, N, Fl_, C_); // row-parallel
    tp_sum(tmp_.data(), static_cast<size_t>(N) * C_);                        // g
    add_bias(tmp_.data(), p.fcprojb, N, C_);
    residual_forward(a.out, a.res2, tmp_.data(), static_cast<size_t>(N) * C_);
    x = a.out;
  }
  if (!last()) return 0.0f;

  std::memcpy(s.targets.data(), targets, sizeof(int32_t) * N);
  layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, lnfw_, lnfb_, N, C_);
  matmul_forward(s.logits, s.lnf, head_, nullptr, N, C_, Vl_);  // vocab-parallel head
  ce_rowmax(s.rowmax, s.logits, N, Vl_, vocab_valid_);
  if (tp_comm) tp_comm->all_reduce(s.rowmax, N, ReduceOp::Max);
  ce_sumexp_target(s.ce, s.ce + N, s.logits, s.rowmax, targets, N, Vl_, vocab_valid_, vocab_lo_);
  tp_sum(s.ce, 2 * static_cast<size_t>(N));
  ce_loss(s.losses, s.ce, s.rowmax, s.ce + N, N);
  double sum = 0.0;
  for (int n = 0; n < N; n++) sum += s.losses[n];
  return static_cast<float>(sum / N);
}

void Stage::backward(int slot, float loss_scale, const std::function<void(size_t)>& ready) {
  Slot& s = slots_[slot];
  const int N = B_ * T_;
  const size_t NC = static_cast<size_t>(N) * C_;
  const int nl = range_.count();
  const float* x_last = nl ? s.layers[nl - 1].out : s.input;

  if (last()) {
    ce_backward(dlogits_.data(), s.logits, s.rowmax, s.ce, s.targets.data(), loss_scale / N, N,
                Vl_, vocab_valid_, vocab_lo_);
    // f: the head's input is shared by all vocab slices.
    matmul_backward_input(dln_.data(), dlogits_.data(), head_, N, C_, Vl_);
    if (tp_comm) tp_comm->all_reduce_start(dln_.data(), NC, ReduceOp::Sum);
    matmul_backward_weight(ghead_, nullptr, dlogits_.data(), s.lnf, N, C_, Vl_);
    if (tp_comm) tp_comm->all_reduce_finish();
    std::fill(dres_.begin(), dres_.end(), 0.0f);
    layernorm_backward(dres_.data(), glnfw_, glnfb_, dln_.data(), x_last, lnfw_, s.lnf_mean,
                       s.lnf_rstd, N, C_);
    if (ready) ready(final_offset_);
  } else {
    std::memcpy(dres_.data(), grad_in_.data(), sizeof(float) * NC);
  }

  for (int l = nl - 1; l >= 0; l--) {
    const LayerParams& p = lp_[l];
    const LayerParams& g = lg_[l];
    LayerActs& a = s.layers[l];
    const float* x = l ? s.layers[l - 1].out : s.input;
    // MLP: dres is dL/d(out); the residual passes it straight to res2.
    matmul_backward(dfg_.data(), g.fcprojw, g.fcprojb, dres_.data(), a.fch_gelu, p.fcprojw, N,
                    Fl_, C_);
    gelu_backward(dfch_.data(), a.fch, dfg_.data(), static_cast<size_t>(N) * Fl_);
    // f: the input gradient's sum runs while the weight gradient is computed.
    matmul_backward_input(dln_.data(), dfch_.data(), p.fcw, N, C_, Fl_);
    if (tp_comm) tp_comm->all_reduce_start(dln_.data(), NC, ReduceOp::Sum);
    matmul_backward_weight(g.fcw, g.fcb, dfch_.data(), a.ln2, N, C_, Fl_);
    if (tp_comm) tp_comm->all_reduce_finish();
    layernorm_backward(dres_.data(), g.ln2w, g.ln2b, dln_.data(), a.res2, p.ln2w, a.ln2_mean,
                       a.ln2_rstd, N, C_);
    // Attention: dres is now dL/d(res2).
    matmul_backward(datty_.data(), g.attprojw, g.attprojb, dres_.data(), a.atty, p.attprojw, N,
                    Cl_, C_);
    attention_backward(dqkv_.data(), datt_.data(), datty_.data(), a.qkv, a.att, B_, T_, Cl_, NHl_);
    matmul_backward_input(dln_.data(), dqkv_.data(), p.qkvw, N, C_, 3 * Cl_);
    if (tp_comm) tp_comm->all_reduce_start(dln_.data(), NC, ReduceOp::Sum);  // f
    matmul_backward_weight(g.qkvw, g.qkvb, dqkv_.data(), a.ln1, N, C_, 3 * Cl_);
    if (tp_comm) tp_comm->all_reduce_finish();
    layernorm_backward(dres_.data(), g.ln1w, g.ln1b, dln_.data(), x, p.ln1w, a.ln1_mean,
                       a.ln1_rstd, N, C_);
    if (ready) ready(layer_offset_[l]);
  }

  if (first()) {
    position_backward(gwpe_, dres_.data(), B_, T_, C_);
    embedding_backward(gwte_, dres_.data(), s.tokens.data(), N, C_, vocab_lo_, Vl_);
    if (ready) ready(0);
  }
}

}  // namespace meshtrain
