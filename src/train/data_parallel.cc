#include "train/data_parallel.h"

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::train {

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> model,
                           std::shared_ptr<comm::Communicator> comm, DataParallelOptions options)
    : model_(std::move(model)), comm_(std::move(comm)) {
  for (auto& p : model_->parameters())
    if (p.requires_grad()) {
      HETRA_ENFORCE(p.scalar_type() == torch::kFloat32, "DataParallel supports float32 parameters");
      params_.push_back(p);
    }
  slots_.resize(params_.size());
  // Reverse registration order: backward produces the last layers' gradients first.
  size_t bucketElems = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t numel = params_[k].numel();
    if (buckets_.empty() ||
        (bucketElems > 0 && (bucketElems + size_t(numel)) * 4 > options.bucketBytes)) {
      buckets_.emplace_back();
      bucketElems = 0;
    }
    slots_[k] = {buckets_.size() - 1, int64_t(bucketElems), false};
    buckets_.back().params.push_back(k);
    bucketElems += size_t(numel);
    buckets_.back().flat = torch::Tensor();  // sized below
  }
  for (auto& b : buckets_) {
    int64_t total = 0;
    for (size_t k : b.params) total += params_[k].numel();
    b.flat = torch::zeros({total}, torch::kFloat32);
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].register_hook([this, k](torch::Tensor grad) {
      if (armed_) onGradient(k, grad);
      return grad;
    });
  }
}

DataParallel::~DataParallel() {
  // Hooks capture `this`; they only act while armed, and a step never ends armed.
  armed_ = false;
}

void DataParallel::broadcastParameters() {
  torch::NoGradGuard noGrad;
  std::vector<comm::WorkPtr> works;
  std::vector<torch::Tensor> staged;
  auto broadcastTensor = [&](torch::Tensor t) {
    HETRA_ENFORCE(t.is_contiguous(), "parameters must be contiguous");
    if (t.scalar_type() == torch::kFloat32)
      works.push_back(comm_->broadcast(t.data_ptr(), size_t(t.numel()), DType::F32, 0));
    else if (t.scalar_type() == torch::kInt64)
      works.push_back(comm_->broadcast(t.data_ptr(), size_t(t.numel()), DType::I64, 0));
    else
      throw ConfigError(
          str("cannot broadcast a model tensor of type ", c10::toString(t.scalar_type())));
  };
  for (auto& p : model_->parameters()) broadcastTensor(p);
  for (auto& b : model_->buffers()) broadcastTensor(b);
  for (auto& w : works) w->wait();
}

void DataParallel::armLastBackward() {
  for (auto& s : slots_) s.filled = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  nextLaunch_ = 0;
  armed_ = true;
}

void DataParallel::onGradient(size_t k, const torch::Tensor& grad) {
  Slot& slot = slots_[k];
  Bucket& bucket = buckets_[slot.bucket];
  torch::NoGradGuard noGrad;
  auto view = bucket.flat.narrow(0, slot.offset, params_[k].numel()).view_as(params_[k]);
  // The hook sees this micro-batch's gradient; earlier micro-batches already accumulated in .grad.
  const auto& accumulated = params_[k].grad();
  if (accumulated.defined())
    torch::add_out(view, accumulated, grad);
  else
    view.copy_(grad);
  if (!slot.filled) {
    slot.filled = true;
    --bucket.pending;
  }
  launchReady();
}

void DataParallel::launchReady() {
  while (nextLaunch_ < buckets_.size() && buckets_[nextLaunch_].pending == 0) {
    Bucket& b = buckets_[nextLaunch_++];
    b.work = comm_->allreduce(b.flat.data_ptr(), b.flat.data_ptr(), size_t(b.flat.numel()),
                              DType::F32, comm::ReduceOp::Sum);
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
    if (slot.filled) continue;
    Bucket& bucket = buckets_[slot.bucket];
    auto view = bucket.flat.narrow(0, slot.offset, params_[k].numel());
    const auto& accumulated = params_[k].grad();
    if (accumulated.defined())
      view.copy_(accumulated.reshape({-1}));
    else
      view.zero_();
    slot.filled = true;
    --bucket.pending;
  }
  launchReady();
  HETRA_ENFORCE_EQ(nextLaunch_, buckets_.size(), "every bucket must be launched");
  const auto start = Clock::now();
  for (auto& b : buckets_) b.work->wait();
  const double waited = secondsSince(start);
  const double scale = 1.0 / double(globalBatch);
  for (size_t k = 0; k < params_.size(); ++k) {
    const Slot& slot = slots_[k];
    auto averaged =
        buckets_[slot.bucket].flat.narrow(0, slot.offset, params_[k].numel()).view_as(params_[k]);
    auto& grad = params_[k].mutable_grad();
    if (!grad.defined()) grad = torch::empty_like(params_[k]);
    torch::mul_out(grad, averaged, scale);
  }
  return waited;
}

}  // namespace hetra::train
