#include "launch.h"

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <thread>

#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"
#include "store/tcp_store.h"

namespace hetra::cli {
namespace {

const Param kRank("HETRA_RANK", "", "This process's rank in the job (set by the launcher).");
const Param kWorldSize("HETRA_WORLD_SIZE", "", "Number of ranks in the job (set by the launcher).");
const Param kLocalRank("HETRA_LOCAL_RANK", "0", "This process's rank among the ranks of its host.");
const Param kStore("HETRA_STORE", "", "host:port of the job's TCP store; rank 0 serves it.");
const Param kStoreExternal("HETRA_STORE_EXTERNAL", "0",
                           "1 when the launcher serves the store (rank 0 then only connects).");
const Param kPin("HETRA_PIN", "1",
                 "Bind local ranks to one CPU each when there are enough CPUs (0: never).");
const Param kJobId("HETRA_JOB_ID", "job", "Prefix of this job's keys in the store.");

int parseRankNumber(const Param& param) {
  const int64_t value = param.integer();
  if (value < 0 || value > 1 << 20)
    throw ConfigError(str(param.env(), "=", value, " is out of range; allowed: 0 to 1048576"));
  return int(value);
}

std::string randomJobId() {
  std::random_device device;
  return str("job-", std::hex, device(), device());
}

}  // namespace

std::optional<RankContext> rankFromEnvironment() {
  if (kRank.str().empty()) return std::nullopt;
  RankContext context;
  context.rank = parseRankNumber(kRank);
  if (kWorldSize.str().empty()) throw ConfigError("HETRA_RANK is set but HETRA_WORLD_SIZE is not");
  context.worldSize = parseRankNumber(kWorldSize);
  if (context.worldSize < 1 || context.rank >= context.worldSize)
    throw ConfigError(
        str("HETRA_RANK=", context.rank, " is not below HETRA_WORLD_SIZE=", context.worldSize));
  context.localRank = parseRankNumber(kLocalRank);
  context.storeAddress = kStore.str();
  if (context.storeAddress.empty() && context.worldSize > 1)
    throw ConfigError("HETRA_RANK is set but HETRA_STORE (host:port of the job's store) is not");
  context.storeExternal = kStoreExternal.flag();
  context.jobId = kJobId.str();
  return context;
}

std::shared_ptr<store::Store> connectJobStore(const RankContext& context, Millis timeout,
                                              std::shared_ptr<void>* server) {
  std::shared_ptr<store::Store> base;
  if (context.worldSize == 1 && context.storeAddress.empty()) {
    base = std::make_shared<store::MemoryStore>();
  } else {
    if (context.storeExternal) {
      const auto address = store::parseHostPort(context.storeAddress);
      base = std::make_shared<store::TcpStore>(address.host, address.port, timeout);
    } else {  // rank 0 serves
      std::unique_ptr<store::TcpStoreServer> served;
      base = store::connectStore(context.storeAddress, context.rank, timeout, &served);
      if (served) *server = std::shared_ptr<store::TcpStoreServer>(std::move(served));
    }
  }
  return std::make_shared<store::PrefixStore>(context.jobId, base);
}

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  return cpus;
}

std::vector<std::vector<int>> onePerCore(int np) {
  const auto cpus = allowedCpus();
  if (int(cpus.size()) < np) return {};
  std::vector<std::vector<int>> sets;
  for (int r = 0; r < np; ++r) sets.push_back({cpus[size_t(r)]});
  return sets;
}

std::vector<std::vector<int>> packByDuty(const std::vector<double>& duty,
                                         const std::vector<int>& threads) {
  const auto cpus = allowedCpus();
  std::vector<double> load(cpus.size(), 0.0);
  std::vector<size_t> order(duty.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return duty[a] * threads[a] > duty[b] * threads[b]; });
  std::vector<std::vector<int>> sets(duty.size());
  for (size_t r : order) {
    // A rank of t threads takes the t least loaded CPUs; each must still have room for its duty.
    std::vector<size_t> byLoad(cpus.size());
    for (size_t c = 0; c < byLoad.size(); ++c) byLoad[c] = c;
    std::stable_sort(byLoad.begin(), byLoad.end(),
                     [&](size_t a, size_t b) { return load[a] < load[b]; });
    if (size_t(threads[r]) > cpus.size()) return {};
    for (int t = 0; t < threads[r]; ++t) {
      const size_t c = byLoad[size_t(t)];
      load[c] += duty[r];
      if (load[c] > 1.0 + 1e-9) return {};
      sets[r].push_back(cpus[c]);
    }
  }
  return sets;
}

int spawnLocalRanks(int np, const std::vector<std::string>& argv,
                    const std::vector<std::vector<int>>& cpuSets, Millis failureGrace) {
  HETRA_ENFORCE(np >= 1, "--np must be at least 1, got ", np);
  const bool pin = !cpuSets.empty() && kPin.flag();
  HETRA_ENFORCE(!pin || int(cpuSets.size()) == np, "one CPU set per rank");
  store::TcpStoreServer server("127.0.0.1", 0);
  const std::string storeAddress = str("127.0.0.1:", server.port());
  const std::string jobId = randomJobId();

  std::vector<pid_t> children;
  for (int rank = 0; rank < np; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw IoError(str("fork failed for rank ", rank));
    if (pid == 0) {
      setenv("HETRA_RANK", std::to_string(rank).c_str(), 1);
      setenv("HETRA_WORLD_SIZE", std::to_string(np).c_str(), 1);
      setenv("HETRA_LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("HETRA_STORE", storeAddress.c_str(), 1);
      setenv("HETRA_STORE_EXTERNAL", "1", 1);
      setenv("HETRA_JOB_ID", jobId.c_str(), 1);
      if (pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int cpu : cpuSets[size_t(rank)]) CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
      }
      std::vector<char*> args;
      for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      _exit(127);
    }
    children.push_back(pid);
  }

  int firstFailure = 0;
  std::optional<Deadline> killAt;
  size_t running = children.size();
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, killAt ? WNOHANG : 0);
    if (pid > 0) {
      --running;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      for (size_t r = 0; r < children.size(); ++r) {
        if (children[r] != pid) continue;
        children[r] = -1;
        if (code != 0) {
          HETRA_ERROR("cli", "rank ", r, " (pid ", pid, ") exited with status ", code);
          if (firstFailure == 0) {
            firstFailure = code;
            killAt = deadlineAfter(failureGrace);
          }
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (killAt && Clock::now() >= *killAt) {
      for (pid_t child : children)
        if (child > 0) kill(child, SIGKILL);
      killAt.reset();
    } else if (pid == 0) {
      std::this_thread::sleep_for(Millis(20));
    }
  }
  return firstFailure;
}

}  // namespace hetra::cli
