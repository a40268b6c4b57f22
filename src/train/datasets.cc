// Vocabulary: see datasets.h.
#include "train/datasets.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <mutex>
#include <random>

#include "common/errors.h"
#include "train/idx.h"

namespace hetra::train {
namespace {

// Standard normal values from a generator of our own (Box-Muller), identical on every platform.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  float next() {
    if (hasSpare_) {
      hasSpare_ = false;
      return spare_;
    }
    const double u1 = (double(rng_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log(u1) is finite
    const double u2 = double(rng_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
    spare_ = float(r * std::sin(angle));
    hasSpare_ = true;
    return float(r * std::cos(angle));
  }

 private:
  std::mt19937_64 rng_;
  float spare_ = 0;
  bool hasSpare_ = false;
};

IdxArray readFashionFile(const std::string& directory, const std::string& split,
                         const std::string& what) {
  const std::string path = fashion_mnist::existingFile(directory, split, what);
  try {
    return readIdx(path);
  } catch (const IoError& e) {
    throw IoError(
        str(e.what(), " (Fashion-MNIST, from the Debian package ", fashion_mnist::kPackage, ")"));
  }
}

TensorDataset loadFashion(const std::string& directory, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const IdxArray images = readFashionFile(directory, prefix, "images");
  const IdxArray labels = readFashionFile(directory, prefix, "labels");
  const std::string where = str("Fashion-MNIST in '", directory, "' (", prefix, " split)");
  // The shape the files declare (28 x 28 for Fashion-MNIST), as datasetGeometry reads it.
  std::vector<int64_t> shape = fashion_mnist::sampleShapeOf(where, images.shape, labels.shape);
  for (uint8_t label : labels.data)
    if (label >= fashion_mnist::kClasses)
      throw IoError(str(where, ": label ", int(label), " is not a class in [0, ",
                        fashion_mnist::kClasses, ")"));

  const int64_t n = images.shape[0];
  shape.insert(shape.begin(), n);
  // from_blob borrows the vectors; the conversions copy, so nothing outlives them.
  auto inputs = at::from_blob(const_cast<uint8_t*>(images.data.data()), shape, at::kByte)
                    .to(at::kFloat)
                    .div_(255.0)
                    .sub_(FashionMnist::kMean)
                    .div_(FashionMnist::kStd);
  auto targets =
      at::from_blob(const_cast<uint8_t*>(labels.data.data()), {n}, at::kByte).to(at::kLong);
  return TensorDataset("fashion-mnist", inputs, targets, fashion_mnist::kClasses);
}

TensorDataset makeSynthetic(int64_t samples, int64_t features, int64_t classes, uint64_t seed,
                            Split split) {
  if (samples < 1 || features < 1 || classes < 2)
    throw ConfigError(str("synthetic data needs samples >= 1, features >= 1 and classes >= 2 (got ",
                          samples, ", ", features, ", ", classes, ")"));
  // The teacher depends on the seed only; each split draws its own inputs from it.
  Gaussian teacherRng(seed * 0x9e3779b97f4a7c15ull + 1);
  std::vector<float> teacher(size_t(features * classes));
  for (float& w : teacher) w = teacherRng.next();
  Gaussian inputRng(seed * 0x9e3779b97f4a7c15ull + (split == Split::kTrain ? 2 : 3));
  std::vector<float> inputs(size_t(samples * features));
  for (float& x : inputs) x = inputRng.next();

  std::vector<int64_t> targets(static_cast<size_t>(samples));
  std::vector<double> scores(static_cast<size_t>(classes));
  for (int64_t s = 0; s < samples; ++s) {
    std::fill(scores.begin(), scores.end(), 0.0);
    for (int64_t f = 0; f < features; ++f) {
      const double x = inputs[size_t(s * features + f)];
      for (int64_t c = 0; c < classes; ++c)
        scores[size_t(c)] += x * teacher[size_t(f * classes + c)];
    }
    targets[size_t(s)] = int64_t(std::max_element(scores.begin(), scores.end()) - scores.begin());
  }
  return TensorDataset("synthetic",
                       at::from_blob(inputs.data(), {samples, features}, at::kFloat).clone(),
                       at::from_blob(targets.data(), {samples}, at::kLong).clone(), classes);
}

}  // namespace

TensorDataset::TensorDataset(std::string name, at::Tensor inputs, at::Tensor targets,
                             int64_t classes)
    : name_(std::move(name)),
      inputs_(inputs.contiguous()),
      targets_(targets.contiguous()),
      classes_(classes) {
  HETRA_ENFORCE(inputs_.scalar_type() == at::kFloat && targets_.scalar_type() == at::kLong,
                "dataset '", name_, "' needs float32 inputs and int64 targets");
  HETRA_ENFORCE(inputs_.dim() >= 2 && targets_.dim() == 1 && inputs_.size(0) == targets_.size(0),
                "dataset '", name_, "': inputs ", inputs_.sizes(), " do not match targets ",
                targets_.sizes());
}

Batch TensorDataset::get(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t i : indices)
    HETRA_ENFORCE(i >= 0 && i < n, "sample index ", i, " is outside dataset '", name_, "' of ", n,
                  " samples");
  // index_select reads the indices before returning, so borrowing the vector is safe.
  auto index =
      at::from_blob(const_cast<int64_t*>(indices.data()), {int64_t(indices.size())}, at::kLong);
  return Batch{inputs_.index_select(0, index), targets_.index_select(0, index)};
}

int64_t TensorDataset::size() const {
  return inputs_.size(0);
}

std::vector<int64_t> TensorDataset::inputShape() const {
  auto sizes = inputs_.sizes();
  return std::vector<int64_t>(sizes.begin() + 1, sizes.end());
}

FashionMnist::FashionMnist(const std::string& directory, Split split)
    : TensorDataset(loadFashion(directory, split)) {}

Synthetic::Synthetic(int64_t samples, int64_t features, int64_t classes, uint64_t seed, Split split)
    : TensorDataset(makeSynthetic(samples, features, classes, seed, split)) {}

std::shared_ptr<const Dataset> makeDataset(const DataSpec& spec, bool train) {
  const Split split = train ? Split::kTrain : Split::kTest;
  if (spec.name == "synthetic")
    return std::make_shared<Synthetic>(train ? spec.samples : spec.testSamples, spec.features,
                                       spec.classes, spec.seed, split);
  if (spec.name != "fashion-mnist")
    throw ConfigError(
        str("data.name = \"", spec.name, "\" is not a dataset; allowed: fashion-mnist, synthetic"));
  // One copy per process (188 MB for the train split), however many rank threads ask; held while
  // any of them uses it. Loading under the lock makes the others wait rather than load it again.
  static std::mutex mutex;
  static std::map<std::pair<std::string, bool>, std::weak_ptr<const Dataset>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = cache[{spec.path, train}];
  if (auto shared = slot.lock()) return shared;
  auto loaded = std::make_shared<const FashionMnist>(spec.path, split);
  slot = loaded;
  return loaded;
}

}  // namespace hetra::train
