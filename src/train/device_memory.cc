#include "train/device_memory.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "balance/memory_caps.h"
#include "common/errors.h"
#include "common/units.h"
#include "train/counting_allocator.h"
#include "train/dataset_geometry.h"
#include "train/datasets.h"
#include "train/models.h"
#include "train/specs.h"
#include "train/zero_plan.h"

namespace hetra::train {
namespace {

using device::MemoryCategory;
using device::MemoryLedger;
using device::readableBytes;

device::MemoryLedger& claimedLedger() {
  installCountingAllocator();
  return MemoryLedger::process();
}

// "12.3 KiB (12595 bytes)": readable, and exact for whoever checks the arithmetic.
std::string bytesText(int64_t bytes) {
  return str(readableBytes(bytes), " (", bytes, " bytes)");
}

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Forward and backward of `batch` as a micro-batch of the trainer (train/trainer.cc) runs them;
// returns the peak of the activations beyond what was live before.
int64_t activationPeakOf(Model& model, const Batch& batch) {
  for (auto& p : model.parameters()) p.mutable_grad().reset();  // as every step starts
  auto& ledger = MemoryLedger::process();
  device::MemoryScope activations(MemoryCategory::kActivations);
  const int64_t before = ledger.usage().liveOf(MemoryCategory::kActivations);
  ledger.startWindow();
  {
    auto loss = torch::nn::functional::cross_entropy(
        model.forward(batch.inputs), batch.targets,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    (loss * (1.0 / double(batch.targets.size(0)))).backward();  // scaled, as the trainer's is
  }
  const int64_t peak = ledger.window().peakOf(MemoryCategory::kActivations) - before;
  for (auto& p : model.parameters()) p.mutable_grad().reset();
  return peak;
}

Batch firstSamples(const Dataset& data, int64_t samples) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < samples; ++i) indices.push_back(i % data.size());
  return data.get(indices);
}

// The footprint of the model of `config` (or the program's own), measured on a replica with the
// cap lifted; `usage` is what the rank held when it was refused.
MeasuredFootprint measureFootprint(const device::MemoryUsage& usage, const RunConfig& config,
                                   const std::function<std::shared_ptr<Model>()>& programModel,
                                   const Dataset& data, int64_t microBatch) {
  MeasuredFootprint footprint;
  auto& ledger = MemoryLedger::process();
  MemoryLedger::Uncapped uncapped(ledger);
  std::shared_ptr<Model> replica;
  {
    device::MemoryScope host(MemoryCategory::kHostData);  // the replica is no device's
    replica =
        programModel
            ? programModel()
            : makeModel(modelSpecOf(config, DatasetGeometry{data.inputShape(), data.classes()}));
  }
  int64_t trainable = 0;
  for (const auto& p : replica->parameters()) {
    const int64_t bytes = int64_t(p.numel() * p.element_size());
    footprint.largestParameter = std::max(footprint.largestParameter, bytes);
    if (p.requires_grad()) trainable += bytes;
  }
  footprint.parameters = usage.liveOf(MemoryCategory::kParameters);
  footprint.gradients = trainable;
  footprint.optimizerState =
      trainable * optimizerStateCopies(config.train.optimizer, config.train.momentum);
  footprint.communication = usage.liveOf(MemoryCategory::kCommunication);

  // Two sizes give base and per-sample bytes; the smaller first, also to warm LibTorch's lazy
  // state up (its first forward allocates what later ones reuse).
  const int64_t small = std::max<int64_t>(1, microBatch / 2);
  const int64_t large = std::max<int64_t>(small + 1, microBatch);
  GradientCategory gradients(replica->parameters());
  const Batch smallBatch = firstSamples(data, small), largeBatch = firstSamples(data, large);
  activationPeakOf(*replica, smallBatch);
  const int64_t atSmall = activationPeakOf(*replica, smallBatch);
  const int64_t atLarge = activationPeakOf(*replica, largeBatch);
  footprint.activationPerSample = std::max<int64_t>(0, ceilDiv(atLarge - atSmall, large - small));
  footprint.activationBase = atSmall - footprint.activationPerSample * small;
  if (footprint.activationBase < 0) {  // not affine: the larger size's bytes per sample err safe
    footprint.activationBase = 0;
    footprint.activationPerSample = ceilDiv(atLarge, large);
  }
  auto blocks = std::dynamic_pointer_cast<BlockModel>(replica);
  if (!programModel && blocks && config.train.activationCheckpointing != "blocks") {
    blocks->setCheckpointing(true);
    const Batch failing = firstSamples(data, microBatch);
    activationPeakOf(*replica, failing);
    footprint.checkpointedActivations = activationPeakOf(*replica, failing);
  }
  return footprint;
}

// The lines of the message after the ledger's own (docs/memory.md shows one).
std::string describe(const DeviceOutOfMemoryError& error, const MeasuredFootprint& footprint,
                     const WhatFits& fits, int64_t microBatch, int devices, bool checkpointing,
                     const std::string& deviceKey) {
  std::string text =
      str("\n  measured (a replica of the model, the cap lifted): parameters ",
          readableBytes(footprint.parameters), ", gradients ", readableBytes(footprint.gradients),
          ", optimizer state ", readableBytes(footprint.optimizerState), ", communication ",
          readableBytes(footprint.communication), ": ", bytesText(footprint.fixed()),
          " fixed; activations ", readableBytes(footprint.activationBase), " + ",
          readableBytes(footprint.activationPerSample), " a sample (",
          bytesText(footprint.activationsAt(microBatch)), " at the failing micro-batch of ",
          microBatch, ")\n  what would fit under the cap of ", bytesText(error.capBytes()), ":");
  const bool batchSized = error.category() == "activations" || error.category() == "gradients";
  if (!batchSized)
    text += str("\n  - a smaller micro-batch does not help: ", error.category(), " passed the cap");
  else if (fits.largestMicroBatch >= 1)
    text +=
        str("\n  - ", deviceKey, ".max_micro_batch = ", fits.largestMicroBatch, " (predicted peak ",
            bytesText(zeroPeak(footprint, 0, devices, fits.largestMicroBatch)),
            "; the balancer accumulates gradients, the step's batch stays the same)");
  else
    text += str("\n  - no micro-batch: the fixed part and one sample's activations need ",
                bytesText(zeroPeak(footprint, 0, devices, 1)));
  if (checkpointing)
    text += "\n  - train.activation_checkpointing is \"blocks\" already";
  else if (fits.checkpointedPeak >= 0)
    text += str("\n  - train.activation_checkpointing = \"blocks\": predicted peak ",
                bytesText(fits.checkpointedPeak), " at micro-batch ", microBatch,
                fits.checkpointedPeak <= error.capBytes() ? " (fits)" : " (does not fit)");
  else
    text +=
        "\n  - activation checkpointing: a program's own model checkpoints its blocks with "
        "hetra::train::checkpoint (train/activation_checkpoint.h)";
  if (fits.zeroStage > 0)
    text += str("\n  - ZeRO stage ", fits.zeroStage, " over ", devices,
                " devices with even shards (zero.stage = ", fits.zeroStage,
                "; docs/zero.md): predicted peak ", bytesText(fits.zeroPeak), " at micro-batch ",
                fits.zeroMicroBatch);
  else if (fits.largestMicroBatch >= 1)
    text +=
        str("\n  - no ZeRO stage over ", devices, " devices holds the micro-batch of ", microBatch,
            " (stage 3: ", bytesText(zeroPeak(footprint, 3, devices, microBatch)), ")");
  else
    text += str("\n  - no ZeRO stage over ", devices, " devices: stage 3 needs ",
                bytesText(zeroPeak(footprint, 3, devices, 1)), " at micro-batch 1; ", deviceKey,
                ".memory must grow");
  return text;
}

// Most samples a micro-batch may hold at ZeRO stage `stage` under `capBytes`.
int64_t largestAt(const MeasuredFootprint& footprint, int stage, int devices, int64_t capBytes) {
  const int64_t base = zeroPeak(footprint, stage, devices, 0);
  if (base + footprint.activationPerSample > capBytes) return 0;
  if (footprint.activationPerSample == 0) return std::numeric_limits<int64_t>::max();
  return (capBytes - base) / footprint.activationPerSample;
}

}  // namespace

GradientCategory::GradientCategory(const std::vector<torch::Tensor>& params) {
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
              recategorize(param.grad(), MemoryCategory::kGradients);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradientCategory::~GradientCategory() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hookKeys_[k]);
}

void GradientCategory::adopt() {
  for (const auto& p : params_) recategorize(p.grad(), MemoryCategory::kGradients);
}

DeviceMemory::DeviceMemory(const std::string& device, int64_t capBytes)
    : accounting_(device::memoryAccountingEnabled()), claim_(claimedLedger(), device, capBytes) {
  if (capBytes > 0 && !accounting_)
    throw ConfigError(str("device ", device, " has a memory cap, which ",
                          device::memoryAccountingParam(),
                          "=0 cannot enforce (nothing is counted): unset it, or remove the cap"));
  if (enforced()) MemoryLedger::process().resetPeaks();
}

void DeviceMemory::trackGradients(const std::vector<torch::Tensor>& params) {
  gradients_.emplace(params);
}

void DeviceMemory::adoptGradients() {
  if (gradients_) gradients_->adopt();
}

void DeviceMemory::startMicroBatch() {
  if (!enforced()) return;
  auto& ledger = MemoryLedger::process();
  windowLive_ = ledger.usage().liveOf(MemoryCategory::kActivations);
  ledger.startWindow();
}

void DeviceMemory::endMicroBatch(int64_t samples) {
  if (!enforced()) return;
  const device::MemoryUsage window = MemoryLedger::process().window();
  const ActivationMeasurement measured{
      samples, window.peakOf(MemoryCategory::kActivations) - windowLive_, window.devicePeak};
  if (std::pair(samples, measured.devicePeak) > std::pair(step_.samples, step_.devicePeak))
    step_ = measured;
}

ActivationMeasurement DeviceMemory::takeMeasurement() {
  return std::exchange(step_, {});
}

int64_t measuredMicroBatchBound(const DeviceConfig& device, const ActivationMeasurement& measured) {
  if (device.memoryBytes <= 0 || measured.samples < 1) return 0;
  // The device's peak less the activations: what stays when the micro-batch shrinks or grows. (The
  // categories' own peaks would count twice what moves between them, such as a gradient autograd
  // holds among the activations before it adopts it.)
  const int64_t fixed = std::max<int64_t>(0, measured.devicePeak - measured.bytes);
  int64_t bound =
      balance::measuredMaxMicroBatch(device.memoryBytes, fixed, measured.bytes, measured.samples);
  if (device.maxMicroBatch > 0) bound = std::min(bound, device.maxMicroBatch);
  return bound;
}

int optimizerStateCopies(const std::string& optimizer, double momentum) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  return optimizer == "sgd" && momentum > 0 ? 1 : 0;
}

int64_t zeroPeak(const MeasuredFootprint& footprint, int stage, int devices, int64_t samples) {
  HETRA_ENFORCE(stage >= 0 && stage <= 3 && devices >= 1, "ZeRO stage ", stage, " over ", devices,
                " devices");
  const int64_t n = devices;
  const int64_t p = footprint.parameters, g = footprint.gradients, s = footprint.optimizerState;
  int64_t fixed = p + g + s;
  if (stage == 1) fixed = p + g + ceilDiv(s, n);
  if (stage == 2) fixed = p + ceilDiv(g + s, n);
  if (stage == 3) fixed = ceilDiv(p + g + s, n) + footprint.largestParameter;
  return fixed + footprint.communication + footprint.activationsAt(samples);
}

WhatFits whatFits(const MeasuredFootprint& footprint, int64_t capBytes, int64_t microBatch,
                  int devices) {
  WhatFits fits;
  // The failing size demonstrably did not fit, whatever the prediction says of it.
  fits.largestMicroBatch =
      std::min(largestAt(footprint, 0, devices, capBytes), std::max<int64_t>(0, microBatch - 1));
  if (footprint.checkpointedActivations >= 0)
    fits.checkpointedPeak = footprint.fixed() + footprint.checkpointedActivations;
  // The least stage that holds the failing micro-batch; when not even one sample fits without
  // ZeRO, the least stage that holds any, at its largest.
  const auto choose = [&](int stage, int64_t samples) {
    fits.zeroStage = stage;
    fits.zeroMicroBatch = samples;
    fits.zeroPeak = zeroPeak(footprint, stage, devices, samples);
  };
  for (int stage = 1; stage <= 3 && fits.zeroStage == 0; ++stage)
    if (largestAt(footprint, stage, devices, capBytes) >= microBatch) choose(stage, microBatch);
  for (int stage = 1; stage <= 3 && fits.zeroStage == 0 && fits.largestMicroBatch == 0; ++stage)
    if (const int64_t largest = largestAt(footprint, stage, devices, capBytes); largest >= 1)
      choose(stage, std::min(largest, microBatch));
  return fits;
}

DeviceOutOfMemoryError withWhatFits(const DeviceOutOfMemoryError& error, const RunConfig& config,
                                    const std::function<std::shared_ptr<Model>()>& makeModel,
                                    const Dataset& data, int64_t microBatch, int rank) {
  std::string text = error.what();
  try {
    const int devices = int(config.devices.size());
    const MeasuredFootprint footprint = measureFootprint(
        MemoryLedger::process().usageAtLastRefusal(), config, makeModel, data, microBatch);
    text += describe(error, footprint, whatFits(footprint, error.capBytes(), microBatch, devices),
                     microBatch, devices, config.train.activationCheckpointing == "blocks",
                     str("devices[", rank, "]"));
  } catch (const std::exception& e) {
    text += str("\n  (what would fit could not be measured: ", e.what(), ")");
  }
  return DeviceOutOfMemoryError(text, error.device(), error.capBytes(), error.category(),
                                error.askedBytes(), error.peakBytes());
}

void checkDeviceMemory(const RunConfig& config) {
  const bool accounting = device::memoryAccountingEnabled();
  int64_t parameterBytes = -1;  // the model is built only when a cap needs it
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const DeviceConfig& d = config.devices[i];
    if (d.memoryBytes <= 0) continue;
    const std::string key = str("devices[", i, "].memory = \"", formatBytes(d.memoryBytes), "\"");
    if (!accounting)
      throw ConfigError(str(key, ": a cap needs memory accounting, which ",
                            device::memoryAccountingParam(),
                            "=0 turns off (nothing could enforce the cap); unset it, or remove "
                            "the cap"));
    if (parameterBytes < 0) {
      device::MemoryScope host(device::MemoryCategory::kHostData);
      parameterBytes =
          int64_t(sizeof(float)) *
          parameterCount(*makeModel(modelSpecOf(config, datasetGeometry(config.data))));
    }
    if (d.memoryBytes < 2 * parameterBytes)
      throw ConfigError(str(key, " (", d.memoryBytes,
                            " bytes): too small for this model, whose parameters and their "
                            "gradients alone need ",
                            bytesText(2 * parameterBytes),
                            "; the rest (optimizer state, activations) is measured when the run "
                            "starts"));
  }
}

std::string predictedMemory(const RunConfig& config) {
  const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
  const MemoryFootprint footprint = estimateFootprint(spec);
  const int64_t devices = int64_t(config.devices.size());
  const int64_t share = (config.train.globalBatch + devices - 1) / std::max<int64_t>(1, devices);
  // Each device's bytes before activations, and its micro-batch cap: the analytic footprint's
  // under data parallelism, the shard plan's under ZeRO (as the trainer plans it).
  std::vector<int64_t> fixed(config.devices.size(), footprint.fixedBytes);
  std::vector<int64_t> caps;
  for (const DeviceConfig& d : config.devices)
    caps.push_back(std::max<int64_t>(1, maxMicroBatch(footprint, d.memoryBytes)));
  if (config.zero.stage > 0) {
    device::MemoryScope host(device::MemoryCategory::kHostData);
    const auto model = makeModel(spec);
    const ShardedBytes bytes = shardedBytesOf(config, *model);
    const auto shards = planShards(config, bytes, bytes.psi, footprint.bytesPerSample);
    const auto shardedCaps = shardedRankCaps(config, bytes, shards, footprint.bytesPerSample);
    for (size_t i = 0; i < config.devices.size(); ++i) {
      fixed[i] = bytes.fixedFor(shards[i], offloadOf(config, i));
      caps[i] = shardedCaps[i].maxMicroBatch;
    }
  }
  std::string text = str(
      "# Predicted peak device memory at an equal split (the analytic estimate, ",
      "which errs high; hetra measures the real one, docs/memory.md)",
      config.zero.stage > 0 ? str(", ZeRO stage ", config.zero.stage, "'s shard plan") : "", ":\n");
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const DeviceConfig& d = config.devices[i];
    int64_t m = std::min(share, caps[i]);
    if (d.maxMicroBatch > 0) m = std::min(m, d.maxMicroBatch);
    const int64_t peak = fixed[i] + m * footprint.bytesPerSample;
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
