#include "train/idx.h"

#include <zlib.h>

#include "common/errors.h"

namespace hetra::train {
namespace {

// gzopen reads plain files too, so one path handles both forms.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) throw IoError(str("cannot open '", path, "'"));
    gzbuffer(file_, 1 << 20);
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

}  // namespace

IdxArray readIdx(const std::string& path) {
  GzFile file(path);
  uint8_t magic[4];
  file.read(magic, 4);
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    throw IoError(str("'", path, "' is not an unsigned-byte IDX file (magic ", int(magic[2]), "/",
                      int(magic[3]), ")"));
  IdxArray array;
  size_t total = 1;
  for (int d = 0; d < magic[3]; ++d) {
    uint8_t dim[4];
    file.read(dim, 4);
    array.shape.push_back(int64_t(bigEndian(dim)));
    total *= size_t(array.shape.back());
  }
  if (total > (size_t(1) << 34)) throw IoError(str("'", path, "' claims an absurd size"));
  array.data.resize(total);
  file.read(array.data.data(), total);
  return array;
}

}  // namespace hetra::train
