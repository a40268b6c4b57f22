// Activation checkpointing (train/activation_checkpoint.h): the same gradients as plain blocks,
// bit for bit; dropout equal only because the generator state is restored; and the activation
// peak, counted by the counting allocator, lower as the arithmetic of docs/memory.md predicts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "device/memory_accounting.h"
#include "train/activation_checkpoint.h"
#include "train/device_memory.h"

namespace hetra::train {
namespace {

// An MLP block, x + fc2(gelu(fc1(x))), optionally with dropout after the gelu.
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t dim, double dropout) : dropout(dropout) {
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::gelu(fc1->forward(x));
    if (dropout > 0) h = torch::dropout(h, dropout, /*train=*/true);
    return x + fc2->forward(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  double dropout;
};
TORCH_MODULE(MlpBlock);

// `blocks` blocks with parameters equal for every call with the same seed.
std::vector<MlpBlock> makeBlocks(int blocks, int64_t dim, double dropout, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<MlpBlock> out;
  for (int b = 0; b < blocks; ++b) out.emplace_back(dim, dropout);
  return out;
}

// Forward and backward through the blocks, plain or checkpointed; returns every parameter's
// gradient and the input's, in order. The loss weights each output element differently.
std::vector<torch::Tensor> gradients(std::vector<MlpBlock>& blocks, const torch::Tensor& input,
                                     bool checkpointed, const CheckpointOptions& options = {}) {
  torch::Tensor x = input.clone().requires_grad_(true);
  torch::Tensor h = x;
  for (auto& block : blocks) h = checkpointed ? checkpoint(block, h, options) : block->forward(h);
  const auto weights = torch::arange(h.numel(), torch::kFloat32).reshape(h.sizes()) / h.numel();
  (h * weights).sum().backward();
  std::vector<torch::Tensor> grads;
  for (auto& block : blocks)
    for (const auto& p : block->parameters()) grads.push_back(p.grad().clone());
  grads.push_back(x.grad().clone());
  return grads;
}

bool allEqual(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

TEST(ActivationCheckpoint, GradientsAreBitwiseEqualToPlainBlocks) {
  const auto input = torch::randn({6, 16});
  auto plain = makeBlocks(4, 16, 0.0, 3);
  auto checkpointed = makeBlocks(4, 16, 0.0, 3);
  const auto expected = gradients(plain, input, false);
  const auto actual = gradients(checkpointed, input, true);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(expected[i].defined() && actual[i].defined()) << i;
    EXPECT_GT(expected[i].abs().sum().item<double>(), 0) << i;
    EXPECT_TRUE(torch::equal(actual[i], expected[i])) << "gradient " << i;
  }
}

TEST(ActivationCheckpoint, DropoutIsEqualOnlyBecauseTheRngStateIsRestored) {
  const auto input = torch::randn({6, 16});
  auto plain = makeBlocks(3, 16, 0.5, 4);
  torch::manual_seed(99);
  const auto expected = gradients(plain, input, false);
  const float nextPlain = torch::rand({1}).item<float>();

  auto restored = makeBlocks(3, 16, 0.5, 4);
  torch::manual_seed(99);
  EXPECT_TRUE(allEqual(gradients(restored, input, true), expected));
  // The recompute gave the caller's generator back where the plain run leaves it.
  EXPECT_EQ(torch::rand({1}).item<float>(), nextPlain);

  auto unrestored = makeBlocks(3, 16, 0.5, 4);
  torch::manual_seed(99);
  CheckpointOptions noRestore;
  noRestore.preserveRngState = false;
  EXPECT_FALSE(allEqual(gradients(unrestored, input, true, noRestore), expected));
}

TEST(ActivationCheckpoint, WithoutGradModeItIsTheBlock) {
  auto blocks = makeBlocks(1, 8, 0.0, 5);
  const auto x = torch::randn({2, 8});
  torch::NoGradGuard noGrad;
  const auto out = checkpoint(blocks[0], x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(torch::equal(out, blocks[0]->forward(x)));
}

// The activations a forward leaves for backward, and their peak over forward and backward, as
// the counting allocator counts them; the parameters' gradients count as gradients once
// accumulated, as in the trainer.
struct ActivationBytes {
  int64_t afterForward = 0, peak = 0;
};

ActivationBytes activationBytes(std::vector<MlpBlock>& blocks, const torch::Tensor& input,
                                bool checkpointed) {
  DeviceMemory memory("test", 0);
  EXPECT_TRUE(memory.enforced());
  for (auto& block : blocks) memory.trackGradients(block->parameters());
  auto& ledger = device::MemoryLedger::process();
  auto activations = [&] { return ledger.usage().liveOf(device::MemoryCategory::kActivations); };
  ledger.resetPeaks();
  const int64_t before = activations();
  ActivationBytes bytes;
  {
    device::MemoryScope scope(device::MemoryCategory::kActivations);
    torch::Tensor h = input.clone().requires_grad_(true);
    const torch::Tensor x = h;
    for (auto& block : blocks) h = checkpointed ? checkpoint(block, h) : block->forward(h);
    bytes.afterForward = activations() - before;
    h.sum().backward();
  }
  bytes.peak = ledger.usage().peakOf(device::MemoryCategory::kActivations) - before;
  for (auto& block : blocks)
    for (auto& p : block->parameters()) p.mutable_grad() = torch::Tensor();
  return bytes;
}

// Plain, each block leaves fc1's and gelu's outputs (4 x dim wide each) and its output for
// backward; checkpointed, only its output, the next block's input. So after the forward the
// checkpointed blocks hold B + 1 block inputs (the first block's input too), and B generator
// states, and the plain ones at
// least 8 B; backward, which recomputes one block at a time, then peaks lower too.
TEST(ActivationCheckpoint, ActivationsAreLowerAsPredicted) {
  const int64_t n = 256, dim = 128, blockCount = 16;
  const auto input = torch::randn({n, dim});
  const int64_t inputBytes = n * dim * int64_t(sizeof(float));
  auto blocks = makeBlocks(int(blockCount), dim, 0.0, 6);
  const ActivationBytes plain = activationBytes(blocks, input, false);
  const ActivationBytes checkpointed = activationBytes(blocks, input, true);
  EXPECT_GE(checkpointed.afterForward, blockCount * inputBytes);
  // Each checkpointed block also keeps the generator state its recompute restores.
  const int64_t rngStateBytes = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  EXPECT_EQ(checkpointed.afterForward, (blockCount + 1) * inputBytes + blockCount * rngStateBytes);
  EXPECT_GE(plain.afterForward, 8 * blockCount * inputBytes);
  EXPECT_LE(2 * checkpointed.peak, plain.peak) << plain.peak << " vs " << checkpointed.peak;
}

}  // namespace
}  // namespace hetra::train
