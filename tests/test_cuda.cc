// GPU tests (label gpu, built with HETRA_WITH_CUDA): the codec kernels against the CPU codecs bit
// for bit, the NCCL transport (one rank; every GPU of the machine when there are several; a rank
// that never joins), and device buffers staged through pinned memory over tcp. Every test skips
// with a message on a machine without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/codec/codec.h"
#include "comm/transport/tcp_transport.h"
#include "common/errors.h"
#include "cuda/codec_elements.h"
#include "cuda/codec_kernels.h"
#include "cuda/cuda_check.h"
#include "cuda/nccl_transport.h"
#include "cuda/staging.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::cuda {
namespace {

#define HETRA_SKIP_WITHOUT_GPU()                                                           \
  do {                                                                                     \
    if (cudaDeviceCount() == 0)                                                            \
      GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount = 0): GPU test skipped"; \
  } while (0)

// Device memory that frees itself.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    HETRA_CUDA_CHECK(cudaMalloc(&ptr, bytes ? bytes : 1));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr); }
  void upload(const void* from, size_t n, size_t offset = 0) {
    HETRA_CUDA_CHECK(cudaMemcpy(data() + offset, from, n, cudaMemcpyHostToDevice));
  }
  void download(void* to, size_t n, size_t offset = 0) const {
    HETRA_CUDA_CHECK(cudaMemcpy(to, data() + offset, n, cudaMemcpyDeviceToHost));
  }
  void* ptr = nullptr;
  size_t bytes;
};

using cuda::elements::bitsOf;
using cuda::elements::floatOf;

// Mixed inputs: blocks of different magnitudes, every float class (NaN payloads, Inf,
// subnormals), values at rounding boundaries.
std::vector<float> inputs(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> bits;
  const float special[] = {0.0f,
                           -0.0f,
                           INFINITY,
                           -INFINITY,
                           NAN,
                           -NAN,
                           FLT_MIN,
                           0x1p-149f,
                           FLT_MAX,
                           65520.0f,
                           448.0f,
                           57344.0f,
                           0x1p-25f,
                           floatOf(0x7f800001u),
                           floatOf(0xffbfffffu)};
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) {
    if (i % 41 == 3)
      x[i] = special[i % std::size(special)];
    else if (i % 17 == 5)
      x[i] = floatOf(bits(rng));
    else
      x[i] = gauss(rng) * std::ldexp(1.0f, int(i / 300 % 50) - 25);
  }
  return x;
}

bool sameOrBothNan(float a, float b) {
  return bitsOf(a) == bitsOf(b) || (std::isnan(a) && std::isnan(b));
}

TEST(CudaCodec, KernelsMatchTheCpuCodecsBitForBit) {
  HETRA_SKIP_WITHOUT_GPU();
  using comm::Compression;
  for (Compression kind :
       {Compression::F16, Compression::BF16, Compression::Fp8E4M3, Compression::Fp8E5M2})
    for (size_t blockSize : {size_t(1), size_t(7), size_t(32), size_t(256), size_t(1000)})
      for (size_t count : {size_t(0), size_t(1), size_t(31), size_t(4099), size_t((1 << 20) + 3)}) {
        if ((kind == Compression::F16 || kind == Compression::BF16) && blockSize != 256) continue;
        const std::string what = std::string(comm::compressionName(kind)) + " block " +
                                 std::to_string(blockSize) + " count " + std::to_string(count);
        auto codec = comm::makeCodec(kind, blockSize);
        const std::vector<float> x = inputs(count, uint32_t(count + blockSize));
        const size_t encoded = codec->encodedBytes(count);
        ASSERT_EQ(encodedBytes(kind, blockSize, count), encoded) << what;
        std::vector<uint8_t> want(encoded);
        codec->encode(x.data(), count, want.data());

        // Encode, at an aligned and an odd output address.
        DeviceBuffer in(count * 4), out(encoded + 1);
        in.upload(x.data(), count * 4);
        for (size_t offset : {size_t(0), size_t(1)}) {
          cudaEncode(kind, blockSize, reinterpret_cast<const float*>(in.data()), count,
                     out.data() + offset, nullptr);
          HETRA_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<uint8_t> got(encoded);
          out.download(got.data(), encoded, offset);
          ASSERT_TRUE(got == want) << what << " offset " << offset;
        }

        // Decode and decodeAdd of the CPU's bytes, and decode of arbitrary bytes.
        std::vector<uint8_t> noise(encoded);
        std::mt19937 rng(static_cast<unsigned>(count));
        for (auto& b : noise) b = uint8_t(rng());
        for (const std::vector<uint8_t>* bytes : {&want, &noise}) {
          DeviceBuffer src(encoded + 1), dst(count * 4);
          src.upload(bytes->data(), encoded, 1);  // odd address
          std::vector<float> cpu(count), gpu(count);
          codec->decode(bytes->data(), count, cpu.data());
          cudaDecode(kind, blockSize, src.data() + 1, count, reinterpret_cast<float*>(dst.data()),
                     nullptr);
          HETRA_CUDA_CHECK(cudaDeviceSynchronize());
          dst.download(gpu.data(), count * 4);
          for (size_t i = 0; i < count; ++i) {
            if (bytes == &want)  // real encodings decode bit for bit, NaNs included
              ASSERT_EQ(bitsOf(gpu[i]), bitsOf(cpu[i])) << what << " decode " << i;
            else  // arbitrary scales may be NaN: only the NaN payload may differ
              ASSERT_TRUE(sameOrBothNan(gpu[i], cpu[i])) << what << " noise decode " << i;
          }
          std::vector<float> base(count);
          for (size_t i = 0; i < count; ++i) base[i] = float(int(i % 29) - 14) * 0.375f;
          cpu = base;
          codec->decodeAdd(bytes->data(), count, cpu.data());
          dst.upload(base.data(), count * 4);
          cudaDecodeAdd(kind, blockSize, src.data() + 1, count,
                        reinterpret_cast<float*>(dst.data()), nullptr);
          HETRA_CUDA_CHECK(cudaDeviceSynchronize());
          dst.download(gpu.data(), count * 4);
          for (size_t i = 0; i < count; ++i)
            ASSERT_TRUE(sameOrBothNan(gpu[i], cpu[i])) << what << " decodeAdd " << i;
        }
      }
}

std::shared_ptr<store::Store> freshStore(const std::string& prefix) {
  return std::make_shared<store::PrefixStore>(prefix, std::make_shared<store::MemoryStore>());
}

TEST(NcclTransport, OneRankAllreduceAndSelfMessages) {
  HETRA_SKIP_WITHOUT_GPU();
  NcclOptions options;
  options.timeout = Millis(60000);
  options.device = 0;
  auto t = createNcclTransport(freshStore("one"), 0, 1, options);
  EXPECT_STREQ(t->name(), "nccl");
  const size_t count = 1001;
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = float(i) * 0.5f - 100.0f;
  DeviceBuffer in(count * 4), out(count * 4);
  in.upload(x.data(), count * 4);
  t->allreduce(in.data(), out.data(), count, DType::F32, comm::ReduceOp::Sum,
               deadlineAfter(Millis(30000)));
  std::vector<float> y(count);
  out.download(y.data(), count * 4);
  EXPECT_EQ(y, x);
  // A message to itself: the send and the receive are launched together by the first wait.
  DeviceBuffer back(count * 4);
  auto send = t->isend(0, 7, in.data(), count * 4);
  auto recv = t->irecv(0, 7, back.data(), count * 4);
  recv->wait(deadlineAfter(Millis(30000)));
  send->wait(deadlineAfter(Millis(30000)));
  back.download(y.data(), count * 4);
  EXPECT_EQ(y, x);
  EXPECT_EQ(t->bytesSent(), count * 4 * 2);  // the allreduce's and the message's
}

TEST(NcclTransport, RingExchangeAndAllreduceOverEveryGpu) {
  HETRA_SKIP_WITHOUT_GPU();
  const int n = cudaDeviceCount();
  if (n < 2) GTEST_SKIP() << "one CUDA device: the multi-rank NCCL test needs two or more";
  auto shared = freshStore("ring");
  const size_t count = 4099;  // odd
  test::runRanks(n, [&](int r) {
    NcclOptions options;
    options.timeout = Millis(120000);
    options.device = r;
    auto t = createNcclTransport(shared, r, n, options);
    std::vector<float> mine(count), fromLeft(count), sum(count);
    for (size_t i = 0; i < count; ++i) mine[i] = float(r * 10000 + int(i));
    DeviceBuffer a(count * 4), b(count * 4);
    a.upload(mine.data(), count * 4);
    // Send right, receive left, then wait: the batch launches both, so this cannot deadlock.
    auto send = t->isend((r + 1) % n, 1, a.data(), count * 4);
    auto recv = t->irecv((r + n - 1) % n, 1, b.data(), count * 4);
    send->wait(deadlineAfter(Millis(60000)));
    recv->wait(deadlineAfter(Millis(60000)));
    b.download(fromLeft.data(), count * 4);
    const int left = (r + n - 1) % n;
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(fromLeft[i], float(left * 10000 + int(i))) << "rank " << r << " element " << i;
    t->allreduce(a.data(), b.data(), count, DType::F32, comm::ReduceOp::Sum,
                 deadlineAfter(Millis(60000)));
    b.download(sum.data(), count * 4);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(sum[i], float(10000 * n * (n - 1) / 2 + n * int(i))) << "rank " << r;
  });
}

TEST(NcclTransport, ARankThatNeverJoinsTimesOut) {
  HETRA_SKIP_WITHOUT_GPU();
  NcclOptions options;
  options.timeout = Millis(3000);
  options.device = 0;
  const auto start = Clock::now();
  EXPECT_THROW(createNcclTransport(freshStore("alone"), 0, 2, options), TimeoutError);
  EXPECT_LT(secondsSince(start), 30.0) << "the timeout must bound initialisation";
}

// Two thread-ranks on GPU 0 move device buffers to each other through pinned slots over tcp.
TEST(Staging, DeviceBuffersOverTcpThroughPinnedSlots) {
  HETRA_SKIP_WITHOUT_GPU();
  for (size_t total : {size_t(0), size_t(1), size_t(1001), size_t(3 * 4096 + 12)}) {
    auto shared = freshStore("staging" + std::to_string(total));
    comm::TcpOptions tcp;
    tcp.timeout = Millis(10000);
    std::vector<std::unique_ptr<comm::Transport>> ranks(2);
    test::runRanks(2,
                   [&](int r) { ranks[size_t(r)] = comm::createTcpTransport(shared, r, 2, tcp); });
    std::vector<uint8_t> source(total), received(total, 0);
    for (size_t i = 0; i < total; ++i) source[i] = uint8_t(i * 11 + 5);
    test::runRanks(2, [&](int r) {
      HETRA_CUDA_CHECK(cudaSetDevice(0));
      DeviceStager stager(4096, 2);
      DeviceBuffer buffer(total);
      const Deadline deadline = deadlineAfter(Millis(20000));
      if (r == 0) {
        buffer.upload(source.data(), total);
        stager.send(*ranks[0], 1, 9, buffer.data(), total, 4, deadline);
      } else {
        stager.recv(*ranks[1], 0, 9, buffer.data(), total, 4, deadline);
        buffer.download(received.data(), total);
      }
    });
    EXPECT_EQ(received, source) << total;
  }
}

}  // namespace
}  // namespace hetra::cuda
