#include "train/data_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "common/logging.h"
#include "device/compute_scope.h"
#include "train/gradient_hooks.h"

namespace hetra::train {

comm::OpPolicy withErrorFeedback(const comm::Communicator& comm, comm::OpPolicy policy,
                                 size_t count, torch::Tensor& residual) {
  if (!comm.feedbackCodec(comm::OpKind::Allreduce, DType::F32, comm::ReduceOp::Sum, count, policy))
    return policy;
  if (!residual.defined()) residual = torch::zeros({int64_t(count)}, torch::kFloat32);
  policy.residual = residual.data_ptr<float>();
  return policy;
}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<comm::Communicator> comm, DataParallelOptions options)
    : model_(std::move(model)),
      comm_(std::move(comm)),
      group_(comm_),
      errorFeedback_(options.errorFeedback) {
  gradientPolicy_.compression = options.compression;
  for (auto& p : model_->parameters())
    if (p.requires_grad()) {
      HETRA_ENFORCE(p.scalar_type() == torch::kFloat32, "DataParallel supports float32 parameters");
      HETRA_ENFORCE(p.is_contiguous(), "DataParallel needs contiguous parameters");
      params_.push_back(p);
    }
  slots_.resize(params_.size());
  // Walk the parameters in reverse registration order, the order backward produces their
  // gradients. A large parameter is reduced where autograd left it: copying it into a bucket would
  // cost the compute thread a pass over its memory, and it is big enough for an allreduce of its
  // own. Small parameters are packed; a packed bucket stays open across direct ones until full.
  // Buckets are launched in the order their last parameter becomes ready, a packed one also after
  // the parameter that follows it in the walk (a bias is produced with its layer's weight, which
  // comes next): ranks that finished early wait inside the first operation the last rank has not
  // reached, and when that is the large one they have staged their part of it already, instead of
  // staging it after a tiny operation completes, on the critical path.
  const size_t directBytes = std::min(options.directBytes, options.bucketBytes);
  struct Draft {
    Bucket bucket;
    size_t closedAt = 0;  // 2 x position in the walk of its last parameter (+3 if packed)
    int64_t elems = 0;
  };
  std::vector<Draft> drafts;
  std::vector<std::pair<size_t, int64_t>> draftOf(params_.size());  // (draft, offset)
  size_t open = SIZE_MAX;  // the packed draft that may take more parameters
  size_t position = 0;
  for (size_t k = params_.size(); k-- > 0; ++position) {
    const int64_t numel = params_[k].numel();
    size_t d;
    if (size_t(numel) * 4 >= directBytes) {
      d = drafts.size();
      drafts.emplace_back();
      drafts[d].bucket.direct = true;
    } else {
      if (open != SIZE_MAX && size_t(drafts[open].elems + numel) * 4 > options.bucketBytes)
        open = SIZE_MAX;
      if (open == SIZE_MAX) {
        open = drafts.size();
        drafts.emplace_back();
      }
      d = open;
    }
    draftOf[k] = {d, drafts[d].elems};
    drafts[d].bucket.params.push_back(k);
    drafts[d].elems += numel;
    drafts[d].closedAt = drafts[d].bucket.direct ? 2 * position : 2 * position + 3;
  }
  std::vector<size_t> order(drafts.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return drafts[x].closedAt < drafts[y].closedAt; });
  std::vector<size_t> indexOf(drafts.size());
  for (size_t i = 0; i < order.size(); ++i) {
    indexOf[order[i]] = i;
    buckets_.push_back(std::move(drafts[order[i]].bucket));
  }
  for (size_t k = 0; k < params_.size(); ++k)
    slots_[k] = {indexOf[draftOf[k].first], draftOf[k].second, false};
  for (auto& b : buckets_) {
    if (b.direct) continue;
    int64_t total = 0;
    for (size_t k : b.params) total += params_[k].numel();
    b.flat = torch::zeros({total}, torch::kFloat32);
  }
  logGradientRoute();
  // The hook fires after autograd accumulated the parameter's gradient (a tensor hook would see
  // only this micro-batch's part, before accumulation).
  for (size_t k = 0; k < params_.size(); ++k) {
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[k]));
    HETRA_ENFORCE(accumulators_.back() != nullptr, "parameter ", k, " has no gradient accumulator");
    hookKeys_.push_back(onGradientAccumulated(*accumulators_.back(), [this, k] {
      if (armed_) onReady(k);
    }));
  }
}

// Says once how the gradients travel: the provider of the largest bucket's allreduce and its wire
// format (on a hierarchy, the format between the islands). A run's log shows what was chosen.
void DataParallel::logGradientRoute() const {
  int64_t largest = 0;
  for (const auto& b : buckets_) {
    int64_t elems = 0;
    for (size_t k : b.params) elems += params_[k].numel();
    largest = std::max(largest, elems);
  }
  if (largest == 0) return;
  const size_t count = size_t(largest);
  const comm::Codec* codec = gradientPolicy_.compression.codecFor(
      comm::OpKind::Allreduce, DType::F32, comm::ReduceOp::Sum, count * sizeof(float));
  HETRA_INFO("train", "gradients: ", buckets_.size(), " buckets, the largest of ", count,
             " floats on provider ",
             group_->providerFor(comm::OpKind::Allreduce, DType::F32, comm::ReduceOp::Sum, count,
                                 gradientPolicy_),
             ", wire format ",
             codec ? comm::compressionName(gradientPolicy_.compression.compression()) : "float32");
}

DataParallel::~DataParallel() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hookKeys_[k]);
}

namespace {

// Starts `root`'s broadcast of a model tensor (a parameter or a buffer) into `into`, its shape.
comm::WorkPtr broadcastModelTensor(comm::Communicator& comm, torch::Tensor& into, int root = 0) {
  HETRA_ENFORCE(into.is_contiguous(), "parameters must be contiguous");
  if (into.scalar_type() == torch::kFloat32)
    return comm.broadcast(into.data_ptr(), size_t(into.numel()), DType::F32, root);
  if (into.scalar_type() == torch::kInt64)
    return comm.broadcast(into.data_ptr(), size_t(into.numel()), DType::I64, root);
  throw ConfigError(
      str("cannot broadcast a model tensor of type ", c10::toString(into.scalar_type())));
}

}  // namespace

std::vector<torch::Tensor> DataParallel::modelTensors() const {
  std::vector<torch::Tensor> tensors = model_->parameters();
  for (auto& b : model_->buffers()) tensors.push_back(b);
  return tensors;
}

void DataParallel::broadcastParameters() {
  torch::NoGradGuard noGrad;
  std::vector<comm::WorkPtr> works;
  for (auto& t : modelTensors()) works.push_back(broadcastModelTensor(*comm_, t));
  for (auto& w : works) w->wait();
}

double DataParallel::resynchronize() {
  HETRA_ENFORCE(group_, "rank ", comm_->rank(), " is left out of the gradient group");
  return adoptRootValues(*group_, modelTensors());
}

void DataParallel::setGradientGroup(std::shared_ptr<comm::Communicator> group) {
  group_ = std::move(group);
  if (group_) logGradientRoute();
}

double adoptRootValues(comm::Communicator& comm, const std::vector<torch::Tensor>& tensors,
                       int root) {
  torch::NoGradGuard noGrad;
  const bool isRoot = comm.rank() == root;
  // The others receive the root's values in copies, to measure the drift before they replace
  // their own.
  std::vector<torch::Tensor> fromRoot;
  std::vector<comm::WorkPtr> works;
  for (const auto& t : tensors) {
    fromRoot.push_back(isRoot ? t : torch::empty_like(t));
    works.push_back(broadcastModelTensor(comm, fromRoot.back(), root));
  }
  for (auto& w : works) w->wait();
  double drift = 0;
  if (isRoot) return drift;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() > 0)
      drift = std::max(drift, (fromRoot[i].to(torch::kFloat64) - tensors[i].to(torch::kFloat64))
                                  .abs()
                                  .max()
                                  .item<double>());
    tensors[i].copy_(fromRoot[i]);
  }
  return drift;
}

void adoptRootOptimizerState(comm::Communicator& comm, torch::optim::Optimizer& optimizer,
                             int root) {
  std::string bytes;
  if (comm.rank() == root) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  int64_t size = int64_t(bytes.size());
  comm.broadcast(&size, 1, DType::I64, root)->wait();
  bytes.resize(size_t(size));
  comm.broadcast(bytes.data(), bytes.size(), DType::U8, root)->wait();
  if (comm.rank() == root) return;
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  optimizer.load(archive);
}

void DataParallel::clearGradients() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

void DataParallel::armLastBackward() {
  HETRA_ENFORCE(group_, "rank ", comm_->rank(), " is left out of the gradient group");
  for (auto& s : slots_) s.ready = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  nextLaunch_ = 0;
  armed_ = true;
}

void DataParallel::onReady(size_t k) {
  torch::NoGradGuard noGrad;
  Slot& slot = slots_[k];
  if (slot.ready) return;
  auto& grad = params_[k].mutable_grad();
  HETRA_ENFORCE(grad.defined(), "parameter ", k, " is ready without a gradient");
  const Bucket& bucket = buckets_[slot.bucket];
  if (bucket.direct) {
    if (!grad.is_contiguous()) grad = grad.contiguous();
  } else {
    bucket.flat.narrow(0, slot.offset, params_[k].numel()).view_as(params_[k]).copy_(grad);
  }
  markReady(k);
}

void DataParallel::markReady(size_t k) {
  Slot& slot = slots_[k];
  slot.ready = true;
  --buckets_[slot.bucket].pending;
  launchReady();
}

void DataParallel::launchReady() {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    // A bucket leaves when an emulated slow device would have made its gradients: the work of the
    // backward so far is stretched first (docs/benchmarks.md, "every compute segment"), so that
    // its allreduce cannot overlap what would still be computing.
    // A group of one (a single device, or the others left out) holds the sum already: nothing to
    // send, nothing lost to a codec.
    if (group_->size() == 1) {
      ++nextLaunch_;
      continue;
    }
    if (armed_) device::settleOpenSegment();
    Bucket& b = buckets_[nextLaunch_++];
    torch::Tensor data = b.direct ? params_[b.params.front()].mutable_grad() : b.flat;
    const size_t count = size_t(data.numel());
    const comm::OpPolicy policy =
        errorFeedback_ ? withErrorFeedback(*group_, gradientPolicy_, count, b.residual)
                       : gradientPolicy_;
    b.work = group_->allreduce(data.data_ptr(), data.data_ptr(), count, DType::F32,
                               comm::ReduceOp::Sum, policy);
  }
}

int64_t DataParallel::residualElements() const {
  int64_t total = 0;
  for (const auto& b : buckets_)
    for (size_t k : b.params) total += params_[k].numel();
  return total;
}

torch::Tensor DataParallel::saveResiduals() const {
  torch::Tensor flat = torch::zeros({residualElements()}, torch::kFloat32);
  int64_t at = 0;
  for (const auto& b : buckets_) {
    int64_t elems = 0;
    for (size_t k : b.params) elems += params_[k].numel();
    if (b.residual.defined()) flat.narrow(0, at, elems).copy_(b.residual);
    at += elems;
  }
  return flat;
}

void DataParallel::loadResiduals(const torch::Tensor& flat) {
  if (!flat.defined()) {
    for (auto& b : buckets_) b.residual = torch::Tensor();
    return;
  }
  HETRA_ENFORCE(flat.scalar_type() == torch::kFloat32 && flat.dim() == 1 &&
                    flat.numel() == residualElements(),
                "error feedback state: ", flat.numel(), " values saved, this model has ",
                residualElements(), " gradient elements");
  int64_t at = 0;
  for (auto& b : buckets_) {
    int64_t elems = 0;
    for (size_t k : b.params) elems += params_[k].numel();
    b.residual = flat.narrow(0, at, elems).clone();
    at += elems;
  }
}

double DataParallel::finish(int64_t globalBatch) {
  torch::NoGradGuard noGrad;
  if (!armed_) armLastBackward();  // a rank without samples this step
  armed_ = false;
  // Parameters that got no gradient in the last backward (unused, or no micro-batch at all)
  // contribute what they accumulated so far, or zeros.
  for (size_t k = 0; k < params_.size(); ++k) {
    Slot& slot = slots_[k];
    if (slot.ready) continue;
    auto& grad = params_[k].mutable_grad();
    const Bucket& bucket = buckets_[slot.bucket];
    if (bucket.direct) {
      if (!grad.defined())
        grad = torch::zeros_like(params_[k]);
      else if (!grad.is_contiguous())
        grad = grad.contiguous();
    } else {
      auto view = bucket.flat.narrow(0, slot.offset, params_[k].numel());
      if (grad.defined())
        view.copy_(grad.reshape({-1}));
      else
        view.zero_();
    }
    markReady(k);
  }
  HETRA_ENFORCE_EQ(nextLaunch_, buckets_.size(), "every bucket must be launched");
  const auto start = Clock::now();
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  const double waited = secondsSince(start);
  const double scale = 1.0 / double(globalBatch);
  for (size_t k = 0; k < params_.size(); ++k) {
    const Slot& slot = slots_[k];
    const Bucket& bucket = buckets_[slot.bucket];
    auto& grad = params_[k].mutable_grad();
    if (bucket.direct) {
      if (scale != 1.0) grad.mul_(scale);
    } else {
      if (!grad.defined()) grad = torch::empty_like(params_[k]);
      torch::mul_out(grad, bucket.flat.narrow(0, slot.offset, params_[k].numel()).view_as(grad),
                     scale);
    }
  }
  return waited;
}

}  // namespace hetra::train
