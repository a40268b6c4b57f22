// The communicator: forms a group (its transport, its islands, the facts its providers may use),
// then turns each call into an operation that the provider table runs in issue order
// (work_queue.h). It names no algorithm: the table chooses one per operation.
#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "comm/hierarchy.h"
#include "comm/providers/choice_cache.h"
#include "comm/providers/registry.h"
#include "comm/transport/registry.h"
#include "comm/transport/transport.h"
#include "comm/work_queue.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/timeline.h"

namespace hetra::comm {
namespace {

const Param kAlgo(
    "HETRA_ALGO", "auto",
    "Collective providers forced per operation: auto (the cost model chooses), one "
    "provider for every operation it has (ring, shared, compressed, hierarchical, ...), "
    "or OPERATION:PROVIDER,... (operations: allreduce, reducescatter, allgather, "
    "broadcast, barrier). `hetra params` lists the providers' names.");
const Param kIslandLink(
    "HETRA_ISLAND_LINK", "5us,5GB/s",
    "Latency and bandwidth of a message inside an island (the cost model), e.g. "
    "\"5us,5GB/s\"; `hetra probe --links` measures them.");
const Param kCrossLink("HETRA_CROSS_LINK", "50us,1.25GB/s",
                       "Latency and bandwidth of a message between islands (the cost model), e.g. "
                       "\"50us,1gbit\".");
const Param kArenaLink("HETRA_ARENA_LINK", "0.7us,18GB/s",
                       "Latency of a sync point and bandwidth of a copy through shared memory (the "
                       "shared-memory providers' cost model; docs/benchmarks.md has the "
                       "measurement).");

// User point-to-point messages use tags above every tag an algorithm derives from a sequence
// number.
constexpr uint64_t kUserTagBase = uint64_t(1) << 63;

// What every rank publishes when a group forms, and what all must agree on.
struct RankRecord {
  std::string host;    // hostIdentity()
  std::string vendor;  // GroupOptions::vendor
  std::string table;   // forced providers and the provider table: must be equal on every rank

  std::string encode() const { return host + "\n" + vendor + "\n" + table; }
  static RankRecord decode(const std::string& text) {
    RankRecord r;
    std::istringstream in(text);
    std::getline(in, r.host);
    std::getline(in, r.vendor);
    std::getline(in, r.table);
    return r;
  }
};

// Runs an operation as a span of the process's timeline, with its provider and bytes.
template <typename Run>
void runTraced(Run& run, Provider& provider, const Operation& o, Deadline d) {
  timeline::Span span(timeline::Lane::Comm, "comm", opKindName(o.kind));
  span.arg("provider", providerName(o.provider)).arg("bytes", int64_t(o.bytes));
  run(provider, o, d);
}

class CommunicatorImpl : public Communicator,
                         public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  CommunicatorImpl(std::shared_ptr<store::Store> store, int rank, int size,
                   const GroupOptions& options)
      : store_(std::move(store)), rank_(rank), size_(size), options_(options) {
    HETRA_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " is outside a group of ", size);
    if (size > kMaxGroupSize)
      throw ConfigError(
          str("a group of ", size, " ranks: at most ", kMaxGroupSize, " are allowed"));
    forced_ = parseForcedProviders(options_.algorithm.empty() ? kAlgo.str() : options_.algorithm);
    islandCost_ =
        parseLinkCost(options_.islandLink.empty() ? kIslandLink.str() : options_.islandLink);
    crossCost_ = parseLinkCost(options_.crossLink.empty() ? kCrossLink.str() : options_.crossLink);
    gatherRecords();
    transport_ = connect();
    facts_.rank = rank_;
    facts_.size = size_;
    facts_.transport = transport_.get();
    facts_.arena = transport_->sharedArena();
    islandOf_ = islandsOfRanks();
    const int islands = *std::max_element(islandOf_.begin(), islandOf_.end()) + 1;
    // A flat operation over several islands crosses the links between them.
    facts_.link = islands > 1 ? crossCost_ : islandCost_;
    facts_.arenaLink = parseLinkCost(kArenaLink.str());
    if (mayUseHierarchy()) hierarchy_ = buildHierarchy();
    facts_.hierarchy = hierarchy_.get();
    queue_ = std::make_unique<WorkQueue>(rank_, options_.timeout, [this](std::exception_ptr e) {
      // Wake the peers still blocked in this operation; they report this rank and the reason.
      try {
        std::rethrow_exception(e);
      } catch (const PeerAbortedError&) {
      } catch (const std::exception& error) {
        transport_->abort(error.what());
      }
    });
  }

  // The queue drains (and its thread stops) before the transport and the hierarchy go.
  ~CommunicatorImpl() override { queue_.reset(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const GroupOptions& groupOptions() const override { return options_; }
  const char* transportName() const override { return transport_->name(); }
  Transport& transport() override { return *transport_; }

  std::shared_ptr<Communicator> split(int color, int key, const GroupOptions& options) override {
    const int splitId = splits_++;
    const std::string base = str("split", splitId);
    store_->setString(str(base, "/", rank_), str(color, " ", key));
    std::vector<std::pair<int, int>> members;  // (key, old rank) of ranks with my color
    const Deadline deadline =
        deadlineAfter(options_.timeout);  // one budget for every rank's record
    for (int r = 0; r < size_; ++r) {
      const std::string value = store_->getString(str(base, "/", r), deadline);
      int theirColor = 0, theirKey = 0;
      HETRA_ENFORCE(std::sscanf(value.c_str(), "%d %d", &theirColor, &theirKey) == 2,
                    "bad split record '", value, "'");
      if (theirColor == color) members.emplace_back(theirKey, r);
    }
    if (color < 0) return nullptr;
    std::sort(members.begin(), members.end());
    int newRank = 0;
    while (members[newRank].second != rank_) ++newRank;
    GroupOptions subOptions = options;
    if (int(options.islands.size()) == size_) {  // one island per rank of this group
      subOptions.islands.clear();
      for (const auto& member : members)
        subOptions.islands.push_back(options.islands[member.second]);
    }
    auto subStore = std::make_shared<store::PrefixStore>(str(base, "/c", color), store_);
    return std::make_shared<CommunicatorImpl>(subStore, newRank, int(members.size()), subOptions);
  }

  WorkPtr allreduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                    const OpPolicy& policy) override {
    AllreduceArgs args{.in = in, .out = out, .count = count, .dtype = dtype, .op = reducedAs(op)};
    const double inputScale = policy.inputScale;
    if (inputScale != 1.0 && !((op == ReduceOp::Sum || op == ReduceOp::Avg) &&
                               (dtype == DType::F32 || dtype == DType::F64)))
      throw ConfigError(str("an input scale applies to float32 or float64 sum or avg, not ",
                            reduceOpName(op), " of ", dtypeName(dtype)));
    return enqueue(
        OpKind::Allreduce, dtype, args.op, count * dtypeSize(dtype), policy,
        [=] { return str("allreduce of ", count, " ", dtypeName(dtype)); },
        [this, args, op, inputScale](Provider& p, const Operation& o, Deadline d) mutable {
          stamp(args, o, d);
          if (p.traits().feedsBackErrors) args.residual = o.policy->residual;
          if (inputScale != 1.0 && p.traits().scalesInput) {
            args.inputScale = inputScale;
          } else if (inputScale != 1.0) {  // the sum of the scaled inputs, reduced in place in out
            scale(args.dtype, args.in, args.out, args.count, inputScale);
            args.in = args.out;
          }
          p.allreduce(facts_, o, args);
          if (op == ReduceOp::Avg) divide(args.dtype, args.out, args.count, size_);
        });
  }

  WorkPtr reduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                        ReduceOp op, const OpPolicy& policy) override {
    checkCounts(counts, "reduceScatter");
    ReduceScatterArgs args{
        .in = in, .out = out, .counts = counts, .dtype = dtype, .op = reducedAs(op)};
    return enqueue(
        OpKind::ReduceScatter, dtype, args.op, totalCount(counts) * dtypeSize(dtype), policy,
        [total = totalCount(counts), dtype] {
          return str("reduce-scatter of ", total, " ", dtypeName(dtype));
        },
        [this, args, op](Provider& p, const Operation& o, Deadline d) mutable {
          stamp(args, o, d);
          if (p.traits().feedsBackErrors) args.residual = o.policy->residual;
          p.reduceScatter(facts_, o, args);
          if (op == ReduceOp::Avg) divide(args.dtype, args.out, args.counts[rank_], size_);
        });
  }

  WorkPtr allgather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                    const OpPolicy& policy) override {
    checkCounts(counts, "allgather");
    AllgatherArgs args{.in = in, .out = out, .counts = counts, .dtype = dtype};
    return enqueue(
        OpKind::Allgather, dtype, ReduceOp::Sum, totalCount(counts) * dtypeSize(dtype), policy,
        [total = totalCount(counts), dtype] {
          return str("allgather of ", total, " ", dtypeName(dtype));
        },
        [this, args](Provider& p, const Operation& o, Deadline d) mutable {
          stamp(args, o, d);
          p.allgather(facts_, o, args);
        });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    HETRA_ENFORCE(root >= 0 && root < size_, "broadcast root ", root, " is outside a group of ",
                  size_);
    BroadcastArgs args{.buf = buf, .count = count, .dtype = dtype, .root = root};
    return enqueue(
        OpKind::Broadcast, dtype, ReduceOp::Sum, count * dtypeSize(dtype), {},
        [=] { return str("broadcast of ", count, " ", dtypeName(dtype)); },
        [this, args](Provider& p, const Operation& o, Deadline d) mutable {
          stamp(args, o, d);
          p.broadcast(facts_, o, args);
        });
  }

  WorkPtr barrier() override {
    return enqueue(
        OpKind::Barrier, DType::U8, ReduceOp::Sum, 0, {}, [] { return std::string("barrier"); },
        [this](Provider& p, const Operation& o, Deadline d) {
          BarrierArgs args;
          stamp(args, o, d);
          p.barrier(facts_, o, args);
        });
  }

  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, uint64_t tag) override {
    checkPointToPoint(dst, tag, "send");
    const size_t bytes = count * dtypeSize(dtype);
    return queue_->enqueue(
        [=] { return str("send of ", bytes, " bytes to rank ", dst); },
        [=, this](Deadline d) { transport_->isend(dst, kUserTagBase | tag, buf, bytes)->wait(d); });
  }

  WorkPtr recv(void* buf, size_t count, DType dtype, int src, uint64_t tag) override {
    checkPointToPoint(src, tag, "recv");
    const size_t bytes = count * dtypeSize(dtype);
    return queue_->enqueue(
        [=] { return str("recv of ", bytes, " bytes from rank ", src); },
        [=, this](Deadline d) { transport_->irecv(src, kUserTagBase | tag, buf, bytes)->wait(d); });
  }

  uint64_t bytesSent() const override {
    return transport_->bytesSent() + (hierarchy_ ? hierarchy_->bytesSent() : 0);
  }
  uint64_t bytesReceived() const override {
    return transport_->bytesReceived() + (hierarchy_ ? hierarchy_->bytesReceived() : 0);
  }

  const Codec* feedbackCodec(OpKind kind, DType dtype, ReduceOp op, size_t count,
                             const OpPolicy& policy) const override {
    HETRA_ENFORCE(kind == OpKind::Allreduce || kind == OpKind::ReduceScatter,
                  "error feedback is kept by allreduce and reduce-scatter only, not ",
                  opKindName(kind));
    const Operation o = operation(kind, dtype, reducedAs(op), count * dtypeSize(dtype), policy);
    return providers()[choose(o) - 1]->traits().feedsBackErrors ? o.codec : nullptr;
  }

  std::string providerFor(OpKind kind, DType dtype, ReduceOp op, size_t count,
                          const OpPolicy& policy) const override {
    const Operation o = operation(kind, dtype, reducedAs(op), count * dtypeSize(dtype), policy);
    return providerName(choose(o));
  }

  void abort(const std::string& reason) override {
    queue_->latch(std::make_exception_ptr(
        PeerAbortedError(rank_, str("rank ", rank_, " aborted the group: ", reason))));
    transport_->abort(reason);
  }

 private:
  static ReduceOp reducedAs(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

  // What an operation learns when it starts running: its deadline, its number in the group (the
  // executing thread numbers them in issue order), its provider.
  template <typename Args>
  void stamp(Args& args, const Operation& o, Deadline d) {
    args.deadline = d;
    args.seq = seq_++;
    args.provider = o.provider;
  }

  Operation operation(OpKind kind, DType dtype, ReduceOp op, size_t bytes,
                      const OpPolicy& policy) const {
    Operation o;
    o.kind = kind;
    o.dtype = dtype;
    o.op = op;
    o.bytes = bytes;
    o.policy = &policy;
    o.codec = policy.compression.codecFor(kind, dtype, op, bytes);
    return o;
  }

  // The table's choice for `o`, remembered per shape: the group facts and the forced providers do
  // not change in the group's life, so the choice for a shape does not either.
  uint8_t choose(const Operation& o) const {
    if (const uint8_t id = choices_.find(o)) return id;
    const uint8_t id = chooseProvider(o, facts_, forced_);
    choices_.remember(o, id);
    return id;
  }

  // The provider is chosen when the operation is issued, so a forced provider that cannot run it
  // fails the call itself (ConfigError), before anything is queued.
  // `run(provider, operation, deadline)` runs it. Providers stay in the table for the life of the
  // process, so the closure holds a plain pointer.
  template <typename Describe, typename Run>
  WorkPtr enqueue(OpKind kind, DType dtype, ReduceOp op, size_t bytes, const OpPolicy& policy,
                  Describe describe, Run run) {
    Operation o = operation(kind, dtype, op, bytes, policy);
    o.provider = choose(o);
    Provider* provider = providers()[o.provider - 1].get();
    return queue_->enqueue(std::move(describe),
                           [run = std::move(run), provider, o, policy](Deadline d) mutable {
                             o.policy = &policy;  // the copy this closure owns
                             if (timeline::active()) [[unlikely]]
                               return runTraced(run, *provider, o, d);
                             run(*provider, o, d);
                           });
  }

  // Every rank publishes its host identity, vendor and provider settings; a rank whose settings
  // differ would choose other providers than its peers, so that is an error on every rank, now.
  void gatherRecords() {
    RankRecord mine;
    mine.host = hostIdentity();
    mine.vendor = options_.vendor;
    mine.table = str(forced_.text, " over ", providerTableText());
    store_->setString(str("rank/", rank_), mine.encode());
    const Deadline deadline =
        deadlineAfter(options_.timeout);  // one budget for every rank's record
    for (int r = 0; r < size_; ++r)
      records_.push_back(
          r == rank_ ? mine : RankRecord::decode(store_->getString(str("rank/", r), deadline)));
    for (int r = 0; r < size_; ++r)
      if (records_[r].table != mine.table)
        throw ConfigError(str("rank ", r, " forces providers '", records_[r].table, "' but rank ",
                              rank_, " forces '", mine.table,
                              "': HETRA_ALGO and the registered providers must be equal on "
                              "every rank"));
  }

  // The transport table (transport/registry.h) decides, from what every rank knows alike.
  std::unique_ptr<Transport> connect() {
    TransportRequest request;
    request.store = store_;
    request.rank = rank_;
    request.size = size_;
    for (const RankRecord& r : records_) request.hosts.push_back(r.host);
    request.timeout = options_.timeout;
    request.listenAddress = options_.listenAddress;
    return connectTransport(options_.transport, request);
  }

  // Whether some operation may run on the hierarchical provider: building one forms sub-groups
  // (collective and not free), so a group that forced others for all its operations skips it.
  bool mayUseHierarchy() const {
    const auto all = providers();
    for (size_t i = 0; i < all.size(); ++i) {
      const ProviderTraits t = all[i]->traits();
      if (t.needs != Needs::Hierarchy) continue;
      for (OpKind kind : kOpKinds) {
        const uint8_t forced = forced_.byKind[size_t(kind)];
        if ((t.ops & bitOf(kind)) && (forced == 0 || forced == i + 1)) return true;
      }
    }
    return false;
  }

  // The island of every rank, numbered in order of each island's lowest rank: as given, else by
  // host identity and vendor. Alike on every rank.
  std::vector<int> islandsOfRanks() const {
    std::vector<int> islandOf(size_);
    if (!options_.islands.empty()) {
      if (int(options_.islands.size()) != size_)
        throw ConfigError(str("islands: ", options_.islands.size(), " entries for a group of ",
                              size_, " ranks; give one island per rank"));
      // Renumber in order of each island's lowest rank.
      std::vector<std::pair<int, int>> seen;  // (given id, number)
      for (int r = 0; r < size_; ++r) {
        auto it = std::find_if(seen.begin(), seen.end(),
                               [&](const auto& p) { return p.first == options_.islands[r]; });
        if (it == seen.end()) it = seen.insert(seen.end(), {options_.islands[r], int(seen.size())});
        islandOf[r] = it->second;
      }
    } else {
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) {
        const std::string key = records_[r].host + "|" + records_[r].vendor;
        auto it = std::find(keys.begin(), keys.end(), key);
        islandOf[r] = int(it - keys.begin());
        if (it == keys.end()) keys.push_back(key);
      }
    }
    return islandOf;
  }

  // The group's islands: a hierarchy when there are several and one has more than one rank.
  // Collective over the group (every rank builds the same one).
  std::unique_ptr<Hierarchy> buildHierarchy() {
    const std::vector<int>& islandOf = islandOf_;
    const int islands = *std::max_element(islandOf.begin(), islandOf.end()) + 1;
    std::vector<int> sizes(islands, 0);
    for (int island : islandOf) ++sizes[island];
    const int largest = *std::max_element(sizes.begin(), sizes.end());
    if (islands < 2 || largest < 2) return nullptr;  // nothing to gain: the flat group is it
    HETRA_INFO("comm", "hierarchy: ", islands, " islands (largest ", largest, " ranks)");
    GroupOptions inside = options_, across = options_;
    inside.islands.clear();
    across.islands.clear();
    inside.algorithm = across.algorithm = "auto";
    return std::make_unique<Hierarchy>(*this, islandOf, inside, across, islandCost_, crossCost_);
  }

  void checkCounts(const std::vector<size_t>& counts, const char* op) const {
    if (int(counts.size()) != size_)
      throw ConfigError(
          str(op, ": counts has ", counts.size(), " entries; the group has ", size_, " ranks"));
  }

  void checkPointToPoint(int peer, uint64_t tag, const char* op) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw ConfigError(str(op, ": peer ", peer, " is not another rank of this group of ", size_));
    if (tag >= kUserTagBase)
      throw ConfigError(str(op, ": tag ", tag, " is too large; user tags are below 2^63"));
  }

  std::shared_ptr<store::Store> store_;
  int rank_;
  int size_;
  GroupOptions options_;
  ForcedProviders forced_;
  LinkCost islandCost_, crossCost_;
  std::vector<RankRecord> records_;  // every rank's, in rank order
  std::vector<int> islandOf_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Hierarchy> hierarchy_;  // null for a group of one island
  GroupFacts facts_;
  mutable ChoiceCache choices_;
  uint64_t seq_ = 0;  // touched only by the executing thread
  int splits_ = 0;
  std::unique_ptr<WorkQueue> queue_;
};

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<store::Store> store, int rank,
                                                   int size, const GroupOptions& options) {
  return std::make_shared<CommunicatorImpl>(
      std::make_shared<store::PrefixStore>("world", std::move(store)), rank, size, options);
}

std::string hostIdentity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  char ipcNs[128] = {0};
  const ssize_t n = readlink("/proc/self/ns/ipc", ipcNs, sizeof ipcNs - 1);
  if (n < 0) ipcNs[0] = 0;
  return str(host, "/", readFirstLine("/proc/sys/kernel/random/boot_id"), "/", ipcNs);
}

}  // namespace hetra::comm
