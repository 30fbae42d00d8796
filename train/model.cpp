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
  kWte = 1,
  kWpe,
  kLnfW,
  kLnfB,
  kHead,
  kLn1W = 16,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
};

uint64_t key_of(uint64_t kind, int layer) { return (kind << 32) | static_cast<uint32_t>(layer + 1); }

}  // namespace

Stage::Stage(const ModelConfig& cfg, const Layout& layout, const Coords& me, int micro_batch, int slots)
    : cfg_(cfg), layout_(layout), me_(me) {
  range_ = stage_layers(layout, cfg.layers, me.pp);
  tp_ = make_tp_scheme(cfg, layout, me.tp, micro_batch);
  const TpShapes& sh = tp_->shapes();
  B_ = micro_batch;
  T_ = cfg.seq;
  C_ = cfg.d_model;
  Nr_ = sh.seqs * T_;
  Cr_ = sh.width;
  Bi_ = sh.inner_seqs;
  Ni_ = Bi_ * T_;
  const int Vp = padded_vocab(cfg.vocab, layout.tp);

  const float std_w = 0.02f;
  const float std_proj = 0.02f / std::sqrt(2.0f * cfg.layers);
  const Linear none = Linear::kCount;
  if (first()) {
    add_param("wte", key_of(kWte, -1), Vp, C_, Tensor::TokenTable, none, std_w, 0, true, true);
    add_param("wpe", key_of(kWpe, -1), T_, C_, Tensor::PosTable, none, std_w, 0, true, true);
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
    using T = Tensor;
    using L = Linear;
    add_param(p("ln1w"), key_of(kLn1W, l), C_, 1, T::Norm, none, 0, 1, false, true);
    add_param(p("ln1b"), key_of(kLn1B, l), C_, 1, T::Norm, none, 0, 0, false, true);
    add_param(p("qkvw"), key_of(kQkvW, l), 3 * C_, C_, T::Weight, L::Qkv, std_w, 0, true, true);
    add_param(p("qkvb"), key_of(kQkvB, l), 3 * C_, 1, T::Bias, L::Qkv, 0, 0, false, true);
    add_param(p("attprojw"), key_of(kAttProjW, l), C_, C_, T::Weight, L::AttProj, std_proj, 0, true, true);
    add_param(p("attprojb"), key_of(kAttProjB, l), C_, 1, T::Bias, L::AttProj, 0, 0, false, true);
    add_param(p("ln2w"), key_of(kLn2W, l), C_, 1, T::Norm, none, 0, 1, false, true);
    add_param(p("ln2b"), key_of(kLn2B, l), C_, 1, T::Norm, none, 0, 0, false, true);
    add_param(p("fcw"), key_of(kFcW, l), 4 * C_, C_, T::Weight, L::Fc, std_w, 0, true, true);
    add_param(p("fcb"), key_of(kFcB, l), 4 * C_, 1, T::Bias, L::Fc, 0, 0, false, true);
    add_param(p("fcprojw"), key_of(kFcProjW, l), C_, 4 * C_, T::Weight, L::FcProj, std_proj, 0, true, true);
    add_param(p("fcprojb"), key_of(kFcProjB, l), C_, 1, T::Bias, L::FcProj, 0, 0, false, true);
  }
  final_offset_ = params.size();
  if (last()) {
    add_param("lnfw", key_of(kLnfW, -1), C_, 1, Tensor::Norm, none, 0, 1, false, true);
    add_param("lnfb", key_of(kLnfB, -1), C_, 1, Tensor::Norm, none, 0, 0, false, true);
    if (!cfg.tied) {
      add_param("lm_head", key_of(kHead, -1), Vp, C_, Tensor::TokenTable, none, std_w, 0, true, true);
    } else if (!first()) {
      // The last stage's copy of the tied embedding: same values as stage 0's,
      // its gradient summed with stage 0's; counted in the norm only there.
      add_param("wte", key_of(kWte, -1), Vp, C_, Tensor::TokenTable, none, std_w, 0, true, false);
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
    LayerParams p{P(i),     P(i + 1), P(i + 2), P(i + 3), P(i + 4),  P(i + 5),
                  P(i + 6), P(i + 7), P(i + 8), P(i + 9), P(i + 10), P(i + 11)};
    LayerParams g{G(i),     G(i + 1), G(i + 2), G(i + 3), G(i + 4),  G(i + 5),
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
  const size_t NC = static_cast<size_t>(Nr_) * Cr_;
  dres_.assign(NC, 0.0f);
  grad_in_.assign(NC, 0.0f);
  dln_.assign(NC, 0.0f);
  tmp_.assign(NC, 0.0f);
  dqkv_.assign(static_cast<size_t>(Ni_) * sh.qkv, 0.0f);
  datt_.assign(static_cast<size_t>(T_) * T_, 0.0f);
  datty_.assign(static_cast<size_t>(Ni_) * sh.att, 0.0f);
  dfch_.assign(static_cast<size_t>(Ni_) * sh.fc, 0.0f);
  dfg_.assign(static_cast<size_t>(Ni_) * sh.fc, 0.0f);
  if (last()) dlogits_.assign(static_cast<size_t>(Ni_) * sh.vocab, 0.0f);
}

void Stage::add_param(const std::string& name, uint64_t key, int rows, int cols, Tensor t, Linear which, float std,
                      float value, bool decay, bool in_norm) {
  ParamSpec s;
  s.name = name;
  s.key = key;
  s.rows = rows;
  s.cols = cols;
  s.init_std = std;
  s.init_value = value;
  s.decay = decay;
  s.in_norm = in_norm;
  tp_->place(&s, t, which);
  s.offset = params.size();
  s.size = static_cast<size_t>(s.local_rows) * s.local_cols;
  params.resize(params.size() + s.size);
  specs_.push_back(s);
}

void Stage::init_params() {
  for (const auto& s : specs_) {
    float* p = params.data() + s.offset;
    for (size_t i = 0; i < s.size; i++) {
      p[i] = s.init_std > 0 ? s.init_std * normal_at(cfg_.seed, s.key, global_index(s, i)) : s.init_value;
    }
  }
}

size_t Stage::activation_bytes() const {
  size_t bytes = 0;
  for (const Slot& s : slots_) {
    bytes += s.mem.size() * sizeof(float) + (s.tokens.size() + s.targets.size()) * sizeof(int32_t);
  }
  return bytes;
}

void Stage::build_slot(Slot& s) {
  const TpShapes& sh = tp_->shapes();
  const size_t NC = static_cast<size_t>(Nr_) * Cr_, Nr = Nr_, Ni = Ni_;
  const size_t att = static_cast<size_t>(Bi_) * sh.heads * T_ * T_;
  const size_t saved = sh.saved[0] + sh.saved[1] + sh.saved[2] + sh.saved[3];
  const size_t per_layer = 5 * NC + 4 * Nr + Ni * (sh.qkv + sh.att + 2 * sh.fc) + att + saved;
  size_t total = NC + per_layer * range_.count();
  if (last()) total += NC + 2 * Nr + Ni * sh.vocab + 4 * Ni + sh.saved[4];
  s.mem.assign(total, 0.0f);
  float* p = s.mem.data();
  auto take = [&](size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  s.input = take(NC);
  for (int l = 0; l < range_.count(); l++) {
    LayerActs a;
    a.ln1 = take(NC);
    a.ln1_mean = take(Nr);
    a.ln1_rstd = take(Nr);
    a.qkv = take(Ni * sh.qkv);
    a.att = take(att);
    a.atty = take(Ni * sh.att);
    a.res2 = take(NC);
    a.ln2 = take(NC);
    a.ln2_mean = take(Nr);
    a.ln2_rstd = take(Nr);
    a.fch = take(Ni * sh.fc);
    a.fch_gelu = take(Ni * sh.fc);
    a.out = take(NC);
    for (int k = 0; k < 4; k++) a.saved[k] = take(sh.saved[k]);
    s.layers.push_back(a);
  }
  if (last()) {
    s.lnf = take(NC);
    s.lnf_mean = take(Nr);
    s.lnf_rstd = take(Nr);
    s.logits = take(Ni * sh.vocab);
    s.rowmax = take(Ni);
    s.ce = take(2 * Ni);  // sumexp then target logit: reduced together
    s.losses = take(Ni);
    s.head_saved = take(sh.saved[4]);
  }
  const size_t N = static_cast<size_t>(B_) * T_;
  s.tokens.assign(N, 0);
  s.targets.assign(N, 0);
}

const float* Stage::output(int slot) const {
  const Slot& s = slots_[slot];
  return s.layers.empty() ? s.input : s.layers.back().out;
}

void Stage::token_logits(int slot, int b, int t, float* out) {
  tp_->token_logits(slots_[slot].logits, b, t, cfg_.vocab, out);
}

void Stage::zero_grads() { std::fill(grads.begin(), grads.end(), 0.0f); }

void Stage::finish_grads() { tp_->finish_grads(grads.data(), specs_.data(), specs_.size()); }

float Stage::forward(int slot, const int32_t* tokens, const int32_t* targets, const std::function<void(size_t)>& need) {
  Slot& s = slots_[slot];
  const int nl = range_.count();
  auto need_until = [&](size_t hi) {
    if (need) need(hi);
  };
  TpScheme& tp = *tp_;
  const TpShapes& sh = tp.shapes();
  const size_t NC = static_cast<size_t>(Nr_) * Cr_;
  if (first()) {
    need_until(nl ? layer_offset_[0] : final_offset_);
    std::memcpy(s.tokens.data(), tokens, sizeof(int32_t) * B_ * T_);
    tp.embed_forward(s.input, tokens, wte_, wpe_);
  }
  const float* x = s.input;
  for (int l = 0; l < nl; l++) {
    need_until(l + 1 < nl ? layer_offset_[l + 1] : final_offset_);
    const LayerParams& p = lp_[l];
    LayerActs& a = s.layers[l];
    tp.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b);
    tp.linear_forward(Linear::Qkv, a.qkv, a.ln1, a.saved[0], p.qkvw, p.qkvb);
    attention_forward(a.atty, a.att, a.qkv, Bi_, T_, sh.att, sh.heads);  // local heads
    tp.linear_forward(Linear::AttProj, tmp_.data(), a.atty, a.saved[1], p.attprojw, p.attprojb);
    residual_forward(a.res2, x, tmp_.data(), NC);
    tp.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b);
    tp.linear_forward(Linear::Fc, a.fch, a.ln2, a.saved[2], p.fcw, p.fcb);
    gelu_forward(a.fch_gelu, a.fch, static_cast<size_t>(Ni_) * sh.fc);
    tp.linear_forward(Linear::FcProj, tmp_.data(), a.fch_gelu, a.saved[3], p.fcprojw, p.fcprojb);
    residual_forward(a.out, a.res2, tmp_.data(), NC);
    x = a.out;
  }
  need_until(params.size());
  if (!last()) return 0.0f;

  std::memcpy(s.targets.data(), targets, sizeof(int32_t) * B_ * T_);
  tp.layernorm_forward(s.lnf, s.lnf_mean, s.lnf_rstd, x, lnfw_, lnfb_);
  tp.linear_forward(Linear::Head, s.logits, s.lnf, s.head_saved, head_, nullptr);
  return tp.cross_entropy_forward(s.rowmax, s.ce, s.losses, s.logits, targets);
}

void Stage::backward(int slot, float loss_scale, const std::function<void(size_t)>& ready) {
  Slot& s = slots_[slot];
  TpScheme& tp = *tp_;
  const TpShapes& sh = tp.shapes();
  const size_t NC = static_cast<size_t>(Nr_) * Cr_;
  const int nl = range_.count();
  const float* x_last = nl ? s.layers[nl - 1].out : s.input;

  if (last()) {
    tp.cross_entropy_backward(dlogits_.data(), s.logits, s.rowmax, s.ce, s.targets.data(), loss_scale / (B_ * T_));
    tp.linear_backward(Linear::Head, dln_.data(), dlogits_.data(), s.lnf, s.head_saved, head_, ghead_, nullptr);
    std::fill(dres_.begin(), dres_.end(), 0.0f);
    tp.layernorm_backward(dres_.data(), glnfw_, glnfb_, dln_.data(), x_last, lnfw_, s.lnf_mean, s.lnf_rstd);
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
    tp.linear_backward(Linear::FcProj, dfg_.data(), dres_.data(), a.fch_gelu, a.saved[3], p.fcprojw, g.fcprojw,
                       g.fcprojb);
    gelu_backward(dfch_.data(), a.fch, dfg_.data(), static_cast<size_t>(Ni_) * sh.fc);
    tp.linear_backward(Linear::Fc, dln_.data(), dfch_.data(), a.ln2, a.saved[2], p.fcw, g.fcw, g.fcb);
    tp.layernorm_backward(dres_.data(), g.ln2w, g.ln2b, dln_.data(), a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd);
    // Attention: dres is now dL/d(res2).
    tp.linear_backward(Linear::AttProj, datty_.data(), dres_.data(), a.atty, a.saved[1], p.attprojw, g.attprojw,
                       g.attprojb);
    attention_backward(dqkv_.data(), datt_.data(), datty_.data(), a.qkv, a.att, Bi_, T_, sh.att, sh.heads);
    tp.linear_backward(Linear::Qkv, dln_.data(), dqkv_.data(), a.ln1, a.saved[0], p.qkvw, g.qkvw, g.qkvb);
    tp.layernorm_backward(dres_.data(), g.ln1w, g.ln1b, dln_.data(), x, p.ln1w, a.ln1_mean, a.ln1_rstd);
    if (ready) ready(layer_offset_[l]);
  }

  if (first()) {
    tp.embed_backward(gwte_, gwpe_, dres_.data(), s.tokens.data());
    if (ready) ready(0);
  }
}

}  // namespace meshtrain
