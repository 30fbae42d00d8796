#include "kernels.h"

#include <cblas.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace meshtrain {

namespace {

// expf that the compiler can vectorise (libm's expf is an opaque call): Cody-Waite
// range reduction to r in [-ln2/2, ln2/2], a degree-6 polynomial, and 2^n built in
// the exponent bits. Relative error ~2 ulp over the range used here; inputs below
// -87 flush to 0 (softmax and tanh never need them).
inline float vexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return p * scale;
}

inline float vtanh(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1); exact enough at both tails since vexp saturates.
  return 1.0f - 2.0f / (vexp(2.0f * x) + 1.0f);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int N, int C, int vocab_lo, int V_local) {
  for (int n = 0; n < N; n++) {
    const int local = tokens[n] - vocab_lo;
    float* o = out + static_cast<size_t>(n) * C;
    if (local >= 0 && local < V_local) {
      std::memcpy(o, wte + static_cast<size_t>(local) * C, sizeof(float) * C);
    } else {
      std::memset(o, 0, sizeof(float) * C);
    }
  }
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int vocab_lo,
                        int V_local) {
  for (int n = 0; n < N; n++) {
    const int local = tokens[n] - vocab_lo;
    if (local < 0 || local >= V_local) continue;
    add_inplace(dwte + static_cast<size_t>(local) * C, dout + static_cast<size_t>(n) * C, C);
  }
}

void position_forward(float* out, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++) add_inplace(out + static_cast<size_t>(b) * T * C, wpe, size_t(T) * C);
}

void position_backward(float* dwpe, const float* dout, int B, int T, int C) {
  for (int b = 0; b < B; b++) add_inplace(dwpe, dout + static_cast<size_t>(b) * T * C, size_t(T) * C);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  for (int n = 0; n < N; n++) {
    const float* x = inp + static_cast<size_t>(n) * C;
    float* o = out + static_cast<size_t>(n) * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= C;
    const float s = 1.0f / std::sqrt(v + 1e-5f);
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * w[i] + b[i];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int i = 0; i < C; i++) {
      const float norm = (x[i] - m) * s;
      const float dnorm = w[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int i = 0; i < C; i++) {
      const float norm = (x[i] - m) * s;
      const float dnorm = w[i] * d[i];
      db[i] += d[i];
      dw[i] += norm * d[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* W, const float* bias, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias) {
    for (int n = 0; n < N; n++) std::memcpy(out + static_cast<size_t>(n) * OC, bias, sizeof(float) * OC);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, W, IC, beta, out, OC);
}

void matmul_backward_input(float* dinp, const float* dout, const float* W, int N, int IC, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, W, IC, 0.0f, dinp, IC);
}

void matmul_backward_weight(float* dW, float* dbias, const float* dout, const float* inp, int N, int IC, int OC) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dW, IC);
  if (dbias) {
    for (int n = 0; n < N; n++) add_inplace(dbias, dout + static_cast<size_t>(n) * OC, OC);
  }
}

void matmul_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, const float* W, int N,
                     int IC, int OC) {
  if (dinp) matmul_backward_input(dinp, dout, W, N, IC, OC);
  matmul_backward_weight(dW, dbias, dout, inp, N, IC, OC);
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int Cl, int NH) {
  const int hs = Cl / NH;
  const int C3 = 3 * Cl;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + static_cast<size_t>(b) * T * C3 + h * hs;
      const float* k = q + Cl;
      const float* v = q + 2 * Cl;
      float* p = att + (static_cast<size_t>(b) * NH + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3, 0.0f, p, T);
      for (int t = 0; t < T; t++) {
        float* row = p + static_cast<size_t>(t) * T;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = 0; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) {
          row[j] = vexp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) row[j] *= inv;
        for (int j = t + 1; j < T; j++) row[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, C3, 0.0f,
                  out + static_cast<size_t>(b) * T * Cl + h * hs, Cl);
    }
  }
}

void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int B, int T,
                        int Cl, int NH) {
  const int hs = Cl / NH;
  const int C3 = 3 * Cl;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t tok0 = static_cast<size_t>(b) * T;
      const float* q = qkv + tok0 * C3 + h * hs;
      const float* k = q + Cl;
      const float* v = q + 2 * Cl;
      float* dq = dqkv + tok0 * C3 + h * hs;
      float* dk = dq + Cl;
      float* dv = dq + 2 * Cl;
      const float* p = att + (static_cast<size_t>(b) * NH + h) * T * T;
      const float* dO = dout + tok0 * Cl + h * hs;
      // dP = dO V^T, dV = P^T dO
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dO, Cl, v, C3, 0.0f, datt, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dO, Cl, 0.0f, dv, C3);
      // Softmax backward, row by row: dS = P * (dP - <dP, P>); masked entries have P = 0.
      for (int t = 0; t < T; t++) {
        float* drow = datt + static_cast<size_t>(t) * T;
        const float* prow = p + static_cast<size_t>(t) * T;
        float dot = 0.0f;
        for (int j = 0; j <= t; j++) dot += drow[j] * prow[j];
        for (int j = 0; j <= t; j++) drow[j] = prow[j] * (drow[j] - dot);
        for (int j = t + 1; j < T; j++) drow[j] = 0.0f;
      }
      // dQ = dS K * scale, dK = dS^T Q * scale
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, C3, 0.0f, dq, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, C3, 0.0f, dk, C3);
    }
  }
}

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + vtanh(u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = vtanh(u);
    const float sech2 = 1.0f - th * th;
    const float local = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void add_inplace(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void add_bias(float* out, const float* bias, int N, int C) {
  for (int n = 0; n < N; n++) add_inplace(out + static_cast<size_t>(n) * C, bias, C);
}

void ce_rowmax(float* rowmax, const float* logits, int N, int V_local, int valid) {
  for (int n = 0; n < N; n++) {
    const float* l = logits + static_cast<size_t>(n) * V_local;
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < valid; j++) mx = l[j] > mx ? l[j] : mx;
    rowmax[n] = mx;
  }
}

void ce_sumexp_target(float* sumexp, float* target, const float* logits, const float* rowmax, const int32_t* targets,
                      int N, int V_local, int valid, int vocab_lo) {
  for (int n = 0; n < N; n++) {
    const float* l = logits + static_cast<size_t>(n) * V_local;
    const float mx = rowmax[n];
    float s = 0.0f;
    for (int j = 0; j < valid; j++) s += vexp(l[j] - mx);
    sumexp[n] = s;
    const int local = targets[n] - vocab_lo;
    target[n] = (local >= 0 && local < valid) ? l[local] : 0.0f;
  }
}

void ce_loss(float* losses, const float* sumexp, const float* rowmax, const float* target, int N) {
  for (int n = 0; n < N; n++) losses[n] = std::log(sumexp[n]) + rowmax[n] - target[n];
}

void ce_backward(float* dlogits, const float* logits, const float* rowmax, const float* sumexp, const int32_t* targets,
                 float dloss, int N, int V_local, int valid, int vocab_lo) {
  for (int n = 0; n < N; n++) {
    const float* l = logits + static_cast<size_t>(n) * V_local;
    float* d = dlogits + static_cast<size_t>(n) * V_local;
    const float mx = rowmax[n];
    const float inv = dloss / sumexp[n];
    for (int j = 0; j < valid; j++) d[j] = vexp(l[j] - mx) * inv;
    for (int j = valid; j < V_local; j++) d[j] = 0.0f;
    const int local = targets[n] - vocab_lo;
    if (local >= 0 && local < valid) d[local] -= dloss;
  }
}

}  // namespace meshtrain
