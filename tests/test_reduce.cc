#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "comm/reduce.h"
#include "harness.h"

namespace hetra::comm {
namespace {

// Scalar reference: every element converted to double, reduced, converted back to the dtype.
double load(DType d, const std::vector<uint8_t>& b, size_t i) {
  return loadElement(d, b.data(), i);
}
void store(DType d, std::vector<uint8_t>& b, size_t i, double v) {
  storeElement(d, b.data(), i, v);
}
class ReduceTest : public ::testing::TestWithParam<std::tuple<DType, ReduceOp>> {};

TEST_P(ReduceTest, ManySourcesMatchScalarReference) {
  const auto [dtype, op] = GetParam();
  std::mt19937 rng(11);
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(513), size_t(4099), size_t(70001)}) {
    for (int n : {1, 2, 3, 5}) {
      std::vector<std::vector<uint8_t>> srcs(n, std::vector<uint8_t>(count * dtypeSize(dtype) + 1));
      for (int k = 0; k < n; ++k)
        for (size_t i = 0; i < count; ++i)
          store(dtype, srcs[k], i,
                dtype == DType::U8 ? double(rng() % 50) : double(int(rng() % 200) - 100) * 0.5);
      std::vector<const void*> ptrs;
      for (auto& s : srcs) ptrs.push_back(s.data());
      std::vector<uint8_t> out(count * dtypeSize(dtype) + 1);
      reduceMany(op, dtype, out.data(), ptrs.data(), n, count);
      for (size_t i = 0; i < count; ++i) {
        double want = load(dtype, srcs[0], i);
        for (int k = 1; k < n; ++k) {
          const double v = load(dtype, srcs[k], i);
          want = op == ReduceOp::Min   ? std::min(want, v)
                 : op == ReduceOp::Max ? std::max(want, v)
                                       : want + v;
        }
        std::vector<uint8_t> rounded(16);
        store(dtype, rounded, 0, want);  // the reference rounds once, as the kernel must
        ASSERT_EQ(load(dtype, out, i), load(dtype, rounded, 0))
            << dtypeName(dtype) << " " << reduceOpName(op) << " n=" << n << " count=" << count
            << " i=" << i;
      }
    }
  }
}

TEST_P(ReduceTest, InPlaceOnFirstSource) {
  const auto [dtype, op] = GetParam();
  const size_t count = 1001;
  std::vector<uint8_t> a(count * dtypeSize(dtype)), b(count * dtypeSize(dtype));
  // Distinct per (source, element) as far as the dtype allows, sums exact (harness.h).
  const test::DistinctValues values(dtype, 2);
  for (size_t i = 0; i < count; ++i) {
    store(dtype, a, i, values(0, i));
    store(dtype, b, i, values(1, i));
  }
  auto expected = a;
  for (size_t i = 0; i < count; ++i) {
    const double x = load(dtype, a, i), y = load(dtype, b, i);
    store(dtype, expected, i,
          op == ReduceOp::Min   ? std::min(x, y)
          : op == ReduceOp::Max ? std::max(x, y)
                                : x + y);
  }
  reduce(op, dtype, a.data(), a.data(), b.data(), count);
  EXPECT_EQ(a, expected);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllDTypes),
                                            ::testing::Values(ReduceOp::Sum, ReduceOp::Min,
                                                              ReduceOp::Max)),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) + "_" +
                                  reduceOpName(std::get<1>(info.param));
                         });

TEST(Reduce, HalfTypesAccumulateInFloat32) {
  // 2048 + 1 + 1 in float16: pairwise rounding gives 2048 (the +1 is lost twice); float32
  // accumulation with one final rounding gives 2050.
  const uint16_t big = hetra::floatToHalf(2048.0f), one = hetra::floatToHalf(1.0f);
  const void* srcs[3] = {&big, &one, &one};
  uint16_t out = 0;
  reduceMany(ReduceOp::Sum, DType::F16, &out, srcs, 3, 1);
  EXPECT_EQ(hetra::halfToFloat(out), 2050.0f);
}

TEST(Reduce, NaNPropagatesThroughMinAndMax) {
  const float a[2] = {NAN, 1.0f}, b[2] = {0.0f, NAN};
  float out[2];
  reduce(ReduceOp::Min, DType::F32, out, a, b, 2);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
  reduce(ReduceOp::Max, DType::F32, out, a, b, 2);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
}

TEST(Reduce, DivideForAverage) {
  std::vector<float> f = {3, 6, 9};
  divide(DType::F32, f.data(), 3, 3);
  EXPECT_EQ(f, (std::vector<float>{1, 2, 3}));
  std::vector<int32_t> i = {-7, 7};
  divide(DType::I32, i.data(), 2, 2);
  EXPECT_EQ(i, (std::vector<int32_t>{-3, 3}));
  std::vector<uint16_t> h = {hetra::floatToHalf(5.0f)};
  divide(DType::F16, h.data(), 1, 2);
  EXPECT_EQ(hetra::halfToFloat(h[0]), 2.5f);
}

TEST(Reduce, BulkConversionsMatchScalar) {
  std::mt19937 rng(3);
  std::vector<float> f(1037);
  for (auto& x : f) x = std::ldexp(float(int(rng() % 20000) - 10000), int(rng() % 40) - 30);
  f[5] = NAN;
  f[6] = INFINITY;
  std::vector<uint16_t> h(f.size()), b(f.size());
  floatToHalf(f.data(), h.data(), f.size());
  floatToBFloat16(f.data(), b.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::isnan(f[i])) {
      EXPECT_TRUE(std::isnan(hetra::halfToFloat(h[i])));
      EXPECT_TRUE(std::isnan(hetra::bfloat16ToFloat(b[i])));
      continue;
    }
    ASSERT_EQ(h[i], hetra::floatToHalf(f[i])) << i;
    ASSERT_EQ(b[i], hetra::floatToBFloat16(f[i])) << i;
  }
  std::vector<float> back(f.size());
  halfToFloat(h.data(), back.data(), h.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (!std::isnan(f[i])) {
      ASSERT_EQ(back[i], hetra::halfToFloat(h[i]));
    }
  }
}

// The collective tests' inputs (harness.h) keep their promise: exact in the dtype, the sum over
// the group exact, distinct per (rank, element) over a window, and a period coprime with 2..10.
TEST(DistinctValues, ExactSummableAndDistinctInEveryDtype) {
  for (DType dtype : kAllDTypes) {
    for (int ranks = 1; ranks <= 10; ++ranks) {
      const test::DistinctValues values(dtype, ranks);
      SCOPED_TRACE(str(dtypeName(dtype), " ranks ", ranks));
      ASSERT_EQ(std::gcd(values.period, int64_t(2 * 3 * 5 * 7)), 1);
      ASSERT_GT(values.window * ranks, values.period - ranks) << "window " << values.window;
      std::vector<uint8_t> cell(16);
      for (size_t start : {size_t(0), size_t(values.period - 1), size_t(123457)}) {
        std::set<double> seen;
        // The wide types' windows run to millions of elements: their first 3000 stand for them.
        const size_t checked = std::min<size_t>(size_t(values.window), 3000);
        for (size_t i = start; i < start + checked; ++i) {
          double sum = 0;
          for (int r = 0; r < ranks; ++r) {
            const double v = values(r, i);
            store(dtype, cell, 0, v);
            ASSERT_EQ(load(dtype, cell, 0), v) << "not exact: rank " << r << " element " << i;
            ASSERT_TRUE(seen.insert(v).second) << "repeated: rank " << r << " element " << i;
            sum += v;
            store(dtype, cell, 0, sum);
            ASSERT_EQ(load(dtype, cell, 0), sum) << "partial sum not exact at element " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hetra::comm
