#include "train/device_memory.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "common/errors.h"
#include "train/counting_allocator.h"
#include "train/dataset_geometry.h"
#include "train/models.h"
#include "train/specs.h"

namespace hetra::train {
namespace {

device::MemoryLedger& claimedLedger() {
  installCountingAllocator();
  return device::MemoryLedger::process();
}

}  // namespace

DeviceMemory::DeviceMemory(const std::string& device, int64_t capBytes)
    : claim_(claimedLedger(), device, capBytes) {
  if (enforced()) device::MemoryLedger::process().resetPeaks();
}

DeviceMemory::~DeviceMemory() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hookKeys_[k]);
}

void DeviceMemory::trackGradients(const std::vector<torch::Tensor>& params) {
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(p);
    HETRA_ENFORCE(accumulator != nullptr, "a parameter has no gradient accumulator");
    params_.push_back(p);
    torch::Tensor param = p;  // a handle: the hook reads the .grad it has just accumulated
    hookKeys_.push_back(
        accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [param](const torch::autograd::variable_list& outputs,
                    const torch::autograd::variable_list&) {
              recategorize(param.grad(), device::MemoryCategory::kGradients);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

void DeviceMemory::adoptGradients() {
  for (const auto& p : params_) recategorize(p.grad(), device::MemoryCategory::kGradients);
}

int optimizerStateCopies(const std::string& optimizer, double momentum) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  return optimizer == "sgd" && momentum > 0 ? 1 : 0;
}

std::string whatFits(const DeviceOutOfMemoryError& error, const device::MemoryUsage& usage,
                     int64_t microBatch, int stateCopies, bool checkpointing,
                     const std::string& deviceKey) {
  using device::MemoryCategory;
  using device::readableBytes;
  const int64_t parameters = usage.liveOf(MemoryCategory::kParameters);
  // Gradients and optimizer state as they will be at the step's end, whether or not they exist
  // yet (the first step fails before the optimizer has allocated its state).
  const int64_t fixed =
      parameters * (2 + stateCopies) + usage.liveOf(MemoryCategory::kCommunication);
  const int64_t cap = error.capBytes();
  std::string text =
      str(error.what(), ". Measured: parameters ", readableBytes(parameters),
          ", with their gradients, optimizer state and buckets ", readableBytes(fixed));
  if (fixed >= cap)
    return text + str("; that alone passes the cap, so no micro-batch fits: this model needs ",
                      deviceKey, ".memory above ", readableBytes(fixed),
                      " (sharding parameters or optimizer state, ZeRO, is not in hetra yet)");
  // The micro-batch had at least its live activations and the refused allocation to hold.
  const int64_t activations = usage.liveOf(MemoryCategory::kActivations) +
                              (error.category() == "activations" ? error.askedBytes() : 0);
  const int64_t perSample = std::max<int64_t>(1, activations / std::max<int64_t>(1, microBatch));
  const int64_t fits = (cap - fixed) / perSample;
  text += str("; a micro-batch of ", microBatch, " samples needed more than ",
              readableBytes(activations), " of activations (", readableBytes(perSample),
              " a sample or more). What would fit: ");
  // perSample is a lower bound (the micro-batch had not finished), so fits is an upper bound.
  if (fits >= 1)
    text += str(deviceKey, ".max_micro_batch = ", std::min(fits, microBatch - 1),
                " or less (the balancer then accumulates gradients, the step stays the same)");
  else
    text += "not one sample of activations as the model is";
  if (!checkpointing)
    text +=
        "; train.activation_checkpointing = \"blocks\" (built-in models: only each block's "
        "input is kept, the rest recomputed in backward)";
  return text;
}

std::string predictedMemory(const RunConfig& config) {
  const MemoryFootprint footprint =
      estimateFootprint(modelSpecOf(config, datasetGeometry(config.data)));
  const int64_t devices = int64_t(config.devices.size());
  const int64_t share = (config.train.globalBatch + devices - 1) / std::max<int64_t>(1, devices);
  std::string text =
      str("# Predicted peak device memory at an equal split (the analytic estimate, ",
          "which errs high; hetra measures the real one, docs/memory.md):\n");
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const DeviceConfig& d = config.devices[i];
    int64_t m = std::min(share, maxMicroBatch(footprint, d.memoryBytes));
    if (d.maxMicroBatch > 0) m = std::min(m, d.maxMicroBatch);
    const int64_t peak = footprint.fixedBytes + m * footprint.bytesPerSample;
    text += str("#   devices[", i, "] ", d.name, ": ", device::readableBytes(peak),
                " at micro-batch ", m,
                d.memoryBytes > 0 ? str(" (cap ", device::readableBytes(d.memoryBytes), ")")
                                  : std::string(" (no cap)"),
                "\n");
  }
  return text;
}

void reportMemory(const DeviceMemory& memory, double* peak, double* categories) {
  if (!memory.enforced()) {
    *peak = -1;
    for (size_t c = 0; c < device::kMemoryCategories; ++c) categories[c] = 0;
    return;
  }
  const auto usage = memory.usage();
  *peak = double(usage.devicePeak);
  for (size_t c = 0; c < device::kMemoryCategories; ++c) categories[c] = double(usage.peak[c]);
}

}  // namespace hetra::train
