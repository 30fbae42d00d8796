// Tensor-parallel schemes. A scheme says which slice of every tensor a rank
// holds and owns all communication around the layers, written as
// forward/backward duals (Megatron's copy-to-region `f` and
// reduce-from-region `g`; Colossal-AI's gathers and reduce-scatters along the
// cube's axes). The layer math in model.cpp calls only the operations below and
// the local kernels, so adding a scheme never touches the layers.
//
// Activations come in two layouts. The residual stream (embedding output,
// LayerNorm in and out, block outputs, what pipeline stages exchange) and the
// inner layout (attention heads, MLP hidden units, logits). Every linear maps
// one layout to the other: QKV, FC and the head go residual -> inner, the
// attention and MLP projections inner -> residual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm.h"
#include "grid.h"

namespace meshtrain {

struct ParamSpec;

// Communicators a scheme may use; null where a group has one rank.
struct TpComms {
  Comm* group = nullptr;                        // every tensor-parallel rank
  Comm* axis[3] = {nullptr, nullptr, nullptr};  // 3D: along the I, W and O axes (CubeAxis)
};

enum class Linear { Qkv = 0, AttProj, Fc, FcProj, Head, kCount };

// What a parameter is, for the scheme to place it.
enum class Tensor {
  TokenTable,  // wte / lm_head: (padded vocab, C)
  PosTable,    // wpe: (T, C)
  Norm,        // LayerNorm weight or bias: (C, 1), residual layout
  Weight,      // weight of a linear: (OC, IC)
  Bias,        // bias of a linear: (OC, 1)
};

// Local sizes of one rank's slices (B = micro-batch sequences, T = seq).
struct TpShapes {
  int seqs = 0;                                         // sequences in the local residual tokens
  int width = 0;                                        // local width of the residual stream
  int inner_seqs = 0;                                   // sequences in the local tokens of the inner layout
  int heads = 0;                                        // local attention heads
  int qkv = 0, att = 0, fc = 0;                         // local widths of the QKV output, attention output, MLP hidden
  int vocab = 0;                                        // local logit columns
  int vocab_lo = 0;                                     // first vocabulary id of the local logit columns
  int vocab_valid = 0;                                  // how many local logit columns are real vocabulary
  size_t saved[static_cast<int>(Linear::kCount)] = {};  // floats a linear keeps for backward
};

class TpScheme {
 public:
  virtual ~TpScheme() = default;
  virtual const TpShapes& shapes() const = 0;
  virtual void set_comms(const TpComms& c) = 0;

  // Fills in the local shape and placement of a tensor whose logical shape,
  // name and key are already set. Linear weights and biases name their linear.
  virtual void place(ParamSpec* s, Tensor t, Linear which) const = 0;

  // Embedding: out (residual layout) = wte[tokens] + wpe. tokens: the whole micro-batch.
  virtual void embed_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe) = 0;
  // dres: gradient of the embedding output (residual layout). Accumulates.
  virtual void embed_backward(float* dwte, float* dwpe, const float* dres, const int32_t* tokens) = 0;

  // LayerNorm over the (possibly split) width of the residual stream.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* w,
                                 const float* b) = 0;
  // din += ..., dw += ..., db += ...
  virtual void layernorm_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w,
                                  const float* mean, const float* rstd) = 0;

  // out = in W^T (+ b) in the output layout; `saved` (shapes().saved floats)
  // keeps what backward needs beyond `in`. bias may be null.
  virtual void linear_forward(Linear k, float* out, const float* in, float* saved, const float* W, const float* b) = 0;
  // din is overwritten (may be null: not needed); dW and db accumulate (db may be null).
  virtual void linear_backward(Linear k, float* din, const float* dout, const float* in, const float* saved,
                               const float* W, float* dW, float* db) = 0;

  // Vocab-parallel cross-entropy over the local logits (inner layout).
  // targets: the whole micro-batch. ce: 2 x inner tokens of scratch; losses:
  // inner tokens. Returns the micro-batch's mean loss, on every rank.
  virtual float cross_entropy_forward(float* rowmax, float* ce, float* losses, const float* logits,
                                      const int32_t* targets) = 0;
  // dlogits = (softmax - onehot) * dloss, overwritten.
  virtual void cross_entropy_backward(float* dlogits, const float* logits, const float* rowmax, const float* ce,
                                      const int32_t* targets, float dloss) = 0;
  // The `vocab` logits of token (b, t) of the micro-batch, on every rank (collective).
  virtual void token_logits(const float* logits, int b, int t, int vocab, float* out) = 0;

  // After the step's backward passes: completes the gradients of tensors
  // that several ranks hold (partial sums on each). Collective.
  virtual void finish_grads(float* grads, const ParamSpec* specs, size_t n) = 0;
};

std::unique_ptr<TpScheme> make_tp_scheme(const ModelConfig& m, const Layout& l, int tp_rank, int micro_batch);
std::unique_ptr<TpScheme> make_tp1d(const ModelConfig& m, int tp, int tp_rank, int micro_batch);
std::unique_ptr<TpScheme> make_tp3d(const ModelConfig& m, int q, int tp_rank, int micro_batch);

}  // namespace meshtrain
