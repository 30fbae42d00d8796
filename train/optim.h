// AdamW with decoupled weight decay, linear warm-up then cosine decay, and
// global-norm gradient clipping.
#pragma once

#include <vector>

#include "model.h"

namespace meshtrain {

struct OptimConfig {
  float lr = 1e-3f;
  float min_lr_ratio = 0.1f;  // cosine decays to lr * min_lr_ratio at the last step
  int warmup = 10;
  int total_steps = 100;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip = 1.0f;  // <= 0 disables clipping
};

// Learning rate of 0-based step `step`.
float lr_at(const OptimConfig& c, int step);

// Sum of squared gradients over the tensors that count on this rank: the
// tensors' spec_grad_sq in spec order, summed in double.
double local_grad_sq(const std::vector<float>& grads, const std::vector<ParamSpec>& specs);
// One tensor's part of it (float, in index order).
float spec_grad_sq(const std::vector<float>& grads, const ParamSpec& s);

// Factor the gradients are multiplied by so that the global norm is at most clip.
float clip_scale(const OptimConfig& c, double global_norm);

class AdamW {
 public:
  explicit AdamW(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
  // t is the 1-based update count (bias correction); grads are multiplied by
  // grad_scale first (clipping).
  void update(std::vector<float>& params, const std::vector<float>& grads, const std::vector<ParamSpec>& specs,
              const OptimConfig& c, float lr, int t, float grad_scale);
  // The same for one tensor: update() is update_spec() over the specs, so
  // updating tensor by tensor in any order gives the same bits.
  void update_spec(std::vector<float>& params, const std::vector<float>& grads, const ParamSpec& s,
                   const OptimConfig& c, float lr, int t, float grad_scale);
  std::vector<float> m, v;
};

}  // namespace meshtrain
