// Throughput of the gradient codecs on one core: encode and decode of a float32 buffer (64 MiB by
// default) per codec, the median of several repeats, against memcpy of the same buffer measured in
// the same run. GB/s counts the float32 input: bytes / (t_encode + t_decode) for the round trip.
//
//   codec_throughput [--mib 64] [--repeats 9] [--isa auto|scalar|avx2|avx512] [--block 256]
//   [--json]
//
// Prints a table, or with --json one JSON object per line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "comm/codec/codec.h"
#include "common/errors.h"

namespace {

using hetra::comm::Codec;
using hetra::comm::CodecIsa;
using hetra::comm::Compression;

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

template <class F>
double timeOnce(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return seconds(std::chrono::steady_clock::now() - start);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct Options {
  size_t mib = 64;
  int repeats = 9;
  CodecIsa isa = CodecIsa::Auto;
  size_t block = 256;
  bool json = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw hetra::ConfigError(hetra::str(arg, " needs a value"));
      return argv[++i];
    };
    if (arg == "--mib")
      o.mib = std::stoul(value());
    else if (arg == "--repeats")
      o.repeats = std::max(1, std::stoi(value()));
    else if (arg == "--isa")
      o.isa = hetra::comm::parseCodecIsa(value());
    else if (arg == "--block")
      o.block = std::stoul(value());
    else if (arg == "--json")
      o.json = true;
    else
      throw hetra::ConfigError(hetra::str(
          "unknown argument '", arg,
          "'; usage: codec_throughput [--mib N] [--repeats N] [--isa NAME] [--block N] [--json]"));
  }
  return o;
}

int run(const Options& o) {
  const size_t count = o.mib * 1024 * 1024 / sizeof(float);
  const double bytes = double(count * sizeof(float));
  // Gradient-like values: normal, with the scale varying slowly along the buffer.
  std::vector<float> input(count);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < count; ++i)
    input[i] = normal(rng) * std::ldexp(1e-2f, int((i >> 16) % 9) - 4);
  std::vector<float> output(count, 0.0f);
  std::vector<uint8_t> encoded(count * sizeof(float) + 1024, 0);  // touched: no page faults timed

  std::vector<double> copies;
  auto measureMemcpy = [&] {
    for (int r = 0; r < o.repeats; ++r)
      copies.push_back(timeOnce([&] { std::memcpy(output.data(), input.data(), count * 4); }));
  };
  measureMemcpy();

  const CodecIsa isa = hetra::comm::resolveCodecIsa(o.isa);
  struct Row {
    Compression kind;
    double encode, decode, decodeAdd, maxRelError;
  };
  std::vector<Row> rows;
  for (Compression kind :
       {Compression::F16, Compression::BF16, Compression::Fp8E4M3, Compression::Fp8E5M2}) {
    const auto codec = hetra::comm::makeCodec(kind, o.block, isa);
    std::vector<double> enc, dec, add;
    for (int r = 0; r < o.repeats; ++r) {
      enc.push_back(timeOnce([&] { codec->encode(input.data(), count, encoded.data()); }));
      dec.push_back(timeOnce([&] { codec->decode(encoded.data(), count, output.data()); }));
      add.push_back(timeOnce([&] { codec->decodeAdd(encoded.data(), count, output.data()); }));
    }
    // The round trip's largest error relative to the largest |x|, a sanity check of the data.
    codec->decode(encoded.data(), count, output.data());
    double maxError = 0, absmax = 0;
    for (size_t i = 0; i < count; ++i) {
      maxError = std::max(maxError, std::fabs(double(input[i]) - double(output[i])));
      absmax = std::max(absmax, std::fabs(double(input[i])));
    }
    rows.push_back({kind, median(enc), median(dec), median(add), maxError / absmax});
  }
  measureMemcpy();
  const double memcpyGBs = bytes / median(copies) / 1e9;

  if (!o.json) {
    std::printf("codec_throughput: %zu MiB float32, median of %d, one thread, isa %s\n", o.mib,
                o.repeats, hetra::comm::codecIsaName(isa));
    std::printf("cpu: %s\n", cpuModel().c_str());
    std::printf("memcpy: %.2f GB/s (%.2f ms)\n\n", memcpyGBs, median(copies) * 1e3);
    std::printf("%-9s %9s %9s %9s %13s %11s %11s %12s\n", "codec", "enc ms", "dec ms", "decAdd ms",
                "enc+dec GB/s", "vs memcpy", "bytes/elem", "max err/amax");
  }
  for (const Row& row : rows) {
    const auto codec = hetra::comm::makeCodec(row.kind, o.block, isa);
    const double gbs = bytes / (row.encode + row.decode) / 1e9;
    const double perElement = double(codec->encodedBytes(count)) / double(count);
    if (o.json) {
      std::printf(
          "{\"codec\":\"%s\",\"isa\":\"%s\",\"mib\":%zu,\"block\":%zu,\"repeats\":%d,"
          "\"encode_s\":%.6f,\"decode_s\":%.6f,\"decode_add_s\":%.6f,\"roundtrip_GBps\":%.3f,"
          "\"memcpy_GBps\":%.3f,\"ratio_to_memcpy\":%.3f,\"encoded_bytes_per_element\":%.4f,"
          "\"max_error_rel_absmax\":%.3g,\"cpu\":\"%s\"}\n",
          hetra::comm::compressionName(row.kind), hetra::comm::codecIsaName(isa), o.mib, o.block,
          o.repeats, row.encode, row.decode, row.decodeAdd, gbs, memcpyGBs, gbs / memcpyGBs,
          perElement, row.maxRelError, cpuModel().c_str());
    } else {
      std::printf("%-9s %9.2f %9.2f %9.2f %13.2f %11.2f %11.3f %12.3g\n",
                  hetra::comm::compressionName(row.kind), row.encode * 1e3, row.decode * 1e3,
                  row.decodeAdd * 1e3, gbs, gbs / memcpyGBs, perElement, row.maxRelError);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "codec_throughput: %s\n", e.what());
    return 2;
  }
}
