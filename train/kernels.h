// Forward/backward kernels of the GPT block, fp32, row-major, written as pairs.
//
// Shapes: N = B*T tokens, C = model width, OC/IC = output/input features of a
// linear layer whose weight is stored (OC, IC) as in GPT-2. Backward kernels
// accumulate (+=) into parameter gradients and into input gradients unless the
// comment says otherwise, so micro-batches and residual branches simply add up.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain {

// out[N,C] = wte[tok - vocab_lo] for tokens in [vocab_lo, vocab_lo + V_local),
// zero otherwise (vocab-parallel lookup; the tensor-parallel sum completes it).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int vocab_lo, int V_local);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int vocab_lo, int V_local);
// out[b,t,:] += wpe[t,:]
void position_forward(float* out, const float* wpe, int B, int T, int C);
void position_backward(float* dwpe, const float* dout, int B, int T, int C);

// out = (x - mean) * rstd * w + b over the last dimension; mean/rstd saved.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C);
// dinp += ..., dw += ..., db += ...
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,IC] * W[OC,IC]^T (+ bias)
void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC);
// dinp[N,IC] = dout * W (overwritten, not accumulated; may be null),
// dW += dout^T * inp, dbias += column sums of dout (may be null).
void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC);
// The two halves of matmul_backward, so that a reduction of dinp can run while
// the weight gradient is computed.
void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC);
void matmul_backward_weight(float* dW, float* dbias, const float* dout, const float* inp, int N, int IC, int OC);

// Causal multi-head self-attention over qkv[B,T,3*Cl], laid out per token as
// [Q heads | K heads | V heads], each of NH heads of size Cl/NH.
// att[B,NH,T,T] keeps the softmax probabilities for backward; out[B,T,Cl].
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int Cl, int NH);
// dqkv is overwritten; datt is scratch of T*T floats.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int Cl, int NH);

// GELU, tanh approximation (GPT-2).
void gelu_forward(float* out, const float* inp, size_t n);
// dinp = dout * gelu'(inp) (overwritten)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

void residual_forward(float* out, const float* a, const float* b, size_t n);
void add_inplace(float* dst, const float* src, size_t n);
void add_bias(float* out, const float* bias, int N, int C);

// Vocab-parallel softmax cross-entropy in three local passes separated by the
// tensor-parallel reductions (max, then sum):
//   1. rowmax[n] = max over the valid local logits (-inf if none are valid);
//   2. given the global max: sumexp[n] = sum exp(logit - max),
//      target[n] = logit of the target when it lives in this slice, else 0;
//   3. loss[n] = log(sumexp) + max - target.
// `valid` is how many local columns are real vocabulary (the rest is padding).
void ce_rowmax(float* rowmax, const float* logits, int N, int V_local, int valid);
void ce_sumexp_target(float* sumexp, float* target, const float* logits, const float* rowmax, const int32_t* targets,
                      int N, int V_local, int valid, int vocab_lo);
void ce_loss(float* losses, const float* sumexp, const float* rowmax, const float* target, int N);
// dlogits = (softmax - onehot) * dloss (overwritten; padded columns get 0).
void ce_backward(float* dlogits, const float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                 float dloss, int N, int V_local, int valid, int vocab_lo);

}  // namespace meshtrain
