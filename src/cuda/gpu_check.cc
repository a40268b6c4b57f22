// hetra-gpu-check: the measurements of scripts/gpu-check.sh that need a GPU, one line each
// ("name<TAB>value<TAB>unit<TAB>note"), exit status 1 when a check fails:
//   memcpy      device-to-device copy bandwidth (read + write bytes per second): the memory bound
//   codec/*     encode, decode, decodeAdd throughput of the kernels, as float32 bytes per second
//               and as memory traffic relative to the copy bandwidth
//   nccl        one-rank NCCL allreduce (forms a communicator, runs, checks the values)
//   hetero      one GPU rank and two CPU ranks (threads) allreduce float32 gradients with fp8
//               compression over tcp; the GPU rank's values live on the device, its contribution
//               is staged through pinned memory; every rank must end with the same bits, and the
//               GPU's fp8 encoding must equal the CPU's.
#include <cuda_runtime.h>  // the typed cudaMalloc overloads

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/codec/codec.h"
#include "comm/communicator.h"
#include "common/errors.h"
#include "cuda/codec_kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/nccl_transport.h"
#include "cuda/staging.h"
#include "store/store.h"

namespace hetra::cuda {
namespace {

int failures = 0;

void line(const std::string& name, double value, const char* unit, const std::string& note) {
  std::printf("%s\t%.3f\t%s\t%s\n", name.c_str(), value, unit, note.c_str());
  std::fflush(stdout);
}

void fail(const std::string& name, const std::string& why) {
  std::printf("%s\tFAIL\t-\t%s\n", name.c_str(), why.c_str());
  std::fflush(stdout);
  ++failures;
}

// Median-free but warm: one untimed run, then `reps` runs timed with events.
template <class F>
double secondsPerRun(F&& run, int reps) {
  run();
  cudaEvent_t start, stop;
  HETRA_CUDA_CHECK(cudaEventCreate(&start));
  HETRA_CUDA_CHECK(cudaEventCreate(&stop));
  HETRA_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) run();
  HETRA_CUDA_CHECK(cudaEventRecord(stop));
  HETRA_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  HETRA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / 1000.0 / reps;
}

void measure(size_t count) {
  const size_t bytes = count * sizeof(float);
  float* in = nullptr;
  float* out = nullptr;
  void* encoded = nullptr;
  HETRA_CUDA_CHECK(cudaMalloc(&in, bytes));
  HETRA_CUDA_CHECK(cudaMalloc(&out, bytes));
  HETRA_CUDA_CHECK(cudaMalloc(&encoded, bytes / 2 + 4096));
  std::vector<float> host(count);
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss(0.0f, 1e-3f);
  for (auto& v : host) v = gauss(rng);
  HETRA_CUDA_CHECK(cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice));

  const double copy = secondsPerRun(
      [&] { HETRA_CUDA_CHECK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const double bandwidth = 2.0 * double(bytes) / copy;  // read + write
  line("memcpy", bandwidth / 1e9, "GB/s", "device-to-device, read+write bytes");

  using comm::Compression;
  for (Compression kind :
       {Compression::F16, Compression::BF16, Compression::Fp8E4M3, Compression::Fp8E5M2}) {
    const size_t block = 256;
    const double encodedBytesTotal = double(encodedBytes(kind, block, count));
    const double enc =
        secondsPerRun([&] { cudaEncode(kind, block, in, count, encoded, nullptr); }, 20);
    const double dec =
        secondsPerRun([&] { cudaDecode(kind, block, encoded, count, out, nullptr); }, 20);
    const double add =
        secondsPerRun([&] { cudaDecodeAdd(kind, block, encoded, count, out, nullptr); }, 20);
    const std::string name = std::string("codec/") + comm::compressionName(kind);
    // Traffic: encode reads the floats and writes the codes; decode the reverse; decodeAdd
    // reads the codes and reads + writes the floats.
    const double encTraffic = double(bytes) + encodedBytesTotal;
    const double addTraffic = 2.0 * double(bytes) + encodedBytesTotal;
    line(name + "/encode", double(bytes) / enc / 1e9, "GB/s",
         str(int(100 * encTraffic / enc / bandwidth), "% of memcpy bandwidth"));
    line(name + "/decode", double(bytes) / dec / 1e9, "GB/s",
         str(int(100 * encTraffic / dec / bandwidth), "% of memcpy bandwidth"));
    line(name + "/decodeAdd", double(bytes) / add / 1e9, "GB/s",
         str(int(100 * addTraffic / add / bandwidth), "% of memcpy bandwidth"));
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(encoded);
}

void ncclOneRank() {
  try {
    NcclOptions options;
    options.timeout = Millis(60000);
    options.device = 0;
    auto t = createNcclTransport(
        std::make_shared<store::PrefixStore>("nccl", std::make_shared<store::MemoryStore>()), 0, 1,
        options);
    const size_t count = size_t(1) << 24;
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = float(i % 1000) - 500.0f;
    float* buf = nullptr;
    HETRA_CUDA_CHECK(cudaMalloc(&buf, count * 4));
    HETRA_CUDA_CHECK(cudaMemcpy(buf, x.data(), count * 4, cudaMemcpyHostToDevice));
    const auto start = Clock::now();
    t->allreduce(buf, buf, count, DType::F32, comm::ReduceOp::Sum, deadlineAfter(Millis(30000)));
    const double seconds = secondsSince(start);
    std::vector<float> y(count);
    HETRA_CUDA_CHECK(cudaMemcpy(y.data(), buf, count * 4, cudaMemcpyDeviceToHost));
    cudaFree(buf);
    if (y != x) return fail("nccl", "one-rank allreduce changed the values");
    line("nccl", seconds * 1e3, "ms", "one-rank allreduce of 64 MiB, values checked");
  } catch (const std::exception& e) {
    fail("nccl", e.what());
  }
}

void heterogeneous() {
  const int size = 3;
  const size_t count = (size_t(1) << 20) + 37;
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::vector<float>> results(size);
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::GroupOptions options;
        options.transport = "tcp";
        options.vendor = r == 0 ? "nvidia" : "cpu";
        options.timeout = Millis(60000);
        const comm::Compression compression = comm::Compression::Fp8E4M3;
        comm::OpPolicy policy;
        policy.compression = comm::CompressionPolicy(compression);
        auto group = comm::Communicator::create(
            std::make_shared<store::PrefixStore>("hetero", store), r, size, options);
        std::vector<float> grad(count);
        for (size_t i = 0; i < count; ++i)
          grad[i] = std::sin(float(i) * 0.001f + float(r)) * std::ldexp(1.0f, int(i % 7) - 3);
        if (r == 0) {
          // The GPU rank: gradients on the device; its fp8 encoding must equal the CPU's, and it
          // joins the host allreduce through a pinned staging buffer.
          HETRA_CUDA_CHECK(cudaSetDevice(0));
          float* dev = nullptr;
          void* enc = nullptr;
          const size_t encodedSize = encodedBytes(compression, 256, count);
          HETRA_CUDA_CHECK(cudaMalloc(&dev, count * 4));
          HETRA_CUDA_CHECK(cudaMalloc(&enc, encodedSize));
          HETRA_CUDA_CHECK(cudaMemcpy(dev, grad.data(), count * 4, cudaMemcpyHostToDevice));
          cudaEncode(compression, 256, dev, count, enc, nullptr);
          std::vector<uint8_t> gpuBytes(encodedSize), cpuBytes(encodedSize);
          HETRA_CUDA_CHECK(cudaMemcpy(gpuBytes.data(), enc, encodedSize, cudaMemcpyDeviceToHost));
          comm::makeCodec(compression, 256)->encode(grad.data(), count, cpuBytes.data());
          if (gpuBytes != cpuBytes) throw MismatchError("GPU fp8 bytes differ from the CPU's");
          PinnedBuffer pinned(count * 4);
          HETRA_CUDA_CHECK(cudaMemcpy(pinned.data(), dev, count * 4, cudaMemcpyDeviceToHost));
          auto* host = reinterpret_cast<float*>(pinned.data());
          group->allreduce(host, host, count, DType::F32, comm::ReduceOp::Sum, policy)->wait();
          HETRA_CUDA_CHECK(cudaMemcpy(dev, host, count * 4, cudaMemcpyHostToDevice));
          results[0].resize(count);
          HETRA_CUDA_CHECK(cudaMemcpy(results[0].data(), dev, count * 4, cudaMemcpyDeviceToHost));
          cudaFree(dev);
          cudaFree(enc);
        } else {
          group->allreduce(grad.data(), grad.data(), count, DType::F32, comm::ReduceOp::Sum, policy)
              ->wait();
          results[size_t(r)] = grad;
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r)
    if (!errors[size_t(r)].empty()) return fail("hetero", str("rank ", r, ": ", errors[size_t(r)]));
  for (int r = 1; r < size; ++r)
    if (std::memcmp(results[0].data(), results[size_t(r)].data(), count * 4) != 0)
      return fail("hetero", str("rank ", r, "'s result differs from the GPU rank's"));
  line("hetero", secondsSince(start) * 1e3, "ms",
       "1 GPU + 2 CPU ranks, fp8 allreduce over tcp, identical bits on all ranks");
}

}  // namespace
}  // namespace hetra::cuda

int main(int argc, char** argv) {
  using namespace hetra::cuda;
  const int devices = gpuDeviceCount();
  if (devices == 0) {
    std::printf("gpu\tFAIL\t-\tno CUDA device visible\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("gpu\t%d\tdevices\t%s, sm_%d%d\n", devices, prop.name, prop.major, prop.minor);
  const size_t count = argc > 1 ? size_t(std::stoull(argv[1])) : size_t(1) << 26;
  try {
    measure(count);
  } catch (const std::exception& e) {
    fail("codec", e.what());
  }
  ncclOneRank();
  heterogeneous();
  return failures ? 1 : 0;
}
