// Models: shapes, parameter counts, deterministic initialisation, that SGD learns a synthetic task,
// and the memory footprint estimate.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "common/errors.h"
#include "train/datasets.h"
#include "train/models.h"

namespace hetra::train {
namespace {

const bool kOneThread = [] {
  torch::set_num_threads(1);
  return true;
}();

ModelSpec spec(const std::string& name) {
  ModelSpec s;
  s.name = name;
  return s;
}

void expectSameParameters(Model& a, Model& b, bool same) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  bool allEqual = true;
  for (size_t i = 0; i < pa.size(); ++i) allEqual = allEqual && torch::equal(pa[i], pb[i]);
  EXPECT_EQ(allEqual, same);
}

TEST(Models, ParameterCountsAndShapes) {
  // Counts worked out by hand from the layer shapes.
  struct Case {
    ModelSpec spec;
    int64_t params;
  };
  ModelSpec wide = spec("mlp");
  wide.hidden = {512, 512};
  ModelSpec linear = spec("mlp");
  linear.hidden = {};
  std::vector<Case> cases = {
      {spec("mlp"), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10},  // 235146
      {wide, 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10},         // 669706
      {linear, 784 * 10 + 10},
      // conv 1->32, conv 32->64 (3x3), 64x7x7 -> 128 -> 10
      {spec("cnn"), (32 * 9 + 32) + (64 * 32 * 9 + 64) + (3136 * 128 + 128) + (128 * 10 + 10)},
      // embed 28->64, positions 28x64, 2 x (2 LayerNorms, qkv, proj, fc1 64->256, fc2), LayerNorm,
      // head
      {spec("transformer"),
       (28 * 64 + 64) + 28 * 64 +
           2 * (2 * 128 + (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64)) +
           128 + (64 * 10 + 10)},
  };
  auto x = torch::randn({5, 1, 28, 28});
  for (auto& c : cases) {
    auto model = makeModel(c.spec);
    EXPECT_EQ(parameterCount(*model), c.params) << c.spec.name;
    auto y = model->forward(x);
    EXPECT_EQ(y.sizes(), (torch::IntArrayRef{5, 10})) << c.spec.name;
    EXPECT_TRUE(torch::isfinite(y).all().item<bool>()) << c.spec.name;
  }
  EXPECT_EQ(cases[0].params, 235146);
  EXPECT_EQ(cases[3].params, 421642);
  EXPECT_EQ(cases[4].params, 104394);
}

TEST(Models, OddShapesAndOptions) {
  // 3 channels, 13x11 images (odd sides floor when pooled), 3 conv blocks, no hidden layer, 7
  // classes.
  ModelSpec cnn = spec("cnn");
  cnn.sampleShape = {3, 13, 11};
  cnn.channels = {4, 6, 5};
  cnn.cnnHidden = 0;
  cnn.classes = 7;
  EXPECT_EQ(makeModel(cnn)->forward(torch::randn({3, 3, 13, 11})).sizes(),
            (torch::IntArrayRef{3, 7}));
  EXPECT_EQ(parameterCount(*makeModel(cnn)),
            (4 * 27 + 4) + (6 * 36 + 6) + (5 * 54 + 5) + (5 * 1 * 1 * 7 + 7));

  // Transformer over 30 features as 5 tokens of 6, 3 heads of width 4, causal, one sample.
  ModelSpec t = spec("transformer");
  t.sampleShape = {30};
  t.seqLen = 5;
  t.dim = 12;
  t.heads = 3;
  t.layers = 3;
  t.causal = true;
  t.classes = 3;
  auto model = makeModel(t);
  auto x = torch::randn({1, 30}, torch::requires_grad());
  auto y = model->forward(x);
  EXPECT_EQ(y.sizes(), (torch::IntArrayRef{1, 3}));
  y.sum().backward();
  EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>());

  // The causal mask changes the function.
  t.causal = false;
  EXPECT_FALSE(torch::allclose(makeModel(t)->forward(x), y));
}

TEST(Models, InitialisationDependsOnTheSeedOnly) {
  for (const char* name : {"mlp", "cnn", "transformer"}) {
    ModelSpec s = spec(name);
    s.seed = 7;
    torch::manual_seed(1);
    auto a = makeModel(s);
    torch::manual_seed(2);  // LibTorch's global generator plays no part
    auto b = makeModel(s);
    expectSameParameters(*a, *b, true);
    s.seed = 8;
    expectSameParameters(*a, *makeModel(s), false);
  }
  // Weights follow U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as LibTorch's default: 784 inputs -> 0.0357.
  auto w = makeModel(spec("mlp"))->parameters()[0];
  EXPECT_LE(w.abs().max().item<double>(), 1.0 / 28.0);
  EXPECT_GT(w.abs().max().item<double>(), 0.99 / 28.0);
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 1e-3);
}

TEST(Models, BadSpecsAreConfigErrors) {
  auto bad = [](ModelSpec s) { EXPECT_THROW(makeModel(s), ConfigError) << s.name; };
  ModelSpec s = spec("resnet");
  bad(s);
  s = spec("cnn");
  s.sampleShape = {32};
  bad(s);
  s = spec("cnn");
  s.channels = {8, 8, 8, 8, 8};  // 28 -> 0 after five halvings
  bad(s);
  s = spec("transformer");
  s.heads = 5;  // does not divide 64
  bad(s);
  s = spec("transformer");
  s.seqLen = 27;  // does not divide 784
  bad(s);
  s = spec("mlp");
  s.hidden = {16, 0};
  bad(s);
  s = spec("mlp");
  s.classes = 0;
  bad(s);
  EXPECT_THROW(estimateFootprint(spec("nope")), ConfigError);
}

TEST(Models, WrongInputShapeIsAnEnforceError) {
  auto model = makeModel(spec("mlp"));
  EXPECT_THROW(model->forward(torch::randn({2, 784})), EnforceError);
  EXPECT_THROW(model->forward(torch::randn({2, 1, 28, 27})), EnforceError);
}

// SGD steps on the synthetic task lower the loss of every model. The task (a linear teacher over
// gaussian noise) suits the mlp; pooling makes it harder for the others, hence their looser bound.
TEST(Models, SgdLearnsSyntheticTask) {
  Synthetic data(512, 64, 5, 3);
  std::vector<int64_t> all(512);
  std::iota(all.begin(), all.end(), 0);
  const Batch full = data.get(all);
  for (const char* name : {"mlp", "cnn", "transformer"}) {
    ModelSpec s = spec(name);
    s.classes = 5;
    s.hidden = {32};
    s.channels = {8, 8};
    s.cnnHidden = 32;
    s.dim = 32;
    s.seqLen = 8;
    s.sampleShape =
        name == std::string("cnn") ? std::vector<int64_t>{1, 8, 8} : std::vector<int64_t>{64};
    auto shape = s.sampleShape;
    shape.insert(shape.begin(), -1);
    auto model = makeModel(s);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto lossOf = [&](const Batch& b) {
      return torch::nn::functional::cross_entropy(model->forward(b.inputs.view(shape)), b.targets);
    };
    const double before = lossOf(full).item<double>();
    for (int step = 0; step < 80; ++step) {
      std::vector<int64_t> idx;
      for (int i = 0; i < 64; ++i) idx.push_back((step * 64 + i * 5) % 512);
      sgd.zero_grad();
      lossOf(data.get(idx)).backward();
      sgd.step();
    }
    const double after = lossOf(full).item<double>();
    EXPECT_NEAR(before, std::log(5.0), 0.5) << name;
    EXPECT_LT(after, (name == std::string("mlp") ? 0.2 : 0.85) * before)
        << name << ": loss " << before << " -> " << after;
  }
}

TEST(Models, FootprintOfTheMlpFollowsTheFormula) {
  const auto fp = estimateFootprint(spec("mlp"));
  EXPECT_EQ(fp.fixedBytes, 5 * 4 * 235146);
  // input 784, logits and softmax 2 x 10, two values per hidden unit; x2 for backward, 4 bytes.
  EXPECT_EQ(fp.bytesPerSample, 2 * 4 * (784 + 20 + 2 * (256 + 128)));
  // Bigger models need more.
  ModelSpec wide = spec("mlp");
  wide.hidden = {512, 512};
  EXPECT_GT(estimateFootprint(wide).fixedBytes, fp.fixedBytes);
  EXPECT_GT(estimateFootprint(wide).bytesPerSample, fp.bytesPerSample);
  ModelSpec longer = spec("transformer");
  longer.layers = 4;
  EXPECT_GT(estimateFootprint(longer).bytesPerSample,
            estimateFootprint(spec("transformer")).bytesPerSample);
  EXPECT_GT(estimateFootprint(spec("cnn")).bytesPerSample, fp.bytesPerSample);
}

TEST(Models, MaxMicroBatchIsMonotonicInTheCap) {
  for (const char* name : {"mlp", "cnn", "transformer"}) {
    const auto fp = estimateFootprint(spec(name));
    EXPECT_EQ(maxMicroBatch(fp, 0), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(maxMicroBatch(fp, fp.fixedBytes), 0);  // the model fits, no sample does
    EXPECT_EQ(maxMicroBatch(fp, fp.fixedBytes + fp.bytesPerSample), 1);
    int64_t previous = 0;
    for (int64_t cap = 1; cap < (int64_t(1) << 33); cap = cap * 3 + 7) {
      const int64_t m = maxMicroBatch(fp, cap);
      EXPECT_GE(m, previous) << name << " cap " << cap;
      if (m > 0) {
        EXPECT_LE(fp.fixedBytes + m * fp.bytesPerSample, cap);
      }
      EXPECT_GT(fp.fixedBytes + (m + 1) * fp.bytesPerSample, cap);
      previous = m;
    }
    EXPECT_GT(previous, 1000) << name;  // 8 GiB holds a large micro-batch of these small models
  }
}

}  // namespace
}  // namespace hetra::train
