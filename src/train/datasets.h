// Datasets: in-memory classification sets that hand out a batch for any list of sample indices.
//
// Vocabulary:
//   sample shape  the shape of one input without the batch dimension (inputShape()).
//   split         train or test: the two disjoint parts of a dataset.
//   teacher       Synthetic: the fixed random linear map whose argmax labels every sample;
//                 the train and test splits share it and differ in their inputs.
//
// get() is const and thread-safe: the ranks of a process (threads) may share one dataset.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/dataset_geometry.h"

namespace hetra::train {

struct Batch {
  at::Tensor inputs;   // float32 [N, sample shape...]
  at::Tensor targets;  // int64 [N], class indices in [0, classes)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The samples at `indices`, in that order (repeats allowed). EnforceError for an index outside
  // [0, size()).
  virtual Batch get(const std::vector<int64_t>& indices) const = 0;
  virtual int64_t size() const = 0;
  virtual std::vector<int64_t> inputShape() const = 0;
  virtual int64_t classes() const = 0;
  virtual std::string name() const = 0;
};

enum class Split { kTrain, kTest };

// Tensor-backed: all inputs [size, sample shape...] and targets [size] held in memory, gathered
// with index_select.
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::string name, at::Tensor inputs, at::Tensor targets, int64_t classes);
  Batch get(const std::vector<int64_t>& indices) const override;
  int64_t size() const override;
  std::vector<int64_t> inputShape() const override;
  int64_t classes() const override { return classes_; }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  at::Tensor inputs_;
  at::Tensor targets_;
  int64_t classes_;
};

// Fashion-MNIST from `directory` (the Debian package dataset-fashion-mnist installs it in
// kDefaultDir): samples [1, H, W] as the files' headers say ([1, 28, 28]; datasetGeometry reads the
// same shape without loading the data), normalised as (x/255 - 0.2860) / 0.3530, 10 classes.
// Throws IoError naming the file (and the package, when a file is missing) for missing, truncated
// or inconsistent files.
class FashionMnist : public TensorDataset {
 public:
  static constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";
  static constexpr double kMean = 0.2860;
  static constexpr double kStd = 0.3530;
  FashionMnist(const std::string& directory, Split split);
};

// A learnable task for tests: gaussian inputs [features], label = argmax of a random linear teacher
// (shared by both splits). Depends only on its arguments, not on LibTorch's generator.
class Synthetic : public TensorDataset {
 public:
  Synthetic(int64_t samples, int64_t features, int64_t classes, uint64_t seed,
            Split split = Split::kTrain);
};

// What makeDataset builds: the run config's [data] table, and the seed of the synthetic set.
struct DataSpec : DataConfig {
  uint64_t seed = 1;  // synthetic
};

// The train (or test) split. Fashion-MNIST splits are loaded once per process and shared (the ranks
// of one process are threads); ConfigError for an unknown name or bad sizes.
std::shared_ptr<const Dataset> makeDataset(const DataSpec& spec, bool train);

}  // namespace hetra::train
