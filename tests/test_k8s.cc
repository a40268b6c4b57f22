// `hetra k8s` (tools/hetra/k8s_command.h): the manifest parsed back with yaml-cpp and checked field
// by field (ConfigMap, Secret, Volcano Job) for examples/fashion_mnist_hetero.toml and a config of
// three device kinds; the pods it describes, emulated, discover the ranks of the config's devices.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "k8s_command.h"
#include "launch_testing.h"

#include "common/errors.h"
#include "launch/rank_environment.h"
#include "train/config.h"

namespace {

using namespace hetra;
using hetra::test::configError;
using hetra::test::contains;
namespace fs = std::filesystem;

const std::string kExample = std::string(HETRA_SOURCE_DIR) + "/examples/fashion_mnist_hetero.toml";
// 64 hex characters, distinct from anything else in the manifest.
const std::string kSecret = "00112233445566778899aabbccddeeff0f1e2d3c4b5a69788796a5b4c3d2e1f0";

std::vector<YAML::Node> parse(const std::string& manifest) {
  return YAML::LoadAll(manifest);
}

// The env entries of a container by name (value, or "fieldRef:<path>").
std::map<std::string, std::string> envOf(const YAML::Node& container) {
  std::map<std::string, std::string> env;
  for (const auto& entry : container["env"]) {
    const std::string name = entry["name"].as<std::string>();
    env[name] = entry["value"]
                    ? entry["value"].as<std::string>()
                    : "fieldRef:" + entry["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>();
  }
  return env;
}

std::optional<YAML::Node> findByName(const YAML::Node& list, const std::string& name) {
  for (const auto& item : list)
    if (item["name"].as<std::string>() == name) return item;
  return std::nullopt;
}

// A config file in a temporary directory, removed with it.
class TempConfig {
 public:
  explicit TempConfig(const std::string& text) {
    static int count = 0;
    path_ = fs::temp_directory_path() / str("hetra-k8s-", getpid(), "-", count++, ".toml");
    std::ofstream(path_) << text;
  }
  ~TempConfig() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

const char* kThreeKinds = R"(
[model]
name = "mlp"
hidden = [16]
[data]
name = "synthetic"
[train]
global_batch = 64
steps = 2
[[devices]]
kind = "cuda"
[[devices]]
kind = "cuda"
[[devices]]
kind = "cpu"
threads = 2
[[devices]]
kind = "cpu"
[[devices]]
kind = "rocm"
)";

TEST(K8sManifest, FashionMnistHeteroFieldByField) {
  cli::K8sOptions options;
  options.configPath = kExample;
  options.sets = {"train.lr=0.05"};
  const auto docs = parse(cli::k8sManifest(options, kSecret));
  ASSERT_EQ(docs.size(), 3u);

  const YAML::Node& configMap = docs[0];
  EXPECT_EQ(configMap["apiVersion"].as<std::string>(), "v1");
  EXPECT_EQ(configMap["kind"].as<std::string>(), "ConfigMap");
  EXPECT_EQ(configMap["metadata"]["name"].as<std::string>(), "fashion-mnist-hetero-config");
  // Every pod reads the config hetra run would: the file's, parsed back equal.
  train::Capabilities any;
  any.cuda = any.rocm = true;
  const auto carried =
      train::parseConfig(configMap["data"]["config.toml"].as<std::string>(), "ConfigMap", {}, any);
  const auto direct = train::loadConfig(kExample, {"train.lr=0.05"}, any);
  EXPECT_TRUE(carried == direct);
  EXPECT_EQ(carried.train.lr, 0.05);  // the --set reaches the pods
  ASSERT_EQ(carried.devices.size(), 3u);
  EXPECT_EQ(carried.devices[2].name, "quarter");

  const YAML::Node& secret = docs[1];
  EXPECT_EQ(secret["kind"].as<std::string>(), "Secret");
  EXPECT_EQ(secret["metadata"]["name"].as<std::string>(), "fashion-mnist-hetero-secret");
  EXPECT_EQ(secret["type"].as<std::string>(), "Opaque");
  EXPECT_EQ(secret["stringData"]["job-secret"].as<std::string>(), kSecret);

  const YAML::Node& job = docs[2];
  EXPECT_EQ(job["apiVersion"].as<std::string>(), "batch.volcano.sh/v1alpha1");
  EXPECT_EQ(job["kind"].as<std::string>(), "Job");
  EXPECT_EQ(job["metadata"]["name"].as<std::string>(), "fashion-mnist-hetero");
  EXPECT_FALSE(job["metadata"]["namespace"]);
  const YAML::Node spec = job["spec"];
  EXPECT_EQ(spec["schedulerName"].as<std::string>(), "volcano");
  EXPECT_EQ(spec["queue"].as<std::string>(), "default");
  EXPECT_EQ(spec["minAvailable"].as<int>(), 3);  // the three devices: gang
  ASSERT_TRUE(spec["plugins"]["svc"]);
  EXPECT_TRUE(spec["plugins"]["svc"].IsSequence());
  EXPECT_TRUE(spec["plugins"]["env"].IsSequence());
  ASSERT_EQ(spec["policies"].size(), 2u);
  EXPECT_EQ(spec["policies"][0]["event"].as<std::string>(), "PodFailed");
  EXPECT_EQ(spec["policies"][0]["action"].as<std::string>(), "AbortJob");

  ASSERT_EQ(spec["tasks"].size(), 1u);
  const YAML::Node task = spec["tasks"][0];
  EXPECT_EQ(task["name"].as<std::string>(), "cpu");
  EXPECT_EQ(task["replicas"].as<int>(), 3);
  const YAML::Node pod = task["template"]["spec"];
  EXPECT_EQ(pod["restartPolicy"].as<std::string>(), "Never");
  EXPECT_EQ(pod["nodeSelector"]["kubernetes.io/arch"].as<std::string>(), "amd64");
  ASSERT_EQ(pod["containers"].size(), 1u);
  const YAML::Node container = pod["containers"][0];
  EXPECT_EQ(container["image"].as<std::string>(), "hetra:cpu");
  EXPECT_EQ(container["args"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"run", "/etc/hetra/config.toml", "--rank-from-env"}));
  EXPECT_FALSE(container["command"]);  // the image's entry point, hetra
  const auto env = envOf(container);
  EXPECT_EQ(env.at("HETRA_VOLCANO_TASK"), "cpu");
  EXPECT_EQ(env.at("HETRA_VOLCANO_TASKS"), "cpu");
  EXPECT_EQ(env.at("HETRA_MASTER_PORT"), "29431");
  EXPECT_EQ(env.at("HETRA_JOB_ID"), "fashion-mnist-hetero");
  EXPECT_EQ(env.at("HETRA_JOB_SECRET_FILE"), "/var/run/hetra/job-secret");
  EXPECT_EQ(env.at("HETRA_IFACE_ADDR"), "fieldRef:status.podIP");
  EXPECT_EQ(env.count("HETRA_JOB_SECRET"), 0u);
  EXPECT_EQ(container["ports"][0]["containerPort"].as<int>(), 29431);
  for (const char* bound : {"requests", "limits"}) {
    const YAML::Node resources = container["resources"][bound];
    EXPECT_EQ(resources.size(), 1u) << bound;  // cpu only: no GPU resource
    EXPECT_EQ(resources["cpu"].as<std::string>(), "1") << bound;
  }
  // The secret is in the Secret only: not in the Job, its env or its arguments.
  EXPECT_FALSE(contains(YAML::Dump(job), kSecret));

  std::map<std::string, std::string> mounts;
  for (const auto& mount : container["volumeMounts"]) {
    EXPECT_TRUE(mount["readOnly"].as<bool>());
    mounts[mount["name"].as<std::string>()] = mount["mountPath"].as<std::string>();
  }
  EXPECT_EQ(mounts, (std::map<std::string, std::string>{{"config", "/etc/hetra"},
                                                        {"job-secret", "/var/run/hetra"}}));
  ASSERT_EQ(pod["volumes"].size(), 2u);
  const YAML::Node volumes = pod["volumes"];
  const auto config = findByName(volumes, "config");
  const auto secretVolume = findByName(volumes, "job-secret");
  ASSERT_TRUE(config && secretVolume);
  EXPECT_EQ((*config)["configMap"]["name"].as<std::string>(), "fashion-mnist-hetero-config");
  EXPECT_EQ((*secretVolume)["secret"]["secretName"].as<std::string>(),
            "fashion-mnist-hetero-secret");
  EXPECT_EQ((*secretVolume)["secret"]["defaultMode"].as<int>(), 0600);
}

TEST(K8sManifest, OneTaskPerKindWithItsResourceImageAndNodes) {
  TempConfig file(kThreeKinds);
  cli::K8sOptions options;
  options.configPath = file.path();
  options.name = "Mixed_Run";
  options.nameSpace = "ml";
  options.queue = "gpus";
  options.images = {"cuda=registry.example/hetra:cuda", "rocm=registry.example/hetra:rocm"};
  options.selectors = {"cuda=gpu.example/model=h100"};
  options.storePort = 4100;
  options.dataHostPath = true;
  const auto docs = parse(cli::k8sManifest(options, kSecret));
  ASSERT_EQ(docs.size(), 3u);
  for (const auto& doc : docs) EXPECT_EQ(doc["metadata"]["namespace"].as<std::string>(), "ml");
  const YAML::Node spec = docs[2]["spec"];
  EXPECT_EQ(docs[2]["metadata"]["name"].as<std::string>(), "mixed-run");
  EXPECT_EQ(spec["queue"].as<std::string>(), "gpus");
  EXPECT_EQ(spec["minAvailable"].as<int>(), 5);
  ASSERT_EQ(spec["tasks"].size(), 3u);

  struct Expected {
    const char* name;
    int replicas;
    const char* image;
    const char* gpuResource;  // "" for cpu
    const char* cpus;
    const char* label;
    const char* value;
  };
  const Expected expected[] = {
      {"cuda", 2, "registry.example/hetra:cuda", "nvidia.com/gpu", "1", "gpu.example/model",
       "h100"},
      {"cpu", 2, "hetra:cpu", "", "2", "kubernetes.io/arch", "amd64"},
      {"rocm", 1, "registry.example/hetra:rocm", "amd.com/gpu", "1",
       "feature.node.kubernetes.io/amd-gpu", "true"},
  };
  for (size_t t = 0; t < 3; ++t) {
    const Expected& e = expected[t];
    const YAML::Node task = spec["tasks"][t];
    EXPECT_EQ(task["name"].as<std::string>(), e.name);
    EXPECT_EQ(task["replicas"].as<int>(), e.replicas) << e.name;
    const YAML::Node pod = task["template"]["spec"];
    EXPECT_EQ(pod["nodeSelector"].size(), 1u);
    EXPECT_EQ(pod["nodeSelector"][e.label].as<std::string>(), e.value) << e.name;
    const YAML::Node container = pod["containers"][0];
    EXPECT_EQ(container["image"].as<std::string>(), e.image);
    const auto env = envOf(container);
    EXPECT_EQ(env.at("HETRA_VOLCANO_TASK"), e.name);
    EXPECT_EQ(env.at("HETRA_VOLCANO_TASKS"), "cuda,cpu,rocm");
    EXPECT_EQ(env.at("HETRA_MASTER_PORT"), "4100");
    EXPECT_EQ(env.at("HETRA_JOB_ID"), "mixed-run");
    const YAML::Node limits = container["resources"]["limits"];
    EXPECT_EQ(limits["cpu"].as<std::string>(), e.cpus) << e.name;
    if (*e.gpuResource) {
      EXPECT_EQ(limits[e.gpuResource].as<int>(), 1) << e.name;
      EXPECT_EQ(limits.size(), 2u);
    } else {
      EXPECT_EQ(limits.size(), 1u);
    }
    const auto data = findByName(pod["volumes"], "data");
    ASSERT_TRUE(data);
    EXPECT_EQ((*data)["hostPath"]["path"].as<std::string>(), "/usr/share/datasets/fashion-mnist");
  }
}

// Sets variables for one emulated pod and unsets them after.
class PodVariables {
 public:
  ~PodVariables() {
    for (const auto& name : names_) unsetenv(name.c_str());
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    names_.push_back(name);
  }

 private:
  std::vector<std::string> names_;
};

// Each pod of the job, given what Volcano sets (its index, every task's hosts) and what the
// manifest sets, discovers a rank whose [[devices]] entry has its task's kind, every rank once.
TEST(K8sManifest, ItsPodsDiscoverTheRanksOfTheConfigsDevices) {
  TempConfig file(kThreeKinds);
  cli::K8sOptions options;
  options.configPath = file.path();
  options.name = "mix";
  const auto docs = parse(cli::k8sManifest(options, kSecret));
  train::Capabilities any;
  any.cuda = any.rocm = true;
  const auto config = train::loadConfig(file.path(), {}, any);
  const YAML::Node tasks = docs[2]["spec"]["tasks"];
  std::vector<int> seen(config.devices.size(), 0);
  for (const auto& task : tasks) {
    const std::string name = task["name"].as<std::string>();
    for (int index = 0; index < task["replicas"].as<int>(); ++index) {
      PodVariables pod;
      pod.set("HETRA_VOLCANO_DIR", "/nonexistent");  // the variables, not this machine's files
      for (const auto& other : tasks) {              // the svc plugin: <job>-<task>-<index>.<job>
        std::string hosts;
        for (int i = 0; i < other["replicas"].as<int>(); ++i)
          hosts += str(hosts.empty() ? "" : ",", "mix-", other["name"].as<std::string>(), "-", i,
                       ".mix");
        std::string upper = other["name"].as<std::string>();
        for (char& c : upper) c = char(std::toupper(c));
        pod.set(str("VC_", upper, "_HOSTS"), hosts);
      }
      pod.set("VC_TASK_INDEX", std::to_string(index));
      for (const auto& [variable, value] : envOf(task["template"]["spec"]["containers"][0]))
        if (value.rfind("fieldRef:", 0) != 0) pod.set(variable, value);
      const auto context = launch::rankFromEnvironment();
      ASSERT_TRUE(context) << name << index;
      EXPECT_EQ(context->launcher, "volcano");
      EXPECT_EQ(context->worldSize, 5);
      EXPECT_EQ(context->storeAddress, "mix-cuda-0.mix:29431");
      ASSERT_LT(context->rank, 5);
      EXPECT_EQ(config.devices[size_t(context->rank)].kind, name) << "rank " << context->rank;
      ++seen[size_t(context->rank)];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(5, 1));
}

TEST(K8sManifest, RefusesWhatAVolcanoJobCannotRun) {
  TempConfig ungrouped(std::string(kThreeKinds) + "[[devices]]\nkind = \"cpu\"\n");
  cli::K8sOptions options;
  options.configPath = ungrouped.path();
  std::string error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "devices[5].kind = \"cpu\" comes after a \"rocm\" device")) << error;
  EXPECT_TRUE(contains(error, "grouped by kind")) << error;

  std::string onHosts = kThreeKinds;
  for (size_t at = 0; (at = onHosts.find("[[devices]]\n", at)) != std::string::npos; at += 12)
    onHosts.insert(at + 12, "host = \"node1\"\n");
  TempConfig hosts(onHosts);
  options.configPath = hosts.path();
  error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "devices[0].host = \"node1\"")) << error;
  EXPECT_TRUE(contains(error, "leave host out")) << error;

  options.configPath = kExample;
  options.sets.clear();
  options.images = {"tpu=x"};
  error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "device kind 'tpu'")) << error;
  options.images = {"cuda"};
  error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "--image cuda: expected KIND=VALUE")) << error;
  options.images.clear();
  options.selectors = {"cpu=nolabel"};
  error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "expected KIND=LABEL=VALUE")) << error;
  options.selectors.clear();
  options.name = "9lives";
  error = configError([&] { cli::k8sManifest(options, kSecret); });
  EXPECT_TRUE(contains(error, "starts with a letter")) << error;
}

TEST(K8sManifest, OutputFileHoldsTheSecretWithMode0600) {
  const fs::path out = fs::temp_directory_path() / ("hetra-k8s-out-" + std::to_string(getpid()));
  cli::K8sOptions options;
  options.configPath = kExample;
  options.outputPath = out.string();
  ASSERT_EQ(cli::runK8sCommand(options), 0);
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const auto docs = YAML::LoadAllFromFile(out.string());
  ASSERT_EQ(docs.size(), 3u);
  const std::string generated = docs[1]["stringData"]["job-secret"].as<std::string>();
  EXPECT_EQ(generated.size(), 64u);
  EXPECT_EQ(generated.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(generated, kSecret);
  fs::remove(out);
}

}  // namespace
