// Rank discovery in a pod (launch/scheduler_environment.h): Volcano's VC_TASK_INDEX with the svc
// plugin's hostfiles (a temporary directory stands for /etc/volcano) or its VC_<TASK>_HOSTS
// variables, Kubeflow PyTorchJob's variables, MPIJob's hostfile; the ranks, hosts and store address
// they give, and the errors that name what is missing.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "launch_command.h"
#include "launch_testing.h"

#include "common/errors.h"
#include "launch/rank_environment.h"
#include "launch/scheduler_environment.h"

extern char** environ;

namespace {

using namespace hetra;
using namespace hetra::launch;
using hetra::test::configError;
using hetra::test::contains;
namespace fs = std::filesystem;

// Unsets every variable a launcher or an operator may set (by prefix: HETRA_, VC_, VK_, PET_,
// OMPI_, SLURM_, PMI_; and torch's names) for the duration of a test and restores them after.
class PodEnvironment {
 public:
  PodEnvironment() {
    std::vector<std::string> names;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string variable = *entry;
      const std::string name = variable.substr(0, variable.find('='));
      if (isLaunchers(name)) names.push_back(name);
    }
    for (const auto& name : names) {
      saved_.emplace_back(name, std::getenv(name.c_str()));
      unsetenv(name.c_str());
    }
    dir_ = fs::temp_directory_path() / ("hetra-volcano-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    set("HETRA_VOLCANO_DIR", dir_.string());  // never this machine's /etc/volcano
  }
  ~PodEnvironment() {
    for (const auto& name : set_) unsetenv(name.c_str());
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
    fs::remove_all(dir_);
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.insert(name);
  }
  // A file of the svc plugin's ConfigMap, as mounted at /etc/volcano.
  void file(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::string dir() const { return dir_.string(); }

 private:
  static bool isLaunchers(const std::string& name) {
    for (const char* prefix : {"HETRA_", "VC_", "VK_", "PET_", "OMPI_", "SLURM_", "PMI_"})
      if (name.rfind(prefix, 0) == 0) return true;
    for (const char* torch : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                              "TORCHELASTIC_RUN_ID", "MPI_LOCALRANKID"})
      if (name == torch) return true;
    return false;
  }
  std::vector<std::pair<std::string, std::string>> saved_;
  std::set<std::string> set_;
  fs::path dir_;
};

// A job "mnist" of 3 cpu pods and 2 cuda pods as the svc plugin describes it in files.
void writeMnistHostfiles(PodEnvironment& pod) {
  pod.file("cpu.host", "mnist-cpu-0.mnist\nmnist-cpu-1.mnist\nmnist-cpu-2.mnist\n");
  pod.file("cpu.num", "3");
  pod.file("cuda.host", "mnist-cuda-0.mnist\nmnist-cuda-1.mnist\n");
  pod.file("cuda.num", "2");
}

TEST(VolcanoEnvironment, HostfilesInTheListedTaskOrder) {
  PodEnvironment pod;
  writeMnistHostfiles(pod);
  pod.set("HETRA_VOLCANO_TASKS", "cuda,cpu");
  pod.set("HETRA_VOLCANO_TASK", "cpu");
  pod.set("VC_TASK_INDEX", "1");
  const auto volcano = volcanoRank();
  ASSERT_TRUE(volcano);
  EXPECT_EQ(volcano->task, "cpu");
  EXPECT_EQ(volcano->index, 1);
  EXPECT_EQ(volcano->rank, 3);  // after cuda's two pods
  EXPECT_EQ(volcano->tasks, (std::vector<std::string>{"cuda", "cpu"}));
  EXPECT_EQ(volcano->hosts, (std::vector<std::string>{"mnist-cuda-0.mnist", "mnist-cuda-1.mnist",
                                                      "mnist-cpu-0.mnist", "mnist-cpu-1.mnist",
                                                      "mnist-cpu-2.mnist"}));
  EXPECT_EQ(volcano->source, pod.dir());

  const auto context = rankFromEnvironment();
  ASSERT_TRUE(context);
  EXPECT_EQ(std::tie(context->launcher, context->rank, context->worldSize, context->localRank,
                     context->storeAddress, context->storeExternal),
            std::make_tuple(std::string("volcano"), 3, 5, 0,
                            std::string("mnist-cuda-0.mnist:29431"), false));
}

TEST(VolcanoEnvironment, EveryPodOfTheJobGetsItsOwnRank) {
  PodEnvironment pod;
  writeMnistHostfiles(pod);
  // Without HETRA_VOLCANO_TASKS the tasks go by name: cpu (ranks 0-2), then cuda (3, 4).
  const std::vector<std::tuple<const char*, const char*, int>> pods = {
      {"cpu", "0", 0}, {"cpu", "1", 1}, {"cpu", "2", 2}, {"cuda", "0", 3}, {"cuda", "1", 4}};
  for (const auto& [task, index, rank] : pods) {
    pod.set("HETRA_VOLCANO_TASK", task);
    pod.set("VC_TASK_INDEX", index);
    const auto context = rankFromEnvironment();
    ASSERT_TRUE(context) << task << index;
    EXPECT_EQ(context->rank, rank) << task << index;
    EXPECT_EQ(context->worldSize, 5);
    EXPECT_EQ(context->storeAddress, "mnist-cpu-0.mnist:29431");
  }
}

TEST(VolcanoEnvironment, TaskFoundFromThePodsHostName) {
  PodEnvironment pod;
  writeMnistHostfiles(pod);
  pod.set("VC_TASK_INDEX", "1");
  // The svc plugin sets the pod's host name to its name, the first label of its hosts entry.
  const auto volcano = volcanoRank({.hostName = "mnist-cuda-1"});
  ASSERT_TRUE(volcano);
  EXPECT_EQ(volcano->task, "cuda");
  EXPECT_EQ(volcano->rank, 4);
  const std::string error = configError([] { volcanoRank({.hostName = "elsewhere"}); });
  EXPECT_TRUE(contains(error, "host name 'elsewhere' is in no task's hosts")) << error;
  EXPECT_TRUE(contains(error, "HETRA_VOLCANO_TASK")) << error;
}

TEST(VolcanoEnvironment, VariablesWhenThereAreNoHostfiles) {
  PodEnvironment pod;
  pod.set("VC_CPU_HOSTS", "job-cpu-0.job,job-cpu-1.job");
  pod.set("VC_CPU_NUM", "2");
  pod.set("VC_GPU_WORKER_HOSTS", "job-gpu-worker-0.job");  // task "gpu-worker"
  pod.set("HETRA_VOLCANO_TASKS", "gpu-worker,cpu");
  pod.set("HETRA_VOLCANO_TASK", "cpu");
  pod.set("VK_TASK_INDEX", "1");  // the env plugin's older name
  pod.set("HETRA_MASTER_PORT", "4100");
  const auto volcano = volcanoRank();
  ASSERT_TRUE(volcano);
  EXPECT_EQ(volcano->source, "VC_*_HOSTS");
  EXPECT_EQ(volcano->rank, 2);
  EXPECT_EQ(volcano->hosts,
            (std::vector<std::string>{"job-gpu-worker-0.job", "job-cpu-0.job", "job-cpu-1.job"}));
  const auto context = rankFromEnvironment();
  ASSERT_TRUE(context);
  EXPECT_EQ(context->storeAddress, "job-gpu-worker-0.job:4100");
  pod.set("HETRA_STORE", "store.example:5000");  // an explicit store wins
  EXPECT_EQ(rankFromEnvironment()->storeAddress, "store.example:5000");
}

TEST(VolcanoEnvironment, RanksSharingAHostAreItsLocalRanks) {
  PodEnvironment pod;
  pod.set("VC_CPU_HOSTS", "127.0.0.1,127.0.0.1,127.0.0.1");
  pod.set("HETRA_VOLCANO_TASK", "cpu");  // VC_CPU_HOSTS
  for (int index = 0; index < 3; ++index) {
    pod.set("VC_TASK_INDEX", std::to_string(index));
    const auto context = rankFromEnvironment();
    ASSERT_TRUE(context);
    EXPECT_EQ(context->rank, index);
    EXPECT_EQ(context->localRank, index);
    EXPECT_EQ(context->storeAddress, "127.0.0.1:29431");
  }
}

TEST(VolcanoEnvironment, ALauncherInsideThePodDescribesItsProcesses) {
  PodEnvironment pod;
  writeMnistHostfiles(pod);
  pod.set("HETRA_VOLCANO_TASK", "cpu");
  pod.set("VC_TASK_INDEX", "0");
  pod.set("OMPI_COMM_WORLD_RANK", "4");  // mpirun run from the pod (Volcano's MPI example)
  pod.set("OMPI_COMM_WORLD_SIZE", "6");
  pod.set("HETRA_STORE", "s:1");
  const auto context = rankFromEnvironment();
  EXPECT_EQ(context->launcher, "openmpi");
  EXPECT_EQ(context->rank, 4);
}

TEST(VolcanoEnvironment, IncompleteOrInconsistentIsRefusedByName) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    std::vector<std::pair<const char*, const char*>> files;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {{{"VC_TASK_INDEX", "0"}}, {}, {"VC_TASK_INDEX is set but no Volcano task's hosts", "svc"}},
      {{{"VC_TASK_INDEX", "3"}, {"HETRA_VOLCANO_TASK", "cpu"}},
       {{"cpu.host", "a\nb\nc\n"}},
       {"VC_TASK_INDEX=3 is not below the 3 hosts of task cpu"}},
      {{{"VC_TASK_INDEX", "two"}}, {{"cpu.host", "a\n"}}, {"VC_TASK_INDEX='two'"}},
      {{{"VC_TASK_INDEX", "0"}, {"HETRA_VOLCANO_TASK", "cpu"}},
       {{"cpu.host", "a\nb\n"}, {"cpu.num", "3"}},
       {"cpu.num says 3 but cpu.host lists 2 hosts"}},
      {{{"VC_TASK_INDEX", "0"}, {"HETRA_VOLCANO_TASK", "gpu"}},
       {{"cpu.host", "a\n"}},
       {"HETRA_VOLCANO_TASK=gpu is not a task of", "tasks there: cpu"}},
      {{{"VC_TASK_INDEX", "0"}, {"HETRA_VOLCANO_TASK", "cpu"}, {"HETRA_VOLCANO_TASKS", "cpu"}},
       {{"cpu.host", "a\n"}, {"rocm.host", "r\n"}},
       {"HETRA_VOLCANO_TASKS=cpu leaves out tasks", "cpu, rocm"}},
      {{{"VC_TASK_INDEX", "0"}, {"HETRA_VOLCANO_TASK", "cpu"}, {"HETRA_VOLCANO_TASKS", "cpu,cuda"}},
       {{"cpu.host", "a\n"}},
       {"HETRA_VOLCANO_TASKS names task 'cuda'"}},
      {{{"VC_TASK_INDEX", "0"}, {"VC_CPU_HOSTS", "a,b"}, {"VC_CPU_NUM", "1"}},
       {},
       {"VC_CPU_NUM=1 but VC_CPU_HOSTS lists 2 hosts"}},
  };
  for (const auto& c : cases) {
    PodEnvironment pod;
    for (const auto& [name, value] : c.vars) pod.set(name, value);
    for (const auto& [name, text] : c.files) pod.file(name, text);
    const std::string error = configError([] { rankFromEnvironment(); });
    for (const auto& part : c.mentions) EXPECT_TRUE(contains(error, part)) << error;
  }
}

TEST(KubeflowEnvironment, PyTorchJobPodIsOneRank) {
  PodEnvironment pod;
  // What the training operator sets in worker 1 of a PyTorchJob with a master and two workers.
  pod.set("RANK", "2");
  pod.set("WORLD_SIZE", "3");
  pod.set("MASTER_ADDR", "mnist-master-0");
  pod.set("MASTER_PORT", "23456");
  pod.set("PET_NNODES", "3");
  pod.set("PET_NODE_RANK", "2");
  pod.set("PET_NPROC_PER_NODE", "1");
  pod.set("PET_MASTER_ADDR", "mnist-master-0");
  pod.set("PET_MASTER_PORT", "23456");
  const auto context = rankFromEnvironment();
  ASSERT_TRUE(context);
  EXPECT_EQ(std::tie(context->launcher, context->rank, context->worldSize, context->storeAddress),
            std::make_tuple(std::string("pytorchjob"), 2, 3,
                            std::string("mnist-master-0:23457")));  // MASTER_PORT is torch's

  pod.set("PET_NPROC_PER_NODE", "4");
  const std::string error = configError([] { rankFromEnvironment(); });
  EXPECT_TRUE(contains(error, "PET_NPROC_PER_NODE=4")) << error;
  EXPECT_TRUE(contains(error, "nprocPerNode: 1")) << error;

  pod.set("TORCHELASTIC_RUN_ID", "r1");  // torchrun in the pod started this process
  EXPECT_EQ(rankFromEnvironment()->launcher, "torchrun");
}

TEST(KubeflowEnvironment, MpiJobHostfileIsTheLaunchersDefault) {
  PodEnvironment pod;
  EXPECT_FALSE(operatorHostfile());
  EXPECT_EQ(cli::parseLaunchArguments({"-np", "2", "prog"}).hosts.size(), 0u);  // local ranks
  // The MPIJob operator's hostfile in the launcher pod (mounted from its ConfigMap).
  pod.file("hostfile",
           "mnist-worker-0.mnist.default.svc slots=1\n"
           "mnist-worker-1.mnist.default.svc slots=1\n");
  pod.set("OMPI_MCA_orte_default_hostfile", pod.dir() + "/hostfile");
  EXPECT_EQ(operatorHostfile(), pod.dir() + "/hostfile");
  const auto options = cli::parseLaunchArguments({"-np", "2", "prog"});
  ASSERT_EQ(options.hosts.size(), 2u);
  EXPECT_EQ(options.hosts[0].host, "mnist-worker-0.mnist.default.svc");
  EXPECT_EQ(options.hosts[1].host, "mnist-worker-1.mnist.default.svc");
  // Hosts given on the command line win.
  EXPECT_EQ(cli::parseLaunchArguments({"-H", "a:2", "prog"}).hosts[0].host, "a");
}

}  // namespace
