// Vocabulary (nccl-tests): *size* is the bytes of the whole buffer an operation works on (the input
// of allreduce and reduce-scatter, the output of allgather, the buffer of broadcast); *count* its
// elements. time = median over iterations of the slowest rank's time; algbw = size / time; busbw =
// algbw times the factor that turns it into the bytes each link must carry (2(n-1)/n for allreduce,
// (n-1)/n for reduce-scatter and allgather, 1 for broadcast), so it can be compared with the link's
// bandwidth.
#include "bench_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "comm/codec/codec.h"
#include "comm/communicator.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/units.h"
#include "launch.h"
#include "rank_group.h"

namespace hetra::cli {
namespace {

enum class Collective { Allreduce, ReduceScatter, Allgather, Broadcast };

Collective parseCollective(const std::string& name) {
  if (name == "allreduce") return Collective::Allreduce;
  if (name == "reducescatter") return Collective::ReduceScatter;
  if (name == "allgather") return Collective::Allgather;
  if (name == "broadcast") return Collective::Broadcast;
  throw ConfigError(
      str("collective '", name,
          "' is not supported; allowed: allreduce, reducescatter, allgather, broadcast"));
}

double busFactor(Collective c, int n) {
  switch (c) {
    case Collective::Allreduce:
      return 2.0 * (n - 1) / n;
    case Collective::ReduceScatter:
    case Collective::Allgather:
      return double(n - 1) / n;
    case Collective::Broadcast:
      return 1.0;
  }
  return 1.0;
}

// Input value of element i on rank r: distinct per rank and element, and small enough that any sum
// over ranks is exact in the dtype, so the check can demand exact equality for sum, min and max.
double inputValue(DType dtype, int rank, size_t i) {
  switch (dtype) {
    case DType::F16:
    case DType::BF16:
      return double(int((rank * 3 + i * 7) % 11) - 5);
    case DType::U8:
      return double((rank * 3 + i) % 7);
    default:
      return double(int((rank * 131 + i * 17) % 1009) - 504);
  }
}

double expectedReduction(const BenchOptions& o, int n, size_t i) {
  double acc = inputValue(o.dtype, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = inputValue(o.dtype, r, i);
    if (o.op == comm::ReduceOp::Min)
      acc = std::min(acc, v);
    else if (o.op == comm::ReduceOp::Max)
      acc = std::max(acc, v);
    else
      acc += v;
  }
  if (o.op == comm::ReduceOp::Avg) acc = isFloating(o.dtype) ? acc / n : std::trunc(acc / n);
  return acc;
}

bool matches(const BenchOptions& o, int n, double got, double want) {
  const auto compression = comm::parseCompression(o.compression);
  if (compression != comm::Compression::None) {
    // compressed.h: u times (the ranks' absolute maxima plus the result's); inputs are <= 504.
    const double scale = (o.op == comm::ReduceOp::Avg ? 1.0 / n : 1.0) * n * 504.0;
    return std::fabs(got - want) <= comm::unitRoundoff(compression) * (scale + std::fabs(want));
  }
  // Sums of our inputs are exact; only avg divides, and rounds in the dtype.
  if (o.op != comm::ReduceOp::Avg || !isFloating(o.dtype)) return got == want;
  const double tolerance = (o.dtype == DType::F16 || o.dtype == DType::BF16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tolerance * std::max(1.0, std::fabs(want));
}

struct Buffers {
  std::vector<uint8_t> in, out;
  std::vector<size_t> counts;  // per rank, for reduce-scatter and allgather
};

class Bench {
 public:
  Bench(const BenchOptions& o, comm::Communicator& comm)
      : o_(o), comm_(comm), kind_(parseCollective(o.collective)) {
    // Every size compressed when asked: the table shows where it pays.
    policy_.compression = comm::CompressionPolicy(comm::parseCompression(o.compression), 256, 0);
  }

  comm::OpKind opKind() const {
    switch (kind_) {
      case Collective::Allreduce:
        return comm::OpKind::Allreduce;
      case Collective::ReduceScatter:
        return comm::OpKind::ReduceScatter;
      case Collective::Allgather:
        return comm::OpKind::Allgather;
      case Collective::Broadcast:
        return comm::OpKind::Broadcast;
    }
    return comm::OpKind::Allreduce;
  }

  // The provider the communicator runs this size on.
  std::string providerFor(size_t count) const {
    return comm_.providerFor(opKind(), o_.dtype, o_.op, count, policy_);
  }

  // Elements per operation for a requested size, rounded so every rank gets an equal block.
  size_t countFor(size_t bytes) const {
    size_t count = bytes / dtypeSize(o_.dtype);
    if (kind_ == Collective::ReduceScatter || kind_ == Collective::Allgather)
      count -= count % size_t(comm_.size());
    return count;
  }

  void prepare(size_t count, Buffers& b) const {
    const int n = comm_.size();
    const size_t elem = dtypeSize(o_.dtype);
    b.counts.assign(n, count / n);
    size_t inCount = count, outCount = count;
    if (kind_ == Collective::ReduceScatter) outCount = count / n;
    if (kind_ == Collective::Allgather) inCount = count / n;
    b.in.assign(std::max<size_t>(inCount, 1) * elem, 0);
    b.out.assign(std::max<size_t>(outCount, 1) * elem, 0);
    const size_t offset = kind_ == Collective::Allgather ? size_t(comm_.rank()) * (count / n) : 0;
    for (size_t i = 0; i < inCount; ++i)
      storeElement(o_.dtype, b.in.data(), i, inputValue(o_.dtype, comm_.rank(), offset + i));
  }

  comm::WorkPtr start(size_t count, Buffers& b) const {
    switch (kind_) {
      case Collective::Allreduce:
        return comm_.allreduce(b.in.data(), b.out.data(), count, o_.dtype, o_.op, policy_);
      case Collective::ReduceScatter:
        return comm_.reduceScatter(b.in.data(), b.out.data(), b.counts, o_.dtype, o_.op, policy_);
      case Collective::Allgather:
        return comm_.allgather(b.in.data(), b.out.data(), b.counts, o_.dtype, policy_);
      case Collective::Broadcast:
        return comm_.broadcast(comm_.rank() == 0 ? b.in.data() : b.out.data(), count, o_.dtype, 0);
    }
    return nullptr;
  }

  // Number of wrong elements in this rank's result of the first operation.
  size_t countWrong(size_t count, const Buffers& b) const {
    const int n = comm_.size(), rank = comm_.rank();
    size_t wrong = 0;
    switch (kind_) {
      case Collective::Allreduce:
        for (size_t i = 0; i < count; ++i)
          wrong +=
              !matches(o_, n, loadElement(o_.dtype, b.out.data(), i), expectedReduction(o_, n, i));
        break;
      case Collective::ReduceScatter: {
        const size_t block = count / n;
        for (size_t i = 0; i < block; ++i)
          wrong += !matches(o_, n, loadElement(o_.dtype, b.out.data(), i),
                            expectedReduction(o_, n, rank * block + i));
        break;
      }
      case Collective::Allgather: {
        const size_t block = count / n;
        for (size_t i = 0; i < count; ++i)
          wrong += !matches(o_, 1, loadElement(o_.dtype, b.out.data(), i),
                            inputValue(o_.dtype, int(i / block), i));
        break;
      }
      case Collective::Broadcast:
        if (rank != 0)
          for (size_t i = 0; i < count; ++i)
            wrong += loadElement(o_.dtype, b.out.data(), i) != inputValue(o_.dtype, 0, i);
        break;
    }
    return wrong;
  }

  double busFactor() const { return cli::busFactor(kind_, comm_.size()); }

 private:
  const BenchOptions& o_;
  comm::Communicator& comm_;
  comm::OpPolicy policy_;
  Collective kind_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

size_t parseSize(const std::string& text) {
  // nccl-tests' shorthand: a lone K, M or G is binary (4K = 4KiB); everything else as parseBytes.
  std::string bytes = text;
  if (!bytes.empty() && std::strchr("KkMmGg", bytes.back())) bytes += "iB";
  return size_t(parseBytes(bytes));
}

int runBenchRank(const BenchOptions& o) {
  auto context = rankFromEnvironment();
  HETRA_ENFORCE(context.has_value(), "runBenchRank needs the rank environment");
  log::setRank(context->rank);
  std::shared_ptr<void> server;
  auto store = connectJobStore(*context, Millis(o.timeoutMs), &server);
  comm::GroupOptions groupOptions = rankGroupOptions(*context, o.transport, Millis(o.timeoutMs));
  groupOptions.algorithm = o.algo;  // "": HETRA_ALGO
  auto comm = comm::Communicator::create(store, context->rank, context->worldSize, groupOptions);
  Bench bench(o, *comm);
  const bool leader = comm->rank() == 0;
  const int n = comm->size();

  if (leader) {
    std::printf(
        "# hetra bench %s: %d ranks, transport %s, dtype %s, op %s, compression %s, warmup %d, "
        "iters %d\n#\n",
        o.collective.c_str(), n, comm->transportName(), dtypeName(o.dtype),
        comm::reduceOpName(o.op), o.compression.c_str(), o.warmup, o.iters);
    std::printf("# %12s %12s %9s %11s %12s %12s %7s  %s\n", "size(B)", "count", "type", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong", "provider");
    std::fflush(stdout);
  }

  nlohmann::json rows = nlohmann::json::array();
  size_t totalWrong = 0;
  for (double bytes = double(o.minBytes); bytes <= double(o.maxBytes) * 1.0000001;
       bytes *= o.factor) {
    const size_t count = bench.countFor(size_t(bytes));
    const size_t sizeBytes = count * dtypeSize(o.dtype);
    Buffers buffers;
    bench.prepare(count, buffers);
    const std::string provider = bench.providerFor(count);

    // Check the first operation's result (and count the bytes it put on the wire), then time
    // warm-up and timed iterations.
    const uint64_t sentBefore = comm->bytesSent();
    bench.start(count, buffers)->wait();
    const int64_t wireBytes = int64_t(comm->bytesSent() - sentBefore);
    int64_t wrong = o.check ? int64_t(bench.countWrong(count, buffers)) : -1;
    for (int i = 0; i < o.warmup; ++i) bench.start(count, buffers)->wait();
    std::vector<double> times(o.iters);
    for (int i = 0; i < o.iters; ++i) {
      comm->barrier()->wait();
      const auto start = Clock::now();
      bench.start(count, buffers)->wait();
      times[i] = secondsSince(start);
    }
    // Each iteration counts as long as its slowest rank took; wrong elements add up over ranks.
    comm->allreduce(times.data(), times.data(), times.size(), DType::F64, comm::ReduceOp::Max)
        ->wait();
    if (o.check) comm->allreduce(&wrong, &wrong, 1, DType::I64, comm::ReduceOp::Sum)->wait();
    const double seconds = median(times);
    const double algbw = seconds > 0 ? double(sizeBytes) / seconds / 1e9 : 0;
    const double busbw = algbw * bench.busFactor();
    if (wrong > 0) totalWrong += size_t(wrong);
    if (leader) {
      std::printf("  %12zu %12zu %9s %11.2f %12.3f %12.3f %7s  %s\n", sizeBytes, count,
                  dtypeName(o.dtype), seconds * 1e6, algbw, busbw,
                  o.check ? std::to_string(wrong).c_str() : "N/A", provider.c_str());
      std::fflush(stdout);
      rows.push_back({{"bytes", sizeBytes},
                      {"count", count},
                      {"dtype", dtypeName(o.dtype)},
                      {"time_us", seconds * 1e6},
                      {"algbw_gbs", algbw},
                      {"busbw_gbs", busbw},
                      {"wrong", wrong},
                      {"wire_bytes_rank0", wireBytes},
                      {"provider", provider}});
    }
    if (o.factor <= 1) break;
  }
  comm->barrier()->wait();
  if (leader) {
    std::printf("# Out of bounds values : %zu %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
    if (!o.jsonPath.empty()) {
      std::ofstream out(o.jsonPath);
      if (!out) throw IoError(str("cannot write --json file '", o.jsonPath, "'"));
      out << rows.dump(2) << "\n";
    }
  }
  return totalWrong ? 1 : 0;
}

}  // namespace hetra::cli
