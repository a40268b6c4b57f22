// `hetra k8s CONFIG`: the Kubernetes objects that run a config's job on a Volcano cluster, one pod
// per rank (docs/deployment.md):
//   ConfigMap <job>-config   the effective config (the file with every --set applied), which every
//                            pod reads at /etc/hetra/config.toml, so all ranks hold the same config
//   Secret <job>-secret      the job secret, generated here once, mounted in every pod as a file
//                            of mode 0600 (HETRA_JOB_SECRET_FILE), never on a command line
//   Job <job>                batch.volcano.sh/v1alpha1: one task per device kind (cpu, cuda, rocm)
//                            with that kind's image, resource and node selector; minAvailable = all
//                            ranks (gang scheduling: every pod or none); the env and svc plugins,
//                            from which each pod learns its rank (launch/scheduler_environment.h)
// Ranks are numbered task by task in the order the kinds first appear in [[devices]], so the
// config must list its devices grouped by kind; rank r then runs [[devices]] entry r.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace hetra::cli {

struct K8sOptions {
  std::string configPath;
  std::vector<std::string> sets;       // "key=value" overrides, as hetra run takes them
  std::string name;                    // the job's name; "": from the config's file name
  std::string nameSpace;               // "": the namespace kubectl applies to
  std::string queue = "default";       // Volcano queue
  std::vector<std::string> images;     // KIND=IMAGE; a kind not named: hetra:KIND
  std::vector<std::string> selectors;  // KIND=LABEL=VALUE, replacing that kind's default
  int storePort = 29431;               // rank 0's store (the tcp transport picks its own ports)
  bool dataHostPath = false;           // mount [data] path from each node, read-only
  std::string outputPath;              // "": standard output
};

// The manifest (three YAML documents: ConfigMap, Secret, Job) for `options`, with `secret` (64 hex
// characters) as the job secret. Throws ConfigError naming the key or option at fault.
std::string k8sManifest(const K8sOptions& options, const std::string& secret);

// Registers `k8s` on `app`, its options filling `options`. Returns the subcommand.
CLI::App* addK8sCommand(CLI::App& app, K8sOptions& options);
// Writes the manifest with a new job secret to the output (mode 0600: it holds the secret).
int runK8sCommand(const K8sOptions& options);

}  // namespace hetra::cli
