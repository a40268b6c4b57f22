// Rank discovery from what a Kubernetes batch operator sets in a pod (one rank per pod), beside the
// launchers of rank_environment.h, which calls it.
//
// Volcano (batch.volcano.sh Job with the env and svc plugins):
//   VC_TASK_INDEX (older: VK_TASK_INDEX)   the pod's index in its task (env plugin)
//   /etc/volcano/<task>.host, <task>.num    every task's pod hosts, one a line (svc plugin's
//                                           ConfigMap); read first, the variables where none is
//   VC_<TASK>_HOSTS, VC_<TASK>_NUM          the same as variables, comma-separated (svc plugin);
//                                           TASK upper-cased, '-' as '_'
//   Global rank order: task by task, in the order HETRA_VOLCANO_TASKS lists them (hetra k8s writes
//   it: the order in which the config's device kinds first appear), else by task name; within a
//   task, by VC_TASK_INDEX. So rank r runs the config's device r when the config lists its devices
//   grouped by kind (hetra k8s refuses a config that does not). Rank 0's host serves the store.
//   The pod's task: HETRA_VOLCANO_TASK (hetra k8s sets it), else the task whose hosts hold this
//   pod's host name (the svc plugin makes it the pod's name, <job>-<task>-<index>, and the hosts
//   <job>-<task>-<index>.<job>).
// Kubeflow PyTorchJob: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank_environment reads them as
//   torchrun's) with PET_NNODES, PET_NPROC_PER_NODE for torchrun; hetra itself (no
//   TORCHELASTIC_RUN_ID) is one rank per pod, so PET_NPROC_PER_NODE must be 1 there.
// Kubeflow MPIJob: mpirun in the launcher pod starts the ranks (OMPI_COMM_WORLD_*, read as Open
//   MPI's); the operator names its hostfile in OMPI_MCA_orte_default_hostfile (Open MPI 5:
//   OMPI_MCA_prte_default_hostfile), which `hetra launch` takes when given no hosts.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace hetra::launch {

// Where the operator's description is read; tests emulate a pod with a temporary directory.
struct SchedulerSources {
  std::string volcanoDir{};  // the svc plugin's files; "": HETRA_VOLCANO_DIR (default /etc/volcano)
  std::string hostName{};    // this pod's host name; "": gethostname()
};

// A Volcano pod's rank: its task and place in the job.
struct VolcanoRank {
  std::string task;
  int index = 0;                   // VC_TASK_INDEX
  int rank = 0;                    // global
  std::vector<std::string> tasks;  // in rank order
  std::vector<std::string> hosts;  // every rank's host, in rank order; hosts[0] serves the store
  std::string source;              // where the hosts came from: a directory, or "VC_*_HOSTS"
};

// The rank Volcano describes, nullopt without VC_TASK_INDEX. ConfigError naming the variable or
// file when the description is incomplete or inconsistent.
std::optional<VolcanoRank> volcanoRank(const SchedulerSources& sources = {});

// "pytorchjob" when RANK and WORLD_SIZE come from a Kubeflow PyTorchJob for this very process,
// "torchrun" otherwise. ConfigError when the PyTorchJob asks for several processes per pod.
std::string torchVariablesLauncher();

// The hostfile a Kubeflow MPIJob's launcher pod is given, nullopt outside one.
std::optional<std::string> operatorHostfile();

}  // namespace hetra::launch
