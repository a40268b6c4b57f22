// NCCL tests (label gpu, built with HETRA_WITH_CUDA): the NCCL transport with one rank, over every
// GPU of the machine when there are several, and a rank that never joins. Every test skips with a
// message on a machine without a CUDA device. The kernels and the staging: test_gpu_kernels.cc.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "cuda/nccl_transport.h"
#include "gpu_test_support.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::cuda {
namespace {

using test::DeviceBuffer;

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
  const int n = gpuDeviceCount();
  if (n < 2) GTEST_SKIP() << "one CUDA device: the multi-rank NCCL test needs two or more";
  auto shared = freshStore("ring");
  const size_t count = 4099;  // odd
  ::hetra::test::runRanks(n, [&](int r) {
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

}  // namespace
}  // namespace hetra::cuda
