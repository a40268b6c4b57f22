#include "train/idx.h"

#include <zlib.h>

#include <algorithm>

#include "common/errors.h"

namespace hetra::train {
namespace {

// gzopen reads plain files too, so one path handles both forms.
class GzFile {
 public:
  // zlib inflates twice `buffer` bytes at a time: large for whole files, small for a header.
  GzFile(const std::string& path, unsigned buffer)
      : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) throw IoError(str("cannot open '", path, "'"));
    gzbuffer(file_, buffer);
  }
  ~GzFile() { gzclose(file_); }

  void read(void* out, size_t bytes) {
    auto* dst = static_cast<uint8_t*>(out);
    while (bytes > 0) {
      const unsigned chunk = unsigned(std::min<size_t>(bytes, 1u << 30));
      const int got = gzread(file_, dst, chunk);
      if (got <= 0) throw IoError(str("'", path_, "' is truncated or not a valid gzip/IDX file"));
      dst += got;
      bytes -= size_t(got);
    }
  }

 private:
  std::string path_;
  gzFile file_;
};

uint32_t bigEndian(const uint8_t* b) {
  return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
}

// The header: magic, then the dimensions.
std::vector<int64_t> readShape(GzFile& file, const std::string& path) {
  uint8_t magic[4];
  file.read(magic, 4);
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    throw IoError(str("'", path, "' is not an unsigned-byte IDX file (magic ", int(magic[2]), "/",
                      int(magic[3]), ")"));
  std::vector<int64_t> shape;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t dim[4];
    file.read(dim, 4);
    shape.push_back(int64_t(bigEndian(dim)));
  }
  return shape;
}

}  // namespace

IdxArray readIdx(const std::string& path) {
  GzFile file(path, 1 << 20);
  IdxArray array;
  array.shape = readShape(file, path);
  constexpr size_t kMaxElements = size_t(1) << 34;
  size_t total = 1;
  for (int64_t d : array.shape) {
    // Checked before multiplying: four dimensions of up to 2^32 overflow size_t.
    if (d > 0 && total > kMaxElements / size_t(d))
      throw IoError(str("'", path, "' claims an absurd size"));
    total *= size_t(d);
  }
  array.data.resize(total);
  file.read(array.data.data(), total);
  return array;
}

std::vector<int64_t> readIdxShape(const std::string& path) {
  GzFile file(path, 1 << 10);
  return readShape(file, path);
}

}  // namespace hetra::train
