// Optimizers (exact first steps, the one-pass loops against LibTorch's), learning-rate schedules
// and gradient clipping. Checkpoints: test_checkpoint.cc.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "common/errors.h"
#include "train/fused_optim.h"
#include "train/one_pass_update.h"
#include "train/optim.h"

namespace hetra::train {
namespace {

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

// One parameter of value `value` whose gradient is `grad`, after one step of `spec`.
double afterOneStep(const OptimSpec& spec, double value, double grad) {
  auto p = torch::full({1}, value, torch::requires_grad());
  auto optimizer = makeOptimizer({p}, spec);
  p.mutable_grad() = torch::full({1}, grad);
  optimizer->step();
  return p.item<double>();
}

TEST(Optimizers, FirstStepsFollowTheirDefinitions) {
  OptimSpec sgd;
  sgd.lr = 0.1;
  sgd.weightDecay = 0.5;
  EXPECT_NEAR(afterOneStep(sgd, 2.0, 1.0), 2.0 - 0.1 * (1.0 + 0.5 * 2.0), 1e-7);
  // Adam's first step moves by lr whatever the gradient's size; L2 decay enters the gradient...
  OptimSpec adam;
  adam.name = "adam";
  adam.lr = 0.1;
  adam.weightDecay = 0.5;
  EXPECT_NEAR(afterOneStep(adam, 2.0, 1.0), 2.0 - 0.1, 1e-6);
  // ...while AdamW's is decoupled: the parameter shrinks by lr * wd first.
  adam.name = "adamw";
  EXPECT_NEAR(afterOneStep(adam, 2.0, 1.0), 2.0 * (1 - 0.1 * 0.5) - 0.1, 1e-6);
  // Nesterov with momentum 0.9: buffer = g, update = g + 0.9 * buffer.
  OptimSpec nesterov;
  nesterov.lr = 0.1;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  EXPECT_NEAR(afterOneStep(nesterov, 2.0, 1.0), 2.0 - 0.1 * 1.9, 1e-7);
}

// The one-pass optimizers against LibTorch's own, over several steps of changing gradients, for
// every option that changes the loop: same trajectory to float rounding (LibTorch fuses some
// multiply-adds, we may not), including a parameter of odd size and one that skips a step.
TEST(FusedOptimizers, FollowLibTorchStepForStep) {
  struct Case {
    std::string name;
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> reference,
        fused;
  };
  std::vector<Case> cases;
  for (double momentum : {0.0, 0.9})
    for (bool nesterov : {false, true})
      for (double decay : {0.0, 0.03})
        for (double dampening : {0.0, 0.2}) {
          if (nesterov && (momentum == 0 || dampening != 0)) continue;  // LibTorch refuses these
          auto options = torch::optim::SGDOptions(0.05)
                             .momentum(momentum)
                             .nesterov(nesterov)
                             .weight_decay(decay)
                             .dampening(dampening);
          cases.push_back(
              {"sgd m=" + std::to_string(momentum) + " nesterov=" + std::to_string(nesterov) +
                   " wd=" + std::to_string(decay) + " damp=" + std::to_string(dampening),
               [=](auto p) { return std::make_unique<torch::optim::SGD>(p, options); },
               [=](auto p) { return std::make_unique<FusedSgd>(p, options); }});
        }
  for (double decay : {0.0, 0.03}) {
    auto adam = torch::optim::AdamOptions(0.01).betas({0.8, 0.95}).eps(1e-6).weight_decay(decay);
    cases.push_back({"adam wd=" + std::to_string(decay),
                     [=](auto p) { return std::make_unique<torch::optim::Adam>(p, adam); },
                     [=](auto p) { return std::make_unique<FusedAdam>(p, adam); }});
    auto adamw = torch::optim::AdamWOptions(0.01).betas({0.8, 0.95}).eps(1e-6).weight_decay(decay);
    cases.push_back({"adamw wd=" + std::to_string(decay),
                     [=](auto p) { return std::make_unique<torch::optim::AdamW>(p, adamw); },
                     [=](auto p) { return std::make_unique<FusedAdamW>(p, adamw); }});
  }
  for (const auto& c : cases) {
    torch::manual_seed(7);
    const std::vector<torch::Tensor> init = {torch::randn({33, 17}), torch::randn({1001}),
                                             torch::randn({5})};
    std::vector<torch::Tensor> ref, mine;
    for (const auto& t : init) {
      ref.push_back(t.clone().requires_grad_());
      mine.push_back(t.clone().requires_grad_());
    }
    auto reference = c.reference(ref);
    auto fused = c.fused(mine);
    for (int step = 0; step < 6; ++step) {
      for (size_t k = 0; k < init.size(); ++k) {
        // The last parameter has no gradient in step 2: both must leave it (and its state) alone.
        const bool skip = k == 2 && step == 2;
        auto grad = torch::randn(init[k].sizes()) * (1.0 + step);
        ref[k].mutable_grad() = skip ? torch::Tensor() : grad.clone();
        mine[k].mutable_grad() = skip ? torch::Tensor() : grad.clone();
      }
      reference->step();
      fused->step();
      if (step == 3) {
        // Same state layout and keys: LibTorch's optimizer continues from the fused one's state
        // (lost momentum or moments would show as a different trajectory from here on).
        torch::serialize::OutputArchive out;
        fused->save(out);
        std::ostringstream bytes;
        out.save_to(bytes);
        std::istringstream back(bytes.str());
        torch::serialize::InputArchive in;
        in.load_from(back);
        reference = c.reference(ref);  // a fresh one: all its state must come from the archive
        reference->load(in);
      }
      for (size_t k = 0; k < init.size(); ++k) {
        const double scale = ref[k].abs().max().item<double>() + 1.0;
        EXPECT_LE((ref[k] - mine[k]).abs().max().item<double>(), 2e-6 * scale)
            << c.name << " step " << step << " parameter " << k;
      }
    }
  }
}

// Momentum and moments that decayed below float's normal range count as zero in the loops (x86
// computes on denormals many times slower); the caller's own floating-point mode is untouched.
TEST(FusedOptimizers, DenormalStateIsFlushedToZero) {
  const float denormal = 1e-39f;
  ASSERT_EQ(std::fpclassify(denormal), FP_SUBNORMAL);
  float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.0f, 0.0f, 0.25f},
        buf[3] = {denormal, -denormal, 1.0f};
  SgdUpdate sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgdUpdate(p, g, buf, 3, sgd);
  EXPECT_EQ(buf[0], 0.0f);
  EXPECT_EQ(buf[1], 0.0f);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], -2.0f);
  EXPECT_FLOAT_EQ(buf[2], 0.9f + 0.25f);  // normal values as before
  EXPECT_FLOAT_EQ(p[2], 0.5f - 0.1f * (0.9f + 0.25f));

  float q[2] = {1.0f, 1.0f}, h[2] = {0.0f, 0.0f}, m[2] = {denormal, 0.0f}, v[2] = {0.0f, denormal};
  AdamUpdate adam;
  adam.lr = 0.01;
  adam.step = 3;
  adamUpdate(q, h, m, v, 2, adam);
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(q[0], 1.0f);
  EXPECT_EQ(q[1], 1.0f);

  volatile float tiny = 1e-38f;  // the caller's arithmetic still makes denormals
  tiny = tiny * 0.1f;
  EXPECT_EQ(std::fpclassify(tiny), FP_SUBNORMAL);
}

// A parameter the loops cannot take (float64 here) sends the whole step through LibTorch's
// operations: still the right update.
TEST(FusedOptimizers, OtherTensorsFallBackToLibTorch) {
  auto p = torch::full({3}, 2.0, torch::dtype(torch::kFloat64).requires_grad(true));
  FusedSgd sgd({p}, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  p.mutable_grad() = torch::full({3}, 1.0, torch::kFloat64);
  sgd.step();
  EXPECT_NEAR(p[1].item<double>(), 2.0 - 0.1 * 1.9, 1e-12);
}

TEST(Optimizers, BadOptionsAreConfigErrors) {
  auto p = torch::zeros({2}, torch::requires_grad());
  auto bad = [&](OptimSpec s) { EXPECT_THROW(makeOptimizer({p}, s), ConfigError) << s.name; };
  OptimSpec s;
  s.name = "lamb";
  bad(s);
  s = {};
  s.nesterov = true;  // without momentum
  bad(s);
  s = {};
  s.lr = -1;
  bad(s);
  s = {};
  s.lr = std::nan("");
  bad(s);
  s = {};
  s.name = "adam";
  s.beta1 = 1.0;
  bad(s);
  s = {};
  s.name = "adamw";
  s.eps = -1e-8;
  bad(s);
}

TEST(LrSchedule, ConstantWarmupAndCosine) {
  LrScheduleSpec spec;
  spec.lr = 0.1;
  EXPECT_DOUBLE_EQ(LrSchedule(spec).lrAt(0), 0.1);
  EXPECT_DOUBLE_EQ(LrSchedule(spec).lrAt(12345), 0.1);
  spec.warmupSteps = 4;
  const LrSchedule warm(spec);
  EXPECT_DOUBLE_EQ(warm.lrAt(0), 0.025);
  EXPECT_DOUBLE_EQ(warm.lrAt(2), 0.075);
  EXPECT_DOUBLE_EQ(warm.lrAt(3), 0.1);
  EXPECT_DOUBLE_EQ(warm.lrAt(4), 0.1);

  spec = {};
  spec.kind = "cosine";
  spec.lr = 1.0;
  spec.totalSteps = 10;
  spec.warmupSteps = 2;
  const LrSchedule cosine(spec);
  EXPECT_DOUBLE_EQ(cosine.lrAt(0), 0.5);
  EXPECT_DOUBLE_EQ(cosine.lrAt(1), 1.0);
  EXPECT_DOUBLE_EQ(cosine.lrAt(2), 1.0);
  EXPECT_NEAR(cosine.lrAt(6), 0.5, 1e-15);
  EXPECT_NEAR(cosine.lrAt(9), 0.5 * (1 + std::cos(M_PI * 7 / 8)),
              1e-15);  // the last step still moves
  EXPECT_GT(cosine.lrAt(9), 0.0);
  EXPECT_EQ(cosine.lrAt(10), 0.0);
  EXPECT_EQ(cosine.lrAt(11), 0.0);
  for (int64_t s = 2; s < 10; ++s) EXPECT_LT(cosine.lrAt(s + 1), cosine.lrAt(s));

  spec.totalSteps = 2;  // no step left after warm-up
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
  spec.kind = "step";
  spec.totalSteps = 10;
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
  spec.kind = "constant";
  spec.warmupSteps = -1;
  EXPECT_THROW(LrSchedule{spec}, ConfigError);
}

TEST(LrSchedule, ApplyLrSetsEveryGroup) {
  auto a = torch::ones({1}, torch::requires_grad()), b = torch::ones({1}, torch::requires_grad());
  OptimSpec spec;
  spec.lr = 0.5;
  auto optimizer = makeOptimizer({a}, spec);
  optimizer->add_param_group(
      torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.7)));
  applyLr(*optimizer, 0.01);
  a.mutable_grad() = torch::ones({1});
  b.mutable_grad() = torch::full({1}, 2.0);
  optimizer->step();
  EXPECT_FLOAT_EQ(a.item<float>(), 0.99f);
  EXPECT_FLOAT_EQ(b.item<float>(), 0.98f);
}

TEST(Clipping, ScalesToTheGlobalNorm) {
  auto a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
  auto noGrad = torch::zeros({3}, torch::requires_grad());
  a.mutable_grad() = torch::full({1}, 3.0);
  b.mutable_grad() = torch::full({1}, -4.0);
  EXPECT_NEAR(clipGradNorm({a, b, noGrad}, 10.0), 5.0, 1e-6);  // below the limit: unchanged
  EXPECT_FLOAT_EQ(a.grad().item<float>(), 3.0f);
  EXPECT_NEAR(clipGradNorm({a, b, noGrad}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().item<double>(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), -0.8, 1e-6);
  EXPECT_THROW(clipGradNorm({a}, 0.0), EnforceError);
}

}  // namespace
}  // namespace hetra::train
