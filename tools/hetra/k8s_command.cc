#include "k8s_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>

#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>

#include "common/auth.h"
#include "common/errors.h"
#include "train/config.h"

namespace hetra::cli {
namespace {

constexpr const char* kConfigDir = "/etc/hetra";
constexpr const char* kConfigFile = "config.toml";
constexpr const char* kSecretDir = "/var/run/hetra";
constexpr const char* kSecretFile = "job-secret";
constexpr int kSecretMode = 0600;

// What each device kind asks of its node.
struct KindDefaults {
  const char* kind;
  const char* resource;  // the device plugin's extended resource; "" for cpu
  const char* label;     // default node selector: the label its GPU operator puts on such nodes
  const char* value;
};

const KindDefaults& defaultsOf(const std::string& kind) {
  static const KindDefaults all[] = {
      {"cpu", "", "kubernetes.io/arch", "amd64"},
      {"cuda", "nvidia.com/gpu", "nvidia.com/gpu.present", "true"},  // GPU feature discovery
      {"rocm", "amd.com/gpu", "feature.node.kubernetes.io/amd-gpu", "true"},  // AMD GPU operator
  };
  for (const auto& entry : all)
    if (kind == entry.kind) return entry;
  throw ConfigError(str("device kind '", kind,
                        "' has no Kubernetes resource; allowed: cpu, cuda, "
                        "rocm"));
}

// A DNS-1123 label (what Kubernetes allows as a name): lower case, digits and '-'.
std::string dnsLabel(const std::string& text) {
  std::string label;
  for (char c : text) {
    const char lower = char(std::tolower(static_cast<unsigned char>(c)));
    label += std::isalnum(static_cast<unsigned char>(lower)) ? lower : '-';
  }
  label.erase(0, label.find_first_not_of('-'));
  label = label.substr(0, 40);  // room for "-config", "-<task>-<index>"
  label.erase(label.find_last_not_of('-') + 1);
  return label;
}

// "KIND=REST" options by kind; ConfigError naming the option for a malformed one.
std::map<std::string, std::string> byKind(const std::vector<std::string>& items,
                                          const char* option) {
  std::map<std::string, std::string> values;
  for (const auto& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw ConfigError(str(option, " ", item, ": expected KIND=VALUE (KIND cpu, cuda or rocm)"));
    defaultsOf(item.substr(0, eq));
    values[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return values;
}

// The kinds in the order they first appear; ConfigError when the devices are not grouped by kind
// (the job numbers its ranks task by task).
std::vector<std::string> kindsInRankOrder(const train::RunConfig& config) {
  std::vector<std::string> kinds;
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const std::string& kind = config.devices[i].kind;
    if (!kinds.empty() && kinds.back() == kind) continue;
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end())
      throw ConfigError(str("devices[", i, "].kind = \"", kind, "\" comes after a \"", kinds.back(),
                            "\" device: a Volcano job numbers its ranks task by ",
                            "task (one task per kind), so list the [[devices]] grouped by kind"));
    kinds.push_back(kind);
  }
  return kinds;
}

void emitMetadata(YAML::Emitter& out, const std::string& name, const K8sOptions& options) {
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << name;
  if (!options.nameSpace.empty())
    out << YAML::Key << "namespace" << YAML::Value << options.nameSpace;
  out << YAML::Key << "labels" << YAML::Value << YAML::BeginMap << YAML::Key << "app" << YAML::Value
      << "hetra" << YAML::EndMap;
  out << YAML::EndMap;
}

void emitEnv(YAML::Emitter& out, const std::string& name, const std::string& value) {
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << name << YAML::Key << "value"
      << YAML::Value << YAML::DoubleQuoted << value << YAML::EndMap;
}

// The pod template of one task: the container, what it asks of its node, its two volumes.
struct TaskSpec {
  std::string kind;
  int replicas = 0;
  int64_t threads = 1;
  std::string image;
  std::string selectorLabel, selectorValue;
};

void emitTask(YAML::Emitter& out, const TaskSpec& task, const std::string& job,
              const std::string& taskOrder, const K8sOptions& options,
              const train::RunConfig& config) {
  const KindDefaults& kind = defaultsOf(task.kind);
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << task.kind;
  out << YAML::Key << "replicas" << YAML::Value << task.replicas;
  out << YAML::Key << "template" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "restartPolicy" << YAML::Value << "Never";
  out << YAML::Key << "nodeSelector" << YAML::Value << YAML::BeginMap << YAML::Key
      << task.selectorLabel << YAML::Value << YAML::DoubleQuoted << task.selectorValue
      << YAML::EndMap;

  out << YAML::Key << "containers" << YAML::Value << YAML::BeginSeq << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << "hetra";
  out << YAML::Key << "image" << YAML::Value << task.image;
  // The image's entry point is hetra.
  out << YAML::Key << "args" << YAML::Value << YAML::Flow << YAML::BeginSeq << "run"
      << str(kConfigDir, "/", kConfigFile) << "--rank-from-env" << YAML::EndSeq;
  out << YAML::Key << "env" << YAML::Value << YAML::BeginSeq;
  emitEnv(out, "HETRA_VOLCANO_TASK", task.kind);
  emitEnv(out, "HETRA_VOLCANO_TASKS", taskOrder);
  emitEnv(out, "HETRA_MASTER_PORT", std::to_string(options.storePort));
  emitEnv(out, "HETRA_JOB_ID", job);
  emitEnv(out, "HETRA_JOB_SECRET_FILE", str(kSecretDir, "/", kSecretFile));
  // The transport listens on the pod's own address, which its peers reach.
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "HETRA_IFACE_ADDR" << YAML::Key
      << "valueFrom" << YAML::Value << YAML::BeginMap << YAML::Key << "fieldRef" << YAML::Value
      << YAML::BeginMap << YAML::Key << "fieldPath" << YAML::Value << "status.podIP" << YAML::EndMap
      << YAML::EndMap << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "ports" << YAML::Value << YAML::BeginSeq << YAML::BeginMap << YAML::Key
      << "name" << YAML::Value << "store" << YAML::Key << "containerPort" << YAML::Value
      << options.storePort << YAML::EndMap << YAML::EndSeq;
  // Requests equal limits: each rank gets its threads' cores, and a GPU rank its one GPU.
  out << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  for (const char* bound : {"requests", "limits"}) {
    out << YAML::Key << bound << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "cpu" << YAML::Value << YAML::DoubleQuoted << std::to_string(task.threads);
    if (*kind.resource) out << YAML::Key << kind.resource << YAML::Value << 1;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  out << YAML::Key << "volumeMounts" << YAML::Value << YAML::BeginSeq;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "config" << YAML::Key
      << "mountPath" << YAML::Value << kConfigDir << YAML::Key << "readOnly" << YAML::Value << true
      << YAML::EndMap;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "job-secret" << YAML::Key
      << "mountPath" << YAML::Value << kSecretDir << YAML::Key << "readOnly" << YAML::Value << true
      << YAML::EndMap;
  if (options.dataHostPath)
    out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "data" << YAML::Key
        << "mountPath" << YAML::Value << config.data.path << YAML::Key << "readOnly" << YAML::Value
        << true << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::EndMap << YAML::EndSeq;  // the container

  out << YAML::Key << "volumes" << YAML::Value << YAML::BeginSeq;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "config" << YAML::Key
      << "configMap" << YAML::Value << YAML::BeginMap << YAML::Key << "name" << YAML::Value
      << job + "-config" << YAML::EndMap << YAML::EndMap;
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "job-secret" << YAML::Key
      << "secret" << YAML::Value << YAML::BeginMap << YAML::Key << "secretName" << YAML::Value
      << job + "-secret" << YAML::Key << "defaultMode" << YAML::Value << kSecretMode
      << YAML::Comment("0600: hetra refuses a secret file others can read") << YAML::EndMap
      << YAML::EndMap;
  if (options.dataHostPath)
    out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << "data" << YAML::Key << "hostPath"
        << YAML::Value << YAML::BeginMap << YAML::Key << "path" << YAML::Value << config.data.path
        << YAML::Key << "type" << YAML::Value << "Directory" << YAML::EndMap << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::EndMap << YAML::EndMap;  // spec, template
  out << YAML::EndMap;
}

}  // namespace

std::string k8sManifest(const K8sOptions& options, const std::string& secret) {
  // The manifest is for the cluster's nodes, not this machine: every device kind is allowed here,
  // and the pods check again with their own capabilities.
  train::Capabilities cluster;
  cluster.cuda = cluster.rocm = true;
  train::RunConfig config = train::loadConfig(options.configPath, options.sets, cluster);
  if (!config.topology.file.empty())
    throw ConfigError(str("topology.file = \"", config.topology.file, "\" would not reach the ",
                          "pods; give its islands and links as keys ([topology] islands, ",
                          "island_link, cross_link)"));
  for (size_t i = 0; i < config.devices.size(); ++i)
    if (!config.devices[i].host.empty())
      throw ConfigError(str("devices[", i, "].host = \"", config.devices[i].host, "\": in a ",
                            "Volcano job the scheduler places the ranks; leave host out"));
  const std::vector<std::string> kinds = kindsInRankOrder(config);
  const std::string job =
      dnsLabel(options.name.empty() ? std::filesystem::path(options.configPath).stem().string()
                                    : options.name);
  if (job.empty() || !std::isalpha(static_cast<unsigned char>(job[0])))
    throw ConfigError(str("--name '", options.name, "': a job name starts with a letter (a-z)"));
  if (options.storePort < 1 || options.storePort > 65535)
    throw ConfigError(str("--store-port ", options.storePort, " is not a TCP port"));
  const auto images = byKind(options.images, "--image");
  const auto selectors = byKind(options.selectors, "--node-selector");

  std::string taskOrder;
  std::vector<TaskSpec> tasks;
  for (const auto& kind : kinds) {
    TaskSpec task;
    task.kind = kind;
    for (const auto& device : config.devices) {
      if (device.kind != kind) continue;
      ++task.replicas;
      task.threads = std::max(task.threads, device.threads);  // one template for the task
    }
    const auto image = images.find(kind);
    task.image = image != images.end() ? image->second : "hetra:" + kind;
    const KindDefaults& defaults = defaultsOf(kind);
    task.selectorLabel = defaults.label;
    task.selectorValue = defaults.value;
    if (auto selector = selectors.find(kind); selector != selectors.end()) {
      const size_t eq = selector->second.find('=');
      if (eq == std::string::npos)
        throw ConfigError(
            str("--node-selector ", kind, "=", selector->second, ": expected KIND=LABEL=VALUE"));
      task.selectorLabel = selector->second.substr(0, eq);
      task.selectorValue = selector->second.substr(eq + 1);
    }
    taskOrder += (taskOrder.empty() ? "" : ",") + kind;
    tasks.push_back(task);
  }

  YAML::Emitter out;
  out << YAML::BeginDoc << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind" << YAML::Value
      << "ConfigMap";
  emitMetadata(out, job + "-config", options);
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap << YAML::Key << kConfigFile
      << YAML::Value << YAML::Literal << train::toToml(config) << YAML::EndMap;
  out << YAML::EndMap;

  out << YAML::BeginDoc << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind" << YAML::Value
      << "Secret";
  emitMetadata(out, job + "-secret", options);
  out << YAML::Key << "type" << YAML::Value << "Opaque";
  out << YAML::Key << "stringData" << YAML::Value << YAML::BeginMap << YAML::Key << kSecretFile
      << YAML::Value << secret << YAML::EndMap;
  out << YAML::EndMap;

  out << YAML::BeginDoc << YAML::BeginMap;
  out << YAML::Key << "apiVersion" << YAML::Value << "batch.volcano.sh/v1alpha1" << YAML::Key
      << "kind" << YAML::Value << "Job";
  emitMetadata(out, job, options);
  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "schedulerName" << YAML::Value << "volcano";
  out << YAML::Key << "queue" << YAML::Value << options.queue;
  out << YAML::Key << "minAvailable" << YAML::Value << int(config.devices.size())
      << YAML::Comment("gang: every rank's pod or none");
  // env: VC_TASK_INDEX; svc: the hosts of every task and a headless service for their names.
  out << YAML::Key << "plugins" << YAML::Value << YAML::BeginMap << YAML::Key << "env"
      << YAML::Value << YAML::Flow << YAML::BeginSeq << YAML::EndSeq << YAML::Key << "svc"
      << YAML::Value << YAML::Flow << YAML::BeginSeq << YAML::EndSeq << YAML::EndMap;
  // A rank that fails ends the job (its peers fail at once with PeerAbortedError); an evicted pod
  // restarts it whole, since a group cannot take a new member mid-run.
  out << YAML::Key << "policies" << YAML::Value << YAML::BeginSeq;
  out << YAML::BeginMap << YAML::Key << "event" << YAML::Value << "PodFailed" << YAML::Key
      << "action" << YAML::Value << "AbortJob" << YAML::EndMap;
  out << YAML::BeginMap << YAML::Key << "event" << YAML::Value << "PodEvicted" << YAML::Key
      << "action" << YAML::Value << "RestartJob" << YAML::EndMap;
  out << YAML::EndSeq;
  out << YAML::Key << "tasks" << YAML::Value << YAML::BeginSeq;
  for (const auto& task : tasks) emitTask(out, task, job, taskOrder, options, config);
  out << YAML::EndSeq;
  out << YAML::EndMap << YAML::EndMap;
  if (!out.good()) throw std::logic_error(str("YAML emitter: ", out.GetLastError()));
  return std::string(out.c_str()) + "\n";
}

CLI::App* addK8sCommand(CLI::App& app, K8sOptions& o) {
  auto* k8s = app.add_subcommand(
      "k8s", "Write the Kubernetes objects (Volcano Job, ConfigMap, Secret) of a config's job");
  k8s->add_option("config", o.configPath, "The run's TOML file (see examples/)")->required();
  k8s->add_option("--set", o.sets, "Override a key as hetra run does (repeatable)");
  k8s->add_option("--name", o.name, "The job's name (default: the config file's name)");
  k8s->add_option("--namespace", o.nameSpace, "The objects' namespace");
  k8s->add_option("--queue", o.queue, "Volcano queue")->capture_default_str();
  k8s->add_option("--image", o.images, "KIND=IMAGE for a device kind (default hetra:KIND)");
  k8s->add_option("--node-selector", o.selectors,
                  "KIND=LABEL=VALUE: the nodes of a kind's pods (default: arch amd64, "
                  "nvidia.com/gpu.present, feature.node.kubernetes.io/amd-gpu)");
  k8s->add_option("--store-port", o.storePort, "Port of rank 0's store")->capture_default_str();
  k8s->add_flag("--data-host-path", o.dataHostPath,
                "Mount the config's data path from each node (read-only)");
  k8s->add_option("-o,--output", o.outputPath, "Write here (mode 0600) instead of stdout");
  return k8s;
}

int runK8sCommand(const K8sOptions& options) {
  const std::string manifest = k8sManifest(options, auth::generateJobSecret());
  if (options.outputPath.empty()) {
    std::fwrite(manifest.data(), 1, manifest.size(), stdout);
    return 0;
  }
  const int fd =
      ::open(options.outputPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, kSecretMode);
  if (fd < 0 || ::fchmod(fd, kSecretMode) != 0 ||
      ::write(fd, manifest.data(), manifest.size()) != ssize_t(manifest.size())) {
    if (fd >= 0) ::close(fd);
    throw IoError(str("-o ", options.outputPath, ": cannot write the manifest"));
  }
  ::close(fd);
  return 0;
}

}  // namespace hetra::cli
