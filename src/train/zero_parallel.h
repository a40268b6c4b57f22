// ZeroParallel: ZeRO stages 1, 2 and 3 over one flat float32 parameter space in uneven shards
// (train/zero_layout.h), the sharded counterpart of DataParallel (docs/zero.md).
//
//   stage 1  every rank keeps all parameters (in one flat buffer) and, during a step, all
//            gradients (autograd's own, allocated by the step's first backward as data
//            parallelism's); in the step's last backward each tensor's gradient is
//            reduce-scattered in place, asynchronously, as soon as autograd has accumulated it
//            and those after it in flat order (finish() waits), each rank updates its own shard
//            with the one-pass optimizer loops (train/fused_optim.h), keeping optimizer state for
//            its shard only, and the parameters are all-gathered in place. finishAndUpdate
//            updates and all-gathers *groups* of tensors (runs of consecutive tensors in reverse
//            flat order, ZeroOptions::groupElements) as soon as each group's reduce-scatters end.
//   stage 2  the same, but a rank keeps gradients for its shard only: in the step's last
//            backward each tensor's gradient is reduce-scattered into the shard as soon as
//            autograd has accumulated it, and freed.
//   stage 3  also the parameters: a rank keeps its shard; a BlockModel's block is all-gathered
//            into the block's own buffer before it runs and freed after it, in forward and
//            again for backward, which recomputes it (the blocks run checkpointed); the block's
//            gradients are reduce-scattered into the shard as the recompute produces them. With
//            prefetch the gather of the block that runs next is issued before the current one
//            runs (see "Stage 3's collective sequence" below).
//
// Uneven accumulation: ranks run different numbers of micro-batches, yet every rank issues the
// same collectives in the same order, and no rank contributes a gradient twice:
//   - gradients stay whole, in .grad, through micro-batches 1..k-1 (memory: the full gradient,
//     4 bytes per parameter, on a rank that accumulates); only the step's last backward
//     reduce-scatters them, one tensor at a time in a fixed order (stages 1 and 2: reverse flat
//     order, each as soon as it and those after it are ready; stage 3:
//     block by block, in backward's order). A rank without samples contributes zeros in finish().
//   - stage 3's gathers happen in every micro-batch: a rank with k micro-batches first runs
//     most - max(k, 1) *idle rounds* (each block gathered and freed as a forward and a backward
//     would, without compute; beginStep), so that every rank runs `most` rounds, the last of
//     them with the reduce-scatters. A rank without samples runs that last round in finish().
//   - evaluation: a rank with fewer test batches than another runs forwardWithoutSamples() for
//     each batch it lacks (stage 3 only gathers; the others do nothing).
//
// Stage 3's collective sequence, n blocks, with prefetch (G b: block b's all-gather issued,
// W b: waited for, F b: its buffer freed, R b: its tensors' reduce-scatters, issued and waited
// for one by one, last round only):
//   forward   G0 G1 W0 [block 0] F0  G2 W1 [block 1] F1  ...  W(n-1) [block n-1] F(n-1)
//   backward  G(n-1) G(n-2) W(n-1) [recompute, backward n-1] F(n-1) R(n-1)
//             G(n-3) W(n-2) [n-2] F(n-2) R(n-2)  ...  W0 [0] F0 R0
// Without prefetch each G b comes just before its W b. Nothing is in flight between passes.
// The collectives of a group run in issue order, so R b runs after the prefetched G(b-1). The
// hooks below (gatherFor) produce it for a computing rank, and idleRound, forwardWithoutSamples
// and gatherParameters call the same hooks, so idle ranks issue the same sequence. Memory: up to
// two gathered blocks at once (b and the next one), 4 bytes per element of each.
//
// Use per step: beginStep(mine, most); micro-batches 1..k-1 with plain backward;
// armLastBackward() before the last backward; finish(); step(lr, clip). The constructor makes
// every rank's parameters rank 0's (a collective). After it, the model's parameters live here:
// under stage 3 they have no storage outside the blocks' runs; keep this object for the model's
// lifetime.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "train/models.h"
#include "train/optim.h"
#include "train/zero_layout.h"
#include "train/zero_offload.h"

namespace torch::autograd {
struct Node;
}

namespace hetra::train {

struct ZeroOptions {
  int stage = 1;                    // 1, 2 or 3
  std::vector<int64_t> shardSizes;  // elements per rank, aligned (zero_layout.h); empty: even
  OptimSpec optimizer;              // sgd, adam or adamw (makeOptimizer's options)
  // This rank's: what of its shard lives in host memory (the ledger's "offloaded", outside the
  // device's cap) rather than on its device.
  Offload offload = Offload::kNone;
  // The gradients' reduce-scatters travel under this policy (comm/policy.h; exact by default)...
  comm::CompressionPolicy compression;
  // ...keeping, for each tensor whose reduce-scatter keeps error feedback
  // (Communicator::feedbackCodec), what its encodings lost, added to the next step's: the whole
  // tensor's floats on every rank (each rank encodes every piece but its own), in the ledger's
  // "communication".
  bool errorFeedback = false;
  bool prefetch = true;  // stage 3: gather the next block while one runs
  // Stage 1's overlapped step (finishAndUpdate): consecutive tensors, in reverse flat order
  // (backward's), are updated and all-gathered together until a group holds at least this many
  // elements (train/zero_layout.h tensorGroups). Alike on every rank: the groups are collectives.
  int64_t groupElements = kTensorGroupElements;
};

// Runs `work` as one compute segment of this rank's device (device/compute_scope.h: an emulated
// device sleeps its slowdown's share after it, before the next collective is issued) and returns
// the seconds the device computed.
using ComputeSegment = std::function<double(const std::function<void()>& work)>;

// What finishAndUpdate spent: waiting for communication, and computing the update.
struct OverlappedStep {
  double waitedSeconds = 0, updateSeconds = 0;
};

// The trainable parameters of `model` in flat order: a BlockModel's block by block (each once),
// any other model's in registration order. ConfigError for a parameter that is not contiguous
// float32, or a BlockModel parameter in no block.
std::vector<torch::Tensor> flatParameters(Model& model);

class ZeroParallel : private BlockHooks {
 public:
  // ConfigError for stage 3 without a BlockModel, for a layout that does not fit the model or
  // the group, or an optimizer other than sgd, adam and adamw.
  ZeroParallel(std::shared_ptr<Model> model, std::shared_ptr<comm::Communicator> comm,
               ZeroOptions options);
  ~ZeroParallel() override;
  ZeroParallel(const ZeroParallel&) = delete;
  ZeroParallel& operator=(const ZeroParallel&) = delete;

  int stage() const { return stage_; }
  Offload offload() const { return offload_; }
  const ShardLayout& layout() const { return layout_; }

  // The step's micro-batches: this rank's and the most any rank runs (alike on every rank).
  void beginStep(int64_t mine, int64_t most);
  // The next backward is the step's last.
  void armLastBackward();
  // Reduces what was not reduced during backward into the shard's gradients (the sum over all
  // ranks; losses are already divided by the global batch). Returns the seconds spent waiting for
  // communication, in backward and here.
  double finish();
  // The seconds this step has waited for communication so far (stage 3's gathers inside forward
  // and backward among them): what a micro-batch's wall time holds besides its compute.
  double waitedSeconds() const { return waited_; }
  // Clips the global gradient norm to gradClip (0: off) and updates this rank's shard with
  // learning rate lr: the optimizer's compute segment. Returns the norm before clipping (0 when
  // not clipping).
  double updateShard(double lr, double gradClip);
  // Stages 1 and 2: all-gathers the updated parameters (stage 3 gathers them block by block when
  // they are used). Returns the seconds it took.
  double shareParameters();
  // updateShard, then shareParameters.
  double step(double lr, double gradClip) {
    const double norm = updateShard(lr, gradClip);
    shareParameters();
    return norm;
  }
  // Stage 1 without clipping (nothing needs the whole gradient before the update): finish(),
  // updateShard(lr, 0) and shareParameters() overlapped. The reduce-scatters issued during
  // backward end in issue order; as soon as a group's has (ZeroOptions::groupElements),
  // this rank updates its piece of the group, as a compute segment of its own (`segment`), and
  // issues the group's all-gather, while the next groups' reduce-scatters still run. Returns
  // when every all-gather has ended. The same updates, element for element, as the sequential
  // calls: the parameters end bitwise alike.
  OverlappedStep finishAndUpdate(double lr, const ComputeSegment& segment);
  // Whether finishAndUpdate can run this step.
  bool overlapsUpdate(double gradClip) const { return stage_ == 1 && gradClip <= 0; }
  // Stage 3: every block gathered and freed, as a forward of a rank with samples does.
  void forwardWithoutSamples();
  // Error-feedback floats this rank keeps (every reduce-scatter's residual together).
  int64_t residualElements() const;
  // Every parameter's current value, in flat order (a collective under stage 3).
  std::vector<torch::Tensor> gatherParameters();

  // Checkpoints (train/zero_checkpoint.h). This rank's shard of the parameters, then of each
  // optimizer state tensor (sgd with momentum: its buffer; adam, adamw: the two moments), as
  // views of the engine's own: a checkpoint reads them, a resume writes them, then calls
  // restored().
  std::vector<torch::Tensor> shardState() const;
  int64_t optimizerSteps() const { return steps_; }
  FlatRange ownShard() const { return shard_; }
  const OptimSpec& optimizer() const { return optimizer_; }
  // After shardState() was written: the optimizer continues after `optimizerSteps` steps, and
  // under stages 1 and 2 every rank's parameters are all-gathered from the shards (a collective).
  void restored(int64_t optimizerSteps);

  // Moves to new shard sizes (a collective, between steps): what the shards hold (stage 3's
  // parameters, the optimizer state) goes through host memory, so a device never holds its old
  // and its new shard at once; the gradient shards start again from zero. ConfigError for sizes
  // that do not fit the layout, or while error feedback keeps residuals (each is tied to the
  // pieces a rank encodes, which the move would change). `chunkElements`: the flat space moves in
  // chunks of that many elements, each all-gathered into host memory where its owners change.
  void reshard(const std::vector<int64_t>& shardSizes, int64_t chunkElements = int64_t(1) << 20);

 private:
  // Forward runs the blocks in order, backward recomputes them in reverse.
  void beforeBlock(size_t block) override {
    gatherFor(block, block + 1 < blockRange_.size() ? block + 1 : kNoBlock);
  }
  void afterBlock(size_t block) override { release(block); }
  void recomputing(size_t block) override { gatherFor(block, block > 0 ? block - 1 : kNoBlock); }
  void takeGradients(size_t block, std::vector<torch::Tensor>& gradients) override;

  static constexpr size_t kNoBlock = size_t(-1);
  // Where this rank's piece of `range` starts in its shard (0 for an empty piece).
  int64_t offsetInShard(FlatRange range) const;
  // Block `block` is about to run: its gather issued unless prefetched, then (with prefetch) that
  // of `next`, the block the pass runs after it (kNoBlock: none), then block's waited for.
  void gatherFor(size_t block, size_t next);
  // Grows the block's buffer and issues its all-gather into it (pending_).
  void issueGather(size_t block);
  void awaitGather(size_t block);
  void release(size_t block);
  // Waits for every gather and reduce-scatter still in flight (an exception left a pass),
  // ignoring their errors, then frees every block's buffer: nothing writes into a buffer after it
  // is gone. Only between passes (no block is computing).
  void settlePending() noexcept;
  void idleRound(bool last);
  // Issues the reduce-scatter of `gradient` (tensor k's whole gradient, contiguous) into the
  // shard's part of k: stage 1's in place, in `gradient`; `gradient`'s storage must live until it
  // completes.
  comm::WorkPtr issueReduce(size_t k, const torch::Tensor& gradient);
  // issueReduce, waited for.
  void reduceIntoShard(size_t k, const torch::Tensor& gradient);
  // Stage 1: waits for the reduce-scatters issued during backward (reducing_).
  void awaitReduces();
  void onReady(size_t k);
  torch::Tensor shardParameters() const;
  // A contiguous range of this rank's shard and where its reduced gradients are: stage 1's in
  // each tensor's .grad, the others' in shardGradient_.
  struct GradientPiece {
    FlatRange range;
    float* gradients;
  };
  // The pieces of the shard's part of `range`, in flat order, after its reduce-scatters ended.
  std::vector<GradientPiece> gradientPieces(FlatRange range) const;
  // Stage 1: the gradients were used; the next backward allocates them anew.
  void releaseGradients();
  // The one-pass optimizer over one piece; one optimizer step is one or more calls after one
  // advanceStep().
  void advanceStep() { ++steps_; }
  void update(double lr, const GradientPiece& piece);

  std::shared_ptr<Model> model_;
  BlockModel* blocks_ = nullptr;  // model_ as a BlockModel, or nullptr
  std::shared_ptr<comm::Communicator> comm_;
  int stage_;
  Offload offload_;
  bool prefetch_;  // stage 3
  OptimSpec optimizer_;
  std::vector<torch::Tensor> params_;  // flat order
  ShardLayout layout_;
  FlatRange shard_;
  torch::Tensor flat_;           // stages 1, 2: every parameter; they are views of it
  torch::Tensor shardGradient_;  // stages 2, 3
  torch::Tensor shardParams_;    // stage 3
  // Stage 3: per block, its flat range, its tensors (indices into params_) and the buffer they
  // are views of, without storage outside the block's runs.
  std::vector<FlatRange> blockRange_;
  std::vector<std::vector<size_t>> blockTensors_;
  std::vector<torch::Tensor> blockBuffer_;
  std::vector<comm::WorkPtr> pending_;  // per block: its all-gather, issued, not yet waited for
  // Optimizer state of the shard: sgd's momentum buffer, or adam's two moments.
  torch::Tensor state1_, state2_;
  int64_t steps_ = 0;
  comm::OpPolicy gradientPolicy_;
  std::vector<torch::Tensor> residuals_;  // per tensor; undefined where there is no feedback
  // Stages 1 and 2: accumulator hooks, as DataParallel's.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hookKeys_;
  std::vector<bool> reduced_;  // tensor k's gradient is in the shard this step
  std::vector<bool> ready_;    // stages 1, 2: autograd has accumulated tensor k's gradient
  size_t nextLaunch_ = 0;      // stages 1, 2: reverse flat order
  // Stage 1: the last backward's reduce-scatters, issued in flat reverse order, in flight until
  // finish() (stage 2 waits for each before it frees the tensor's gradient).
  std::vector<comm::WorkPtr> reducing_;
  // Stage 1: the groups of tensors updated and all-gathered together, in backward's order; the
  // overlapped step's all-gathers while in flight.
  std::vector<TensorGroup> groups_;
  std::vector<comm::WorkPtr> gathering_;
  bool armed_ = false;
  double waited_ = 0;
};

}  // namespace hetra::train
