// GPU tests of the code that CUDA and ROCm builds share (label gpu; built with HETRA_WITH_CUDA or
// HETRA_WITH_ROCM): the codec kernels against the CPU codecs bit for bit, and device buffers
// staged through pinned memory over tcp. Every test skips with a message on a machine without a
// GPU.
#include <gtest/gtest.h>

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
#include "cuda/staging.h"
#include "gpu_test_support.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::cuda {
namespace {

using test::DeviceBuffer;

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

TEST(GpuCodec, KernelsMatchTheCpuCodecsBitForBit) {
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

// Two thread-ranks on GPU 0 move device buffers to each other through pinned slots over tcp.
TEST(Staging, DeviceBuffersOverTcpThroughPinnedSlots) {
  HETRA_SKIP_WITHOUT_GPU();
  for (size_t total : {size_t(0), size_t(1), size_t(1001), size_t(3 * 4096 + 12)}) {
    auto shared = freshStore("staging" + std::to_string(total));
    comm::TcpOptions tcp;
    tcp.timeout = Millis(10000);
    std::vector<std::unique_ptr<comm::Transport>> ranks(2);
    ::hetra::test::runRanks(
        2, [&](int r) { ranks[size_t(r)] = comm::createTcpTransport(shared, r, 2, tcp); });
    std::vector<uint8_t> source(total), received(total, 0);
    for (size_t i = 0; i < total; ++i) source[i] = uint8_t(i * 11 + 5);
    ::hetra::test::runRanks(2, [&](int r) {
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
