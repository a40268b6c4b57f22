// The geometry of a dataset, the shape of one sample and the number of classes, known without
// loading it: a synthetic dataset's from its keys, Fashion-MNIST's from the headers of its IDX
// files (a few bytes each). No LibTorch, so the configuration checks the model against the data
// before any rank starts, and the trainer builds its model from the same answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace hetra::train {

struct DatasetGeometry {
  std::vector<int64_t> sampleShape;  // one input without the batch dimension, e.g. {1, 28, 28}
  int64_t classes = 0;
  int64_t features() const;  // elements of one sample: the product of sampleShape
  bool operator==(const DatasetGeometry&) const = default;
};

// The geometry of the dataset `data` names; for Fashion-MNIST both splits' headers are read and
// checked against each other. IoError naming the file for missing or inconsistent files,
// ConfigError for an unknown data.name.
DatasetGeometry datasetGeometry(const DataConfig& data);

namespace fashion_mnist {

constexpr const char* kPackage = "dataset-fashion-mnist";  // the Debian package that installs it
constexpr int64_t kClasses = 10;                           // labels are 0..9

// The path of one file of a split: "train" or "t10k", "images" or "labels". IoError naming the
// file and the package when it does not exist.
std::string existingFile(const std::string& directory, const std::string& split,
                         const std::string& what);

// The sample shape {1, H, W} of a split whose images have shape `images` ([N, H, W]) and whose
// labels have shape `labels` ([N]); IoError naming `where` when they do not fit together.
std::vector<int64_t> sampleShapeOf(const std::string& where, const std::vector<int64_t>& images,
                                   const std::vector<int64_t>& labels);

}  // namespace fashion_mnist
}  // namespace hetra::train
