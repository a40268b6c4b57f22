// Hand-written IDX files for the dataset and configuration tests, in a folder the test removes.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace hetra::testing {

// A fresh folder, removed with its files at the end of the test.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("hetra_idx_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A plain (uncompressed) IDX file of unsigned bytes; gzopen reads plain files, so a .gz name is
// fine. `data` may be shorter than the shape says (a header-only or truncated file).
inline void writeIdx(const std::string& path, const std::vector<uint32_t>& shape,
                     const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary);
  const uint8_t magic[4] = {0, 0, 0x08, uint8_t(shape.size())};
  out.write(reinterpret_cast<const char*>(magic), 4);
  for (uint32_t d : shape) {
    const uint8_t be[4] = {uint8_t(d >> 24), uint8_t(d >> 16), uint8_t(d >> 8), uint8_t(d)};
    out.write(reinterpret_cast<const char*>(be), 4);
  }
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

// The two files of a Fashion-MNIST split ("train" or "t10k") in `dir`: n images of height x width
// whose pixel p of image i is (i * 7 + p) % 256, and `labels`.
inline void writeFashionSplit(const TempDir& dir, const std::string& split, uint32_t n,
                              uint32_t height, uint32_t width, const std::vector<uint8_t>& labels) {
  const size_t pixelsPerImage = size_t(height) * width;
  std::vector<uint8_t> pixels(n * pixelsPerImage);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = uint8_t((i / pixelsPerImage) * 7 + i % pixelsPerImage);
  writeIdx(dir.file(split + "-images-idx3-ubyte.gz"), {n, height, width}, pixels);
  writeIdx(dir.file(split + "-labels-idx1-ubyte.gz"), {uint32_t(labels.size())}, labels);
}

}  // namespace hetra::testing
