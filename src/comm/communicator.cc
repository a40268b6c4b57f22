#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/algorithms/compressed.h"
#include "comm/algorithms/ring.h"
#include "comm/algorithms/shared.h"
#include "comm/hierarchy.h"
#include "comm/transport/shm_transport.h"
#include "comm/transport/tcp_transport.h"
#include "comm/transport/transport.h"
#ifdef HETRA_WITH_MPI
#include "comm/transport/mpi_transport.h"
#endif
#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"

namespace hetra::comm {
namespace {

const Param kAlgo(
    "HETRA_ALGO", "auto",
    "Collective algorithm: auto (hierarchical across islands when the cost model says so; "
    "shared memory when the transport has it, else ring), ring, shared, or hierarchical.");
const Param kIfaceAddr("HETRA_IFACE_ADDR", "127.0.0.1",
                       "Address the tcp transport listens on (the interface other hosts reach).");

// User point-to-point messages use tags above every tag an algorithm derives from a sequence
// number.
constexpr uint64_t kUserTagBase = uint64_t(1) << 63;

class CommunicatorImpl;

// One operation of a communicator. Its description is built only when a message needs it.
class WorkImpl : public Work {
 public:
  WorkImpl(CommunicatorImpl* owner, std::function<std::string()> describe,
           std::function<void(Deadline)> run)
      : owner_(owner), describe_(std::move(describe)), run_(std::move(run)) {}

  bool isCompleted() const override { return done_.load(std::memory_order_acquire); }
  void wait(Millis timeout) override;
  std::exception_ptr exception() const override { return isCompleted() ? error_ : nullptr; }
  double seconds() const override { return isCompleted() ? seconds_ : 0.0; }

  std::string describe() const { return describe_(); }

  // Runs the operation (once, on whichever thread executes it) and publishes the result.
  void execute(std::exception_ptr latched, Millis timeout);

 private:
  friend class CommunicatorImpl;
  CommunicatorImpl* owner_;  // valid until done_: the communicator drains its queue before dying
  std::function<std::string()> describe_;
  std::function<void(Deadline)> run_;
  std::exception_ptr error_;
  double seconds_ = 0;
  std::atomic<bool> done_{false};
};

class CommunicatorImpl : public Communicator,
                         public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  CommunicatorImpl(std::shared_ptr<store::Store> store, int rank, int size,
                   const GroupOptions& options)
      : store_(std::move(store)), rank_(rank), size_(size), options_(options) {
    HETRA_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " is outside a group of ", size);
    transport_ = connect();
    algo_ = options_.algorithm.empty() ? kAlgo.str() : options_.algorithm;
    const std::string& algo = algo_;
    if (algo != "auto" && algo != "ring" && algo != "shared" && algo != "hierarchical")
      throw ConfigError(
          str("HETRA_ALGO='", algo, "' is not allowed; allowed: auto, ring, shared, hierarchical"));
    useShared_ = transport_->sharedArena() != nullptr && algo != "ring";
    if (algo == "shared" && !transport_->sharedArena())
      throw ConfigError(
          str("HETRA_ALGO=shared needs a transport with shared memory; this group uses ",
              transport_->name()));
    if (algo == "auto" || algo == "hierarchical") hierarchy_ = buildHierarchy();
    if (options_.compression != Compression::None && !hierarchy_)
      codec_ = makeCodec(options_.compression, options_.compressionBlock);
    worker_ = std::thread([this] { workLoop(); });
  }

  // Operations still queued run before the progress thread stops, so no Work is left pending.
  ~CommunicatorImpl() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  // Waits for `work`. The waiting thread runs queued operations itself, in order, when nobody else
  // is running one: an operation issued and waited for at once never crosses threads, so small
  // collectives cost what the algorithm costs (no thread wake-up on the critical path).
  void waitFor(WorkImpl& work, Millis timeout) {
    const Deadline deadline = deadlineAfter(timeout);
    const Deadline spinUntil = deadlineAfter(Millis(0)) + std::chrono::microseconds(kWaitSpinUs);
    while (!work.isCompleted()) {
      if (!executing_.load(std::memory_order_acquire) &&
          queued_.load(std::memory_order_acquire) > 0) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!executing_ && !queue_.empty()) executeFront(lock);
        continue;
      }
      if (Clock::now() < spinUntil) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock<std::mutex> lock(mutex_);
      ++waiters_;
      const bool ready = cv_.wait_until(
          lock, deadline, [&] { return work.isCompleted() || (!executing_ && !queue_.empty()); });
      --waiters_;
      if (!ready)
        throw TimeoutError(
            str("waiting for ", work.describe(), " timed out after ", timeout.count(), " ms"));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transportName() const override { return transport_->name(); }
  Transport& transport() override { return *transport_; }

  std::shared_ptr<Communicator> split(int color, int key, const GroupOptions& options) override {
    const int splitId = splits_++;
    const std::string base = str("split", splitId);
    store_->setString(str(base, "/", rank_), str(color, " ", key));
    std::vector<std::pair<int, int>> members;  // (key, old rank) of ranks with my color
    for (int r = 0; r < size_; ++r) {
      const std::string value = store_->getString(str(base, "/", r), options_.timeout);
      int theirColor = 0, theirKey = 0;
      HETRA_ENFORCE(std::sscanf(value.c_str(), "%d %d", &theirColor, &theirKey) == 2,
                    "bad split record '", value, "'");
      if (theirColor == color) members.emplace_back(theirKey, r);
    }
    if (color < 0) return nullptr;
    std::sort(members.begin(), members.end());
    int newRank = 0;
    while (members[newRank].second != rank_) ++newRank;
    auto subStore = std::make_shared<store::PrefixStore>(str(base, "/c", color), store_);
    return std::make_shared<CommunicatorImpl>(subStore, newRank, int(members.size()), options);
  }

  WorkPtr allreduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    AllreduceArgs args;
    args.in = in;
    args.out = out;
    args.count = count;
    args.dtype = dtype;
    args.op = op;
    return enqueueAllreduce(args);
  }

  WorkPtr allreduceWithFeedback(const float* in, float* out, size_t count,
                                float* residual) override {
    AllreduceArgs args;
    args.in = in;
    args.out = out;
    args.count = count;
    args.residual = residual;
    return enqueueAllreduce(args);
  }

  WorkPtr reduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                        ReduceOp op) override {
    checkCounts(counts, "reduceScatter");
    ReduceScatterArgs args;
    args.in = in;
    args.out = out;
    args.counts = counts;
    args.dtype = dtype;
    args.op = op;
    return enqueue(
        [=] { return str("reduce-scatter of ", totalCount(counts), " ", dtypeName(dtype)); },
        [this, args](Deadline d) mutable {
          args.deadline = d;
          args.seq = seq_++;
          if (compresses(args.dtype, args.op, totalCount(args.counts)))
            reduceScatterCompressed(*transport_, args, *codec_);
          else if (useShared_)
            reduceScatterShared(*transport_->sharedArena(), args);
          else
            reduceScatterRing(*transport_, args);
          if (args.op == ReduceOp::Avg) divide(args.dtype, args.out, args.counts[rank_], size_);
        });
  }

  WorkPtr allgather(const void* in, void* out, const std::vector<size_t>& counts,
                    DType dtype) override {
    checkCounts(counts, "allgather");
    AllgatherArgs args;
    args.in = in;
    args.out = out;
    args.counts = counts;
    args.dtype = dtype;
    return enqueue([=] { return str("allgather of ", totalCount(counts), " ", dtypeName(dtype)); },
                   [this, args](Deadline d) mutable {
                     args.deadline = d;
                     args.seq = seq_++;
                     if (compresses(args.dtype, ReduceOp::Sum, totalCount(args.counts)))
                       allgatherCompressed(*transport_, args, *codec_);
                     else if (useShared_)
                       allgatherShared(*transport_->sharedArena(), args);
                     else
                       allgatherRing(*transport_, args);
                   });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    HETRA_ENFORCE(root >= 0 && root < size_, "broadcast root ", root, " is outside a group of ",
                  size_);
    BroadcastArgs args;
    args.buf = buf;
    args.count = count;
    args.dtype = dtype;
    args.root = root;
    return enqueue([=] { return str("broadcast of ", count, " ", dtypeName(dtype)); },
                   [this, args](Deadline d) mutable {
                     args.deadline = d;
                     args.seq = seq_++;
                     if (useShared_)
                       broadcastShared(*transport_->sharedArena(), args);
                     else
                       broadcastPipelined(*transport_, args);
                   });
  }

  WorkPtr barrier() override {
    return enqueue([] { return std::string("barrier"); },
                   [this](Deadline d) {
                     BarrierArgs args;
                     args.deadline = d;
                     args.seq = seq_++;
                     if (useShared_)
                       barrierShared(*transport_->sharedArena(), args);
                     else
                       barrierDissemination(*transport_, args);
                   });
  }

  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, uint32_t tag) override {
    checkPeer(dst, "send");
    const size_t bytes = count * dtypeSize(dtype);
    return enqueue(
        [=] { return str("send of ", bytes, " bytes to rank ", dst); },
        [=, this](Deadline d) { transport_->isend(dst, kUserTagBase | tag, buf, bytes)->wait(d); });
  }

  WorkPtr recv(void* buf, size_t count, DType dtype, int src, uint32_t tag) override {
    checkPeer(src, "recv");
    const size_t bytes = count * dtypeSize(dtype);
    return enqueue(
        [=] { return str("recv of ", bytes, " bytes from rank ", src); },
        [=, this](Deadline d) { transport_->irecv(src, kUserTagBase | tag, buf, bytes)->wait(d); });
  }

  uint64_t bytesSent() const override {
    return transport_->bytesSent() + (hierarchy_ ? hierarchy_->bytesSent() : 0);
  }
  uint64_t bytesReceived() const override {
    return transport_->bytesReceived() + (hierarchy_ ? hierarchy_->bytesReceived() : 0);
  }

  const Codec* codecFor(DType dtype, ReduceOp op, size_t count) const override {
    const bool applies = codec_ && dtype == DType::F32 &&
                         (op == ReduceOp::Sum || op == ReduceOp::Avg) &&
                         count * sizeof(float) >= options_.compressionMinBytes;
    return applies ? codec_.get() : nullptr;
  }

  void abort(const std::string& reason) override {
    latch(std::make_exception_ptr(
        PeerAbortedError(rank_, str("rank ", rank_, " aborted the group: ", reason))));
    transport_->abort(reason);
  }

 private:
  std::unique_ptr<Transport> connect() {
    const std::string& choice = options_.transport;
    if (choice != "auto" && choice != "shm" && choice != "tcp" && choice != "mpi")
      throw ConfigError(
          str("transport '", choice, "' is not allowed; allowed: auto, shm, tcp, mpi"));
#ifndef HETRA_WITH_MPI
    if (choice == "mpi")
      throw ConfigError(
          "transport 'mpi': this hetra was not built with MPI support "
          "(configure with -DHETRA_WITH_MPI=ON)");
#endif
    // Every rank publishes its host identity; the group is local when all are equal.
    const std::string mine = hostIdentity();
    store_->setString(str("host/", rank_), mine);
    bool oneHost = true;
    for (int r = 0; r < size_; ++r) {
      hosts_.push_back(store_->getString(str("host/", r), options_.timeout));
      oneHost = oneHost && hosts_.back() == mine;
    }
    if (choice == "shm" && !oneHost)
      throw ConfigError(
          "transport 'shm' needs every rank of the group on one host; this group spans hosts");
#ifdef HETRA_WITH_MPI
    if (choice == "mpi") {
      MpiOptions mpi;
      mpi.timeout = options_.timeout;
      return createMpiTransport(std::make_shared<store::PrefixStore>("mpi", store_), rank_, size_,
                                mpi);
    }
#endif
    const bool useShm = choice == "shm" || (choice == "auto" && oneHost);
    if (useShm) {
      store::PrefixStore shmStore("shm", store_);
      ShmOptions shm;
      shm.timeout = options_.timeout;
      return createShmTransport(shmStore, rank_, size_, shm);
    }
    TcpOptions tcp;
    tcp.timeout = options_.timeout;
    tcp.listenAddress = options_.listenAddress.empty() ? kIfaceAddr.str() : options_.listenAddress;
    return createTcpTransport(std::make_shared<store::PrefixStore>("tcp", store_), rank_, size_,
                              tcp);
  }

  WorkPtr enqueueAllreduce(AllreduceArgs args) {
    const size_t count = args.count;
    const DType dtype = args.dtype;
    return enqueue([=] { return str("allreduce of ", count, " ", dtypeName(dtype)); },
                   [this, args](Deadline d) mutable {
                     args.deadline = d;
                     args.seq = seq_++;
                     if (hierarchical(args.count * dtypeSize(args.dtype))) {
                       const ReduceOp requested = args.op;
                       if (args.op == ReduceOp::Avg) args.op = ReduceOp::Sum;
                       hierarchy_->allreduce(args);
                       args.op = requested;
                     } else if (compresses(args.dtype, args.op, args.count))
                       allreduceCompressed(*transport_, args, *codec_);
                     else if (useShared_)
                       allreduceShared(*transport_->sharedArena(), args);
                     else
                       allreduceRing(*transport_, args);
                     if (args.op == ReduceOp::Avg) divide(args.dtype, args.out, args.count, size_);
                   });
  }

  // The group's islands: a hierarchy when there are several and one has more than one rank.
  // Collective over the group (every rank builds the same one).
  std::unique_ptr<Hierarchy> buildHierarchy() {
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
      store_->setString(str("vendor/", rank_), options_.vendor);
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) {
        const std::string key =
            hosts_[r] + "|" + store_->getString(str("vendor/", r), options_.timeout);
        auto it = std::find(keys.begin(), keys.end(), key);
        islandOf[r] = int(it - keys.begin());
        if (it == keys.end()) keys.push_back(key);
      }
    }
    const int islands = *std::max_element(islandOf.begin(), islandOf.end()) + 1;
    const int largest = [&] {
      std::vector<int> sizes(islands, 0);
      for (int island : islandOf) ++sizes[island];
      return *std::max_element(sizes.begin(), sizes.end());
    }();
    if (islands < 2 || largest < 2) return nullptr;  // nothing to gain: the flat ring is it
    HETRA_INFO("comm", "hierarchy: ", islands, " islands (largest ", largest,
               " ranks), compression between them: ", compressionName(options_.compression));
    GroupOptions inside = options_, across = options_;
    inside.islands.clear();
    across.islands.clear();
    inside.algorithm = across.algorithm = "auto";
    inside.compression = Compression::None;
    return std::make_unique<Hierarchy>(*this, islandOf, inside, across);
  }

  bool hierarchical(size_t bytes) const {
    if (!hierarchy_) return false;
    return algo_ == "hierarchical" ||
           hierarchy_->hierarchicalSeconds(bytes) < hierarchy_->flatSeconds(bytes);
  }

  bool compresses(DType dtype, ReduceOp op, size_t count) const {
    return codecFor(dtype, op, count) != nullptr;
  }

  void checkCounts(const std::vector<size_t>& counts, const char* op) const {
    if (int(counts.size()) != size_)
      throw ConfigError(
          str(op, ": counts has ", counts.size(), " entries; the group has ", size_, " ranks"));
  }

  void checkPeer(int peer, const char* op) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw ConfigError(str(op, ": peer ", peer, " is not another rank of this group of ", size_));
  }

  WorkPtr enqueue(std::function<std::string()> describe, std::function<void(Deadline)> run) {
    auto work = std::make_shared<WorkImpl>(this, std::move(describe), std::move(run));
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(work);
    queued_.fetch_add(1, std::memory_order_release);
    // A polling progress thread finds the operation by itself; only a deep sleeper needs a wake-up.
    if (workerAsleep_) cv_.notify_all();
    return work;
  }

  // Runs the operation at the front of the queue with the lock released; exactly one thread
  // executes at a time, which keeps the group's operations in issue order on every rank.
  void executeFront(std::unique_lock<std::mutex>& lock) {
    auto work = queue_.front();
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
    executing_.store(true, std::memory_order_release);
    const std::exception_ptr latched = failed_;
    lock.unlock();
    work->execute(latched, options_.timeout);
    if (auto error = work->exception()) {
      if (!latched) {
        latch(error);
        // Wake the peers still blocked in this operation; they report this rank and the reason.
        try {
          std::rethrow_exception(error);
        } catch (const PeerAbortedError&) {
        } catch (const std::exception& e) {
          transport_->abort(e.what());
        }
      }
    }
    lock.lock();
    executing_.store(false, std::memory_order_release);
    if (waiters_ > 0 || workerAsleep_ || !queue_.empty()) cv_.notify_all();
  }

  void latch(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_) failed_ = error;
  }

  // The progress thread runs operations nobody waits for yet (gradient buckets during backward).
  // While the group is busy it polls every kPollUs instead of being woken per operation; after
  // kDeepSleepMs without work it sleeps until an enqueue wakes it.
  void workLoop() {
    log::setRank(rank_);
    std::unique_lock<std::mutex> lock(mutex_);
    Deadline lastActive = Clock::now();
    for (;;) {
      if (!executing_ && !queue_.empty()) {
        executeFront(lock);
        lastActive = Clock::now();
        continue;
      }
      if (stopping_ && queue_.empty() && !executing_) return;
      if (Clock::now() - lastActive < Millis(kDeepSleepMs)) {
        cv_.wait_for(lock, std::chrono::microseconds(kPollUs));
      } else {
        workerAsleep_ = true;
        cv_.wait(lock, [&] { return stopping_ || (!executing_ && !queue_.empty()); });
        workerAsleep_ = false;
        lastActive = Clock::now();
      }
    }
  }

  std::shared_ptr<store::Store> store_;
  int rank_;
  int size_;
  GroupOptions options_;
  std::unique_ptr<Transport> transport_;
  std::vector<std::string> hosts_;  // host identity of every rank
  std::string algo_;
  bool useShared_ = false;
  std::unique_ptr<Hierarchy> hierarchy_;  // null for a group of one island
  std::unique_ptr<Codec> codec_;          // null without compression
  uint64_t seq_ = 0;                      // touched only by the progress thread
  int splits_ = 0;

  static constexpr int kWaitSpinUs = 50;
  static constexpr int kPollUs = 1000;
  static constexpr int kDeepSleepMs = 50;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<WorkImpl>> queue_;
  std::atomic<size_t> queued_{0};       // queue_.size(), readable without the lock
  std::atomic<bool> executing_{false};  // an operation is running (on any thread)
  int waiters_ = 0;                     // callers blocked on cv_
  bool workerAsleep_ = false;           // the progress thread waits for an explicit wake-up
  std::exception_ptr failed_;
  bool stopping_ = false;
  std::thread worker_;
};

void WorkImpl::wait(Millis timeout) {
  if (!isCompleted()) owner_->waitFor(*this, timeout);
  if (error_) std::rethrow_exception(error_);
}

void WorkImpl::execute(std::exception_ptr latched, Millis timeout) {
  const auto start = Clock::now();
  if (latched) {
    error_ = latched;
  } else {
    try {
      run_(start + timeout);
    } catch (const std::exception& e) {
      HETRA_WARN("comm", describe(), " failed: ", e.what());
      error_ = std::current_exception();
    }
  }
  seconds_ = secondsSince(start);
  done_.store(true, std::memory_order_release);
}

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
