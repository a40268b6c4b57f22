// Provider "compressed": the encoded collectives of algorithms/compressed.h over any Transport, for
// operations whose policy asks for a codec. Its cost is the ring's message count with the wire
// bytes shrunk by the codec, plus the encoding and decoding passes over the buffer on the CPU.
#include "comm/algorithms/compressed.h"
#include "comm/providers/provider.h"

namespace hetra::comm {
namespace {

// Encode or decode-and-add of float32 on one core, a conservative figure of bench/codec_throughput
// (3.5-13 GB/s measured, docs/benchmarks.md).
constexpr double kCodecBytesPerSecond = 3e9;

class CompressedProvider final : public Provider {
 public:
  const char* name() const override { return "compressed"; }
  ProviderTraits traits() const override {
    ProviderTraits t;
    t.ops = bitOf(OpKind::Allreduce) | bitOf(OpKind::ReduceScatter) | bitOf(OpKind::Allgather);
    t.dtypes = bitOf(DType::F32);
    t.reduceOps = bitOf(ReduceOp::Sum);
    t.exact = false;
    t.compressed = true;
    t.feedsBackErrors = true;
    return t;
  }
  double seconds(const Operation& op, const GroupFacts& group) const override {
    if (group.size == 1) return 0;
    const double n = group.size, bytes = double(op.bytes);
    const double ratio = wireRatio(op);
    const double phases = op.kind == OpKind::Allreduce ? 2 : 1;
    // Each input is sent straight to its reducer: n-1 messages per phase, after a header round
    // with every rank.
    return group.link.seconds(n - 1 + phases * (n - 1), phases * (n - 1) / n * bytes * ratio) +
           2 * phases * bytes / kCodecBytesPerSecond;
  }
  void allreduce(const GroupFacts& g, const Operation& op, const AllreduceArgs& a) override {
    allreduceCompressed(*g.transport, a, *op.codec);
  }
  void reduceScatter(const GroupFacts& g, const Operation& op,
                     const ReduceScatterArgs& a) override {
    reduceScatterCompressed(*g.transport, a, *op.codec);
  }
  void allgather(const GroupFacts& g, const Operation& op, const AllgatherArgs& a) override {
    allgatherCompressed(*g.transport, a, *op.codec);
  }
};

}  // namespace

std::shared_ptr<Provider> makeCompressedProvider() {
  return std::make_shared<CompressedProvider>();
}

}  // namespace hetra::comm
