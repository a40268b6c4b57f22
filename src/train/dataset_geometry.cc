#include "train/dataset_geometry.h"

#include <filesystem>

#include "common/errors.h"
#include "train/idx.h"

namespace hetra::train {

int64_t DatasetGeometry::features() const {
  int64_t n = 1;
  for (int64_t d : sampleShape) n *= d;
  return n;
}

namespace fashion_mnist {
namespace {

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += str(i ? ", " : "", shape[i]);
  return out + "]";
}

// The sample shape of one split, from its two headers.
std::vector<int64_t> splitShape(const std::string& directory, const std::string& split) {
  const std::string where = str("Fashion-MNIST in '", directory, "' (", split, " split)");
  auto header = [&](const std::string& what) {
    const std::string path = existingFile(directory, split, what);
    try {
      return readIdxShape(path);
    } catch (const IoError& e) {
      throw IoError(str(e.what(), " (Fashion-MNIST, from the Debian package ", kPackage, ")"));
    }
  };
  const auto images = header("images");  // named first in messages: read first
  const auto labels = header("labels");
  return sampleShapeOf(where, images, labels);
}

}  // namespace

std::string existingFile(const std::string& directory, const std::string& split,
                         const std::string& what) {
  const std::string suffix = what == "images" ? "-images-idx3-ubyte.gz" : "-labels-idx1-ubyte.gz";
  const std::string path = (std::filesystem::path(directory) / (split + suffix)).string();
  if (!std::filesystem::exists(path))
    throw IoError(
        str("Fashion-MNIST file '", path, "' does not exist: install the Debian package ", kPackage,
            " (apt install ", kPackage, "), or set data.path to a folder holding ",
            "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz ",
            "and t10k-labels-idx1-ubyte.gz"));
  return path;
}

std::vector<int64_t> sampleShapeOf(const std::string& where, const std::vector<int64_t>& images,
                                   const std::vector<int64_t>& labels) {
  if (images.size() != 3 || images[1] < 1 || images[2] < 1)
    throw IoError(str(where, ": the images are not [N, height, width] but ", shapeText(images)));
  if (labels.size() != 1 || labels[0] != images[0])
    throw IoError(
        str(where, ": ", images[0], " images but the labels file has shape ", shapeText(labels)));
  return {1, images[1], images[2]};  // one grey channel
}

}  // namespace fashion_mnist

DatasetGeometry datasetGeometry(const DataConfig& data) {
  if (data.name == "synthetic") return {{data.features}, data.classes};
  if (data.name != "fashion-mnist")
    throw ConfigError(
        str("data.name = \"", data.name, "\" is not a dataset; allowed: fashion-mnist, synthetic"));
  const auto train = fashion_mnist::splitShape(data.path, "train");
  const auto test = fashion_mnist::splitShape(data.path, "t10k");
  if (train != test)
    throw IoError(str("Fashion-MNIST in '", data.path, "': the train images are ",
                      fashion_mnist::shapeText(train), " but the test images ",
                      fashion_mnist::shapeText(test)));
  return {train, fashion_mnist::kClasses};
}

}  // namespace hetra::train
