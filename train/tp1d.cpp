// Megatron 1D tensor parallelism (section 5.1 of the algorithms notes). The
// residual stream and LayerNorm are replicated; QKV, FC and the head are
// column-parallel, the two projections row-parallel. Communication is the two
// conjugate operators:
//   f = copy to the tensor-parallel region: forward identity, backward all-reduce;
//   g = reduce from the region: forward all-reduce, backward identity.
// f's backward all-reduce is started before the weight-gradient GEMM and
// waited for after it, so the two overlap.
#include <algorithm>

#include "kernels.h"
#include "param.h"
#include "tp.h"

namespace meshtrain {

namespace {

// f: forward identity; backward: the input gradient summed over the group,
// started here and waited for by the caller, who computes in between.
struct CopyToRegion {
  Comm* comm = nullptr;
  Work backward(float* grad, size_t n) {
    return comm ? comm->all_reduce(grad, n, ReduceOp::Sum, Urgency::critical()) : Work();
  }
};

// g: forward sum over the group; backward identity.
struct ReduceFromRegion {
  Comm* comm = nullptr;
  void forward(float* buf, size_t n) {
    if (comm) comm->all_reduce(buf, n, ReduceOp::Sum, Urgency::critical()).wait();
  }
};

bool column_parallel(Linear k) { return k == Linear::Qkv || k == Linear::Fc || k == Linear::Head; }

class Tp1d final : public TpScheme {
 public:
  Tp1d(const ModelConfig& m, int tp, int rank, int B) : tp_(tp), rank_(rank), B_(B), T_(m.seq), C_(m.d_model) {
    N_ = B * m.seq;
    sh_.seqs = B;
    sh_.width = C_;
    sh_.inner_seqs = B;
    sh_.heads = m.heads / tp;
    sh_.qkv = 3 * C_ / tp;
    sh_.att = C_ / tp;
    sh_.fc = 4 * C_ / tp;
    sh_.vocab = padded_vocab(m.vocab, tp) / tp;
    sh_.vocab_lo = rank * sh_.vocab;
    sh_.vocab_valid = std::max(0, std::min(sh_.vocab, m.vocab - sh_.vocab_lo));
  }

  const TpShapes& shapes() const override { return sh_; }
  void set_comms(const TpComms& c) override {
    comm_ = c.group;
    f_.comm = c.group;
    g_.comm = c.group;
  }

  void place(ParamSpec* s, Tensor t, Linear which) const override {
    s->local_rows = s->rows;
    s->local_cols = s->cols;
    bool sharded = false;
    if (t == Tensor::TokenTable) {
      sharded = true;  // vocab-parallel rows
      s->row_slices = tp_, s->row_slice = rank_;
    } else if ((t == Tensor::Weight || t == Tensor::Bias) && column_parallel(which)) {
      sharded = true;
      s->row_slices = tp_, s->row_slice = rank_;
      s->qkv = which == Linear::Qkv;
    } else if (t == Tensor::Weight) {  // row-parallel: input columns
      sharded = true;
      s->col_parts = tp_, s->col_part = rank_;
    }
    s->local_rows = s->rows / s->row_slices;
    s->local_cols = s->cols / s->col_parts;
    // Replicated tensors count once per group in the global norm.
    if (!sharded) s->in_norm = s->in_norm && rank_ == 0;
  }

  void embed_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe) override {
    // g on the vocab-parallel lookup: rows outside this slice are zero.
    embedding_forward(out, tokens, wte, N_, C_, sh_.vocab_lo, sh_.vocab);
    g_.forward(out, static_cast<size_t>(N_) * C_);
    position_forward(out, wpe, B_, T_, C_);
  }

  void embed_backward(float* dwte, float* dwpe, const float* dres, const int32_t* tokens) override {
    position_backward(dwpe, dres, B_, T_, C_);
    embedding_backward(dwte, dres, tokens, N_, C_, sh_.vocab_lo, sh_.vocab);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                         const float* b) override {
    meshtrain::layernorm_forward(out, mean, rstd, in, w, b, N_, C_);
  }
  void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                          const float* mean, const float* rstd) override {
    meshtrain::layernorm_backward(din, dw, db, dout, in, w, mean, rstd, N_, C_);
  }

  void linear_forward(Linear k, float* out, const float* in, float*, const float* W, const float* b) override {
    int IC = 0, OC = 0;
    dims(k, &IC, &OC);
    if (column_parallel(k)) {  // f (identity) then the local columns
      matmul_forward(out, in, W, b, N_, IC, OC);
    } else {  // the local partial product, g, then the bias once
      matmul_forward(out, in, W, nullptr, N_, IC, OC);
      g_.forward(out, static_cast<size_t>(N_) * OC);
      if (b) add_bias(out, b, N_, OC);
    }
  }

  void linear_backward(Linear k, float* din, const float* dout, const float* in, const float*, const float* W,
                       float* dW, float* db) override {
    int IC = 0, OC = 0;
    dims(k, &IC, &OC);
    if (column_parallel(k)) {
      // f's backward: the input gradient's sum runs while dW is computed.
      matmul_backward_input(din, dout, W, N_, IC, OC);
      Work sum = f_.backward(din, static_cast<size_t>(N_) * IC);
      matmul_backward_weight(dW, db, dout, in, N_, IC, OC);
      sum.wait();
    } else {  // g's backward is the identity
      matmul_backward(din, dW, db, dout, in, W, N_, IC, OC);
    }
  }

  float cross_entropy_forward(float* rowmax, float* ce, float* losses, const float* logits,
                              const int32_t* targets) override {
    const int V = sh_.vocab;
    ce_rowmax(rowmax, logits, N_, V, sh_.vocab_valid);
    if (comm_) comm_->all_reduce(rowmax, N_, ReduceOp::Max, Urgency::critical()).wait();
    ce_sumexp_target(ce, ce + N_, logits, rowmax, targets, N_, V, sh_.vocab_valid, sh_.vocab_lo);
    if (comm_) comm_->all_reduce(ce, 2 * static_cast<size_t>(N_), ReduceOp::Sum, Urgency::critical()).wait();
    ce_loss(losses, ce, rowmax, ce + N_, N_);
    double sum = 0.0;
    for (int n = 0; n < N_; n++) sum += losses[n];
    return static_cast<float>(sum / N_);
  }

  void cross_entropy_backward(float* dlogits, const float* logits, const float* rowmax, const float* ce,
                              const int32_t* targets, float dloss) override {
    ce_backward(dlogits, logits, rowmax, ce, targets, dloss, N_, sh_.vocab, sh_.vocab_valid, sh_.vocab_lo);
  }

  void token_logits(const float* logits, int b, int t, int vocab, float* out) override {
    std::fill(out, out + vocab, 0.0f);
    const float* row = logits + (static_cast<size_t>(b) * T_ + t) * sh_.vocab;
    std::copy_n(row, sh_.vocab_valid, out + sh_.vocab_lo);
    if (comm_) comm_->all_reduce(out, vocab, ReduceOp::Sum, Urgency::critical()).wait();
  }

  // Replicated tensors get identical gradients on every rank (their inputs'
  // gradients were summed by f), so there is nothing to complete.
  void finish_grads(float*, const ParamSpec*, size_t) override {}

 private:
  void dims(Linear k, int* IC, int* OC) const {
    switch (k) {
      case Linear::Qkv: *IC = C_, *OC = sh_.qkv; break;
      case Linear::AttProj: *IC = sh_.att, *OC = C_; break;
      case Linear::Fc: *IC = C_, *OC = sh_.fc; break;
      case Linear::FcProj: *IC = sh_.fc, *OC = C_; break;
      default: *IC = C_, *OC = sh_.vocab; break;
    }
  }

  int tp_, rank_, B_, T_, C_, N_;
  TpShapes sh_;
  Comm* comm_ = nullptr;
  CopyToRegion f_;
  ReduceFromRegion g_;
};

}  // namespace

std::unique_ptr<TpScheme> make_tp1d(const ModelConfig& m, int tp, int tp_rank, int micro_batch) {
  return std::make_unique<Tp1d>(m, tp, tp_rank, micro_batch);
}

std::unique_ptr<TpScheme> make_tp_scheme(const ModelConfig& m, const Layout& l, int tp_rank, int micro_batch) {
  if (l.tp_mode == TpMode::ThreeD) return make_tp3d(m, l.cube(), tp_rank, micro_batch);
  return make_tp1d(m, l.tp, tp_rank, micro_batch);
}

}  // namespace meshtrain
