#include "train/tensor_parallel_trainer.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "device/compute_scope.h"
#include "device/memory_accounting.h"
#include "device/slowdown.h"
#include "train/dataset_geometry.h"
#include "train/rank_device.h"
#include "train/specs.h"

namespace hetra::train {

double profileModelSeconds(const ModelSpec& spec, const DeviceConfig& device, int64_t samples) {
  device::MemoryScope host(device::MemoryCategory::kHostData);  // a probe, not the run's state
  auto model = makeModel(spec);
  std::vector<int64_t> shape{samples};
  shape.insert(shape.end(), spec.sampleShape.begin(), spec.sampleShape.end());
  auto generator = at::detail::createCPUGenerator(1);
  const auto inputs = torch::randn(shape, generator);
  const auto targets = torch::zeros({samples}, torch::kInt64);
  device::SlowdownEmulator emulator;
  const auto clocks = device::ComputeClocks::ofThisProcess(int(device.threads));
  std::vector<double> seconds;
  for (int i = 0; i < 4; ++i) {
    model->zero_grad();
    device::ComputeScope segment(emulator, slowdownAt(device, 0), clocks);
    torch::nn::functional::cross_entropy(model->forward(inputs), targets).backward();
    segment.end();
    if (i > 0) seconds.push_back(segment.computingSeconds());  // the first warms up
  }
  std::nth_element(seconds.begin(), seconds.begin() + 1, seconds.end());
  return seconds[1];
}

namespace {

// The split every replica uses (their slices are all-reduced between replicas, so they must be
// alike): every rank measures its device, the world all-gathers the times, and each rank computes
// the same split from, for each tensor rank t, the slowest of the replicas' devices t.
TensorSplit splitOfReplicas(const RunConfig& config, const ModelSpec& spec,
                            comm::Communicator& world) {
  const size_t t = size_t(config.parallel.tensor), ranks = size_t(world.size());
  if (config.parallel.tensorSplit == "even")
    return tensorSplitFor(spec, std::vector<double>(t, 1.0), /*even=*/true);
  const DeviceConfig& device = config.devices[size_t(world.rank())];
  setComputeThreads(int(device.threads));
  double mine = profileModelSeconds(spec, device, std::min<int64_t>(16, config.train.globalBatch));
  std::vector<double> seconds(ranks);
  world.allgather(&mine, seconds.data(), std::vector<size_t>(ranks, 1), DType::F64)->wait();
  std::vector<double> slowest(t, 0.0);
  for (size_t r = 0; r < ranks; ++r) slowest[r % t] = std::max(slowest[r % t], seconds[r]);
  std::vector<double> speeds;
  for (double s : slowest) speeds.push_back(1.0 / std::max(s, 1e-9));
  return tensorSplitFor(spec, speeds);
}

std::string listed(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : "/") + std::to_string(x);
  return s;
}

}  // namespace

TrainResult trainTensorParallel(const RunConfig& config, std::shared_ptr<comm::Communicator> world,
                                const TrainerOptions& options) {
  const int t = int(config.parallel.tensor), rank = world->rank();
  HETRA_ENFORCE(t > 1 && world->size() % t == 0, "parallel.tensor = ", t, " over ", world->size(),
                " ranks");
  const int replica = rank / t, tensorRank = rank % t, replicas = world->size() / t;
  comm::GroupOptions groupOptions;
  groupOptions.timeout = Millis(int64_t(config.comm.timeoutS * 1000));
  std::shared_ptr<comm::Communicator> tensor = world->split(replica, tensorRank, groupOptions);
  std::shared_ptr<comm::Communicator> data = world->split(tensorRank, replica, groupOptions);

  const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
  const TensorSplit split = splitOfReplicas(config, spec, *world);
  if (rank == 0) {
    std::printf(
        "tensor parallel: %d replica(s) of %d devices, heads %s, MLP units %s per device "
        "(parallel.tensor_split = \"%s\")\n",
        replicas, t, listed(split.heads).c_str(), listed(split.hidden).c_str(),
        config.parallel.tensorSplit.c_str());
    std::fflush(stdout);
  }

  // The data-parallel trainer over this rank's data-parallel group: its devices are this tensor
  // rank's of every replica.
  RunConfig inner = config;
  inner.parallel.tensor = 1;
  // Each tensor rank runs a balancer of its own, fed alike; leaving a replica out would need every
  // rank of it to leave its group at once (balance/balancer.h, "left out"): not done.
  inner.balance.leaveOut = false;
  inner.devices.clear();
  for (int j = 0; j < replicas; ++j)
    inner.devices.push_back(config.devices[size_t(j * t + tensorRank)]);
  TrainerOptions innerOptions = options;
  innerOptions.makeModel = [spec, split, tensor] {
    return std::make_shared<TensorParallelTransformer>(spec, split, tensor);
  };
  innerOptions.replicaGroup = tensor;
  innerOptions.modelName = str("transformer, tensor-parallel over ", t, " devices a replica");
  if (tensorRank != 0) {
    innerOptions.report = false;
    innerOptions.metricsPath.clear();
  }
  return train(inner, std::move(data), innerOptions);
}

std::string predictedTensorParallel(const RunConfig& config) {
  const size_t t = size_t(config.parallel.tensor);
  if (t <= 1) return "";
  setComputeThreads(1);  // as a device of one thread; LibTorch's default takes every core here
  const ModelSpec spec = modelSpecOf(config, datasetGeometry(config.data));
  const size_t replicas = config.devices.size() / t;
  const int64_t samples = std::max<int64_t>(1, config.train.globalBatch / int64_t(replicas));
  DeviceConfig here;
  here.threads = 1;
  const double seconds = profileModelSeconds(spec, here, samples);
  // The slowest device of each tensor rank over the replicas, as the run's split takes it.
  std::vector<double> slowdowns(t, 0.0);
  for (size_t r = 0; r < config.devices.size(); ++r)
    slowdowns[r % t] = std::max(slowdowns[r % t], slowdownAt(config.devices[r], 0));
  std::vector<double> speeds;
  for (double s : slowdowns) speeds.push_back(1.0 / s);
  const TensorSplit chosen = tensorSplitFor(spec, speeds, config.parallel.tensorSplit == "even");
  const TensorSplit even = tensorSplitFor(spec, speeds, /*even=*/true);
  // A device's part of the step: the whole model's time times its fraction of the heads, slowed.
  const auto stepOf = [&](const TensorSplit& split) {
    double step = 0;
    for (size_t i = 0; i < t; ++i)
      step = std::max(step, seconds * slowdowns[i] * double(split.heads[i]) / double(spec.heads));
    return step;
  };
  const auto millis = [](double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f ms", 1e3 * s);
    return std::string(text);
  };
  return str("# Tensor parallelism: ", replicas, " replica(s) of ", t,
             " devices, parallel.tensor_split = \"", config.parallel.tensorSplit, "\": heads ",
             listed(chosen.heads), ", MLP units ", listed(chosen.hidden), " per device\n",
             "#   predicted compute of a replica's step (", samples,
             " samples): ", millis(stepOf(chosen)), "; an even split (heads ", listed(even.heads),
             "): ", millis(stepOf(even)), "\n",
             "#   from the whole model's forward and backward on one thread of this host (",
             millis(seconds), "), times each device's fraction of the heads and its slowdown; ",
             "the replicated embedding and head and the layers' allreduces are not counted\n");
}

}  // namespace hetra::train
