#include "launch/scheduler_environment.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/errors.h"
#include "common/net.h"
#include "common/params.h"
#include "common/units.h"

namespace hetra::launch {
namespace {

namespace fs = std::filesystem;

const Param kVolcanoDir("HETRA_VOLCANO_DIR", "/etc/volcano",
                        "Where a Volcano job's svc plugin mounts its hostfiles (<task>.host).");
const Param kVolcanoTask("HETRA_VOLCANO_TASK", "",
                         "This pod's Volcano task (else found from the host name; hetra k8s sets "
                         "it).");
const Param kVolcanoTasks("HETRA_VOLCANO_TASKS", "",
                          "Volcano tasks in global rank order, comma-separated (else by name; "
                          "hetra k8s sets it).");

// Variables of the operators: read, never declared (they are not hetra's to document).
constexpr const char* kTaskIndex = "VC_TASK_INDEX";
constexpr const char* kOldTaskIndex = "VK_TASK_INDEX";
constexpr const char* kTorchElasticRun = "TORCHELASTIC_RUN_ID";  // torchrun's own children
constexpr const char* kPetNodes = "PET_NNODES";
constexpr const char* kPetProcsPerNode = "PET_NPROC_PER_NODE";
constexpr const char* kHostfileVariables[] = {"OMPI_MCA_orte_default_hostfile",
                                              "OMPI_MCA_prte_default_hostfile"};

std::vector<std::string> splitList(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, separator)) {
    item.erase(0, item.find_first_not_of(" \t\r"));
    item.erase(item.find_last_not_of(" \t\r") + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

int parseIndex(const char* name, const std::string& text) {
  const std::optional<int64_t> value = wholeInteger(text);
  if (!value || *value < 0 || *value > 1 << 20)
    throw ConfigError(str(name, "='", text, "' is not a task index (0 to 1048576)"));
  return int(*value);
}

// The svc plugin's name of a task in variables: VC_<TASK>_HOSTS.
std::string variableForm(const std::string& task) {
  std::string name = task;
  for (char& c : name)
    c = std::isalnum(static_cast<unsigned char>(c)) ? char(std::toupper(c)) : '_';
  return name;
}

// Every task's hosts as one source describes them, by task name.
struct TaskHosts {
  std::map<std::string, std::vector<std::string>> hosts;
  std::string source;
};

// The svc plugin's files <task>.host, with <task>.num checked against them; empty when the
// directory holds none.
TaskHosts hostsFromFiles(const std::string& dir) {
  TaskHosts found;
  found.source = dir;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return found;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const fs::path path = entry.path();
    if (path.extension() != ".host") continue;
    std::ifstream in(path);
    if (!in) throw ConfigError(str(path.string(), ": cannot read the Volcano hostfile"));
    std::stringstream text;
    text << in.rdbuf();
    found.hosts[path.stem().string()] = splitList(text.str(), '\n');
  }
  for (const auto& [task, hosts] : found.hosts) {
    std::ifstream num(fs::path(dir) / (task + ".num"));
    std::string count;
    if (num >> count && wholeInteger(count) != int64_t(hosts.size()))
      throw ConfigError(str(dir, "/", task, ".num says ", count, " but ", task, ".host lists ",
                            hosts.size(), " hosts"));
  }
  return found;
}

// The svc plugin's variables VC_<TASK>_HOSTS, by the task's variable form (the original spelling
// is lost there); `known` tasks keep their own names.
TaskHosts hostsFromVariables(const std::vector<std::string>& known) {
  TaskHosts found;
  found.source = "VC_*_HOSTS";
  std::map<std::string, std::string> nameOfForm;
  for (const auto& task : known) nameOfForm[variableForm(task)] = task;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string variable = *entry;
    const size_t eq = variable.find('=');
    const std::string name = variable.substr(0, eq);
    const std::string prefix = "VC_", suffix = "_HOSTS";
    if (eq == std::string::npos || name.size() <= prefix.size() + suffix.size() ||
        name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string form =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    const auto knownName = nameOfForm.find(form);
    const std::string task = knownName != nameOfForm.end() ? knownName->second : form;
    found.hosts[task] = splitList(variable.substr(eq + 1), ',');
    const std::string numName = str("VC_", form, "_NUM");
    if (auto num = environmentValue(numName);
        num && wholeInteger(*num) != int64_t(found.hosts[task].size()))
      throw ConfigError(
          str(numName, "=", *num, " but ", name, " lists ", found.hosts[task].size(), " hosts"));
  }
  return found;
}

// The task whose hosts hold `hostName` as their first label (<job>-<task>-<index>.<job>).
std::optional<std::string> taskOfHost(const TaskHosts& found, const std::string& hostName) {
  for (const auto& [task, hosts] : found.hosts)
    for (const auto& host : hosts)
      if (host == hostName || host.substr(0, host.find('.')) == hostName) return task;
  return std::nullopt;
}

std::string namesOf(const TaskHosts& found) {
  std::string names;
  for (const auto& [task, hosts] : found.hosts) names += (names.empty() ? "" : ", ") + task;
  return names;
}

}  // namespace

std::optional<VolcanoRank> volcanoRank(const SchedulerSources& sources) {
  const char* indexName = kTaskIndex;
  auto indexText = environmentValue(kTaskIndex);
  if (!indexText) indexText = environmentValue(indexName = kOldTaskIndex);
  if (!indexText) return std::nullopt;
  VolcanoRank volcano;
  volcano.index = parseIndex(indexName, *indexText);

  const std::vector<std::string> order = splitList(kVolcanoTasks.str(), ',');
  const auto ownTask = environmentValue(kVolcanoTask.env());
  TaskHosts found =
      hostsFromFiles(sources.volcanoDir.empty() ? kVolcanoDir.str() : sources.volcanoDir);
  if (found.hosts.empty()) {
    std::vector<std::string> known = order;
    if (ownTask) known.push_back(*ownTask);
    found = hostsFromVariables(known);
  }
  if (found.hosts.empty())
    throw ConfigError(str(indexName, " is set but no Volcano task's hosts are (no ", found.source,
                          ", no <task>.host under ", kVolcanoDir.env(), "=", kVolcanoDir.str(),
                          "); add the svc plugin to the job"));
  volcano.source = found.source;

  if (order.empty()) {
    for (const auto& entry : found.hosts) volcano.tasks.push_back(entry.first);  // by name
  } else {
    for (const auto& task : order) {
      if (!found.hosts.count(task))
        throw ConfigError(str(kVolcanoTasks.env(), " names task '", task, "' but ", found.source,
                              " has no hosts for it; tasks there: ", namesOf(found)));
      volcano.tasks.push_back(task);
    }
    if (volcano.tasks.size() != found.hosts.size())
      throw ConfigError(str(kVolcanoTasks.env(), "=", kVolcanoTasks.str(), " leaves out tasks of ",
                            found.source, " (", namesOf(found), "); list every task once"));
  }

  if (ownTask) {
    volcano.task = *ownTask;
  } else {
    const std::string host = sources.hostName.empty() ? net::hostName() : sources.hostName;
    const auto task = taskOfHost(found, host);
    if (!task)
      throw ConfigError(str("cannot tell this pod's Volcano task: host name '", host,
                            "' is in no task's hosts (", found.source, "); set ",
                            kVolcanoTask.env()));
    volcano.task = *task;
  }
  if (!found.hosts.count(volcano.task))
    throw ConfigError(str(kVolcanoTask.env(), "=", volcano.task, " is not a task of ", found.source,
                          "; tasks there: ", namesOf(found)));

  for (const auto& task : volcano.tasks) {
    if (task == volcano.task) volcano.rank = int(volcano.hosts.size()) + volcano.index;
    const auto& hosts = found.hosts[task];
    volcano.hosts.insert(volcano.hosts.end(), hosts.begin(), hosts.end());
  }
  const size_t taskSize = found.hosts[volcano.task].size();
  if (size_t(volcano.index) >= taskSize)
    throw ConfigError(str(indexName, "=", volcano.index, " is not below the ", taskSize,
                          " hosts of task ", volcano.task, " (", found.source, ")"));
  return volcano;
}

std::string torchVariablesLauncher() {
  if (environmentValue(kTorchElasticRun) || !environmentValue(kPetNodes)) return "torchrun";
  if (auto procs = environmentValue(kPetProcsPerNode); procs && *procs != "1")
    throw ConfigError(str(kPetProcsPerNode, "=", *procs, ": a PyTorchJob pod runs one hetra rank; ",
                          "set nprocPerNode: 1 (or start hetra under torchrun)"));
  return "pytorchjob";
}

std::optional<std::string> operatorHostfile() {
  for (const char* name : kHostfileVariables)
    if (auto path = environmentValue(name)) return path;
  return std::nullopt;
}

}  // namespace hetra::launch
