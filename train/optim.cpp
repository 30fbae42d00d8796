#include "optim.h"

#include <cmath>

namespace meshtrain {

float lr_at(const OptimConfig& c, int step) {
  if (c.warmup > 0 && step < c.warmup) return c.lr * static_cast<float>(step + 1) / c.warmup;
  const int span = c.total_steps - c.warmup;
  if (span <= 1) return c.lr;
  float progress = static_cast<float>(step - c.warmup) / (span - 1);
  progress = progress > 1.0f ? 1.0f : progress;
  const float min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5f * (c.lr - min_lr) * (1.0f + std::cos(3.14159265358979f * progress));
}

// Per-tensor float partials keep the loop vectorised; the sum across tensors
// is in double so large models do not lose the small tensors.
float spec_grad_sq(const std::vector<float>& grads, const ParamSpec& s) {
  const float* g = grads.data() + s.offset;
  float part = 0.0f;
  for (size_t i = 0; i < s.size; i++) part += g[i] * g[i];
  return part;
}

double local_grad_sq(const std::vector<float>& grads, const std::vector<ParamSpec>& specs) {
  double total = 0.0;
  for (const auto& s : specs) {
    if (s.in_norm) total += spec_grad_sq(grads, s);
  }
  return total;
}

float clip_scale(const OptimConfig& c, double global_norm) {
  if (c.clip <= 0.0f || !(global_norm > c.clip)) return 1.0f;
  return static_cast<float>(c.clip / global_norm);
}

void AdamW::update(std::vector<float>& params, const std::vector<float>& grads, const std::vector<ParamSpec>& specs,
                   const OptimConfig& c, float lr, int t, float grad_scale) {
  for (const auto& s : specs) update_spec(params, grads, s, c, lr, t, grad_scale);
}

void AdamW::update_spec(std::vector<float>& params, const std::vector<float>& grads, const ParamSpec& s,
                        const OptimConfig& c, float lr, int t, float grad_scale) {
  const float b1 = c.beta1, b2 = c.beta2;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(b2, static_cast<float>(t));
  const float wd = s.decay ? c.weight_decay : 0.0f;
  float* p = params.data() + s.offset;
  const float* g = grads.data() + s.offset;
  float* m_ = m.data() + s.offset;
  float* v_ = v.data() + s.offset;
  for (size_t i = 0; i < s.size; i++) {
    const float gi = g[i] * grad_scale;
    m_[i] = b1 * m_[i] + (1.0f - b1) * gi;
    v_[i] = b2 * v_[i] + (1.0f - b2) * gi * gi;
    const float mh = m_[i] / bc1, vh = v_[i] / bc2;
    p[i] -= lr * (mh / (std::sqrt(vh) + c.eps) + wd * p[i]);
  }
}

}  // namespace meshtrain
