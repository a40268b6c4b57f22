#include "train/pipeline/profile.h"

#include <algorithm>
#include <limits>

#include "common/timing.h"
#include "device/memory_accounting.h"
#include "train/models.h"

namespace hetra::train::pipeline {

double EmulatedDevice::compute(double slowdown, const std::function<void()>& work) {
  const auto start = Clock::now();
  device::ComputeScope segment(emulator_, slowdown, clocks_);
  work();
  segment.end();
  return secondsSince(start);
}

torch::Tensor summedLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

BlockProfile profileBlocks(BlockModel& model, const Batch& chunk, EmulatedDevice& device,
                           double slowdown, int rounds) {
  const size_t blocks = model.blockCount();
  BlockProfile profile;
  profile.seconds.assign(blocks, std::numeric_limits<double>::infinity());
  profile.activationBytes.assign(blocks, 0);
  profile.outputShapes.resize(blocks);
  auto& ledger = device::MemoryLedger::process();
  // Host memory: the profile holds every block's activations at once, more than any stage will, so
  // it must not count against the device's cap. What each forward leaves alive is still measured.
  constexpr auto kProfiled = device::MemoryCategory::kHostData;
  device::MemoryScope host(kProfiled);
  for (int round = 0; round < rounds; ++round) {
    // Each block's input is a leaf, as on a stage, so its backward can run on its own.
    std::vector<torch::Tensor> inputs(blocks), outputs(blocks);
    std::vector<double> seconds(blocks, 0.0);
    torch::Tensor x = chunk.inputs;
    for (size_t b = 0; b < blocks; ++b) {
      inputs[b] = b == 0 ? x : x.detach().requires_grad_(true);
      const int64_t before = ledger.usage().liveOf(kProfiled);
      seconds[b] += device.compute(slowdown, [&] {
        outputs[b] = model.forwardBlocks(inputs[b], b, b + 1);
        if (b + 1 == blocks) outputs[b] = summedLoss(outputs[b], chunk.targets);
      });
      const int64_t after = ledger.usage().liveOf(kProfiled);
      profile.activationBytes[b] = std::max<int64_t>(profile.activationBytes[b], after - before);
      if (b + 1 < blocks) {
        const auto sizes = outputs[b].sizes();
        profile.outputShapes[b].assign(sizes.begin() + 1, sizes.end());
      }
      x = outputs[b];
    }
    torch::Tensor gradient;
    for (size_t b = blocks; b-- > 0;) {
      seconds[b] += device.compute(slowdown, [&] {
        if (b + 1 == blocks)
          outputs[b].backward();
        else
          outputs[b].backward(gradient);
      });
      if (b > 0) gradient = inputs[b].grad();
    }
    for (size_t b = 0; b < blocks; ++b)
      profile.seconds[b] = std::min(profile.seconds[b], seconds[b]);
  }
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  return profile;
}

}  // namespace hetra::train::pipeline
