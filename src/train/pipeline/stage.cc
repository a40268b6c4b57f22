#include "train/pipeline/stage.h"

#include <algorithm>

#include "common/errors.h"
#include "common/timeline.h"
#include "train/models.h"

namespace hetra::train::pipeline {

Stage::Stage(BlockModel& model, StageSpan span, comm::Communicator& comm)
    : model_(model), span_(std::move(span)), comm_(comm) {
  HETRA_ENFORCE_EQ(int64_t(span_.ranks.size()), int64_t(span_.stages), "a rank per stage");
  HETRA_ENFORCE_EQ(comm.size(), span_.stages, "one rank per stage");
  HETRA_ENFORCE_EQ(comm.rank(), span_.ranks[size_t(span_.stage)], "this rank runs its stage");
  HETRA_ENFORCE(
      0 <= span_.first && span_.first < span_.last && span_.last <= int64_t(model.blockCount()),
      "stage ", span_.stage, " holds blocks [", span_.first, ", ", span_.last, ") of ",
      model.blockCount());
}

// Distinct per step, chunk and direction, so a message can only land in the receive posted for it.
// Below 2^62: the evaluation's tags have bit 62 set, the algorithms' are above 2^63.
uint64_t Stage::tag(int64_t step, int64_t chunk, bool gradient) const {
  return ((uint64_t(step) * uint64_t(scheduleChunks_) + uint64_t(chunk)) << 1 |
          (gradient ? 1 : 0)) &
         ((uint64_t(1) << 62) - 1);
}

StageStep Stage::run(int64_t step, const std::vector<Batch>& chunks, double lossScale,
                     EmulatedDevice& device, double slowdown) {
  const int64_t m = int64_t(chunks.size());
  // A pipeline the balancer gave no samples this step: every stage of it knows, none waits.
  if (m == 0) return {};
  if (m != scheduleChunks_) {
    schedule_ = oneFOneB(span_.stage, span_.stages, m);
    scheduleChunks_ = m;
  }
  inputs_.assign(size_t(m), {});
  outputs_.assign(size_t(m), {});
  gradients_.assign(size_t(m), {});
  inFlight_ = 0;
  StageStep out;
  abortOnFailure([&] {
    for (const Step& s : schedule_) execute(s, step, chunks, lossScale, device, slowdown, out);
  });
  return out;
}

void Stage::abortOnFailure(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    comm_.abort(str("pipeline stage ", span_.stage, " failed: ", e.what()));
    throw;
  }
}

std::pair<double, double> Stage::evaluate(int64_t round, const std::vector<Batch>& chunks) {
  torch::NoGradGuard noGrad;
  const bool first = span_.stage == 0, last = span_.stage + 1 == span_.stages;
  // Tags of their own: bit 62 set, below the training steps' for any run of fewer than 2^61.
  const auto evalTag = [&](size_t k) { return uint64_t(1) << 62 | uint64_t(round) << 32 | k; };
  double lossSum = 0, correct = 0;
  abortOnFailure([&] {
    for (size_t k = 0; k < chunks.size(); ++k) {
      torch::Tensor x = chunks[k].inputs;
      if (!first) {
        std::vector<int64_t> shape{chunks[k].targets.size(0)};
        shape.insert(shape.end(), span_.inputShape.begin(), span_.inputShape.end());
        x = torch::empty(shape, torch::kFloat32);
        comm_.recv(x.data_ptr<float>(), size_t(x.numel()), DType::F32, previous(), evalTag(k))
            ->wait();
      }
      torch::Tensor y =
          model_.forwardBlocks(x, size_t(span_.first), size_t(span_.last)).contiguous();
      if (last) {
        lossSum += summedLoss(y, chunks[k].targets).item<double>();
        correct += y.argmax(1).eq(chunks[k].targets).sum().item<double>();
      } else {
        comm_.send(y.data_ptr<float>(), size_t(y.numel()), DType::F32, next(), evalTag(k))->wait();
      }
    }
  });
  return {lossSum, correct};
}

void Stage::execute(const Step& s, int64_t step, const std::vector<Batch>& chunks, double lossScale,
                    EmulatedDevice& device, double slowdown, StageStep& out) {
  const size_t k = size_t(s.chunk);
  const bool last = span_.stage + 1 == span_.stages;
  const int64_t samples = chunks[k].targets.size(0);
  switch (s.action) {
    case Action::kReceiveActivation: {
      std::vector<int64_t> shape{samples};
      shape.insert(shape.end(), span_.inputShape.begin(), span_.inputShape.end());
      torch::Tensor x = torch::empty(shape, torch::kFloat32);
      timeline::Span span(timeline::Lane::Compute, "comm", "receive activation");
      comm_
          .recv(x.data_ptr<float>(), size_t(x.numel()), DType::F32, previous(),
                tag(step, s.chunk, false))
          ->wait();
      inputs_[k] = x.requires_grad_(true);
      return;
    }
    case Action::kForward: {
      timeline::Span span(timeline::Lane::Compute, "compute", "forward");
      span.arg("chunk", s.chunk);
      torch::Tensor input = span_.stage == 0 ? chunks[k].inputs : inputs_[k];
      out.computeSeconds += device.compute(slowdown, [&] {
        torch::Tensor y = model_.forwardBlocks(input, size_t(span_.first), size_t(span_.last));
        outputs_[k] = last ? summedLoss(y, chunks[k].targets) : y;
      });
      if (last) out.lossSum += outputs_[k].item<double>();
      out.peakChunksInFlight = std::max(out.peakChunksInFlight, ++inFlight_);
      return;
    }
    case Action::kSendActivation: {
      const torch::Tensor y = outputs_[k].detach().contiguous();
      timeline::Span span(timeline::Lane::Compute, "comm", "send activation");
      comm_
          .send(y.data_ptr<float>(), size_t(y.numel()), DType::F32, next(),
                tag(step, s.chunk, false))
          ->wait();
      return;
    }
    case Action::kReceiveGradient: {
      torch::Tensor g = torch::empty(outputs_[k].sizes(), torch::kFloat32);
      timeline::Span span(timeline::Lane::Compute, "comm", "receive gradient");
      comm_
          .recv(g.data_ptr<float>(), size_t(g.numel()), DType::F32, next(),
                tag(step, s.chunk, true))
          ->wait();
      gradients_[k] = g;
      return;
    }
    case Action::kBackward: {
      timeline::Span span(timeline::Lane::Compute, "compute", "backward");
      span.arg("chunk", s.chunk);
      out.computeSeconds += device.compute(slowdown, [&] {
        if (last)
          (outputs_[k] * lossScale).backward();
        else
          outputs_[k].backward(gradients_[k]);
      });
      outputs_[k] = torch::Tensor();  // the chunk's activations go with its graph
      gradients_[k] = torch::Tensor();
      --inFlight_;
      return;
    }
    case Action::kSendGradient: {
      const torch::Tensor g = inputs_[k].grad().contiguous();
      timeline::Span span(timeline::Lane::Compute, "comm", "send gradient");
      comm_
          .send(g.data_ptr<float>(), size_t(g.numel()), DType::F32, previous(),
                tag(step, s.chunk, true))
          ->wait();
      inputs_[k] = torch::Tensor();
      return;
    }
  }
}

}  // namespace hetra::train::pipeline
