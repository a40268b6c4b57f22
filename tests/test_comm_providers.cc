// The provider table (comm/providers/registry.h): every rank chooses the same provider, a forced
// provider is honoured or refused with a ConfigError, every provider equals the exact result for
// each operation it declares, the hierarchy's reduce-scatter and allgather(v) with uneven counts
// and islands, and a provider registered through the public path is chosen when it is cheapest.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>

#include "comm/communicator.h"
#include "comm/providers/registry.h"
#include "comm/transport/transport.h"
#include "common/errors.h"
#include "harness.h"
#include "store/store.h"

namespace hetra::comm {
namespace {

using test::runRanks;
using test::runRanksCollect;

constexpr DType kDtypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16,
                             DType::I32, DType::I64, DType::U8};

// A value for (rank, element) that is exact in `dtype` and whose sums over up to 8 ranks stay
// exact: distinct per (rank, element) over a period longer than the counts tested for the wide
// types; as distinct as the type allows for the narrow ones (a period coprime with the world
// sizes, so neighbouring ranks never repeat each other's element).
double valueOf(DType dtype, int rank, size_t i) {
  switch (dtype) {
    case DType::F32:
    case DType::I32:
      return double((rank * 200003 + i * 7) % 1000003) - 500000;  // |sum of 8| < 2^24
    case DType::F64:
    case DType::I64:
      return double(rank) * 1e9 + double(i) * 3 - 7e8;
    case DType::F16:
      return double((rank * 37 + i * 11) % 251) - 125;  // |sum of 8| < 2^11
    case DType::BF16:
      return double((rank * 5 + i * 3) % 31) - 15;  // |sum of 8| < 2^8
    case DType::U8:
      return double((rank * 3 + i) % 31);  // sum of 8 < 256
  }
  return 0;
}

double reduceRef(DType dtype, ReduceOp op, int n, size_t i) {
  return test::reduceOverRanks(op, n, [&](int r) { return valueOf(dtype, r, i); });
}

std::vector<uint8_t> filled(DType dtype, int rank, size_t from, size_t count) {
  std::vector<uint8_t> buffer(std::max<size_t>(1, count) * dtypeSize(dtype));
  for (size_t i = 0; i < count; ++i)
    storeElement(dtype, buffer.data(), i, valueOf(dtype, rank, from + i));
  return buffer;
}

GroupOptions groupOf(const std::string& transport, const std::string& algorithm = "auto",
                     std::vector<int> islands = {}) {
  GroupOptions o;
  o.transport = transport;
  o.timeout = Millis(20000);
  o.algorithm = algorithm;
  o.islands = std::move(islands);
  return o;
}

// Uneven counts with an empty block: rank r gets (r * 7 + 3) % 11 + base elements, rank 1 none.
std::vector<size_t> unevenCounts(int n, size_t base) {
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : (r * 7 + 3) % 11 + base;
  return counts;
}

TEST(Providers, EveryRankChoosesTheSameProviderForEveryOperation) {
  for (const std::string transport : {"shm", "tcp"}) {
    for (int n : {1, 2, 3, 5}) {
      auto store = std::make_shared<store::MemoryStore>();
      std::vector<std::vector<std::string>> chosen(n);
      runRanks(n, [&](int r) {
        // Islands {0, 0, 1, ...}: a hierarchy where there are two islands of which one has two.
        std::vector<int> islands(n, 1);
        islands[0] = 0;
        if (n > 1) islands[1] = 0;
        auto comm = Communicator::create(store, r, n, groupOf(transport, "auto", islands));
        OpPolicy exact, fp8;
        fp8.compression = CompressionPolicy(Compression::Fp8E4M3, 256, 4096);
        for (OpKind kind : {OpKind::Allreduce, OpKind::ReduceScatter, OpKind::Allgather,
                            OpKind::Broadcast, OpKind::Barrier})
          for (DType dtype : kDtypes)
            for (size_t count = 1; count <= (size_t(1) << 24); count *= 8)
              for (const OpPolicy* policy : {&exact, &fp8})
                chosen[r].push_back(comm->providerFor(kind, dtype, ReduceOp::Sum, count, *policy));
      });
      for (int r = 1; r < n; ++r) ASSERT_EQ(chosen[r], chosen[0]) << transport << " n=" << n;
      // The sweep is not trivial: a group of several ranks runs more than one provider.
      if (n > 2) {
        std::map<std::string, int> used;
        for (const auto& name : chosen[0]) ++used[name];
        EXPECT_GE(used.size(), 2u) << transport << " n=" << n;
      }
    }
  }
}

TEST(Providers, RanksForcingDifferentProvidersFailOnEveryRankWhenTheGroupForms) {
  constexpr int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  auto errors = runRanksCollect(n, [&](int r) {
    Communicator::create(store, r, n, groupOf("shm", r == 1 ? "ring" : "auto"));
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " formed the group";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("HETRA_ALGO"), std::string::npos) << e.what();
    }
  }
}

TEST(Providers, AForcedProviderThatCannotRunAnOperationIsAConfigErrorNamingIt) {
  constexpr int n = 2;
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOf("tcp", "allreduce:shared"));
    float x = 1;
    try {
      comm->allreduce(&x, &x, 1, DType::F32, ReduceOp::Sum);
      FAIL() << "a shared-memory allreduce was accepted on tcp";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'shared'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
    }
    // The other operations still choose by cost, and the group still works.
    comm->barrier()->wait();
  });
  EXPECT_THROW(parseForcedProviders("allreduce:nosuch"), ConfigError);
  EXPECT_THROW(parseForcedProviders("shuffle:ring"), ConfigError);
  EXPECT_THROW(parseForcedProviders("nosuch"), ConfigError);
}

// Each provider, forced for each operation it declares, against a reference computed here.
struct ProviderCase {
  std::string provider, transport;
  std::vector<int> islands;  // for the hierarchy
  bool compressed = false;
  size_t maxCount = SIZE_MAX;  // the small-message providers take small operations only
};

class EveryProvider : public ::testing::TestWithParam<ProviderCase> {};

TEST_P(EveryProvider, EqualsTheExactResultForEveryOperationItDeclares) {
  const ProviderCase c = GetParam();
  const int n = c.islands.empty() ? 3 : int(c.islands.size());
  std::shared_ptr<Provider> provider;
  for (const auto& p : providers())
    if (p->name() == c.provider) provider = p;
  ASSERT_TRUE(provider) << c.provider;
  const ProviderTraits traits = provider->traits();
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOf(c.transport, c.provider, c.islands));
    OpPolicy policy;
    if (c.compressed) policy.compression = CompressionPolicy(Compression::BF16, 256, 0);
    for (DType dtype : kDtypes) {
      if (c.compressed && dtype != DType::F32) continue;
      // bf16 on the wire: compressed.h's bound, u (2^-8) times the inputs' and the result's
      // magnitudes, each below 5e5 per rank.
      const double tolerance = c.compressed ? std::ldexp(1.0, -8) * 2 * n * 5e5 : 0;
      auto near = [&](double got, double want, const char* what, size_t i) {
        ASSERT_LE(std::fabs(got - want), tolerance)
            << c.provider << " " << what << " " << dtypeName(dtype) << " element " << i << " rank "
            << r;
      };
      for (size_t count : {size_t(0), size_t(1), size_t(13), size_t(40961)}) {
        if (count > c.maxCount) continue;
        if (traits.ops & bitOf(OpKind::Allreduce))
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max}) {
            if (!(traits.reduceOps & bitOf(op))) continue;
            auto in = filled(dtype, r, 0, count);
            std::vector<uint8_t> out(in.size());
            comm->allreduce(in.data(), out.data(), count, dtype, op, policy)->wait();
            for (size_t i = 0; i < count; ++i)
              near(loadElement(dtype, out.data(), i), reduceRef(dtype, op, n, i), "allreduce", i);
          }
        const std::vector<size_t> counts = unevenCounts(n, count);
        size_t offset = 0;
        for (int q = 0; q < r; ++q) offset += counts[q];
        const size_t total = totalCount(counts);
        if (traits.ops & bitOf(OpKind::ReduceScatter)) {
          auto in = filled(dtype, r, 0, total);
          std::vector<uint8_t> out(std::max<size_t>(1, counts[r]) * dtypeSize(dtype));
          comm->reduceScatter(in.data(), out.data(), counts, dtype, ReduceOp::Sum, policy)->wait();
          for (size_t i = 0; i < counts[r]; ++i)
            near(loadElement(dtype, out.data(), i), reduceRef(dtype, ReduceOp::Sum, n, offset + i),
                 "reduce-scatter", i);
        }
        if (traits.ops & bitOf(OpKind::Allgather)) {
          auto in = filled(dtype, r, offset, counts[r]);
          std::vector<uint8_t> out(std::max<size_t>(1, total) * dtypeSize(dtype));
          comm->allgather(in.data(), out.data(), counts, dtype, policy)->wait();
          size_t at = 0;
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < counts[q]; ++i, ++at)
              near(loadElement(dtype, out.data(), at), valueOf(dtype, q, at), "allgather", at);
        }
        if (traits.ops & bitOf(OpKind::Broadcast)) {
          const int root = n - 1;
          auto buffer = filled(dtype, r, 0, count);
          comm->broadcast(buffer.data(), count, dtype, root)->wait();
          for (size_t i = 0; i < count; ++i)
            near(loadElement(dtype, buffer.data(), i), valueOf(dtype, root, i), "broadcast", i);
        }
      }
    }
    if (traits.ops & bitOf(OpKind::Barrier)) comm->barrier()->wait();
  });
}

INSTANTIATE_TEST_SUITE_P(
    Table, EveryProvider,
    ::testing::Values(ProviderCase{"ring", "tcp", {}, false},
                      ProviderCase{"ring", "shm", {}, false},
                      ProviderCase{"shared", "shm", {}, false},
                      ProviderCase{"compressed", "tcp", {}, true},
                      ProviderCase{"hierarchical", "shm", {0, 1, 1, 0, 2}, false},
                      ProviderCase{"hierarchical", "tcp", {0, 0, 0, 1, 1}, true},
                      ProviderCase{"small-shared", "shm", {}, false, 13},
                      ProviderCase{"recursive-doubling", "tcp", {}, false, 13},
                      ProviderCase{"recursive-doubling", "shm", {}, false, 13},
                      ProviderCase{"direct", "tcp", {}, false}),
    [](const auto& info) {
      std::string name = info.param.provider + "_" + info.param.transport +
                         (info.param.compressed ? "_compressed" : "");
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// The hierarchy's reduce-scatter and allgather(v): uneven islands (including one of one rank),
// interleaved ranks, uneven counts with empty blocks, every dtype.
class HierarchyUneven : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(HierarchyUneven, ReduceScatterAndAllgatherEqualTheExactResult) {
  const std::vector<int> islands = GetParam();
  const int n = int(islands.size());
  auto store = std::make_shared<store::MemoryStore>();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOf("shm", "hierarchical", islands));
    for (DType dtype : kDtypes)
      for (size_t base : {size_t(0), size_t(1), size_t(5000)}) {
        const std::vector<size_t> counts = unevenCounts(n, base);
        const size_t total = totalCount(counts);
        size_t offset = 0;
        for (int q = 0; q < r; ++q) offset += counts[q];
        const uint64_t flatBytes = comm->transport().bytesSent();

        auto in = filled(dtype, r, 0, total);
        std::vector<uint8_t> mine(std::max<size_t>(1, counts[r]) * dtypeSize(dtype));
        comm->reduceScatter(in.data(), mine.data(), counts, dtype, ReduceOp::Sum)->wait();
        for (size_t i = 0; i < counts[r]; ++i)
          ASSERT_EQ(loadElement(dtype, mine.data(), i),
                    reduceRef(dtype, ReduceOp::Sum, n, offset + i))
              << "reduce-scatter " << dtypeName(dtype) << " base " << base << " rank " << r
              << " element " << i;

        auto block = filled(dtype, r, offset, counts[r]);
        std::vector<uint8_t> all(std::max<size_t>(1, total) * dtypeSize(dtype));
        comm->allgather(block.data(), all.data(), counts, dtype)->wait();
        for (size_t i = 0; i < total; ++i) {
          int owner = 0;
          size_t start = 0;
          while (i >= start + counts[owner]) start += counts[owner++];
          ASSERT_EQ(loadElement(dtype, all.data(), i), valueOf(dtype, owner, i))
              << "allgather " << dtypeName(dtype) << " base " << base << " rank " << r
              << " element " << i;
        }
        // Every byte went through the island and cross groups, none through the flat group.
        ASSERT_EQ(comm->transport().bytesSent(), flatBytes);
      }
  });
}

INSTANTIATE_TEST_SUITE_P(Islands, HierarchyUneven,
                         ::testing::Values(std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{0, 1, 0, 1, 1},
                                           std::vector<int>{0, 1, 1, 1, 2},
                                           std::vector<int>{3, 3, 3, 3, 8, 8, 5}));

// A provider added through the public registration path: every rank sends its input to every
// other rank and reduces all of them itself (a real, if naive, allreduce). It declares only int64
// max and says it costs nothing, so it wins exactly there.
std::atomic<int> gDirectRuns{0};

class DirectExchangeProvider final : public Provider {
 public:
  const char* name() const override { return "test-direct"; }
  ProviderTraits traits() const override {
    ProviderTraits t;
    t.ops = bitOf(OpKind::Allreduce);
    t.dtypes = bitOf(DType::I64);
    t.reduceOps = bitOf(ReduceOp::Max);
    return t;
  }
  double seconds(const Operation&, const GroupFacts&) const override { return 0; }
  void allreduce(const GroupFacts& g, const Operation&, const AllreduceArgs& a) override {
    ++gDirectRuns;
    const size_t bytes = a.count * sizeof(int64_t);
    std::vector<int64_t> mine(static_cast<const int64_t*>(a.in),
                              static_cast<const int64_t*>(a.in) + a.count);
    std::vector<std::vector<int64_t>> theirs(g.size, std::vector<int64_t>(a.count));
    std::vector<std::unique_ptr<Request>> requests;
    const uint64_t tag = (uint64_t(1) << 61) | a.seq;
    for (int p = 0; p < g.size; ++p) {
      if (p == g.rank) continue;
      requests.push_back(g.transport->irecv(p, tag, theirs[p].data(), bytes));
      requests.push_back(g.transport->isend(p, tag, mine.data(), bytes));
    }
    for (auto& request : requests) request->wait(a.deadline);
    auto* out = static_cast<int64_t*>(a.out);
    for (size_t i = 0; i < a.count; ++i) {
      int64_t best = mine[i];
      for (int p = 0; p < g.size; ++p)
        if (p != g.rank) best = std::max(best, theirs[p][i]);
      out[i] = best;
    }
  }
};

TEST(Providers, AProviderRegisteredThroughThePublicPathIsChosenWhereItIsCheapest) {
  static std::once_flag once;
  std::call_once(once, [] { registerProvider(std::make_shared<DirectExchangeProvider>()); });
  EXPECT_THROW(registerProvider(std::make_shared<DirectExchangeProvider>()), ConfigError);
  constexpr int n = 3;
  auto store = std::make_shared<store::MemoryStore>();
  const int before = gDirectRuns.load();
  runRanks(n, [&](int r) {
    auto comm = Communicator::create(store, r, n, groupOf("tcp"));
    EXPECT_EQ(comm->providerFor(OpKind::Allreduce, DType::I64, ReduceOp::Max, 100), "test-direct");
    // Where it does not qualify the table's own providers stay.
    EXPECT_NE(comm->providerFor(OpKind::Allreduce, DType::I64, ReduceOp::Sum, 100), "test-direct");
    EXPECT_NE(comm->providerFor(OpKind::Allreduce, DType::F64, ReduceOp::Max, 100), "test-direct");
    const size_t count = 1001;
    auto in = filled(DType::I64, r, 0, count);
    std::vector<uint8_t> out(in.size());
    comm->allreduce(in.data(), out.data(), count, DType::I64, ReduceOp::Max)->wait();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(loadElement(DType::I64, out.data(), i), reduceRef(DType::I64, ReduceOp::Max, n, i))
          << "element " << i;
  });
  EXPECT_EQ(gDirectRuns.load() - before, n);
}

}  // namespace
}  // namespace hetra::comm
