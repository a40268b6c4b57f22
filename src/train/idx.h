// Reading IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed. No LibTorch: the
// configuration reads a dataset's shape from its headers (train/dataset_geometry.h).
//
// Format: 4 magic bytes (0, 0, element type 0x08 = unsigned byte, number of dimensions), one
// big-endian uint32 per dimension, then the elements in row-major order.
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

// The shape only, from the header (a few bytes read); the same errors for the header as readIdx.
std::vector<int64_t> readIdxShape(const std::string& path);

}  // namespace hetra::train
