#include "train/zero_parallel.h"

#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <utility>

#include "common/errors.h"
#include "common/timing.h"
#include "device/compute_scope.h"
#include "device/memory_accounting.h"
#include "train/fused_optim.h"
#include "train/gradient_hooks.h"

namespace hetra::train {
namespace {

using device::MemoryCategory;
using device::MemoryScope;

void requireFlatFloat(const torch::Tensor& p) {
  if (p.scalar_type() != torch::kFloat32 || !p.is_contiguous() || !p.device().is_cpu())
    throw ConfigError("ZeRO shards contiguous float32 CPU parameters only");
}

// The storage of `buffer` (a block's flat buffer) grown to hold it, or shrunk to nothing: the
// tensors that are views of it keep their shapes, so autograd's accumulators and the block's
// code never notice (PyTorch FSDP frees its flat parameters the same way).
void resizeStorage(const torch::Tensor& buffer, size_t bytes) {
  at::native::resize_bytes_cpu(buffer.storage().unsafeGetStorageImpl(), bytes);
}

// A tensor's floats from `offset`; an empty tensor's (an empty shard's) is a valid address that
// no collective writes to, its counts being zero.
float* floats(const torch::Tensor& t, int64_t offset = 0) {
  static float none = 0;
  return !t.defined() || t.numel() == 0 ? &none : t.data_ptr<float>() + offset;
}

}  // namespace

std::vector<torch::Tensor> flatParameters(Model& model) {
  std::vector<torch::Tensor> params;
  std::unordered_set<const void*> seen;
  auto add = [&](const torch::Tensor& p) {
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) return;
    requireFlatFloat(p);
    params.push_back(p);
  };
  if (auto* blocks = dynamic_cast<BlockModel*>(&model)) {
    for (size_t b = 0; b < blocks->blockCount(); ++b)
      for (const auto& p : blocks->blockParameters(b)) add(p);
    for (const auto& p : model.parameters())
      if (p.requires_grad() && !seen.count(p.unsafeGetTensorImpl()))
        throw ConfigError("a parameter of the model belongs to no block: ZeRO cannot place it");
  } else {
    for (const auto& p : model.parameters()) add(p);
  }
  return params;
}

namespace {

std::vector<int64_t> sizesOf(const std::vector<torch::Tensor>& params) {
  std::vector<int64_t> sizes;
  for (const auto& p : params) sizes.push_back(p.numel());
  return sizes;
}

int64_t totalOf(const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  return total;
}

std::vector<int64_t> shardSizesFor(const ZeroOptions& options, int64_t total, int ranks) {
  if (!options.shardSizes.empty()) return options.shardSizes;
  return proportionalShards(total, std::vector<double>(size_t(ranks), 1.0));
}

}  // namespace

ZeroParallel::ZeroParallel(std::shared_ptr<Model> model, std::shared_ptr<comm::Communicator> comm,
                           ZeroOptions options)
    : model_(std::move(model)),
      blocks_(dynamic_cast<BlockModel*>(model_.get())),
      comm_(std::move(comm)),
      stage_(options.stage),
      offload_(options.offload),
      prefetch_(options.prefetch),
      optimizer_(options.optimizer),
      params_(flatParameters(*model_)),
      layout_(sizesOf(params_), shardSizesFor(options, totalOf(sizesOf(params_)), comm_->size())) {
  if (stage_ < 1 || stage_ > 3)
    throw ConfigError(str("zero.stage = ", stage_, " is not a sharded stage; allowed: 1, 2, 3"));
  if (stage_ == 3 && !blocks_)
    throw ConfigError("zero.stage = 3 needs a model built from blocks (train/models.h BlockModel)");
  if (optimizer_.name != "sgd" && optimizer_.name != "adam" && optimizer_.name != "adamw")
    throw ConfigError(str("train.optimizer = \"", optimizer_.name,
                          "\" is not sharded by ZeRO; allowed: sgd, adam, adamw"));
  if (offload_ == Offload::kParameters && stage_ != 3)
    throw ConfigError(str("offload = \"parameters\" needs zero.stage = 3; stage ", stage_,
                          " keeps every parameter on every device"));
  if (layout_.ranks() != comm_->size())
    throw ConfigError(str("ZeRO: ", layout_.ranks(), " shards for a group of ", comm_->size()));
  shard_ = layout_.shard(comm_->rank());
  torch::NoGradGuard noGrad;
  // Rank 0's values everywhere, while every rank still holds the whole model.
  std::vector<comm::WorkPtr> works;
  for (auto& p : params_)
    works.push_back(comm_->broadcast(p.data_ptr(), size_t(p.numel()), DType::F32, 0));
  for (auto& b : model_->buffers())
    if (b.scalar_type() == torch::kFloat32 && b.is_contiguous())
      works.push_back(comm_->broadcast(b.data_ptr(), size_t(b.numel()), DType::F32, 0));
  for (auto& w : works) w->wait();

  const int64_t shardSize = shard_.size();
  // Offloaded, the shard lives in host memory and the one-pass optimizer updates it there; the
  // blocks' gathers read it from the host (on an accelerator: a host-to-device copy).
  const bool shardOnHost = offload_ == Offload::kParameters;
  if (stage_ < 3) {
    {
      MemoryScope parameters(MemoryCategory::kParameters);
      flat_ = torch::empty({layout_.total()}, torch::kFloat32);
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      const FlatRange t = layout_.tensor(k);
      auto view = flat_.narrow(0, t.begin, t.size()).view(params_[k].sizes());
      view.copy_(params_[k]);
      params_[k].set_data(view);  // the model's own copy goes
    }
  }
  // Stage 1's gradients are autograd's own, as data parallelism's: each step's first backward
  // allocates them rather than adding into zeroed buffers (an extra pass over psi floats, 10% of
  // the demo's step), and the reduce-scatter leaves the shard's part of each in place.
  if (stage_ > 1) {
    MemoryScope gradients(shardOnHost ? MemoryCategory::kOffloaded : MemoryCategory::kGradients);
    shardGradient_ = torch::zeros({shardSize}, torch::kFloat32);
  }
  if (stage_ == 3) {
    {
      MemoryScope parameters(shardOnHost ? MemoryCategory::kOffloaded
                                         : MemoryCategory::kParameters);
      shardParams_ = torch::empty({shardSize}, torch::kFloat32);
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      const FlatRange t = layout_.tensor(k), piece = intersect(shard_, t);
      if (piece.size() == 0) continue;
      shardParams_.narrow(0, piece.begin - shard_.begin, piece.size())
          .copy_(params_[k].reshape({-1}).narrow(0, piece.begin - t.begin, piece.size()));
    }
    size_t next = 0;  // flatParameters lists the blocks' tensors in block order
    for (size_t b = 0; b < blocks_->blockCount(); ++b) {
      const int64_t begin = next < params_.size() ? layout_.tensor(next).begin : layout_.total();
      std::vector<size_t> tensors;
      for (const auto& p : blocks_->blockParameters(b))
        if (next < params_.size() && p.unsafeGetTensorImpl() == params_[next].unsafeGetTensorImpl())
          tensors.push_back(next++);
      const int64_t end = next < params_.size() ? layout_.tensor(next).begin : layout_.total();
      torch::Tensor buffer;
      {
        MemoryScope parameters(MemoryCategory::kParameters);
        buffer = torch::empty({end - begin}, torch::kFloat32);
      }
      for (size_t k : tensors) {
        const FlatRange t = layout_.tensor(k);
        params_[k].set_data(buffer.narrow(0, t.begin - begin, t.size()).view(params_[k].sizes()));
      }
      resizeStorage(buffer, 0);
      blockRange_.push_back({begin, end});
      blockTensors_.push_back(std::move(tensors));
      blockBuffer_.push_back(std::move(buffer));
    }
    HETRA_ENFORCE_EQ(next, params_.size(), "every parameter in one block");
    pending_.resize(blockBuffer_.size());
    blocks_->setBlockHooks(this);
  }
  {
    MemoryScope state(offload_ != Offload::kNone ? MemoryCategory::kOffloaded
                                                 : MemoryCategory::kOptimizerState);
    if (optimizer_.name == "sgd" && optimizer_.momentum != 0)
      state1_ = torch::zeros({shardSize}, torch::kFloat32);
    if (optimizer_.name != "sgd") {
      state1_ = torch::zeros({shardSize}, torch::kFloat32);
      state2_ = torch::zeros({shardSize}, torch::kFloat32);
    }
  }
  gradientPolicy_.compression = options.compression;
  if (stage_ == 1) groups_ = tensorGroups(layout_, options.groupElements);
  residuals_.resize(params_.size());
  if (options.errorFeedback) {
    MemoryScope communication(MemoryCategory::kCommunication);
    for (size_t k = 0; k < params_.size(); ++k)
      if (comm_->feedbackCodec(comm::OpKind::ReduceScatter, DType::F32, comm::ReduceOp::Sum,
                               size_t(params_[k].numel()), gradientPolicy_))
        residuals_[k] = torch::zeros({params_[k].numel()}, torch::kFloat32);
  }
  reduced_.assign(params_.size(), false);
  if (stage_ < 3)
    for (size_t k = 0; k < params_.size(); ++k) {
      accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[k]));
      HETRA_ENFORCE(accumulators_.back() != nullptr, "parameter ", k, " has no accumulator");
      hookKeys_.push_back(onGradientAccumulated(*accumulators_.back(), [this, k] {
        if (armed_) onReady(k);
      }));
    }
}

ZeroParallel::~ZeroParallel() {
  settlePending();
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hookKeys_[k]);
  if (blocks_ && stage_ == 3) blocks_->setBlockHooks(nullptr);
}

int64_t ZeroParallel::offsetInShard(FlatRange range) const {
  const FlatRange piece = intersect(shard_, range);
  return piece.size() > 0 ? piece.begin - shard_.begin : 0;
}

void ZeroParallel::gatherFor(size_t block, size_t next) {
  if (!pending_[block]) issueGather(block);
  if (prefetch_ && next != kNoBlock) issueGather(next);
  awaitGather(block);
}

void ZeroParallel::issueGather(size_t block) {
  HETRA_ENFORCE(!pending_[block], "block ", block, "'s gather issued twice");
  const FlatRange range = blockRange_[block];
  const torch::Tensor& buffer = blockBuffer_[block];
  {
    MemoryScope parameters(MemoryCategory::kParameters);
    resizeStorage(buffer, size_t(range.size()) * sizeof(float));
  }
  pending_[block] = comm_->allgather(floats(shardParams_, offsetInShard(range)), floats(buffer),
                                     layout_.countsOf(range), DType::F32);
}

void ZeroParallel::awaitGather(size_t block) {
  device::ComputePause waiting;  // the emulated device idles; its slowdown does not stretch this
  const auto start = Clock::now();
  pending_[block]->wait();  // on failure it stays pending: settlePending waits again
  pending_[block].reset();
  waited_ += secondsSince(start);
}

void ZeroParallel::release(size_t block) {
  HETRA_ENFORCE(!pending_[block], "block ", block, " freed with its gather in flight");
  resizeStorage(blockBuffer_[block], 0);
}

void ZeroParallel::settlePending() noexcept {
  for (auto* works : {&reducing_, &gathering_})
    for (auto& work : *works) {
      try {
        if (work) work->wait(deadlineAfter(Millis(60000)));
      } catch (const std::exception&) {  // the group's latched error: reported where it arose
      }
    }
  // As for the gathers below: one that outlived even that deadline stays.
  for (auto* works : {&reducing_, &gathering_})
    std::erase_if(*works, [](const comm::WorkPtr& w) { return !w || w->isCompleted(); });
  for (size_t b = 0; b < pending_.size(); ++b) {
    if (!pending_[b]) continue;
    try {
      pending_[b]->wait(deadlineAfter(Millis(60000)));
    } catch (const std::exception&) {  // the group's latched error: reported where it arose
    }
    // A work that outlived even that deadline keeps its buffer: better leaked than overwritten.
    if (pending_[b]->isCompleted()) pending_[b].reset();
  }
  // The block that was computing when the pass threw is gathered but no longer pending.
  for (size_t b = 0; b < pending_.size(); ++b)
    if (!pending_[b]) resizeStorage(blockBuffer_[b], 0);
}

comm::WorkPtr ZeroParallel::issueReduce(size_t k, const torch::Tensor& gradient) {
  HETRA_ENFORCE(gradient.is_contiguous() && gradient.numel() == params_[k].numel(),
                "gradient of parameter ", k);
  const FlatRange t = layout_.tensor(k);
  // Stage 1: in place, into the shard's part of the gradient itself.
  float* out = stage_ == 1 ? gradient.data_ptr<float>() + (intersect(shard_, t).begin - t.begin)
                           : floats(shardGradient_, offsetInShard(t));
  comm::OpPolicy policy = gradientPolicy_;
  if (residuals_[k].defined()) policy.residual = residuals_[k].data_ptr<float>();
  reduced_[k] = true;
  return comm_->reduceScatter(gradient.data_ptr<float>(), out, layout_.countsOf(t), DType::F32,
                              comm::ReduceOp::Sum, policy);
}

void ZeroParallel::reduceIntoShard(size_t k, const torch::Tensor& gradient) {
  device::ComputePause waiting;
  const auto start = Clock::now();
  comm::WorkPtr work = issueReduce(k, gradient);
  work->wait();
  waited_ += secondsSince(start);
}

void ZeroParallel::awaitReduces() {
  device::ComputePause waiting;
  const auto start = Clock::now();
  for (auto& work : reducing_) {
    work->wait();  // on failure the rest stay in flight: settlePending waits for them
    work.reset();
  }
  reducing_.clear();
  waited_ += secondsSince(start);
}

void ZeroParallel::onReady(size_t k) {
  // A second accumulation would land in a gradient already reduced (or in flight): lost.
  HETRA_ENFORCE(!ready_[k], "the gradient of parameter ", k,
                " was accumulated again after its reduce-scatter was issued: one backward after "
                "armLastBackward()");
  ready_[k] = true;  // reduced below, in reverse flat order
  const size_t n = params_.size();
  while (nextLaunch_ < n && ready_[n - 1 - nextLaunch_]) {
    // As DataParallel's buckets: an emulated slow device's backward so far is stretched before
    // its gradient leaves.
    device::settleOpenSegment();
    const size_t next = n - 1 - nextLaunch_++;
    auto& grad = params_[next].mutable_grad();
    if (!grad.defined()) {
      MemoryScope gradients(MemoryCategory::kGradients);
      grad = torch::zeros_like(params_[next]);
    }
    if (!grad.is_contiguous()) grad = grad.contiguous();
    if (stage_ == 1) {
      // Autograd is done with it: the reduce-scatter runs while backward computes the tensors
      // before it; finish() waits.
      reducing_.push_back(issueReduce(next, grad));
      continue;
    }
    reduceIntoShard(next, grad);
    grad = torch::Tensor();  // only the shard's part stays
  }
}

void ZeroParallel::takeGradients(size_t block, std::vector<torch::Tensor>& gradients) {
  release(block);
  if (!armed_) return;  // accumulated in .grad until the last micro-batch
  torch::NoGradGuard noGrad;
  const auto& tensors = blockTensors_[block];
  HETRA_ENFORCE_EQ(gradients.size(), tensors.size(), "gradients of block ", block);
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& grad = params_[tensors[i]].mutable_grad();
    // The sum DataParallel's accumulator would form: earlier micro-batches' plus this one's (an
    // idle round has neither, or only the earlier ones').
    torch::Tensor total = gradients[i];
    if (grad.defined()) total = total.defined() ? grad + total : grad;
    if (!total.defined()) total = torch::zeros_like(params_[tensors[i]]);
    reduceIntoShard(tensors[i], total.contiguous());
    grad = torch::Tensor();
    gradients[i] = torch::Tensor();
  }
}

// A micro-batch's collectives without its compute: the hooks a forward and a backward call, in
// their order, so the sequence is a computing rank's by construction. takeGradients
// reduce-scatters (what accumulated, or zeros) only in the last round, once armed.
void ZeroParallel::idleRound(bool last) {
  HETRA_ENFORCE_EQ(last, armed_, "an idle round reduces exactly when armed");
  torch::NoGradGuard noGrad;
  forwardWithoutSamples();
  for (size_t b = blockRange_.size(); b-- > 0;) {
    recomputing(b);
    std::vector<torch::Tensor> none(blockTensors_[b].size());
    takeGradients(b, none);
  }
}

void ZeroParallel::beginStep(int64_t mine, int64_t most) {
  HETRA_ENFORCE(mine >= 0 && mine <= most, "micro-batches: ", mine, " of at most ", most);
  waited_ = 0;
  settlePending();  // normally nothing: a pass that threw may have left its prefetch
  // Stage 1: the step's first backward allocates the gradients anew.
  if (stage_ == 1)
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  if (stage_ == 3)
    for (int64_t round = std::max<int64_t>(mine, 1); round < most; ++round) idleRound(false);
}

void ZeroParallel::armLastBackward() {
  reduced_.assign(params_.size(), false);
  ready_.assign(params_.size(), false);
  nextLaunch_ = 0;
  armed_ = true;
}

double ZeroParallel::finish() {
  torch::NoGradGuard noGrad;
  const bool hadSamples = armed_;
  if (!armed_) armLastBackward();
  if (stage_ < 3) {
    for (size_t k = params_.size(); k-- > 0;)
      if (!ready_[k]) onReady(k);  // unused, or no samples: what accumulated, or zeros
    awaitReduces();
  } else if (!hadSamples) {
    idleRound(true);
  }
  armed_ = false;
  for (size_t k = 0; k < params_.size(); ++k)
    HETRA_ENFORCE(reduced_[k], "the gradient of parameter ", k, " was never reduced");
  return waited_;
}

torch::Tensor ZeroParallel::shardParameters() const {
  return stage_ == 3 ? shardParams_ : flat_.narrow(0, shard_.begin, shard_.size());
}

std::vector<ZeroParallel::GradientPiece> ZeroParallel::gradientPieces(FlatRange range) const {
  const FlatRange mine = intersect(shard_, range);
  if (mine.size() == 0) return {};
  if (stage_ > 1) return {{mine, floats(shardGradient_, mine.begin - shard_.begin)}};
  std::vector<GradientPiece> pieces;
  for (size_t k = 0; k < params_.size(); ++k) {
    const FlatRange t = layout_.tensor(k), piece = intersect(mine, t);
    if (piece.size() == 0) continue;
    const torch::Tensor& grad = params_[k].grad();
    HETRA_ENFORCE(grad.defined() && grad.is_contiguous(), "parameter ", k,
                  " has no reduced gradient to update with");
    pieces.push_back({piece, grad.data_ptr<float>() + (piece.begin - t.begin)});
  }
  return pieces;
}

void ZeroParallel::releaseGradients() {
  if (stage_ == 1)
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

double ZeroParallel::updateShard(double lr, double gradClip) {
  torch::NoGradGuard noGrad;
  const auto pieces = gradientPieces(shard_);
  double norm = 0;
  if (gradClip > 0) {
    // The norm over every rank's shard, as LibTorch's clip_grad_norm_ scales: by
    // gradClip / (norm + 1e-6) when that is below 1.
    double squares = 0;
    for (const auto& [range, g] : pieces)
      for (int64_t i = 0; i < range.size(); ++i) squares += double(g[i]) * double(g[i]);
    {
      device::ComputePause waiting;
      comm_->allreduce(&squares, &squares, 1, DType::F64, comm::ReduceOp::Sum)->wait();
    }
    norm = std::sqrt(squares);
    const float coefficient = float(gradClip / (norm + 1e-6));
    if (coefficient < 1)
      for (const auto& [range, g] : pieces)
        for (int64_t i = 0; i < range.size(); ++i) g[i] *= coefficient;
  }
  advanceStep();
  for (const auto& piece : pieces) update(lr, piece);
  releaseGradients();
  return norm;
}

double ZeroParallel::shareParameters() {
  if (stage_ == 3) return 0;
  const auto start = Clock::now();
  const auto counts = layout_.countsOf({0, layout_.total()});
  comm_->allgather(floats(flat_, shard_.begin), floats(flat_), counts, DType::F32)->wait();
  return secondsSince(start);
}

void ZeroParallel::update(double lr, const GradientPiece& piece) {
  const int64_t n = piece.range.size(), offset = piece.range.begin - shard_.begin;
  if (n == 0) return;
  const torch::Tensor params = shardParameters();
  HETRA_ENFORCE(offset >= 0 && offset + n <= params.numel(), "update of ", n, " elements from ",
                offset, " in a shard of ", params.numel());
  auto at = [offset](const torch::Tensor& t) { return t.defined() ? floats(t, offset) : nullptr; };
  if (optimizer_.name == "sgd") {
    SgdUpdate u;
    u.lr = lr;
    u.weightDecay = optimizer_.weightDecay;
    u.momentum = optimizer_.momentum;
    u.nesterov = optimizer_.nesterov;
    u.firstStep = steps_ == 1;
    sgdUpdate(at(params), piece.gradients, at(state1_), n, u);
    return;
  }
  AdamUpdate u;
  u.lr = lr;
  u.weightDecay = optimizer_.weightDecay;
  u.beta1 = optimizer_.beta1;
  u.beta2 = optimizer_.beta2;
  u.eps = optimizer_.eps;
  u.step = steps_;
  u.decoupled = optimizer_.name == "adamw";
  adamUpdate(at(params), piece.gradients, at(state1_), at(state2_), n, u);
}

OverlappedStep ZeroParallel::finishAndUpdate(double lr, const ComputeSegment& segment) {
  HETRA_ENFORCE(overlapsUpdate(0), "the overlapped update is stage 1's");
  torch::NoGradGuard noGrad;
  if (!armed_) armLastBackward();  // no samples: zeros
  for (size_t k = params_.size(); k-- > 0;)
    if (!ready_[k]) onReady(k);  // unused, or no samples: what accumulated, or zeros
  armed_ = false;
  for (size_t k = 0; k < params_.size(); ++k)
    HETRA_ENFORCE(reduced_[k], "the gradient of parameter ", k, " was never reduced");
  OverlappedStep spent;
  spent.waitedSeconds = waited_;
  advanceStep();
  // reducing_ holds one reduce-scatter per tensor in reverse flat order, the groups' order.
  HETRA_ENFORCE_EQ(reducing_.size(), params_.size(), "one reduce-scatter per tensor");
  for (const TensorGroup& group : groups_) {
    {
      const auto start = Clock::now();
      for (size_t k = group.firstTensor; k < group.endTensor; ++k) {
        auto& work = reducing_[params_.size() - 1 - k];
        work->wait();  // on failure the rest stay in flight: settlePending waits for them
        work.reset();
      }
      spent.waitedSeconds += secondsSince(start);
    }
    const FlatRange range = group.range, piece = intersect(shard_, range);
    spent.updateSeconds += segment([&] {
      for (const auto& p : gradientPieces(range)) update(lr, p);
    });
    gathering_.push_back(comm_->allgather(floats(flat_, piece.size() > 0 ? piece.begin : 0),
                                          floats(flat_, range.begin), layout_.countsOf(range),
                                          DType::F32));
  }
  reducing_.clear();
  releaseGradients();
  const auto start = Clock::now();
  for (auto& work : gathering_) {
    work->wait();
    work.reset();
  }
  gathering_.clear();
  spent.waitedSeconds += secondsSince(start);
  return spent;
}

void ZeroParallel::forwardWithoutSamples() {
  if (stage_ != 3) return;
  for (size_t b = 0; b < blockRange_.size(); ++b) {
    beforeBlock(b);
    afterBlock(b);
  }
}

int64_t ZeroParallel::residualElements() const {
  int64_t elements = 0;
  for (const auto& r : residuals_)
    if (r.defined()) elements += r.numel();
  return elements;
}

std::vector<torch::Tensor> ZeroParallel::gatherParameters() {
  torch::NoGradGuard noGrad;
  std::vector<torch::Tensor> out(params_.size());
  if (stage_ < 3) {
    for (size_t k = 0; k < params_.size(); ++k) out[k] = params_[k].clone();
    return out;
  }
  for (size_t b = 0; b < blockRange_.size(); ++b) {  // a forward's sequence
    beforeBlock(b);
    for (size_t k : blockTensors_[b]) out[k] = params_[k].clone();
    afterBlock(b);
  }
  return out;
}

std::vector<torch::Tensor> ZeroParallel::shardState() const {
  std::vector<torch::Tensor> state{shardParameters()};
  for (const auto& t : {state1_, state2_})
    if (t.defined()) state.push_back(t);
  return state;
}

void ZeroParallel::restored(int64_t optimizerSteps) {
  steps_ = optimizerSteps;
  shareParameters();
}

void ZeroParallel::reshard(const std::vector<int64_t>& shardSizes, int64_t chunkElements) {
  HETRA_ENFORCE(chunkElements > 0, "reshard chunks of ", chunkElements, " elements");
  HETRA_ENFORCE(!armed_, "reshard between steps only");
  if (residualElements() > 0)
    throw ConfigError("ZeRO cannot move shards while error feedback keeps residuals");
  ShardLayout next(sizesOf(params_), shardSizes);
  if (next.ranks() != comm_->size())
    throw ConfigError(str("ZeRO: ", next.ranks(), " shards for a group of ", comm_->size()));
  if (next.shardSizes() == layout_.shardSizes()) return;
  settlePending();
  torch::NoGradGuard noGrad;
  const FlatRange from = shard_, to = next.shard(comm_->rank());
  const bool shardOnHost = offload_ == Offload::kParameters;
  // A tensor of the shard, re-made for `to` from every rank's old piece, chunk by chunk: each
  // chunk all-gathered into host memory where its owners changed, copied locally where not.
  auto move = [&](torch::Tensor& held, MemoryCategory category) {
    if (!held.defined()) return;
    torch::Tensor staged;
    {
      MemoryScope host(MemoryCategory::kHostData);
      staged = held.clone();
    }
    held = torch::Tensor();
    {
      MemoryScope device(category);
      held = torch::empty({to.size()}, torch::kFloat32);
    }
    for (int64_t begin = 0; begin < layout_.total(); begin += chunkElements) {
      const FlatRange chunk{begin, std::min(layout_.total(), begin + chunkElements)};
      const FlatRange mine = intersect(to, chunk);
      const auto counts = layout_.countsOf(chunk);
      if (counts == next.countsOf(chunk)) {  // alike on every rank: no collective
        if (mine.size() > 0)
          held.narrow(0, mine.begin - to.begin, mine.size())
              .copy_(staged.narrow(0, mine.begin - from.begin, mine.size()));
        continue;
      }
      torch::Tensor gathered;
      {
        MemoryScope host(MemoryCategory::kHostData);
        gathered = torch::empty({chunk.size()}, torch::kFloat32);
      }
      const FlatRange sent = intersect(from, chunk);
      comm_
          ->allgather(floats(staged, sent.size() > 0 ? sent.begin - from.begin : 0),
                      floats(gathered), counts, DType::F32)
          ->wait();
      if (mine.size() > 0)
        held.narrow(0, mine.begin - to.begin, mine.size())
            .copy_(gathered.narrow(0, mine.begin - chunk.begin, mine.size()));
    }
  };
  const MemoryCategory state =
      offload_ != Offload::kNone ? MemoryCategory::kOffloaded : MemoryCategory::kOptimizerState;
  if (stage_ == 3)
    move(shardParams_, shardOnHost ? MemoryCategory::kOffloaded : MemoryCategory::kParameters);
  move(state1_, state);
  move(state2_, state);
  if (stage_ > 1) {
    shardGradient_ = torch::Tensor();
    MemoryScope gradients(shardOnHost ? MemoryCategory::kOffloaded : MemoryCategory::kGradients);
    shardGradient_ = torch::zeros({to.size()}, torch::kFloat32);
  }
  layout_ = std::move(next);
  shard_ = to;
}

}  // namespace hetra::train
