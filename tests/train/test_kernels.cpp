// Every backward kernel against central finite differences of its forward.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels.h"

using namespace meshtrain;

namespace {

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic[i] against d loss / d x[i] for a sample of indices.
void check_grad(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& loss,
                const char* what, float eps = 1e-2f, double tol = 2e-2) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const size_t stride = x.size() > 64 ? x.size() / 61 : 1;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float old = x[i];
    x[i] = old + eps;
    const double lp = loss();
    x[i] = old - eps;
    const double lm = loss();
    x[i] = old;
    const double num = (lp - lm) / (2.0 * eps);
    const double err = std::fabs(num - analytic[i]) / std::max(1.0, std::fabs(num));
    EXPECT_LT(err, tol) << what << "[" << i << "]: numeric " << num << " analytic " << analytic[i];
  }
}

}  // namespace

TEST(Kernels, LayerNormBackward) {
  std::mt19937 g(1);
  const int N = 6, C = 16;
  auto x = randn(N * C, g), w = randn(C, g), b = randn(C, g), r = randn(N * C, g);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, r);
  };
  loss();
  std::vector<float> dx(N * C, 0), dw(C, 0), db(C, 0);
  layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  check_grad(x, dx, loss, "ln dx");
  check_grad(w, dw, loss, "ln dw");
  check_grad(b, db, loss, "ln db");
}

TEST(Kernels, MatmulBackward) {
  std::mt19937 g(2);
  const int N = 5, IC = 12, OC = 7;
  auto x = randn(N * IC, g), W = randn(OC * IC, g), bias = randn(OC, g), r = randn(N * OC, g);
  std::vector<float> out(N * OC);
  auto loss = [&] {
    matmul_forward(out.data(), x.data(), W.data(), bias.data(), N, IC, OC);
    return dot(out, r);
  };
  std::vector<float> dx(N * IC, 0), dW(OC * IC, 0), db(OC, 0);
  matmul_backward(dx.data(), dW.data(), db.data(), r.data(), x.data(), W.data(), N, IC, OC);
  check_grad(x, dx, loss, "matmul dx");
  check_grad(W, dW, loss, "matmul dW");
  check_grad(bias, db, loss, "matmul db");
}

TEST(Kernels, AttentionBackward) {
  std::mt19937 g(3);
  const int B = 2, T = 7, Cl = 12, NH = 3;
  auto qkv = randn(B * T * 3 * Cl, g), r = randn(B * T * Cl, g);
  std::vector<float> out(B * T * Cl), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, Cl, NH);
    return dot(out, r);
  };
  loss();
  // Causality: the output at position t does not depend on later positions.
  std::vector<float> before(out);
  qkv[(B * T - 1) * 3 * Cl] += 5.0f;  // last token of the last sequence
  loss();
  for (int t = 0; t < T - 1; t++) {
    for (int c = 0; c < Cl; c++) {
      const size_t i = ((B - 1) * T + t) * Cl + c;
      EXPECT_EQ(before[i], out[i]) << "position " << t << " saw the future";
    }
  }
  qkv[(B * T - 1) * 3 * Cl] -= 5.0f;
  loss();
  std::vector<float> dqkv(qkv.size(), 0), datt(T * T);
  attention_backward(dqkv.data(), datt.data(), r.data(), qkv.data(), att.data(), B, T, Cl, NH);
  check_grad(qkv, dqkv, loss, "attention dqkv");
}

TEST(Kernels, GeluBackward) {
  std::mt19937 g(4);
  const size_t n = 200;
  auto x = randn(n, g, 2.0f), r = randn(n, g);
  std::vector<float> out(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return dot(out, r);
  };
  // Reference values of the tanh approximation.
  std::vector<float> probe = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
  std::vector<float> res(probe.size());
  gelu_forward(res.data(), probe.data(), probe.size());
  for (size_t i = 0; i < probe.size(); i++) {
    const double xx = probe[i];
    const double ref = 0.5 * xx * (1 + std::tanh(std::sqrt(2 / M_PI) * (xx + 0.044715 * xx * xx * xx)));
    EXPECT_NEAR(res[i], ref, 1e-6) << "gelu(" << xx << ")";
  }
  std::vector<float> dx(n);
  gelu_backward(dx.data(), x.data(), r.data(), n);
  check_grad(x, dx, loss, "gelu dx", 1e-3f);
}

TEST(Kernels, EmbeddingAndPositionBackward) {
  std::mt19937 g(5);
  const int B = 2, T = 4, C = 3, V = 6;
  std::vector<int32_t> tok = {0, 5, 2, 2, 1, 3, 4, 0};
  auto wte = randn(V * C, g), wpe = randn(T * C, g), r = randn(B * T * C, g);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    embedding_forward(out.data(), tok.data(), wte.data(), B * T, C, 0, V);
    position_forward(out.data(), wpe.data(), B, T, C);
    return dot(out, r);
  };
  std::vector<float> dwte(V * C, 0), dwpe(T * C, 0);
  embedding_backward(dwte.data(), r.data(), tok.data(), B * T, C, 0, V);
  position_backward(dwpe.data(), r.data(), B, T, C);
  check_grad(wte, dwte, loss, "dwte");
  check_grad(wpe, dwpe, loss, "dwpe");
}

// Loss of a vocab split into `parts` slices, with the reductions done by hand:
// must equal the one-slice result and give the same gradient slices.
TEST(Kernels, CrossEntropyVocabParallelMatchesFull) {
  std::mt19937 g(6);
  const int N = 5, V = 10, Vp = 12;            // 2 padded columns
  std::vector<int32_t> tgt = {0, 9, 5, 6, 3};  // 5 and 6 sit at the slice border
  auto logits = randn(N * Vp, g, 3.0f);
  for (int n = 0; n < N; n++) logits[n * Vp + 10] = logits[n * Vp + 11] = 100.0f;  // padding must not count

  auto full_loss = [&](std::vector<float>& lg, std::vector<float>* dl) {
    std::vector<float> mx(N), se(N), tl(N), losses(N);
    ce_rowmax(mx.data(), lg.data(), N, Vp, V);
    ce_sumexp_target(se.data(), tl.data(), lg.data(), mx.data(), tgt.data(), N, Vp, V, 0);
    ce_loss(losses.data(), se.data(), mx.data(), tl.data(), N);
    if (dl) ce_backward(dl->data(), lg.data(), mx.data(), se.data(), tgt.data(), 1.0f, N, Vp, V, 0);
    double s = 0;
    for (float l : losses) s += l;
    return s;
  };
  std::vector<float> dfull(N * Vp);
  const double ref = full_loss(logits, &dfull);
  double expect = 0;  // log-sum-exp over the real vocabulary only
  for (int n = 0; n < N; n++) {
    double z = 0;
    for (int v = 0; v < V; v++) z += std::exp(static_cast<double>(logits[n * Vp + v]));
    expect += std::log(z) - logits[n * Vp + tgt[n]];
  }
  EXPECT_NEAR(ref, expect, 1e-4 * std::fabs(expect));
  std::vector<float> x(logits);
  check_grad(
      x, dfull, [&] { return full_loss(x, nullptr); }, "ce dlogits", 1e-2f);
  for (int n = 0; n < N; n++) {
    EXPECT_EQ(dfull[n * Vp + 10], 0.0f);
    EXPECT_EQ(dfull[n * Vp + 11], 0.0f);
  }

  const int parts = 2, Vl = Vp / parts;
  std::vector<std::vector<float>> slice(parts, std::vector<float>(N * Vl));
  for (int k = 0; k < parts; k++) {
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < Vl; j++) slice[k][n * Vl + j] = logits[n * Vp + k * Vl + j];
    }
  }
  std::vector<float> mx(N, -INFINITY), part(N), ce(2 * N, 0), pce(2 * N);
  for (int k = 0; k < parts; k++) {
    const int valid = std::max(0, std::min(Vl, V - k * Vl));
    ce_rowmax(part.data(), slice[k].data(), N, Vl, valid);
    for (int n = 0; n < N; n++) mx[n] = std::max(mx[n], part[n]);
  }
  for (int k = 0; k < parts; k++) {
    const int valid = std::max(0, std::min(Vl, V - k * Vl));
    ce_sumexp_target(pce.data(), pce.data() + N, slice[k].data(), mx.data(), tgt.data(), N, Vl, valid, k * Vl);
    for (int i = 0; i < 2 * N; i++) ce[i] += pce[i];
  }
  std::vector<float> losses(N);
  ce_loss(losses.data(), ce.data(), mx.data(), ce.data() + N, N);
  double sum = 0;
  for (float l : losses) sum += l;
  EXPECT_NEAR(sum, ref, 1e-4 * std::fabs(ref));
  for (int k = 0; k < parts; k++) {
    const int valid = std::max(0, std::min(Vl, V - k * Vl));
    std::vector<float> d(N * Vl);
    ce_backward(d.data(), slice[k].data(), mx.data(), ce.data(), tgt.data(), 1.0f, N, Vl, valid, k * Vl);
    for (int n = 0; n < N; n++) {
      for (int j = 0; j < Vl; j++) EXPECT_NEAR(d[n * Vl + j], dfull[n * Vp + k * Vl + j], 1e-6);
    }
  }
}
