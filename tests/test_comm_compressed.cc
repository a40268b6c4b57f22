// Compressed collectives through the communicator, over both transports: results against the exact
// float32 reduction within the documented bound (which must not grow with the world size), bitwise
// identical results on every rank, bytes on the wire from the transport counters, uneven blocks,
// the size floor, and a mismatched compression setting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "comm/communicator.h"
#include "comm/transport/transport.h"
#include "common/errors.h"
#include "harness.h"

namespace hetra::comm {
namespace {

using test::runRanks;

constexpr Compression kCodecs[] = {Compression::F16, Compression::BF16, Compression::Fp8E4M3,
                                   Compression::Fp8E5M2};

GroupOptions groupOn(const std::string& transport) {
  GroupOptions o;
  o.transport = transport;
  o.timeout = Millis(20000);
  return o;
}

// The operations' policy: every size compressed with `kind` unless a floor is given.
OpPolicy compressedWith(Compression kind, size_t minBytes = 0) {
  OpPolicy policy;
  policy.compression = CompressionPolicy(kind, 256, minBytes);
  return policy;
}

// Inputs of rank r: distinct per rank and element, signed, spanning a few binades (and all within
// fp16's normal range, where the unit roundoff bound holds).
std::vector<float> inputOf(int rank, size_t count) {
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> mantissa(0.5f, 1.0f);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    const float sign = (i + rank) % 3 == 0 ? -1.0f : 1.0f;
    values[i] = sign * std::ldexp(mantissa(rng), int((i * 7 + rank) % 9) - 4);
  }
  return values;
}

double maxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

struct Case {
  std::string transport;
  Compression codec;
};

class CompressedAllreduce : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Error of every element against the exact sum, normalised by the bound's scale (u times the sum
// of the ranks' absolute maxima plus the result's): at most 1 for every codec and world size.
TEST_P(CompressedAllreduce, WithinTheBoundAndIdenticalOnEveryRank) {
  const auto [transport, n] = GetParam();
  for (Compression kind : kCodecs) {
    for (size_t count : {size_t(1), size_t(7), size_t(4099), size_t(150001)}) {
      auto store = std::make_shared<store::MemoryStore>();
      std::vector<std::vector<float>> results(n);
      double scale = 0;
      std::vector<double> exact(count, 0.0);
      for (int r = 0; r < n; ++r) {
        const auto in = inputOf(r, count);
        scale += maxAbs(in);
        for (size_t i = 0; i < count; ++i) exact[i] += in[i];
      }
      double exactMax = 0;
      for (double x : exact) exactMax = std::max(exactMax, std::fabs(x));
      const double bound = unitRoundoff(kind) * (scale + exactMax) + 1e-6 * scale;
      runRanks(n, [&](int r) {
        auto comm = Communicator::create(store, r, n, groupOn(transport));
        auto buffer = inputOf(r, count);
        std::vector<float> out(count, -1.0f);
        comm->allreduce(buffer.data(), out.data(), count, DType::F32, ReduceOp::Sum,
                        compressedWith(kind))
            ->wait();
        results[r] = out;
      });
      double worst = 0;
      for (size_t i = 0; i < count; ++i)
        worst = std::max(worst, std::fabs(results[0][i] - exact[i]));
      EXPECT_LE(worst, bound) << compressionName(kind) << " n " << n << " count " << count;
      // The codec really ran: the result is not the exact float32 sum everywhere.
      if (count > 1000) {
        EXPECT_GT(worst, 0.0) << compressionName(kind);
      }
      for (int r = 1; r < n; ++r)
        ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), count * sizeof(float)))
            << compressionName(kind) << ": rank " << r << " differs from rank 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TransportsAndWorldSizes, CompressedAllreduce,
                         ::testing::Combine(::testing::Values("shm", "tcp"),
                                            ::testing::Values(2, 3, 5, 8)));

// The normalised error of fp8 stays the same as ranks are added: it does not grow with n (a ring
// that re-encodes partial sums would add one rounding per hop).
TEST(CompressedAllreduceError, DoesNotGrowWithTheWorldSize) {
  const size_t count = 20000;
  std::map<int, double> normalised;
  for (int n : {2, 4, 8}) {
    auto store = std::make_shared<store::MemoryStore>();
    std::vector<float> result(count);
    std::vector<double> exact(count, 0.0);
    double scale = 0;
    for (int r = 0; r < n; ++r) {
      const auto in = inputOf(r, count);
      scale += maxAbs(in);
      for (size_t i = 0; i < count; ++i) exact[i] += in[i];
    }
    runRanks(n, [&](int r) {
      auto comm = Communicator::create(store, r, n, groupOn("shm"));
      auto buffer = inputOf(r, count);
      comm->allreduce(buffer.data(), buffer.data(), count, DType::F32, ReduceOp::Sum,
                      compressedWith(Compression::Fp8E4M3))
          ->wait();
      if (r == 0) result = buffer;
    });
    double rms = 0;
    for (size_t i = 0; i < count; ++i) rms += std::pow(result[i] - exact[i], 2);
    normalised[n] = std::sqrt(rms / count) / scale;
  }
  EXPECT_LE(normalised[8], 1.25 * normalised[2])
      << "2 ranks " << normalised[2] << ", 8 ranks " << normalised[8];
}

TEST(CompressedAllreduceBytes, WireBytesShrinkByTheCodecsRatio) {
  constexpr int n = 3;
  const size_t count = 1 << 20;
  for (Compression kind : kCodecs) {
    auto store = std::make_shared<store::MemoryStore>();
    std::vector<double> ratio(n);
    runRanks(n, [&](int r) {
      auto comm = Communicator::create(store, r, n, groupOn("tcp"));
      auto buffer = inputOf(r, count);
      auto bytesOf = [&](const OpPolicy& policy) {
        const uint64_t before = comm->transport().bytesSent();
        comm->allreduce(buffer.data(), buffer.data(), count, DType::F32, ReduceOp::Sum, policy)
            ->wait();
        return double(comm->transport().bytesSent() - before);
      };
      const double fp32 = bytesOf(OpPolicy{});
      ratio[r] = bytesOf(compressedWith(kind)) / fp32;
    });
    const double limit = kind == Compression::F16 || kind == Compression::BF16 ? 0.51 : 0.26;
    for (int r = 0; r < n; ++r)
      EXPECT_LE(ratio[r], limit) << compressionName(kind) << " rank " << r;
    EXPECT_GE(ratio[0], limit - 0.03) << compressionName(kind);
  }
}

TEST(CompressedCollectives, AvgReduceScatterAndAllgatherWithUnevenBlocks) {
  constexpr int n = 5;
  const std::vector<size_t> counts = {3001, 0, 17, 8192, 4097};
  const size_t total = 3001 + 17 + 8192 + 4097;
  auto store = std::make_shared<store::MemoryStore>();
  std::vector<std::vector<float>> inputs(n);
  for (int r = 0; r < n; ++r) inputs[r] = inputOf(r, total);
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOn("tcp"));
    const OpPolicy bf16 = compressedWith(Compression::BF16);
    const double u = unitRoundoff(Compression::BF16);
    size_t offset = 0;
    for (int b = 0; b < r; ++b) offset += counts[b];

    std::vector<float> mine(counts[r] + 1, -7.0f);
    comm->reduceScatter(inputs[r].data(), mine.data(), counts, DType::F32, ReduceOp::Avg, bf16)
        ->wait();
    double scale = 0;
    for (int q = 0; q < n; ++q) scale += maxAbs(inputs[q]) / n;
    for (size_t i = 0; i < counts[r]; ++i) {
      double exact = 0;
      for (int q = 0; q < n; ++q) exact += inputs[q][offset + i] / n;
      ASSERT_NEAR(mine[i], exact, u * scale + 1e-6) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(mine[counts[r]], -7.0f) << "reduce-scatter wrote past its block";

    std::vector<float> block(inputs[r].begin() + offset, inputs[r].begin() + offset + counts[r]);
    std::vector<float> all(total, 0.0f);
    comm->allgather(block.data(), all.data(), counts, DType::F32, bf16)->wait();
    size_t at = 0;
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < counts[b]; ++i, ++at) {
        const float expected = inputs[b][at];
        ASSERT_NEAR(all[at], expected, u * std::fabs(expected) + 1e-30)
            << "rank " << r << " block " << b << " element " << i;
      }
  });
}

// Error feedback on a reduce-scatter (ZeRO's compressed gradients): the same inputs reduced T
// times. Without it each call loses the same rounding, T times over; with it what a call loses is
// added to the next one's, so the sum of the T results stays within one call's rounding of T
// times the exact sum. The own block, never encoded, leaves its residual untouched.
TEST(CompressedCollectives, ReduceScatterWithErrorFeedbackLosesNothingOverCalls) {
  constexpr int kCalls = 40;
  for (const auto& [transport, n] : {std::pair<std::string, int>{"tcp", 3}, {"shm", 5}}) {
    std::vector<size_t> counts = {1500, 0, 700, 4097, 33};
    counts.resize(size_t(n));
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<std::vector<float>> inputs(n);
    for (int r = 0; r < n; ++r) inputs[r] = inputOf(r, total);
    double scale = 0;
    for (int q = 0; q < n; ++q) scale += maxAbs(inputs[q]);
    const double u = unitRoundoff(Compression::Fp8E5M2);
    auto store = std::make_shared<store::MemoryStore>();
    runRanks(n, [&](int r) {
      auto comm = Communicator::create(store, r, n, groupOn(transport));
      size_t offset = 0;
      for (int b = 0; b < r; ++b) offset += counts[b];
      OpPolicy withFeedback = compressedWith(Compression::Fp8E5M2);
      ASSERT_NE(comm->feedbackCodec(OpKind::ReduceScatter, DType::F32, ReduceOp::Sum, total,
                                    withFeedback),
                nullptr);
      std::vector<float> residual(total, 0.0f);
      const float kUntouched = 0.25f;  // the own block's residual is never written
      std::fill(residual.begin() + long(offset), residual.begin() + long(offset + counts[r]),
                kUntouched);
      withFeedback.residual = residual.data();
      std::vector<double> fedBack(counts[r], 0.0), plain(counts[r], 0.0);
      std::vector<float> out(counts[r]);
      for (int t = 0; t < kCalls; ++t) {
        comm->reduceScatter(inputs[r].data(), out.data(), counts, DType::F32, ReduceOp::Sum,
                            withFeedback)
            ->wait();
        for (size_t i = 0; i < counts[r]; ++i) fedBack[i] += out[i];
        comm->reduceScatter(inputs[r].data(), out.data(), counts, DType::F32, ReduceOp::Sum,
                            compressedWith(Compression::Fp8E5M2))
            ->wait();
        for (size_t i = 0; i < counts[r]; ++i) plain[i] += out[i];
      }
      double worstFedBack = 0, worstPlain = 0;
      for (size_t i = 0; i < counts[r]; ++i) {
        double exact = 0;
        for (int q = 0; q < n; ++q) exact += double(inputs[q][offset + i]);
        worstFedBack = std::max(worstFedBack, std::fabs(fedBack[i] - kCalls * exact));
        worstPlain = std::max(worstPlain, std::fabs(plain[i] - kCalls * exact));
        ASSERT_EQ(residual[offset + i], kUntouched) << transport << " rank " << r << " " << i;
      }
      if (counts[r] == 0) return;
      EXPECT_LE(worstFedBack, 2 * u * scale) << transport << " rank " << r;
      EXPECT_LT(worstFedBack, 0.2 * worstPlain) << transport << " rank " << r;
    });
  }
}

TEST(CompressedCollectives, BuffersBelowTheFloorStayExact) {
  constexpr int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOn("shm"));
    const size_t count = 1000;  // 4000 bytes: below the floor
    auto buffer = inputOf(r, count);
    comm->allreduce(buffer.data(), buffer.data(), count, DType::F32, ReduceOp::Sum,
                    compressedWith(Compression::Fp8E5M2, 4096))
        ->wait();
    for (size_t i = 0; i < count; ++i) {
      float exact = 0;
      for (int q = 0; q < n; ++q) exact += inputOf(q, count)[i];
      ASSERT_FLOAT_EQ(buffer[i], exact) << "element " << i;
    }
  });
}

TEST(CompressedCollectives, MismatchedCompressionFailsOnEveryRank) {
  constexpr int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  auto errors = test::runRanksCollect(n, [&](int r) {
    GroupOptions options = groupOn("tcp");
    options.timeout = Millis(5000);
    auto comm = Communicator::create(store, r, n, options);
    auto buffer = inputOf(r, 5000);
    comm->allreduce(buffer.data(), buffer.data(), buffer.size(), DType::F32, ReduceOp::Sum,
                    compressedWith(r == 1 ? Compression::F16 : Compression::BF16))
        ->wait();
  });
  test::expectMismatchOnEveryRank(errors, "compressed");
}

}  // namespace
}  // namespace hetra::comm
