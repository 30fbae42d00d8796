// Colossal-AI 3D tensor parallelism (Bian et al., arXiv 2105.14450; section
// 5.2 of the algorithms notes) over a q x q x q cube of ranks with axes I, W, O
// (cube coordinates (i, w, o), see grid.h).
//
// Activations are cut into q^2 blocks of whole sequences and q blocks of
// width. The residual stream holds tokens block (w, i) and width block o; the
// inner layout tokens block (w, o) and width block i. A linear whose input
// width is cut along axis h (O for the residual stream, I for the inner
// layout; s is the other of the two) computes
//   forward:  X gathered over s (tokens), W gathered over W (rows),
//             local GEMM, partial sums reduce-scattered over h (tokens);
//   backward: dY gathered over h; dX = dY W reduce-scattered over s;
//             dW = dY^T X reduce-scattered over W.
// so its output comes out in the other layout, as the next linear expects
// (the reference code's swap of input and output groups). A weight of shape
// (OC, IC) is cut into rows block (c_s, w) of OC/q^2 and columns block c_h of
// IC/q: every element lives on one rank. Biases, LayerNorm parameters and the
// position table hold a width block replicated over a plane of the cube; their
// partial gradients are summed over that plane in finish_grads.
//
// LayerNorm sums its per-token statistics over O; the token table is cut into
// q^2 vocabulary blocks x q width blocks (lookup partial sums reduce-scattered
// over W then I); the head is a 3D linear, and cross-entropy reduces its
// per-token max and sums over I, where the vocabulary is cut.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "param.h"
#include "tp.h"

namespace meshtrain {

namespace {

constexpr int kSyncW = 1 << kAxisW, kSyncI = 1 << kAxisI;

class Tp3d final : public TpScheme {
 public:
  Tp3d(const ModelConfig& m, int q, int rank, int B)
      : q_(q), c_(cube_coords(rank, q)), B_(B), T_(m.seq), C_(m.d_model) {
    N_ = B * T_;
    Nq_ = N_ / q;
    Nq2_ = N_ / (q * q);
    Vp_ = padded_vocab(m.vocab, q * q * q);
    sh_.seqs = B / (q * q);
    sh_.width = C_ / q;
    sh_.inner_seqs = B / (q * q);
    sh_.heads = m.heads / q;
    sh_.qkv = 3 * C_ / q;
    sh_.att = C_ / q;
    sh_.fc = 4 * C_ / q;
    sh_.vocab = Vp_ / q;
    sh_.vocab_lo = c_.i * sh_.vocab;
    sh_.vocab_valid = std::max(0, std::min(sh_.vocab, m.vocab - sh_.vocab_lo));
    size_t most_out = 0, most_w = 0, most_in = 0;
    for (int k = 0; k < static_cast<int>(Linear::kCount); k++) {
      const Dims d = dims(static_cast<Linear>(k));
      sh_.saved[k] = static_cast<size_t>(Nq_) * (d.IC / q) + static_cast<size_t>(d.OC / q) * (d.IC / q);
      most_out = std::max(most_out, static_cast<size_t>(Nq_) * (d.OC / q));
      most_in = std::max(most_in, static_cast<size_t>(Nq_) * (d.IC / q));
      most_w = std::max(most_w, static_cast<size_t>(d.OC / q) * (d.IC / q));
    }
    // The embedding's partial lookups cover the whole micro-batch.
    most_out = std::max(most_out, static_cast<size_t>(N_) * (C_ / q));
    part_.assign(most_out, 0.0f);
    gath_.assign(most_out, 0.0f);
    din_.assign(most_in, 0.0f);
    dw_.assign(most_w, 0.0f);
    dw_local_.assign(most_w / q, 0.0f);
    stats_.assign(2 * static_cast<size_t>(Nq2_), 0.0f);
  }

  const TpShapes& shapes() const override { return sh_; }
  void set_comms(const TpComms& c) override { tc_ = c; }

  void place(ParamSpec* s, Tensor t, Linear which) const override {
    s->sync = 0;
    switch (t) {
      case Tensor::TokenTable: {
        // Rows: vocabulary block (i, w) of Vp/q^2 (so that gathering over W
        // gives the head's block i); columns: width block o.
        s->row_slices = q_, s->row_slice = c_.i, s->row_subs = q_, s->row_sub = c_.w;
        s->col_parts = q_, s->col_part = c_.o;
        break;
      }
      case Tensor::PosTable:
        s->col_parts = q_, s->col_part = c_.o;
        replicated(s, kAxisW, kAxisI, kSyncW | kSyncI);
        break;
      case Tensor::Norm:
        s->row_slices = q_, s->row_slice = c_.o;
        replicated(s, kAxisW, kAxisI, kSyncW | kSyncI);
        break;
      case Tensor::Weight: {
        const Dims d = dims(which);
        s->row_slices = q_, s->row_slice = c_.axis(d.s), s->row_subs = q_, s->row_sub = c_.w;
        s->qkv = which == Linear::Qkv;
        s->col_parts = q_, s->col_part = c_.axis(d.h);
        break;
      }
      case Tensor::Bias: {
        // Added to the output (width block c_s); its gradient is summed over
        // the tokens of the W group here and is the same along h.
        const Dims d = dims(which);
        s->row_slices = q_, s->row_slice = c_.axis(d.s);
        s->qkv = which == Linear::Qkv;
        replicated(s, kAxisW, d.h, kSyncW);
        break;
      }
    }
    s->local_rows = s->rows / (s->row_slices * s->row_subs);
    s->local_cols = s->cols / s->col_parts;
  }

  void embed_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe) override {
    const int Cq = C_ / q_, Vl = Vp_ / (q_ * q_);
    const int lo = (c_.i * q_ + c_.w) * Vl;
    // Partial lookups of the whole micro-batch in this rank's vocabulary
    // block, summed and scattered over W (token block w), then over I.
    embedding_forward(part_.data(), tokens, wte, N_, Cq, lo, Vl);
    reduce_scatter(kAxisW, part_.data(), gath_.data(), static_cast<size_t>(Nq_) * Cq);
    reduce_scatter(kAxisI, gath_.data(), out, static_cast<size_t>(Nq2_) * Cq);
    position_forward(out, wpe, sh_.seqs, T_, Cq);
  }

  void embed_backward(float* dwte, float* dwpe, const float* dres, const int32_t* tokens) override {
    const int Cq = C_ / q_, Vl = Vp_ / (q_ * q_);
    const int lo = (c_.i * q_ + c_.w) * Vl;
    position_backward(dwpe, dres, sh_.seqs, T_, Cq);
    all_gather(kAxisI, dres, gath_.data(), static_cast<size_t>(Nq2_) * Cq);
    all_gather(kAxisW, gath_.data(), part_.data(), static_cast<size_t>(Nq_) * Cq);
    embedding_backward(dwte, part_.data(), tokens, N_, Cq, lo, Vl);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                         const float* b) override {
    const int Cq = C_ / q_, N = Nq2_;
    for (int n = 0; n < N; n++) {
      const float* x = in + static_cast<size_t>(n) * Cq;
      float s = 0.0f;
      for (int k = 0; k < Cq; k++) s += x[k];
      mean[n] = s;
    }
    all_reduce(kAxisO, mean, N);
    for (int n = 0; n < N; n++) {
      const float* x = in + static_cast<size_t>(n) * Cq;
      const float m = mean[n] / C_;
      mean[n] = m;
      float v = 0.0f;
      for (int k = 0; k < Cq; k++) v += (x[k] - m) * (x[k] - m);
      rstd[n] = v;
    }
    all_reduce(kAxisO, rstd, N);
    for (int n = 0; n < N; n++) {
      const float* x = in + static_cast<size_t>(n) * Cq;
      float* o = out + static_cast<size_t>(n) * Cq;
      const float m = mean[n], r = 1.0f / std::sqrt(rstd[n] / C_ + 1e-5f);
      rstd[n] = r;
      for (int k = 0; k < Cq; k++) o[k] = (x[k] - m) * r * w[k] + b[k];
    }
  }

  void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                          const float* mean, const float* rstd) override {
    const int Cq = C_ / q_, N = Nq2_;
    float* sums = stats_.data();  // [sum dnorm | sum dnorm * norm] per token
    for (int n = 0; n < N; n++) {
      const float* d = dout + static_cast<size_t>(n) * Cq;
      const float* x = in + static_cast<size_t>(n) * Cq;
      float a = 0.0f, c = 0.0f;
      for (int k = 0; k < Cq; k++) {
        const float norm = (x[k] - mean[n]) * rstd[n], dnorm = w[k] * d[k];
        a += dnorm;
        c += dnorm * norm;
      }
      sums[n] = a;
      sums[N + n] = c;
    }
    all_reduce(kAxisO, sums, 2 * static_cast<size_t>(N));
    for (int n = 0; n < N; n++) {
      const float* d = dout + static_cast<size_t>(n) * Cq;
      const float* x = in + static_cast<size_t>(n) * Cq;
      float* dx = din + static_cast<size_t>(n) * Cq;
      const float m1 = sums[n] / C_, m2 = sums[N + n] / C_;
      for (int k = 0; k < Cq; k++) {
        const float norm = (x[k] - mean[n]) * rstd[n], dnorm = w[k] * d[k];
        db[k] += d[k];
        dw[k] += norm * d[k];
        dx[k] += (dnorm - m1 - norm * m2) * rstd[n];
      }
    }
  }

  void linear_forward(Linear k, float* out, const float* in, float* saved, const float* W, const float* b) override {
    const Dims d = dims(k);
    const int ICq = d.IC / q_, OCq = d.OC / q_;
    float* xg = saved;                                   // [N/q, IC/q]
    float* wg = saved + static_cast<size_t>(Nq_) * ICq;  // [OC/q, IC/q]
    all_gather(d.s, in, xg, static_cast<size_t>(Nq2_) * ICq);
    all_gather(kAxisW, W, wg, static_cast<size_t>(OCq / q_) * ICq);
    matmul_forward(part_.data(), xg, wg, nullptr, Nq_, ICq, OCq);
    reduce_scatter(d.h, part_.data(), out, static_cast<size_t>(Nq2_) * OCq);
    if (b) add_bias(out, b, Nq2_, OCq);
  }

  // W itself is not needed: forward kept the gathered weight in `saved`.
  void linear_backward(Linear k, float* din, const float* dout, const float*, const float* saved, const float*,
                       float* dW, float* db) override {
    const Dims d = dims(k);
    const int ICq = d.IC / q_, OCq = d.OC / q_;
    const float* xg = saved;
    const float* wg = saved + static_cast<size_t>(Nq_) * ICq;
    float* dyg = gath_.data();  // [N/q, OC/q]
    all_gather(d.h, dout, dyg, static_cast<size_t>(Nq2_) * OCq);
    if (din) {
      matmul_backward_input(din_.data(), dyg, wg, Nq_, ICq, OCq);
      reduce_scatter(d.s, din_.data(), din, static_cast<size_t>(Nq2_) * ICq);
    }
    const size_t wn = static_cast<size_t>(OCq) * ICq;
    std::fill(dw_.begin(), dw_.begin() + wn, 0.0f);
    matmul_backward_weight(dw_.data(), db, dyg, xg, Nq_, ICq, OCq);
    reduce_scatter(kAxisW, dw_.data(), dw_local_.data(), wn / q_);
    add_inplace(dW, dw_local_.data(), wn / q_);
  }

  float cross_entropy_forward(float* rowmax, float* ce, float* losses, const float* logits,
                              const int32_t* targets) override {
    const int N = Nq2_, V = sh_.vocab;
    const int32_t* tg = targets + first_inner_token();
    ce_rowmax(rowmax, logits, N, V, sh_.vocab_valid);
    if (Comm* c = tc_.axis[kAxisI]) c->all_reduce(rowmax, N, ReduceOp::Max, Urgency::critical()).wait();
    ce_sumexp_target(ce, ce + N, logits, rowmax, tg, N, V, sh_.vocab_valid, sh_.vocab_lo);
    all_reduce(kAxisI, ce, 2 * static_cast<size_t>(N));
    ce_loss(losses, ce, rowmax, ce + N, N);
    double sum = 0.0;
    for (int n = 0; n < N; n++) sum += losses[n];
    // The other token blocks live along W and O.
    float total = static_cast<float>(sum);
    all_reduce(kAxisW, &total, 1);
    all_reduce(kAxisO, &total, 1);
    return total / N_;
  }

  void cross_entropy_backward(float* dlogits, const float* logits, const float* rowmax, const float* ce,
                              const int32_t* targets, float dloss) override {
    ce_backward(dlogits, logits, rowmax, ce, targets + first_inner_token(), dloss, Nq2_, sh_.vocab, sh_.vocab_valid,
                sh_.vocab_lo);
  }

  void token_logits(const float* logits, int b, int t, int vocab, float* out) override {
    std::fill(out, out + vocab, 0.0f);
    const int n = b * T_ + t - first_inner_token();
    if (n >= 0 && n < Nq2_) {
      std::copy_n(logits + static_cast<size_t>(n) * sh_.vocab, sh_.vocab_valid, out + sh_.vocab_lo);
    }
    if (tc_.group) tc_.group->all_reduce(out, vocab, ReduceOp::Sum, Urgency::critical()).wait();
  }

  void finish_grads(float* grads, const ParamSpec* specs, size_t n) override {
    for (size_t k = 0; k < n; k++) {
      for (int a = 0; a < 3; a++) {
        if (specs[k].sync & (1 << a)) all_reduce(a, grads + specs[k].offset, specs[k].size);
      }
    }
  }

 private:
  struct Dims {
    int IC, OC;
    int h, s;  // axis cutting the input width, and the other one
  };
  Dims dims(Linear k) const {
    switch (k) {
      case Linear::Qkv: return {C_, 3 * C_, kAxisO, kAxisI};
      case Linear::AttProj: return {C_, C_, kAxisI, kAxisO};
      case Linear::Fc: return {C_, 4 * C_, kAxisO, kAxisI};
      case Linear::FcProj: return {4 * C_, C_, kAxisI, kAxisO};
      default: return {C_, Vp_, kAxisO, kAxisI};
    }
  }

  // A tensor replicated over the plane of axes a and b: counted in the norm
  // once, its gradient summed over the axes in `sync`.
  void replicated(ParamSpec* s, int a, int b, int sync) const {
    s->in_norm = s->in_norm && c_.axis(a) == 0 && c_.axis(b) == 0;
    s->sync = sync;
  }

  // First micro-batch token of the inner layout's block (w, o).
  int first_inner_token() const { return (c_.w * q_ + c_.o) * Nq2_; }

  void all_gather(int axis, const float* in, float* out, size_t n) {
    if (Comm* c = tc_.axis[axis]) {
      c->all_gather(in, out, n, Urgency::critical()).wait();
    } else {
      std::memcpy(out, in, n * sizeof(float));
    }
  }
  void reduce_scatter(int axis, const float* in, float* out, size_t n) {
    if (Comm* c = tc_.axis[axis]) {
      c->reduce_scatter(in, out, n, Urgency::critical()).wait();
    } else {
      std::memcpy(out, in, n * sizeof(float));
    }
  }
  void all_reduce(int axis, float* buf, size_t n) {
    if (Comm* c = tc_.axis[axis]) c->all_reduce(buf, n, ReduceOp::Sum, Urgency::critical()).wait();
  }

  int q_;
  CubeCoords c_;
  int B_, T_, C_, N_, Nq_, Nq2_, Vp_;
  TpShapes sh_;
  TpComms tc_;
  std::vector<float> part_, gath_, din_, dw_, dw_local_, stats_;
};

}  // namespace

std::unique_ptr<TpScheme> make_tp3d(const ModelConfig& m, int q, int tp_rank, int micro_batch) {
  return std::make_unique<Tp3d>(m, q, tp_rank, micro_batch);
}

}  // namespace meshtrain
