#include "run_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "comm/communicator.h"
#include "common/errors.h"
#include "common/logging.h"
#include "launch.h"
#include "train/config.h"
#include "train/trainer.h"

namespace hetra::cli {

int runTraining(const RunOptions& options, const std::vector<std::string>& argv) {
  // Every rank parses the same file and overrides, so all hold the same config without sending it.
  const train::RunConfig config = train::loadConfig(options.configPath, options.sets);
  train::checkModelFits(config);
  auto context = rankFromEnvironment();
  if (!context) {
    if (options.printConfig) {
      std::printf("%s", train::toToml(config).c_str());
      return 0;
    }
    for (const auto& warning : config.warnings)
      std::fprintf(stderr, "hetra: warning: %s\n", warning.c_str());
    // Emulated devices are packed onto cores by duty cycle, so a slowed device's sleeps leave room
    // for another and the fast device keeps a core to itself; the PyTorch peer (bench/) does the
    // same.
    std::vector<double> duty;
    std::vector<int> threads;
    for (const auto& device : config.devices) {
      double fastest = device.slowdown;
      for (const auto& change : device.slowdownSchedule) fastest = std::min(fastest, change.factor);
      duty.push_back(1.0 / fastest);
      threads.push_back(int(device.threads));
    }
    return spawnLocalRanks(int(config.devices.size()), argv, packByDuty(duty, threads));
  }
  if (context->worldSize != int(config.devices.size()))
    throw ConfigError(str("the config lists ", config.devices.size(),
                          " devices but HETRA_WORLD_SIZE is ", context->worldSize,
                          "; run one rank per [[devices]] entry"));
  log::setRank(context->rank);
  const Millis timeout(int64_t(config.comm.timeoutS * 1000));
  std::shared_ptr<void> server;
  auto store = connectJobStore(*context, timeout, &server);
  comm::GroupOptions group;
  group.transport = config.comm.transport;
  group.timeout = timeout;
  auto comm = comm::Communicator::create(store, context->rank, context->worldSize, group);
  train::TrainerOptions trainer;
  trainer.metricsPath = options.metricsPath;
  trainer.resumeDir = options.resumeDir;
  trainer.progressBar = context->rank == 0 && isatty(STDOUT_FILENO);
  train::train(config, comm, trainer);
  comm->barrier()->wait();
  return 0;
}

}  // namespace hetra::cli
