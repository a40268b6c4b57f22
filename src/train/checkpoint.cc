// Vocabulary: see checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <torch/nn/module.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "balance/balancer.h"
#include "comm/communicator.h"
#include "common/errors.h"
#include "common/logging.h"
#include "train/data_parallel.h"
#include "train/models.h"
#include "train/periodic_sync.h"
#include "train/specs.h"
#include "train/zero_checkpoint.h"
#include "train/zero_parallel.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Names and shapes of a module's parameters and buffers, in registration order.
std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : model.named_parameters())
    out.emplace_back(item.key(), item.value().sizes().vec());
  for (const auto& item : model.named_buffers())
    out.emplace_back(item.key(), item.value().sizes().vec());
  return out;
}

constexpr const char* kManifest = "MANIFEST";
constexpr const char* kManifestHeader = "hetra-checkpoint 1";

// Flushes a file, or a directory's entries, to the disk.
void fsyncPath(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw IoError(str("cannot open '", path.string(), "' to sync: ", strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(str("fsync of '", path.string(), "' failed: ", strerror(err)));
}

fs::path parentOf(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

void renameDurably(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec)
    throw IoError(
        str("cannot rename '", from.string(), "' to '", to.string(), "': ", ec.message()));
  fsyncPath(parentOf(to), true);
}

// Size and CRC32C of a file, read in 1 MiB blocks.
std::pair<uint64_t, uint32_t> sizeAndCrc(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot read '", path.string(), "'"));
  std::vector<char> block(1 << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  while (in) {
    in.read(block.data(), std::streamsize(block.size()));
    const auto got = size_t(in.gcount());
    crc = crc32c(block.data(), got, crc);
    size += got;
  }
  if (in.bad()) throw IoError(str("reading '", path.string(), "' failed"));
  return {size, crc};
}

// step-<N> directories under `root`, newest first.
std::vector<std::pair<int64_t, fs::path>> stepDirectories(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = checkpointStep(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) out.emplace_back(step, entry.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void writeFileAtomically(const std::string& path, const std::string& bytes) {
  writeFileAtomically(path, std::vector<std::string_view>{bytes});
}

void writeFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(str("cannot write '", tmp.string(), "': ", strerror(errno)));
  for (const std::string_view bytes : pieces) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = errno;
        ::close(fd);
        throw IoError(str("writing '", tmp.string(), "' failed: ", strerror(err)));
      }
      done += size_t(n);
    }
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(str("fsync of '", tmp.string(), "' failed: ", strerror(err)));
  renameDurably(tmp, target);
}

void commitCheckpoint(const std::string& tmpDir, const std::string& finalDir,
                      const std::vector<FileChecksum>& written) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(tmpDir))
    if (entry.is_regular_file() && entry.path().filename() != kManifest)
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  // Another host's rank wrote into its own file system: the MANIFEST would not list its file.
  for (const auto& f : written)
    if (!fs::exists(fs::path(tmpDir) / f.name))
      throw IoError(str("'", (fs::path(tmpDir) / f.name).string(),
                        "' was written by another rank but is not here: the checkpoint directory "
                        "of a sharded run must be one directory that every rank sees"));
  std::ostringstream manifest;
  manifest << kManifestHeader << "\n";
  for (const auto& file : files) {
    const auto filename = file.filename().string();
    HETRA_ENFORCE(filename.find_first_of(" \n") == std::string::npos,
                  "checkpoint file names have no spaces: '", filename, "'");
    const auto known = std::find_if(written.begin(), written.end(),
                                    [&](const FileChecksum& f) { return f.name == filename; });
    uint64_t size = 0;
    uint32_t crc = 0;
    if (known != written.end()) {
      size = known->size;
      crc = known->crc;
    } else {
      fsyncPath(file, false);
      std::tie(size, crc) = sizeAndCrc(file);
    }
    manifest << "file " << filename << " " << size << " " << std::hex << crc << std::dec << "\n";
  }
  // The MANIFEST is written (and synced) after every file it describes is on the disk.
  writeFileAtomically((fs::path(tmpDir) / kManifest).string(), manifest.str());
  fs::remove_all(finalDir);
  renameDurably(tmpDir, finalDir);
}

namespace {

// A sharded run's shard-<r>.bin (train/zero_checkpoint.h).
bool isShardFile(const std::string& name) {
  return name.starts_with("shard-") && name.ends_with(".bin");
}

}  // namespace

std::string checkCheckpoint(const std::string& dir, bool shardContents) {
  const fs::path manifestPath = fs::path(dir) / kManifest;
  std::ifstream in(manifestPath);
  if (!in) return "it has no MANIFEST (an unfinished or truncated save)";
  std::string line;
  if (!std::getline(in, line) || line != kManifestHeader)
    return str("its MANIFEST does not start with '", kManifestHeader, "'");
  int listed = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string word, name;
    uint64_t size = 0;
    uint32_t crc = 0;
    if (!(fields >> word >> name >> size >> std::hex >> crc) || word != "file")
      return str("its MANIFEST has a bad line: '", line, "'");
    const fs::path file = fs::path(dir) / name;
    std::error_code ec;
    const auto actualSize = fs::file_size(file, ec);
    if (ec) return str(name, " is missing");
    if (actualSize != size)
      return str(name, " has ", actualSize, " bytes, the MANIFEST lists ", size,
                 actualSize < size ? " (truncated)" : "");
    if (!shardContents && isShardFile(name)) {
      ++listed;
      continue;
    }
    try {
      const uint32_t actual = sizeAndCrc(file).second;
      if (actual != crc)
        return str(name, " has CRC32C ", std::hex, actual, ", the MANIFEST lists ", crc,
                   " (corrupted)");
    } catch (const IoError& e) {
      return e.what();
    }
    ++listed;
  }
  if (listed == 0) return "its MANIFEST lists no files";
  return "";
}

int64_t checkpointStep(const std::string& name) {
  constexpr std::string_view prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string findCheckpoint(const std::string& path) {
  const fs::path given(path);
  if (fs::exists(given / kManifest) || checkpointStep(given.filename().string()) >= 0) {
    const std::string why = checkCheckpoint(path, /*shardContents=*/false);
    if (!why.empty()) throw IoError(str("checkpoint '", path, "' cannot be used: ", why));
    return path;
  }
  // Every step directory is tried, newest first; `latest` is only a hint for people, since a crash
  // between renaming a step directory and rewriting `latest` leaves the newest one unnamed.
  const auto candidates = stepDirectories(given);
  std::string skipped;
  for (const auto& [step, dir] : candidates) {
    const std::string why = checkCheckpoint(dir.string(), /*shardContents=*/false);
    if (why.empty()) return dir.string();
    HETRA_WARN("train", "checkpoint '", dir.string(), "' is unusable: ", why,
               "; trying the previous one");
    skipped += str("; ", dir.filename().string(), ": ", why);
  }
  throw ConfigError(str("--resume ", path, ": no usable checkpoint there (no step-<N> directory",
                        candidates.empty() ? "" : " that verifies", ")", skipped));
}

std::vector<std::string> pruneCheckpoints(const std::string& root, int64_t keep) {
  HETRA_ENFORCE_GE(keep, 1, "at least one checkpoint is kept");
  std::vector<std::string> removed;
  const auto dirs = stepDirectories(root);
  for (size_t i = size_t(keep); i < dirs.size(); ++i) {
    fs::remove_all(dirs[i].second);
    removed.push_back(dirs[i].second.string());
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() > 4 && name.ends_with(".tmp") &&
        checkpointStep(name.substr(0, name.size() - 4)) >= 0) {
      fs::remove_all(entry.path());
      removed.push_back(entry.path().string());
    }
  }
  if (!removed.empty()) fsyncPath(root, true);
  return removed;
}

void saveCheckpoint(const std::string& path, const torch::nn::Module& model,
                    const torch::optim::Optimizer& optimizer, const CheckpointInfo& info) {
  const std::string tmp = path + ".tmp";
  try {
    torch::serialize::OutputArchive root, modelArchive, optimArchive;
    model.save(modelArchive);
    optimizer.save(optimArchive);
    root.write("model", modelArchive);
    root.write("optimizer", optimArchive);
    // LibTorch's optimizer archive restores the state (moments, step counts) but not the options
    // of the parameter groups, so the learning rates, which a schedule changes, are kept here.
    std::vector<double> lrs;
    for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
    root.write("lrs", torch::tensor(lrs, torch::kFloat64));
    root.write("step", c10::IValue(info.step));
    root.write("text", c10::IValue(info.text));
    root.save_to(tmp);
  } catch (const c10::Error& e) {
    throw IoError(str("cannot write checkpoint '", tmp, "': ", e.what_without_backtrace()));
  }
  fsyncPath(tmp, false);
  renameDurably(tmp, path);
}

CheckpointInfo loadCheckpoint(const std::string& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer) {
  if (!std::filesystem::exists(path)) throw IoError(str("checkpoint '", path, "' does not exist"));
  CheckpointInfo info;
  torch::serialize::InputArchive root, modelArchive, optimArchive;
  try {
    root.load_from(path);
  } catch (const c10::Error& e) {
    throw IoError(str("cannot read checkpoint '", path, "': ", e.what_without_backtrace()));
  }
  try {
    root.read("model", modelArchive);
    root.read("optimizer", optimArchive);
    c10::IValue step, text;
    root.read("step", step);
    root.read("text", text);
    torch::Tensor lrs;
    root.read("lrs", lrs);
    info.step = step.toInt();
    info.text = text.toStringRef();
    if (lrs.numel() != int64_t(optimizer.param_groups().size()))
      throw IoError(str("checkpoint '", path, "' has ", lrs.numel(),
                        " parameter groups, the optimizer ", optimizer.param_groups().size()));
    // Module::load replaces each tensor by the stored one without comparing shapes: compare here.
    const auto before = shapes(model);
    model.load(modelArchive);
    const auto after = shapes(model);
    for (size_t i = 0; i < before.size(); ++i)
      if (before[i].second != after[i].second)
        throw IoError(hetra::str("checkpoint '", path, "' does not fit this model: '",
                                 before[i].first, "' is ", c10::IntArrayRef(after[i].second),
                                 " in the checkpoint and ", c10::IntArrayRef(before[i].second),
                                 " in the model"));
    optimizer.load(optimArchive);
    for (size_t g = 0; g < optimizer.param_groups().size(); ++g)
      optimizer.param_groups()[g].options().set_lr(lrs[int64_t(g)].item<double>());
  } catch (const c10::Error& e) {
    throw IoError(str("checkpoint '", path,
                      "' does not fit this model and optimizer: ", e.what_without_backtrace()));
  }
  return info;
}
int64_t savedStep(const std::string& stepDir) {
  const fs::path path = fs::path(stepDir) / "state.json";
  std::ifstream in(path);
  if (!in) throw IoError(str("cannot read '", path.string(), "'"));
  const json state = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object() || !state.contains("step") || !state.at("step").is_number_integer())
    throw IoError(str("'", path.string(), "' holds no step"));
  return state.at("step").get<int64_t>();
}

std::string newestCheckpointSince(const std::string& root, fs::file_time_type since) {
  for (const auto& [step, dir] : stepDirectories(root)) {
    std::error_code ec;
    const auto written = fs::last_write_time(dir / kManifest, ec);
    if (ec || written < since) continue;
    const std::string why = checkCheckpoint(dir.string(), /*shardContents=*/false);
    if (why.empty()) return dir.string();
    HETRA_WARN("train", "checkpoint ", dir.string(), " is unusable: ", why);
  }
  return "";
}

void refuseForeignCheckpoints(const std::string& root) {
  auto found = stepDirectories(root);
  if (found.empty()) return;
  std::reverse(found.begin(), found.end());  // oldest first
  std::string names;
  for (size_t i = 0; i < found.size() && i < 3; ++i)
    names += (i ? ", " : "") + found[i].second.filename().string();
  if (found.size() > 3) names += ", ...";
  throw ConfigError(str(
      "train.checkpoint_dir = \"", root, "\" already holds checkpoints of an earlier run (", names,
      "): continue it with --resume ", root, ", or give this run another train.checkpoint_dir"));
}

namespace {

// Every rank's `mine` as the rows of one tensor (a collective; exact: the allgather asks for no
// compression).
torch::Tensor gatherRows(comm::Communicator& comm, const torch::Tensor& mine) {
  torch::Tensor rows = torch::empty({comm.size(), mine.numel()}, torch::kFloat32);
  comm.allgather(mine.data_ptr(), rows.data_ptr(),
                 std::vector<size_t>(size_t(comm.size()), size_t(mine.numel())), DType::F32)
      ->wait();
  return rows;
}

// This rank's row of a file that gatherRows' tensor was saved to.
torch::Tensor loadOwnRow(const fs::path& file, const comm::Communicator& comm) {
  torch::Tensor all;
  torch::load(all, file.string());
  HETRA_ENFORCE(all.dim() == 2 && all.size(0) == comm.size(), "checkpoint ", file.string(),
                " holds residuals of ", all.size(0), " ranks, not ", comm.size());
  return all[comm.rank()].contiguous();
}

}  // namespace

RunCheckpoints::RunCheckpoints(const RunConfig& config, comm::Communicator& comm,
                               TrainingParts parts)
    : config_(config), comm_(comm), parts_(parts) {}

bool RunCheckpoints::feedsBackErrors() const {
  // Data parallelism's residuals (DataParallel's buckets); a sharded run's are not saved (start()).
  return parts_.parallel && config_.comm.errorFeedback && config_.comm.compression != "none";
}

std::vector<std::string> RunCheckpoints::deviceNames() const {
  std::vector<std::string> names;
  for (const auto& device : config_.devices) names.push_back(device.name);
  return names;
}

RunCheckpoints::Resumed RunCheckpoints::start(const std::string& resumePath) {
  if (resumePath.empty()) {
    // Every rank checks: on one host they see the same directory, so all refuse alike.
    if (config_.train.checkpointEvery > 0) refuseForeignCheckpoints(config_.train.checkpointDir);
    return {};
  }
  const fs::path dir(findCheckpoint(resumePath));
  std::ifstream in(dir / "state.json");
  const json state = json::parse(in);
  // A sharded checkpoint resumes under every stage, zero.stage = 0 included (every rank then
  // reads all the shards); a data-parallel one too (every rank reads the whole model file).
  if (parts_.zero && !state.contains("zero")) {
    HETRA_ENFORCE(bool(parts_.makeReplica), "a sharded run resuming a model file needs a replica");
    readModelFileIntoShards(*parts_.zero, parts_.makeReplica, optimSpecOf(config_.train),
                            (dir / "model.pt").string());
  } else if (parts_.zero) {
    readShards(*parts_.zero, state.at("zero"), dir.string());
  } else if (state.contains("zero")) {
    auto* model = dynamic_cast<Model*>(&parts_.model);
    HETRA_ENFORCE(model != nullptr, "a sharded checkpoint resumes into a hetra Model");
    readShardsIntoModel(*model, parts_.optimizer, optimSpecOf(config_.train), state.at("zero"),
                        dir.string());
  } else {
    loadCheckpoint((dir / "model.pt").string(), parts_.model, parts_.optimizer);
  }
  const Resumed resumed{dir.string(), state.at("step").get<int64_t>()};
  // Each rank's residuals of a sharded run cover every tensor (zero_parallel.h): a copy of the
  // whole gradient per rank, too much to save beside the shards. What they held is dropped: one
  // step's rounding of the compressed reduce-scatters.
  if (parts_.zero && parts_.zero->residualElements() > 0 && comm_.rank() == 0)
    HETRA_WARN("train", "resuming a sharded run with compressed gradients from ", dir.string(),
               ": its error-feedback residuals were not saved and start at zero");
  // After an elastic restart without a device (or a --resume with other devices) the survivors
  // would not even keep their rank numbers, and their speeds change with the freed cores, so the
  // balancer starts afresh (equal split, re-profiling); the split never changes the result.
  // Checkpoints of older hetra versions do not list their devices: the rank count decides.
  auto saved = balance::Balancer::load(state.at("balancer").get<std::string>());
  const auto savedDevices =
      state.value("devices", std::vector<std::string>{});  // empty: an older checkpoint
  const bool sameDevices =
      state.contains("devices") ? savedDevices == deviceNames() : saved.ranks() == comm_.size();
  // The same devices with another global batch (train.global_batch = 0 resolved under other
  // caps, train/global_batch.h): the saved split does not cover this run's batch.
  const int64_t savedBatch = saved.options().globalBatch;
  const int64_t batch = parts_.balancer.options().globalBatch;
  // A balancer that may leave ranks out, for a loop that needs every rank, or the reverse, splits
  // by another rule too (balance/balancer.h, "left out").
  const bool sameRule =
      saved.options().sharesWithinCaps == parts_.balancer.options().sharesWithinCaps &&
      saved.options().leaveOut == parts_.balancer.options().leaveOut;
  if (sameDevices) {
    if (savedBatch == batch && sameRule)
      parts_.balancer = std::move(saved);
    else if (savedBatch == batch && comm_.rank() == 0)
      HETRA_INFO("train", "checkpoint ", dir.string(),
                 " was written under a rule that splits the batch otherwise (shares within the "
                 "micro-batch caps or not, devices left out or not: ZeRO stages, "
                 "balance.leave_out): the balancer re-profiles from an equal split");
    else if (comm_.rank() == 0)
      HETRA_WARN("train", "checkpoint ", dir.string(), " was written with a global batch of ",
                 savedBatch, ", this run's is ", batch,
                 ": the balancer re-profiles from an equal split");
    const fs::path residualsFile = dir / "residuals.pt";
    if (feedsBackErrors() && fs::exists(residualsFile))
      parts_.parallel->loadResiduals(loadOwnRow(residualsFile, comm_));
    const fs::path syncResidualsFile = dir / "sync_residuals.pt";
    if (parts_.periodic && fs::exists(syncResidualsFile))
      parts_.periodic->loadResiduals(loadOwnRow(syncResidualsFile, comm_));
    return resumed;
  }
  // Whatever a departed rank owed in error feedback is dropped.
  if (parts_.parallel) parts_.parallel->loadResiduals(torch::Tensor());
  if (parts_.periodic) parts_.periodic->loadResiduals(torch::Tensor());
  auto list = [](const std::vector<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
    return text;
  };
  if (comm_.rank() == 0)
    HETRA_WARN("train", "checkpoint ", dir.string(), " was written by ", saved.ranks(), " devices",
               state.contains("devices") ? str(" (", list(savedDevices), ")") : std::string(),
               ", this run has ", comm_.size(), " (", list(deviceNames()),
               "): the balancer re-profiles from an equal split",
               feedsBackErrors() ? "; error-feedback residuals start at zero" : "");
  return resumed;
}

void RunCheckpoints::save(int64_t step) {
  comm_.barrier()->wait();  // every rank has finished the step
  // Every rank's residuals go into the checkpoint (rank 0 writes it), exact: the allgather asks
  // for no compression.
  torch::Tensor residuals, syncResiduals;
  if (feedsBackErrors()) residuals = gatherRows(comm_, parts_.parallel->saveResiduals());
  if (parts_.periodic && parts_.periodic->feedsBackErrors())
    syncResiduals = gatherRows(comm_, parts_.periodic->residuals());
  const fs::path root(config_.train.checkpointDir);
  const std::string name = str("step-", step);
  const fs::path tmp = root / (name + ".tmp");
  if (comm_.rank() == 0) {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  std::optional<WrittenShards> shards;
  if (parts_.zero) {
    comm_.barrier()->wait();  // the directory exists before any rank writes its shard into it
    shards = writeShards(*parts_.zero, comm_, tmp.string());
  }
  if (comm_.rank() == 0) {
    if (!parts_.zero)
      saveCheckpoint((tmp / "model.pt").string(), parts_.model, parts_.optimizer,
                     CheckpointInfo{step, ""});
    json state = {{"step", step},
                  {"balancer", parts_.balancer.save()},
                  {"devices", deviceNames()},
                  {"config", toToml(config_)}};
    if (shards) state["zero"] = shards->plan;
    writeFileAtomically((tmp / "state.json").string(), state.dump(1));
    if (residuals.defined()) torch::save(residuals, (tmp / "residuals.pt").string());
    if (syncResiduals.defined()) torch::save(syncResiduals, (tmp / "sync_residuals.pt").string());
    commitCheckpoint(tmp.string(), (root / name).string(),
                     shards ? shards->files : std::vector<FileChecksum>{});
    writeFileAtomically((root / "latest").string(), name + "\n");
    HETRA_INFO("train", "checkpoint ", (root / name).string());
    for (const auto& old : pruneCheckpoints(root.string(), config_.train.keepCheckpoints))
      HETRA_INFO("train", "removed checkpoint ", old);
  }
  comm_.barrier()->wait();  // no rank runs ahead while rank 0 writes
}

}  // namespace hetra::train
