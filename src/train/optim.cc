// Vocabulary: see optim.h.
#include "train/optim.h"

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/types.h>
#include "train/fused_optim.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::train {
namespace {

void requireAtLeast(double value, double least, const char* key) {
  if (!(value >= least))  // also rejects NaN
    throw ConfigError(str("train.", key, " = ", value, " is not allowed; it must be >= ", least));
}

void requireBelowOne(double value, const char* key) {
  if (!(value >= 0.0 && value < 1.0))
    throw ConfigError(str("train.", key, " = ", value, " is not allowed; it must be in [0, 1)"));
}

// Names and shapes of a module's parameters and buffers, in registration order.
std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : model.named_parameters())
    out.emplace_back(item.key(), item.value().sizes().vec());
  for (const auto& item : model.named_buffers())
    out.emplace_back(item.key(), item.value().sizes().vec());
  return out;
}

namespace fs = std::filesystem;

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
  const fs::path target(path);
  const fs::path tmp = target.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(str("cannot write '", tmp.string(), "': ", strerror(errno)));
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
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw IoError(str("fsync of '", tmp.string(), "' failed: ", strerror(err)));
  renameDurably(tmp, target);
}

void commitCheckpoint(const std::string& tmpDir, const std::string& finalDir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(tmpDir))
    if (entry.is_regular_file() && entry.path().filename() != kManifest)
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  std::ostringstream manifest;
  manifest << kManifestHeader << "\n";
  for (const auto& file : files) {
    const auto filename = file.filename().string();
    HETRA_ENFORCE(filename.find_first_of(" \n") == std::string::npos,
                  "checkpoint file names have no spaces: '", filename, "'");
    fsyncPath(file, false);
    const auto [size, crc] = sizeAndCrc(file);
    manifest << "file " << filename << " " << size << " " << std::hex << crc << std::dec << "\n";
  }
  // The MANIFEST is written (and synced) after every file it describes is on the disk.
  writeFileAtomically((fs::path(tmpDir) / kManifest).string(), manifest.str());
  fs::remove_all(finalDir);
  renameDurably(tmpDir, finalDir);
}

std::string checkCheckpoint(const std::string& dir) {
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

namespace {

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

std::string findCheckpoint(const std::string& path) {
  const fs::path given(path);
  if (fs::exists(given / kManifest) || checkpointStep(given.filename().string()) >= 0) {
    const std::string why = checkCheckpoint(path);
    if (!why.empty()) throw IoError(str("checkpoint '", path, "' cannot be used: ", why));
    return path;
  }
  // Every step directory is tried, newest first; `latest` is only a hint for people, since a crash
  // between renaming a step directory and rewriting `latest` leaves the newest one unnamed.
  const auto candidates = stepDirectories(given);
  std::string skipped;
  for (const auto& [step, dir] : candidates) {
    const std::string why = checkCheckpoint(dir.string());
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

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(std::vector<torch::Tensor> params,
                                                       const OptimSpec& spec) {
  requireAtLeast(spec.lr, 0.0, "lr");
  requireAtLeast(spec.weightDecay, 0.0, "weight_decay");
  if (spec.name == "sgd") {
    requireAtLeast(spec.momentum, 0.0, "momentum");
    if (spec.nesterov && spec.momentum <= 0.0)
      throw ConfigError(
          str("train.nesterov = true needs train.momentum > 0 (it is ", spec.momentum, ")"));
    auto options = torch::optim::SGDOptions(spec.lr)
                       .momentum(spec.momentum)
                       .nesterov(spec.nesterov)
                       .weight_decay(spec.weightDecay);
    return std::make_unique<FusedSgd>(std::move(params), options);
  }
  if (spec.name != "adam" && spec.name != "adamw")
    throw ConfigError(str("train.optimizer = \"", spec.name,
                          "\" is not an optimizer; allowed: sgd, adam, adamw"));
  requireBelowOne(spec.beta1, "betas[0]");
  requireBelowOne(spec.beta2, "betas[1]");
  requireAtLeast(spec.eps, 0.0, "eps");
  const auto betas = std::make_tuple(spec.beta1, spec.beta2);
  if (spec.name == "adam") {
    auto options = torch::optim::AdamOptions(spec.lr).betas(betas).eps(spec.eps).weight_decay(
        spec.weightDecay);
    return std::make_unique<FusedAdam>(std::move(params), options);
  }
  auto options =
      torch::optim::AdamWOptions(spec.lr).betas(betas).eps(spec.eps).weight_decay(spec.weightDecay);
  return std::make_unique<FusedAdamW>(std::move(params), options);
}

LrSchedule::LrSchedule(const LrScheduleSpec& spec) : spec_(spec) {
  requireAtLeast(spec.lr, 0.0, "lr");
  if (spec.warmupSteps < 0)
    throw ConfigError(
        str("train.warmup_steps = ", spec.warmupSteps, " is not allowed; it must be >= 0"));
  if (spec.kind == "cosine") {
    if (spec.totalSteps <= spec.warmupSteps)
      throw ConfigError(str("train.lr_schedule = \"cosine\" needs more steps (", spec.totalSteps,
                            ") than train.warmup_steps (", spec.warmupSteps, ")"));
  } else if (spec.kind != "constant") {
    throw ConfigError(str("train.lr_schedule = \"", spec.kind,
                          "\" is not a schedule; allowed: constant, cosine"));
  }
}

double LrSchedule::lrAt(int64_t step) const {
  HETRA_ENFORCE_GE(step, 0, "steps count from 0");
  if (step < spec_.warmupSteps) return spec_.lr * double(step + 1) / double(spec_.warmupSteps);
  if (spec_.kind == "constant") return spec_.lr;
  if (step >= spec_.totalSteps) return 0.0;
  const double p = double(step - spec_.warmupSteps) / double(spec_.totalSteps - spec_.warmupSteps);
  return spec_.lr * 0.5 * (1.0 + std::cos(M_PI * p));
}

void applyLr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

double clipGradNorm(const std::vector<torch::Tensor>& params, double maxNorm) {
  HETRA_ENFORCE(maxNorm > 0.0, "the gradient clipping norm must be positive, not ", maxNorm);
  return torch::nn::utils::clip_grad_norm_(params, maxNorm);
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

}  // namespace hetra::train
