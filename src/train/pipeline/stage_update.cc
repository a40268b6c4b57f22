#include "train/pipeline/stage_update.h"

#include "common/errors.h"
#include "common/timeline.h"
#include "common/timing.h"
#include "device/memory_accounting.h"
#include "train/data_parallel.h"
#include "train/models.h"
#include "train/zero_parallel.h"

namespace hetra::train::pipeline {
namespace {

// The stage's parameters as a Model, for ZeroParallel, which shards a model's parameters in
// registration order. The tensors are the stage's own (registering shares them), so moving them
// into ZeRO's flat buffer moves the blocks' parameters too. Never run.
class ParameterList : public Model {
 public:
  explicit ParameterList(const std::vector<torch::Tensor>& parameters) {
    for (size_t k = 0; k < parameters.size(); ++k)
      register_parameter("p" + std::to_string(k), parameters[k]);
  }
  torch::Tensor forward(torch::Tensor x) override {
    HETRA_ENFORCE(false, "a pipeline stage's parameter list is not a model to run");
    return x;
  }
};

}  // namespace

StageUpdate::StageUpdate(std::vector<torch::Tensor> parameters,
                         std::shared_ptr<comm::Communicator> replicas, StageUpdateOptions options)
    : parameters_(std::move(parameters)), replicas_(std::move(replicas)) {
  HETRA_ENFORCE(options.zeroStage == 0 || options.zeroStage == 1,
                "a pipeline stage runs zero.stage 0 or 1, not ", options.zeroStage);
  if (options.zeroStage == 1) {
    ZeroOptions zero;
    zero.stage = 1;
    zero.optimizer = options.optimizer;
    zero.shardSizes = std::move(options.shardSizes);
    zero_ = std::make_unique<ZeroParallel>(std::make_shared<ParameterList>(parameters_), replicas_,
                                           zero);
    return;
  }
  optimizer_ = makeOptimizer(parameters_, options.optimizer);
  if (replicas_->size() > 1) {
    int64_t elements = 0;
    for (const auto& p : parameters_) elements += p.numel();
    device::MemoryScope buffer(device::MemoryCategory::kCommunication);
    flatGradients_ = torch::empty({elements}, torch::kFloat32);
  }
}

StageUpdate::~StageUpdate() = default;

void StageUpdate::beginStep() {
  if (zero_) zero_->beginStep(1, 1);
}

void StageUpdate::sumGradients() {
  torch::NoGradGuard noGrad;
  int64_t offset = 0;
  for (const auto& p : parameters_) {
    auto part = flatGradients_.narrow(0, offset, p.numel());
    if (p.grad().defined())
      part.copy_(p.grad().reshape({-1}));
    else
      part.zero_();  // this replica ran no samples, or the parameter was unused
    offset += p.numel();
  }
  replicas_
      ->allreduce(flatGradients_.data_ptr<float>(), flatGradients_.data_ptr<float>(),
                  size_t(flatGradients_.numel()), DType::F32, comm::ReduceOp::Sum)
      ->wait();
  offset = 0;
  for (auto& p : parameters_) {
    auto summed = flatGradients_.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined())
      p.mutable_grad().copy_(summed);
    else
      p.mutable_grad() = summed.clone();
    offset += p.numel();
  }
}

UpdateSeconds StageUpdate::update(double lr, EmulatedDevice& device, double slowdown) {
  UpdateSeconds spent;
  if (zero_) {
    {
      timeline::Span span(timeline::Lane::Compute, "comm", "reduce-scatter stage gradients");
      device::MemoryScope buffers(device::MemoryCategory::kCommunication);
      spent.comm += zero_->finish();
    }
    {
      timeline::Span span(timeline::Lane::Compute, "compute", "optimizer step");
      device::MemoryScope state(device::MemoryCategory::kOptimizerState);
      spent.compute = device.compute(slowdown, [&] { zero_->updateShard(lr, 0); });
    }
    timeline::Span span(timeline::Lane::Compute, "comm", "all-gather stage parameters");
    spent.comm += zero_->shareParameters();
    return spent;
  }
  if (flatGradients_.defined()) {
    timeline::Span span(timeline::Lane::Compute, "comm", "allreduce stage gradients");
    const auto start = Clock::now();
    sumGradients();
    spent.comm = secondsSince(start);
  }
  {
    timeline::Span span(timeline::Lane::Compute, "compute", "optimizer step");
    device::MemoryScope state(device::MemoryCategory::kOptimizerState);
    spent.compute = device.compute(slowdown, [&] {
      applyLr(*optimizer_, lr);
      optimizer_->step();
    });
  }
  for (auto& p : parameters_) p.mutable_grad().reset();
  return spent;
}

ParameterState StageUpdate::stateOf(const torch::Tensor& parameter) {
  HETRA_ENFORCE(optimizer_ != nullptr, "moving optimizer state needs zero.stage = 0");
  return parameterStateOf(*optimizer_, parameter);
}

void StageUpdate::setState(const torch::Tensor& parameter, ParameterState state) {
  HETRA_ENFORCE(optimizer_ != nullptr, "moving optimizer state needs zero.stage = 0");
  setParameterState(*optimizer_, parameter, std::move(state));
}

double StageUpdate::resynchronize() {
  if (zero_ || replicas_->size() == 1) return 0.0;
  return adoptRootValues(*replicas_, parameters_);
}

int64_t StageUpdate::updatedElements() const {
  if (zero_) return zero_->ownShard().size();
  int64_t elements = 0;
  for (const auto& p : parameters_) elements += p.numel();
  return elements;
}

}  // namespace hetra::train::pipeline
