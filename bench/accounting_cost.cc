// What memory accounting costs one rank's training step (docs/memory.md), measured directly: whole
// demo runs (bench/compare_accounting.sh) vary more between runs on a shared VM than the 1% to be
// resolved. The config's model, optimizer and data are stepped as the trainer steps a micro-batch
// (phases, the micro-batch's memory window, gradient adoption, the optimizer step, gradients set to
// none) in child processes, alternately with HETRA_MEMORY_ACCOUNTING=1 and =0 (order ABBA, so that
// a drift of the machine falls on both alike); each child reports its median step in thread CPU
// time, which other processes on the machine do not add to. Prints every pair, the medians' ratio
// on/off and the allocations a step makes: the accounting's share of a step's compute, which bounds
// its share of a run's samples/s (a rank's step also waits for communication, which the accounting
// does not touch). In-process alternation of the allocators would mix counted and uncounted blocks
// in one heap, which no run does.
//   accounting_cost [CONFIG] [MICRO_BATCH] [PAIRS] [STEPS]
// Defaults: examples/fashion_mnist_hetero.toml, 293 samples (the fast device's share of the demo's
// 512), 6 pairs of children, 300 steps each (after 20 of warm-up). HETRA_KEEP_HOST_HEAP=0 measures
// with glibc's adaptive heap (device/host_heap.h).
#include <c10/core/CPUAllocator.h>
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/config.h"
#include "train/datasets.h"
#include "train/device_memory.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/rank_device.h"
#include "train/specs.h"

namespace {

using namespace hetra;
using device::MemoryCategory;

double threadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Counts the calls that reach the allocator in front of which it is put (one step, not timed).
class CallCounter : public c10::Allocator {
 public:
  explicit CallCounter(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t bytes) const override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return inner_->allocate(bytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  mutable std::atomic<long> calls{0};

 private:
  c10::Allocator* inner_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Measurement {
  double medianStep = 0;  // seconds of thread CPU time
  long allocations = 0;   // per step
};

// One child: the accounting as the environment says, as in a run.
Measurement measure(const std::string& path, int64_t microBatch, int steps) {
  const train::RunConfig config = train::loadConfig(path, {});
  // As a trainer sets up its rank (compute threads, host heap, DeviceMemory: with the accounting
  // on, the counting allocator): the config's first device, the demo's fast one.
  train::RankDevice device(config, 0);
  train::DeviceMemory& memory = device.memory;
  auto data = train::makeDataset(train::dataSpecOf(config), /*train=*/true);
  std::shared_ptr<train::Model> model;
  {
    device::MemoryScope parameters(MemoryCategory::kParameters);
    model = train::makeModel(
        train::modelSpecOf(config, train::DatasetGeometry{data->inputShape(), data->classes()}));
  }
  memory.trackGradients(model->parameters());
  auto optimizer = train::makeOptimizer(model->parameters(), train::optimSpecOf(config.train));

  int64_t next = 0;
  const auto step = [&] {
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < microBatch; ++i) indices.push_back(next++ % data->size());
    train::Batch batch = data->get(indices);
    {
      device::MemoryScope activations(MemoryCategory::kActivations);
      memory.startMicroBatch();
      auto loss = torch::nn::functional::cross_entropy(
          model->forward(batch.inputs), batch.targets,
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      (loss / double(config.train.globalBatch)).backward();
      memory.endMicroBatch(microBatch);
    }
    memory.takeMeasurement();
    {
      device::MemoryScope buckets(MemoryCategory::kCommunication);
      memory.adoptGradients();
    }
    {
      device::MemoryScope state(MemoryCategory::kOptimizerState);
      optimizer->step();
    }
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  };

  // Warm-up (the optimizer's state, LibTorch's first-call paths, the heap), then one step's calls
  // counted in front of whichever allocator is in use (c10 takes it at a higher priority).
  for (int i = 0; i < 20; ++i) step();
  CallCounter counter(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counter, /*priority=*/200);
  step();
  Measurement m;
  m.allocations = counter.calls.load();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const double start = threadCpuSeconds();
    step();
    times.push_back(threadCpuSeconds() - start);
  }
  m.medianStep = median(times);
  return m;
}

// Runs this program as a child with the accounting on or off; reads its one line back.
Measurement child(const char* self, bool accounting, const std::string& path, int64_t microBatch,
                  int steps) {
  const std::string command = str("HETRA_MEMORY_ACCOUNTING=", accounting ? 1 : 0, " '", self,
                                  "' --child '", path, "' ", microBatch, " ", steps);
  FILE* out = ::popen(command.c_str(), "r");
  HETRA_ENFORCE(out != nullptr, "cannot run ", command);
  Measurement m;
  const int fields = std::fscanf(out, "%lf %ld", &m.medianStep, &m.allocations);
  const int status = ::pclose(out);
  HETRA_ENFORCE(fields == 2 && status == 0, "the child failed: ", command);
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc == 5 && std::string(argv[1]) == "--child") {
    const Measurement m = measure(argv[2], std::atol(argv[3]), std::atoi(argv[4]));
    std::printf("%.9f %ld\n", m.medianStep, m.allocations);
    return 0;
  }
  const std::string path = argc > 1 ? argv[1] : "examples/fashion_mnist_hetero.toml";
  const int64_t microBatch = argc > 2 ? std::atol(argv[2]) : 293;
  const int pairs = argc > 3 ? std::atoi(argv[3]) : 6;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 300;
  HETRA_ENFORCE(microBatch >= 1 && pairs >= 1 && steps >= 1,
                "MICRO_BATCH, PAIRS and STEPS must be positive");
  std::printf("%s, micro-batch %lld, %d pairs of children of %d steps, 1 thread\n", path.c_str(),
              (long long)microBatch, pairs, steps);
  std::printf("%-5s %12s %12s %8s %18s\n", "pair", "on ms/step", "off ms/step", "on/off",
              "allocations/step");
  std::vector<double> ratios;
  for (int pair = 0; pair < pairs; ++pair) {
    Measurement on, off;
    if (pair % 2 == 0) {
      on = child(argv[0], true, path, microBatch, steps);
      off = child(argv[0], false, path, microBatch, steps);
    } else {
      off = child(argv[0], false, path, microBatch, steps);
      on = child(argv[0], true, path, microBatch, steps);
    }
    HETRA_ENFORCE(on.allocations == off.allocations, "the settings made different allocations (",
                  on.allocations, " and ", off.allocations, "): not the same step");
    ratios.push_back(on.medianStep / off.medianStep);
    std::printf("%-5d %12.3f %12.3f %8.4f %18ld\n", pair + 1, 1e3 * on.medianStep,
                1e3 * off.medianStep, ratios.back(), on.allocations);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "on/off: median %.4f, min %.4f, max %.4f (1.0000: no cost; 1.01: the accounting "
      "costs 1%% of a step's compute)\n",
      median(ratios), ratios.front(), ratios.back());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "accounting_cost: %s\n", e.what());
  return 1;
}
