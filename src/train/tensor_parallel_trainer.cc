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

}  // namespace hetra::train
