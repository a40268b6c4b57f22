// Vocabulary: see zero_checkpoint.h.
#include "train/zero_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <torch/torch.h>

#include "comm/communicator.h"
#include "common/errors.h"
#include "device/memory_accounting.h"
#include "train/fused_optim.h"
#include "train/zero_parallel.h"

namespace hetra::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kPlanFormat = 1;

std::string shardFileName(int rank) {
  return str("shard-", rank, ".bin");
}

// The fields a shard file holds for `optimizer`, in file order (ZeroParallel::shardState's).
std::vector<std::string> fieldsOf(const OptimSpec& optimizer) {
  std::vector<std::string> fields{"parameters"};
  if (optimizer.name == "sgd" && optimizer.momentum != 0) fields.push_back("momentum");
  if (optimizer.name != "sgd") fields.insert(fields.end(), {"exp_avg", "exp_avg_sq"});
  return fields;
}

size_t chunksOf(uint64_t bytes) {
  return size_t((bytes + kShardChunkBytes - 1) / kShardChunkBytes);
}

std::string listOf(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

// A shard file opened for reads of byte ranges, each verified against its chunks' CRC32C.
class ShardReader {
 public:
  ShardReader(fs::path path, uint64_t bytes, std::vector<uint32_t> crcs)
      : path_(std::move(path)), bytes_(bytes), crcs_(std::move(crcs)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw IoError(str("cannot read '", path_.string(), "': ", strerror(errno)));
    std::error_code ec;
    const auto size = fs::file_size(path_, ec);
    if (ec || size != bytes_)
      throw IoError(
          str("'", path_.string(), "' has ", ec ? 0 : size, " bytes, the plan lists ", bytes_));
    HETRA_ENFORCE_EQ(crcs_.size(), chunksOf(bytes_), "chunk checksums of ", path_.string());
  }
  ~ShardReader() { ::close(fd_); }
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Copies bytes [offset, offset + size) of the file to `out`, reading only the chunks they lie in.
  void read(uint64_t offset, uint64_t size, char* out) {
    HETRA_ENFORCE_LE(offset + size, bytes_, "a range of ", path_.string());
    for (uint64_t at = offset; at < offset + size;) {
      const size_t chunk = size_t(at / kShardChunkBytes);
      const uint64_t begin = uint64_t(chunk) * kShardChunkBytes;
      const uint64_t length = std::min<uint64_t>(kShardChunkBytes, bytes_ - begin);
      loadChunk(chunk, begin, length);
      const uint64_t end = std::min(offset + size, begin + length);
      std::memcpy(out + (at - offset), buffer_.data() + (at - begin), size_t(end - at));
      at = end;
    }
  }

 private:
  void loadChunk(size_t chunk, uint64_t begin, uint64_t length) {
    if (chunk == loaded_) return;
    buffer_.resize(size_t(length));
    size_t done = 0;
    while (done < length) {
      const ssize_t n =
          ::pread(fd_, buffer_.data() + done, size_t(length) - done, off_t(begin + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw IoError(str("reading '", path_.string(), "' at byte ", begin + done,
                          " failed: ", n < 0 ? strerror(errno) : "end of file"));
      done += size_t(n);
    }
    const uint32_t crc = crc32c(buffer_.data(), buffer_.size());
    if (crc != crcs_[chunk])
      throw IoError(str("'", path_.string(), "' bytes [", begin, ", ", begin + length,
                        ") have CRC32C ", std::hex, crc, ", the plan lists ", crcs_[chunk],
                        " (corrupted)"));
    loaded_ = chunk;
  }

  fs::path path_;
  uint64_t bytes_;
  std::vector<uint32_t> crcs_;
  int fd_ = -1;
  std::vector<char> buffer_;
  size_t loaded_ = size_t(-1);
};

}  // namespace

WrittenShards writeShards(ZeroParallel& zero, comm::Communicator& comm, const std::string& dir) {
  const ShardLayout& layout = zero.layout();
  const auto state = zero.shardState();
  const auto fields = fieldsOf(zero.optimizer());
  HETRA_ENFORCE_EQ(state.size(), fields.size(), "shard state tensors");
  std::vector<std::string_view> pieces;
  std::vector<int64_t> mine;  // this file's size, CRC32C, then its chunks' CRC32C
  uint32_t whole = 0;
  uint64_t bytes = 0;
  for (const auto& t : state) {
    HETRA_ENFORCE(t.is_contiguous() && t.scalar_type() == torch::kFloat32, "a shard tensor");
    pieces.emplace_back(static_cast<const char*>(t.data_ptr()), size_t(t.numel()) * sizeof(float));
    bytes += pieces.back().size();
  }
  // Chunks run across the fields' boundaries: they are the file's, not a field's.
  std::vector<int64_t> chunkCrcs;
  uint32_t running = 0;
  size_t inChunk = 0;
  for (const auto piece : pieces) {
    whole = crc32c(piece.data(), piece.size(), whole);
    for (size_t at = 0; at < piece.size();) {
      const size_t n = std::min(piece.size() - at, kShardChunkBytes - inChunk);
      running = crc32c(piece.data() + at, n, running);
      at += n;
      inChunk += n;
      if (inChunk == kShardChunkBytes) {
        chunkCrcs.push_back(running);
        running = 0;
        inChunk = 0;
      }
    }
  }
  if (inChunk > 0) chunkCrcs.push_back(running);
  writeFileAtomically((fs::path(dir) / shardFileName(comm.rank())).string(), pieces);
  mine.push_back(int64_t(bytes));
  mine.push_back(int64_t(whole));
  mine.insert(mine.end(), chunkCrcs.begin(), chunkCrcs.end());

  // Every rank's numbers, their counts known from the layout.
  std::vector<size_t> counts;
  size_t total = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const auto fileBytes = uint64_t(layout.shard(r).size()) * fields.size() * sizeof(float);
    counts.push_back(2 + chunksOf(fileBytes));
    total += counts.back();
  }
  HETRA_ENFORCE_EQ(mine.size(), counts[size_t(comm.rank())], "this rank's checksums");
  std::vector<int64_t> all(total);
  comm.allgather(mine.data(), all.data(), counts, DType::I64)->wait();

  WrittenShards out;
  json files = json::array();
  size_t at = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const auto* row = all.data() + at;
    at += counts[size_t(r)];
    std::vector<uint32_t> crcs(row + 2, row + counts[size_t(r)]);
    out.files.push_back({shardFileName(r), uint64_t(row[0]), uint32_t(row[1])});
    files.push_back({{"name", shardFileName(r)}, {"bytes", row[0]}, {"crc32c", crcs}});
  }
  std::vector<int64_t> tensors;
  for (size_t k = 0; k < layout.tensors(); ++k) tensors.push_back(layout.tensor(k).size());
  out.plan = {{"format", kPlanFormat},
              {"stage", zero.stage()},
              {"optimizer", zero.optimizer().name},
              {"fields", fields},
              {"elements", layout.total()},
              {"tensors", tensors},
              {"shards", layout.shardSizes()},
              {"optimizer_steps", zero.optimizerSteps()},
              {"chunk_bytes", kShardChunkBytes},
              {"files", files}};
  return out;
}

std::string planMismatch(const std::vector<int64_t>& tensorSizes, const OptimSpec& spec,
                         const json& plan) {
  std::vector<std::string> differences;
  int64_t total = 0;
  for (int64_t n : tensorSizes) total += n;
  const auto elements = plan.at("elements").get<int64_t>();
  if (elements != total)
    differences.push_back(str("its flat space has ", elements,
                              " elements (trainable parameters), this model's ", total));
  const auto tensors = plan.at("tensors").get<std::vector<int64_t>>();
  if (tensors.size() != tensorSizes.size()) {
    differences.push_back(
        str("it has ", tensors.size(), " parameter tensors, this model ", tensorSizes.size()));
  } else {
    for (size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k] != tensorSizes[k]) {
        differences.push_back(str("parameter tensor ", k, " (flat order) has ", tensors[k],
                                  " elements there, ", tensorSizes[k], " here"));
        break;
      }
  }
  const auto optimizer = plan.at("optimizer").get<std::string>();
  if (optimizer != spec.name)
    differences.push_back(str("its optimizer is train.optimizer = \"", optimizer,
                              "\", this run's \"", spec.name, "\""));
  const auto fields = plan.at("fields").get<std::vector<std::string>>();
  const auto ours = fieldsOf(spec);
  if (optimizer == spec.name && fields != ours)
    differences.push_back(str("its optimizer state is [",
                              listOf({fields.begin() + 1, fields.end()}), "], this run's [",
                              listOf({ours.begin() + 1, ours.end()}), "] (train.momentum)"));
  std::string text;
  for (const auto& d : differences) text += (text.empty() ? "" : "; ") + d;
  return text;
}

namespace {

// Reads the flat range `want` of every field of the step directory `dir`'s shards into `out` (one
// pointer per field, want.size() floats each): from each saved shard only its overlap with `want`.
// Refuses a plan that is not this model's and optimizer's first.
void readFlatRange(const std::vector<int64_t>& tensorSizes, const OptimSpec& spec, const json& plan,
                   const std::string& dir, FlatRange want, const std::vector<float*>& out) {
  if (plan.value("format", 0) != kPlanFormat)
    throw IoError(str("checkpoint '", dir, "' has a sharded plan of format ",
                      plan.value("format", 0), "; this hetra reads format ", kPlanFormat));
  const std::string why = planMismatch(tensorSizes, spec, plan);
  if (!why.empty())
    throw ConfigError(str("--resume ", dir, ": the checkpoint does not fit this run: ", why));
  HETRA_ENFORCE_EQ(plan.at("chunk_bytes").get<size_t>(), kShardChunkBytes, "chunk size of ", dir);
  HETRA_ENFORCE_EQ(out.size(), plan.at("fields").size(), "fields of ", dir);
  const auto savedShards = plan.at("shards").get<std::vector<int64_t>>();
  const auto& files = plan.at("files");
  HETRA_ENFORCE_EQ(files.size(), savedShards.size(), "shard files of ", dir);
  int64_t savedBegin = 0;
  for (size_t s = 0; s < savedShards.size(); ++s) {
    const FlatRange saved{savedBegin, savedBegin + savedShards[s]};
    savedBegin = saved.end;
    const FlatRange overlap = intersect(want, saved);
    if (overlap.size() <= 0) continue;  // never opened: only the overlapping shards are read
    const auto& file = files.at(s);
    ShardReader reader(fs::path(dir) / file.at("name").get<std::string>(),
                       file.at("bytes").get<uint64_t>(),
                       file.at("crc32c").get<std::vector<uint32_t>>());
    for (size_t f = 0; f < out.size(); ++f) {
      const uint64_t offset =
          (uint64_t(f) * uint64_t(saved.size()) + uint64_t(overlap.begin - saved.begin)) *
          sizeof(float);
      reader.read(offset, uint64_t(overlap.size()) * sizeof(float),
                  reinterpret_cast<char*>(out[f] + (overlap.begin - want.begin)));
    }
  }
  HETRA_ENFORCE_EQ(savedBegin, plan.at("elements").get<int64_t>(), "the saved shards of ", dir);
}

}  // namespace

void readShards(ZeroParallel& zero, const json& plan, const std::string& dir) {
  std::vector<int64_t> tensorSizes;
  for (size_t k = 0; k < zero.layout().tensors(); ++k)
    tensorSizes.push_back(zero.layout().tensor(k).size());
  std::vector<float*> out;
  for (const auto& t : zero.shardState()) out.push_back(t.data_ptr<float>());
  readFlatRange(tensorSizes, zero.optimizer(), plan, dir, zero.ownShard(), out);
  zero.restored(plan.at("optimizer_steps").get<int64_t>());
}

namespace {

// Adam's or AdamW's state of one parameter (LibTorch's class, which FusedAdam(W) steps with).
template <class State>
std::unique_ptr<torch::optim::OptimizerParamState> adamState(int64_t steps, torch::Tensor expAvg,
                                                             torch::Tensor expAvgSq) {
  auto state = std::make_unique<State>();
  state->step(steps);
  state->exp_avg(std::move(expAvg));
  state->exp_avg_sq(std::move(expAvgSq));
  return state;
}

}  // namespace

void readShardsIntoModel(Model& model, torch::optim::Optimizer& optimizer, const OptimSpec& spec,
                         const json& plan, const std::string& dir) {
  torch::NoGradGuard noGrad;
  const auto params = flatParameters(model);
  std::vector<int64_t> tensorSizes;
  int64_t total = 0;
  for (const auto& p : params) {
    tensorSizes.push_back(p.numel());
    total += p.numel();
  }
  const auto fields = fieldsOf(spec);
  std::vector<torch::Tensor> flat;
  std::vector<float*> out;
  for (size_t f = 0; f < fields.size(); ++f) {
    flat.push_back(torch::empty({total}, torch::kFloat32));
    out.push_back(flat.back().data_ptr<float>());
  }
  readFlatRange(tensorSizes, spec, plan, dir, {0, total}, out);
  const auto steps = plan.at("optimizer_steps").get<int64_t>();
  int64_t begin = 0;
  for (const auto& p : params) {
    auto piece = [&](size_t f) { return flat[f].narrow(0, begin, p.numel()).view_as(p).clone(); };
    p.copy_(flat[0].narrow(0, begin, p.numel()).view_as(p));
    auto& slot = paramStateSlot(optimizer, p);
    if (spec.name == "sgd" && fields.size() == 2) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(piece(1));
      slot = std::move(state);
    } else if (spec.name == "adam") {
      slot = adamState<torch::optim::AdamParamState>(steps, piece(1), piece(2));
    } else if (spec.name == "adamw") {
      slot = adamState<torch::optim::AdamWParamState>(steps, piece(1), piece(2));
    }
    begin += p.numel();
  }
}

void readModelFileIntoShards(ZeroParallel& zero,
                             const std::function<std::shared_ptr<Model>()>& makeReplica,
                             const OptimSpec& spec, const std::string& modelFile) {
  // The replica and its optimizer state live in host memory, not on the device (its cap).
  device::MemoryScope host(device::MemoryCategory::kHostData);
  torch::NoGradGuard noGrad;
  const auto replicaOwner = makeReplica();
  HETRA_ENFORCE(replicaOwner != nullptr, "no replica of the model");
  Model& replica = *replicaOwner;
  auto optimizer = makeOptimizer(replica.parameters(), spec);
  loadCheckpoint(modelFile, replica, *optimizer);
  const auto params = flatParameters(replica);
  const ShardLayout& layout = zero.layout();
  HETRA_ENFORCE_EQ(params.size(), layout.tensors(), "tensors of the replica");
  const auto state = zero.shardState();
  const FlatRange mine = zero.ownShard();
  // Parameter k's tensors in the order of the shard's fields (none but itself when the run never
  // stepped it), and the step count, the same on every rank: the most of any parameter's.
  int64_t steps = 0;
  auto sourcesOf = [&](const torch::Tensor& p) {
    std::vector<torch::Tensor> sources{p};
    const auto& slot = paramStateSlot(*optimizer, p);
    if (!slot || state.size() == 1) return sources;
    if (state.size() == 2) {
      sources.push_back(static_cast<torch::optim::SGDParamState&>(*slot).momentum_buffer());
      steps = std::max<int64_t>(steps, 1);  // sgd tells only a first step from a later one
      return sources;
    }
    auto adam = [&](auto& s) {  // Adam's and AdamW's state classes have the same fields
      sources.push_back(s.exp_avg());
      sources.push_back(s.exp_avg_sq());
      steps = std::max<int64_t>(steps, s.step());
    };
    if (spec.name == "adamw")
      adam(static_cast<torch::optim::AdamWParamState&>(*slot));
    else
      adam(static_cast<torch::optim::AdamParamState&>(*slot));
    return sources;
  };
  for (size_t k = 0; k < params.size(); ++k) {
    const FlatRange t = layout.tensor(k), piece = intersect(mine, t);
    HETRA_ENFORCE_EQ(params[k].numel(), t.size(), "parameter ", k, " of the replica");
    const auto sources = sourcesOf(params[k]);
    if (piece.size() <= 0) continue;
    for (size_t f = 0; f < state.size(); ++f) {
      auto to = state[f].narrow(0, piece.begin - mine.begin, piece.size());
      if (f < sources.size())
        to.copy_(sources[f].reshape({-1}).narrow(0, piece.begin - t.begin, piece.size()));
      else
        to.zero_();  // never stepped: no state yet
    }
  }
  zero.restored(steps);
}

}  // namespace hetra::train
