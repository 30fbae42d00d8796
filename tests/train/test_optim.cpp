// AdamW, the learning-rate schedule and clipping against hand computation.
#include <gtest/gtest.h>

#include <cmath>

#include "optim.h"

using namespace meshtrain;

TEST(Optim, WarmupThenCosineToTheFloor) {
  OptimConfig c;
  c.lr = 1.0f;
  c.min_lr_ratio = 0.1f;
  c.warmup = 4;
  c.total_steps = 15;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(c, 3), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 4), 1.0f);     // cosine starts at the peak
  EXPECT_NEAR(lr_at(c, 9), 0.55f, 1e-6);  // half way: the mean of peak and floor
  EXPECT_NEAR(lr_at(c, 14), 0.1f, 1e-6);  // last step at the floor
  EXPECT_NEAR(lr_at(c, 50), 0.1f, 1e-6);
  for (int s = 4; s < 14; s++) EXPECT_GT(lr_at(c, s), lr_at(c, s + 1));
}

TEST(Optim, ClipScale) {
  OptimConfig c;
  c.clip = 1.0f;
  EXPECT_FLOAT_EQ(clip_scale(c, 0.5), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(c, 4.0), 0.25f);
  c.clip = 0.0f;
  EXPECT_FLOAT_EQ(clip_scale(c, 4.0), 1.0f);
  c.clip = 1.0f;
  EXPECT_FLOAT_EQ(clip_scale(c, std::nan("")), 1.0f);
}

TEST(Optim, AdamWStepsAndDecaysOnlyMatrices) {
  std::vector<ParamSpec> specs(2);
  specs[0].offset = 0, specs[0].size = 2, specs[0].decay = true;
  specs[1].offset = 2, specs[1].size = 1, specs[1].decay = false, specs[1].in_norm = false;
  std::vector<float> p = {1.0f, -2.0f, 3.0f}, g = {0.5f, 0.0f, -1.0f};
  OptimConfig c;
  c.beta1 = 0.9f, c.beta2 = 0.99f, c.eps = 1e-8f, c.weight_decay = 0.1f;
  AdamW opt(3);
  opt.update(p, g, specs, c, 0.01f, 1, 2.0f);  // grad_scale 2 doubles the gradients
  // First step: m_hat = g, v_hat = g^2, so the step is lr * sign(g) (+ decay).
  EXPECT_NEAR(p[0], 1.0f - 0.01f * (1.0f + 0.1f * 1.0f), 1e-6);
  EXPECT_NEAR(p[1], -2.0f - 0.01f * (0.0f + 0.1f * -2.0f), 1e-6);
  EXPECT_NEAR(p[2], 3.0f + 0.01f, 1e-6);
  EXPECT_NEAR(opt.m[0], 0.1f * 1.0f, 1e-7);
  EXPECT_NEAR(opt.v[2], 0.01f * 4.0f, 1e-7);
  EXPECT_DOUBLE_EQ(local_grad_sq(g, specs), 0.25);  // the tensor out of the norm is skipped
}
