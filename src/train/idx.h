// Reading IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetra::train {

struct IdxArray {
  std::vector<int64_t> shape;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> data;   // row-major, unsigned bytes (the only element type these files use)
};

// Throws IoError naming the file when it is missing, truncated, or not an unsigned-byte IDX array.
IdxArray readIdx(const std::string& path);

}  // namespace hetra::train
