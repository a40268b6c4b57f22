#include "train/config/fields.h"

#include "common/units.h"

namespace hetra::train::cfg {
namespace {

// A "LATENCY,BANDWIDTH" link cost such as "5us,5GB/s", read with the parsers comm::parseLinkCost
// uses (common/units.h), so the config accepts exactly what the communicator will. Empty: the
// text is fine.
std::string linkCostProblem(const std::string& text) {
  const size_t comma = text.find(',');
  try {
    if (comma != std::string::npos) {
      parseSeconds(text.substr(0, comma), "latency");
      if (parseRate(text.substr(comma + 1), "bandwidth", RateUnit::kRequired) > 0) return "";
    }
  } catch (const ConfigError&) {
    // Said below, with the forms allowed.
  }
  return "expected \"LATENCY,BANDWIDTH\" such as \"5us,5GB/s\" or \"50us,1gbit\" (latency in "
         "s, ms, us or ns; bandwidth > 0 in B/s, KB/s, MB/s, GB/s, kbit, mbit or gbit)";
}

Field<DeviceConfig> memoryField() {
  return {"memory", "memory cap: \"512MiB\", \"2GiB\", bytes, or \"unlimited\"", false,
          [](DeviceConfig& d, const Site& site) {
            const std::string allowed =
                "expected a size such as \"512MiB\", \"2GiB\" or \"1.5GB\", an integer number of "
                "bytes > 0, or \"unlimited\"";
            int64_t bytes = 0;
            if (auto* s = site.node.as_string()) {
              if (s->get() == "unlimited") {
                d.memoryBytes = 0;
                return;
              }
              try {
                bytes = parseBytes(s->get());
              } catch (const ConfigError&) {
                site.fail(allowed);
              }
            } else if (auto* i = site.node.as_integer()) {
              bytes = i->get();
            } else {
              site.fail(allowed);
            }
            if (bytes <= 0) site.fail(allowed);
            d.memoryBytes = bytes;
          },
          [](const DeviceConfig& d) {
            if (d.memoryBytes == 0) return std::string("\"unlimited\"");
            std::string s = formatBytes(d.memoryBytes);
            return s.find_first_not_of("0123456789") == std::string::npos ? s : quote(s);
          }};
}

Field<DeviceConfig> scheduleField() {
  return {"slowdown_schedule", "[[step, factor], ...]: slowdown from each step on", false,
          [](DeviceConfig& d, const Site& site) {
            auto* a = site.node.as_array();
            if (!a)
              site.fail("expected a list of [step, factor] pairs, e.g. [[100, 2.0], [300, 1]]");
            std::vector<SlowdownChange> changes;
            for (size_t i = 0; i < a->size(); ++i) {
              Site entry = site.element(i, *a->get(i));
              auto* pair = entry.node.as_array();
              if (!pair || pair->size() != 2)
                entry.fail("expected a [step, factor] pair: step an integer >= 0, factor >= 1");
              SlowdownChange c;
              c.step = readInt(entry.element(0, *pair->get(0)), atLeast(0));
              c.factor = readNumber(entry.element(1, *pair->get(1)), within(1, 1e6));
              if (!changes.empty() && c.step <= changes.back().step)
                entry.fail(str("steps must increase: step ", c.step, " follows step ",
                               changes.back().step));
              changes.push_back(c);
            }
            d.slowdownSchedule = std::move(changes);
          },
          [](const DeviceConfig& d) {
            return formatList(d.slowdownSchedule, [](const SlowdownChange& c) {
              return str("[", c.step, ", ", formatDouble(c.factor), "]");
            });
          }};
}

}  // namespace

const Fields<ModelConfig>& modelFields() {
  using M = ModelConfig;
  static const Fields<M> fields = {
      choiceField("name", &M::name, {"mlp", "cnn", "transformer"}, "mlp | cnn | transformer"),
      intListField("hidden", &M::hidden, atLeast(1), "mlp: hidden layer widths ([]: linear model)"),
      intListField("channels", &M::channels, atLeast(1),
                   "cnn: output channels of each conv 3x3 + max-pool 2x2 block"),
      intField("layers", &M::layers, within(1, 1024), "transformer: encoder layers"),
      intField("heads", &M::heads, within(1, 1024), "transformer: attention heads (divide dim)"),
      intField("dim", &M::dim, within(1, 1 << 20), "transformer: model width"),
      intField("seq_len", &M::seqLen, within(1, 1 << 20),
               "transformer: tokens per sample (its features cut into seq_len tokens)"),
  };
  return fields;
}

const Fields<DataConfig>& dataFields() {
  using D = DataConfig;
  static const Fields<D> fields = {
      choiceField("name", &D::name, {"fashion-mnist", "synthetic"}, "fashion-mnist | synthetic"),
      stringField("path", &D::path, "fashion-mnist: folder of the IDX .gz files"),
      intField("samples", &D::samples, atLeast(1), "synthetic: training samples"),
      intField("test_samples", &D::testSamples, atLeast(1), "synthetic: test samples"),
      intField("features", &D::features, within(1, 1 << 24), "synthetic: features per sample"),
      intField("classes", &D::classes, within(2, 1 << 24), "synthetic: classes"),
  };
  return fields;
}

const Fields<TrainConfig>& trainFields() {
  using T = TrainConfig;
  static const Fields<T> fields = {
      intField("global_batch", &T::globalBatch, atLeast(0),
               "samples per step over all devices; 0: from memory, the sum of the devices' "
               "micro-batch caps (docs/memory.md)"),
      numField("epochs", &T::epochs, atLeast(0), "passes over the training set"),
      intField("steps", &T::steps, atLeast(0), "> 0: exactly this many steps (epochs ignored)"),
      numField("lr", &T::lr, above(0), "learning rate (peak, after warm-up)"),
      choiceField("optimizer", &T::optimizer, {"sgd", "adam", "adamw"}, "sgd | adam | adamw"),
      numField("momentum", &T::momentum, upTo(0, 1), "sgd momentum"),
      boolField("nesterov", &T::nesterov, "sgd Nesterov momentum (needs momentum > 0)"),
      numField("weight_decay", &T::weightDecay, atLeast(0), "L2 (sgd, adam) or decoupled (adamw)"),
      numListField("betas", &T::betas, upTo(0, 1), 2, "adam, adamw: [beta1, beta2]"),
      numField("eps", &T::eps, above(0), "adam, adamw: denominator epsilon"),
      choiceField("lr_schedule", &T::lrSchedule, {"constant", "cosine"},
                  "constant | cosine (decays to 0 at the last step)"),
      intField("warmup_steps", &T::warmupSteps, atLeast(0), "linear warm-up from 0 to lr"),
      numField("grad_clip", &T::gradClip, atLeast(0), "max global gradient L2 norm; 0 = off"),
      intField("seed", &T::seed, atLeast(0), "model init, data order, synthetic data"),
      intField("eval_every", &T::evalEvery, atLeast(0), "evaluate every N steps; 0 = at the end"),
      intField("log_every", &T::logEvery, atLeast(0), "console line every N steps; 0 = none"),
      intField("checkpoint_every", &T::checkpointEvery, atLeast(0), "save every N steps; 0 = off"),
      stringField("checkpoint_dir", &T::checkpointDir, "where checkpoints go"),
      intField("keep_checkpoints", &T::keepCheckpoints, atLeast(1),
               "the newest N checkpoints stay, older ones are removed"),
      numField("bucket_mib", &T::bucketMib, within(0.001, 65536),
               "gradient bucket size (MiB) of the overlapped allreduce"),
      intField("resync_every", &T::resyncEvery, within(-1, int64_t(1) << 40),
               "zero.stage = 0: every N steps rank 0's parameters replace the other replicas' "
               "(each stage's, with several pipelines) and their drift is measured "
               "(replica_drift); 0 = never; -1 = 100 where the devices are of more than one "
               "kind, else never"),
      choiceField("precision", &T::precision, {"fp32", "bf16"},
                  "fp32 | bf16: forward under autocast (matrix products in bfloat16; "
                  "parameters, gradients and optimizer in float32)"),
      choiceField("activation_checkpointing", &T::activationCheckpointing, {"none", "blocks"},
                  "none | blocks: recompute each model block's activations in backward"),
      intField("sync_every", &T::syncEvery, within(1, 1 << 20),
               "average the models every H local steps; 1 = synchronous gradients"),
      choiceField("sync_mode", &T::syncMode, {"steps", "time"},
                  "steps (H local steps) | time (at most H, until sync_seconds)"),
      numField("sync_seconds", &T::syncSeconds, atLeast(0),
               "sync_mode = \"time\": a round's time budget on each device"),
      intField("sync_warmup_steps", &T::syncWarmupSteps, atLeast(0),
               "synchronous steps before the first round of local steps"),
  };
  return fields;
}

const Fields<BalanceConfig>& balanceFields() {
  using B = BalanceConfig;
  static const Fields<B> fields = {
      choiceField("mode", &B::mode, {"dynamic", "static", "equal"},
                  "dynamic | static (decide once after profiling) | equal (as DDP)"),
      numField("threshold", &B::threshold, between(0, 1), "least predicted gain worth a change"),
      intField("min_steps_between", &B::minStepsBetween, atLeast(0), "steps between changes"),
      intField("persist_steps", &B::persistSteps, atLeast(1), "dynamic: steps a gain must persist"),
      intField("profile_steps", &B::profileSteps, atLeast(1), "steps on the equal split first"),
      boolField("leave_out", &B::leaveOut,
                "leave out a device no share pays for (data parallelism, synchronous)"),
  };
  return fields;
}

const Fields<CommConfig>& commFields() {
  using C = CommConfig;
  static const Fields<C> fields = {
      choiceField("transport", &C::transport, {"auto", "shm", "tcp", "mpi"},
                  "auto (shm on one host, else tcp) | shm | tcp | mpi (a build with MPI)"),
      numField("timeout_s", &C::timeoutS, within(0.001, 1e6), "deadline of blocking comm calls"),
      choiceField("compression", &C::compression, {"none", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"},
                  "gradient bytes on the wire: none | fp16 | bf16 | fp8-e4m3 | fp8-e5m2"),
      boolField("error_feedback", &C::errorFeedback,
                "carry each bucket's compression error into the next step"),
      intField("compression_block", &C::compressionBlock, within(1, 1 << 20),
               "fp8: elements per fp32 scale"),
      intField("compression_min_bytes", &C::compressionMinBytes, atLeast(0),
               "gradient buckets smaller than this travel uncompressed"),
  };
  return fields;
}

const Fields<ElasticConfig>& elasticFields() {
  using E = ElasticConfig;
  static const Fields<E> fields = {
      intField(
          "max_restarts", &E::maxRestarts, within(0, 1000),
          "restarts after a rank fails: from the last checkpoint, without its device; 0 = off"),
      intField("min_devices", &E::minDevices, within(1, 1 << 16),
               "no restart when fewer devices than this would remain"),
  };
  return fields;
}

const Fields<TopologyConfig>& topologyFields() {
  using T = TopologyConfig;
  static const Fields<T> fields = {
      optionalStringField("file", &T::file,
                          "topology JSON from `hetra probe --links --out`: islands, link costs"),
      intListField("islands", &T::islands, atLeast(0),
                   "island id of each [[devices]] entry ([]: by host and vendor, or the file's)"),
      choiceField("algorithm", &T::algorithm, {"auto", "ring", "hierarchical"},
                  "auto (cost model; HETRA_ALGO) | ring | hierarchical"),
      optionalStringField("island_link", &T::islandLink,
                          "\"LATENCY,BANDWIDTH\" inside islands, e.g. \"5us,5GB/s\"",
                          linkCostProblem),
      optionalStringField("cross_link", &T::crossLink,
                          "\"LATENCY,BANDWIDTH\" between islands, e.g. \"50us,1gbit\"",
                          linkCostProblem),
  };
  return fields;
}

const Fields<LaunchConfig>& launchFields() {
  using L = LaunchConfig;
  static const Fields<L> fields = {
      stringField("mpirun", &L::mpirun, "the mpirun that starts ranks on named hosts"),
      stringListField("mpi_args", &L::mpiArgs, "extra mpirun arguments, as a list of strings"),
  };
  return fields;
}

const Fields<ParallelConfig>& parallelFields() {
  using P = ParallelConfig;
  static const Fields<P> fields = {
      intField("pipeline", &P::pipeline, within(1, 1 << 16),
               "stages of each pipeline, one per device (devices / pipeline pipelines, "
               "data-parallel); 1 = data parallelism"),
      choiceField("partition", &P::partition, {"balanced", "even"},
                  "balanced (measured block times and memory) | even (equal block counts)"),
      intField("chunks", &P::chunks, within(1, 1 << 20), "pipeline: micro-batches per step (1F1B)"),
      boolField("repartition", &P::repartition,
                "pipeline, balanced: move blocks between stages when a measured imbalance "
                "persists (zero.stage = 0)"),
      intField("tensor", &P::tensor, within(1, 1 << 16),
               "transformer: devices per tensor-parallel group (heads and MLP units split over "
               "them; consecutive [[devices]], the groups data-parallel); 1 = none"),
      choiceField("tensor_split", &P::tensorSplit, {"speed", "even"},
                  "speed (heads and units by each device's speed, measured at start) | even"),
  };
  return fields;
}

const Fields<ZeroConfig>& zeroFields() {
  using Z = ZeroConfig;
  static const Fields<Z> fields = {
      intField("stage", &Z::stage, within(0, 3),
               "ZeRO: 0 = data parallel; 1 shards optimizer state, 2 also gradients, 3 also "
               "parameters"),
      choiceField("shards", &Z::shards, {"memory", "even"},
                  "memory (by each device's headroom) | even (FSDP's and DeepSpeed's)"),
      choiceField("offload", &Z::offload, {"none", "optimizer", "parameters"},
                  "kept in host memory: none | optimizer (state) | parameters (stage 3: also "
                  "the shard's parameters and gradients)"),
      boolField("prefetch", &Z::prefetch,
                "stage 3: all-gather the next block while the current one runs (two blocks "
                "gathered at once)"),
      boolField("follow_speed", &Z::followSpeed,
                "shards = \"memory\": re-size the shards by each device's measured optimizer "
                "speed, never past what its memory plan gives it"),
      boolField("overlap_update", &Z::overlapUpdate,
                "stage 1 without clipping: update and all-gather each group of tensors as soon "
                "as its gradients are reduce-scattered, while the rest still are"),
  };
  return fields;
}

const Fields<DeviceConfig>& deviceFields() {
  using D = DeviceConfig;
  static const Fields<D> fields = [] {
    Fields<D> f = {
        choiceField("kind", &D::kind, {"cpu", "cuda", "rocm"}, "cpu | cuda | rocm"),
        stringField("name", &D::name, "unique name in logs and metrics"),
        intField("threads", &D::threads, within(1, 1024), "intra-op threads of this rank"),
        numField("slowdown", &D::slowdown, within(1, 1e6),
                 "emulation: runs this many times slower"),
        scheduleField(),
        memoryField(),
        choiceField("offload", &D::offload, {"none", "optimizer", "parameters"},
                    "ZeRO: this device's [zero] offload (unset: the section's)"),
        intField("max_micro_batch", &D::maxMicroBatch, within(1, int64_t(1) << 40),
                 "most samples per micro-batch (besides the memory cap)"),
        intField("index", &D::index, within(0, 1 << 16), "cuda/rocm: GPU index"),
        stringField("host", &D::host, "host of this rank (\"\" = this one); hosts: via mpirun"),
    };
    // Unset (0) is not written back; only GPUs have an index (a cpu device keeps -1).
    f[f.size() - 3].write = [](const D& d) {
      return d.maxMicroBatch == 0 ? std::string() : std::to_string(d.maxMicroBatch);
    };
    f[f.size() - 2].write = [](const D& d) {
      return d.kind == "cpu" ? std::string() : std::to_string(d.index);
    };
    f.back().write = [](const D& d) { return d.host.empty() ? std::string() : quote(d.host); };
    for (auto& field : f)
      if (field.key == "offload")
        field.write = [](const D& d) {
          return d.offload.empty() ? std::string() : quote(d.offload);
        };
    return f;
  }();
  return fields;
}

const std::vector<std::string>& sectionNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    forEachSection([&](const char* section, auto, const auto&) { n.push_back(section); });
    n.push_back("devices");
    return n;
  }();
  return names;
}

std::vector<std::pair<std::string, std::string>> allKeys() {
  std::vector<std::pair<std::string, std::string>> keys;  // (leaf, full key)
  auto add = [&](const std::string& section, const auto& fields) {
    for (const auto& leaf : keysOf(fields)) keys.push_back({leaf, section + "." + leaf});
  };
  forEachSection([&](const char* section, auto, const auto& fields) { add(section, fields); });
  add("devices[i]", deviceFields());
  return keys;
}

std::string suggestion(const std::string& leaf, const std::vector<std::string>& known,
                       const std::string& prefix, const std::string& where) {
  std::string near = closest(leaf, known);
  if (!near.empty()) return str("unknown key (did you mean ", prefix, near, "?)");
  for (const auto& [l, full] : allKeys())
    if (l == leaf) return str("unknown key (did you mean ", full, "?)");
  return str("unknown key; the keys of ", where, " are ", join(known, ", "));
}

bool isTextKey(const std::vector<std::string>& path) {
  auto textIn = [](const auto& fields, const std::string& leaf) {
    for (const auto& f : fields)
      if (f.key == leaf) return f.text;
    return false;
  };
  if (path.size() == 3 && path[0] == "devices") return textIn(deviceFields(), path[2]);
  bool text = false;
  if (path.size() == 2)
    forEachSection([&](const char* section, auto, const auto& fields) {
      if (path[0] == section) text = textIn(fields, path[1]);
    });
  return text;
}

}  // namespace hetra::train::cfg
