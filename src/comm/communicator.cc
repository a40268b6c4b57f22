#include "comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/algorithms/ring.h"
#include "comm/algorithms/shared.h"
#include "comm/transport/shm_transport.h"
#include "comm/transport/tcp_transport.h"
#include "comm/transport/transport.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"

namespace hetra::comm {
namespace {

const Param kAlgo("HETRA_ALGO", "auto",
                  "Collective algorithm: auto (shared memory when the transport has it, else ring), "
                  "ring, or shared.");
const Param kIfaceAddr("HETRA_IFACE_ADDR", "127.0.0.1",
                       "Address the tcp transport listens on (the interface other hosts reach).");

// User point-to-point messages use tags above every tag an algorithm derives from a sequence number.
constexpr uint64_t kUserTagBase = uint64_t(1) << 63;

class WorkImpl : public Work {
 public:
  bool isCompleted() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  void wait(Millis timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return done_; }))
      throw TimeoutError(str("waiting for ", what_, " timed out after ", timeout.count(), " ms"));
    if (error_) std::rethrow_exception(error_);
  }

  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

  double seconds() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return seconds_;
  }

  void finish(std::exception_ptr error, double seconds) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      seconds_ = seconds;
      done_ = true;
    }
    cv_.notify_all();
  }

  std::string what_;
  std::function<void(Deadline)> run_;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  double seconds_ = 0;
  std::exception_ptr error_;
};

class CommunicatorImpl : public Communicator,
                         public std::enable_shared_from_this<CommunicatorImpl> {
 public:
  CommunicatorImpl(std::shared_ptr<store::Store> store, int rank, int size,
                   const GroupOptions& options)
      : store_(std::move(store)), rank_(rank), size_(size), options_(options) {
    HETRA_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " is outside a group of ", size);
    transport_ = connect();
    const std::string algo = kAlgo.str();
    if (algo != "auto" && algo != "ring" && algo != "shared")
      throw ConfigError(str("HETRA_ALGO='", algo, "' is not allowed; allowed: auto, ring, shared"));
    useShared_ = transport_->sharedArena() != nullptr && algo != "ring";
    if (algo == "shared" && !transport_->sharedArena())
      throw ConfigError(str("HETRA_ALGO=shared needs a transport with shared memory; this group uses ",
                            transport_->name()));
    worker_ = std::thread([this] { workLoop(); });
  }

  ~CommunicatorImpl() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
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
    return enqueue(str("allreduce of ", count, " ", dtypeName(dtype)), [this, args](Deadline d) mutable {
      args.deadline = d;
      args.seq = seq_++;
      if (useShared_) allreduceShared(*transport_->sharedArena(), args);
      else allreduceRing(*transport_, args);
      if (args.op == ReduceOp::Avg) divide(args.dtype, args.out, args.count, size_);
    });
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
    return enqueue(str("reduce-scatter of ", totalCount(counts), " ", dtypeName(dtype)),
                   [this, args](Deadline d) mutable {
                     args.deadline = d;
                     args.seq = seq_++;
                     if (useShared_) reduceScatterShared(*transport_->sharedArena(), args);
                     else reduceScatterRing(*transport_, args);
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
    return enqueue(str("allgather of ", totalCount(counts), " ", dtypeName(dtype)),
                   [this, args](Deadline d) mutable {
                     args.deadline = d;
                     args.seq = seq_++;
                     if (useShared_) allgatherShared(*transport_->sharedArena(), args);
                     else allgatherRing(*transport_, args);
                   });
  }

  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    HETRA_ENFORCE(root >= 0 && root < size_, "broadcast root ", root, " is outside a group of ", size_);
    BroadcastArgs args;
    args.buf = buf;
    args.count = count;
    args.dtype = dtype;
    args.root = root;
    return enqueue(str("broadcast of ", count, " ", dtypeName(dtype)), [this, args](Deadline d) mutable {
      args.deadline = d;
      args.seq = seq_++;
      if (useShared_) broadcastShared(*transport_->sharedArena(), args);
      else broadcastPipelined(*transport_, args);
    });
  }

  WorkPtr barrier() override {
    return enqueue("barrier", [this](Deadline d) {
      BarrierArgs args;
      args.deadline = d;
      args.seq = seq_++;
      if (useShared_) barrierShared(*transport_->sharedArena(), args);
      else barrierDissemination(*transport_, args);
    });
  }

  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, uint32_t tag) override {
    checkPeer(dst, "send");
    const size_t bytes = count * dtypeSize(dtype);
    return enqueue(str("send of ", bytes, " bytes to rank ", dst), [=, this](Deadline d) {
      transport_->isend(dst, kUserTagBase | tag, buf, bytes)->wait(d);
    });
  }

  WorkPtr recv(void* buf, size_t count, DType dtype, int src, uint32_t tag) override {
    checkPeer(src, "recv");
    const size_t bytes = count * dtypeSize(dtype);
    return enqueue(str("recv of ", bytes, " bytes from rank ", src), [=, this](Deadline d) {
      transport_->irecv(src, kUserTagBase | tag, buf, bytes)->wait(d);
    });
  }

  void abort(const std::string& reason) override {
    latch(std::make_exception_ptr(PeerAbortedError(rank_, str("rank ", rank_, " aborted the group: ", reason))));
    transport_->abort(reason);
  }

 private:
  std::unique_ptr<Transport> connect() {
    const std::string& choice = options_.transport;
    if (choice != "auto" && choice != "shm" && choice != "tcp")
      throw ConfigError(str("transport '", choice, "' is not allowed; allowed: auto, shm, tcp"));
    // Every rank publishes its host identity; the group is local when all are equal.
    store_->setString(str("host/", rank_), hostIdentity());
    bool oneHost = true;
    const std::string mine = hostIdentity();
    for (int r = 0; r < size_; ++r)
      oneHost = oneHost && store_->getString(str("host/", r), options_.timeout) == mine;
    if (choice == "shm" && !oneHost)
      throw ConfigError("transport 'shm' needs every rank of the group on one host; this group spans hosts");
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
    return createTcpTransport(std::make_shared<store::PrefixStore>("tcp", store_), rank_, size_, tcp);
  }

  void checkCounts(const std::vector<size_t>& counts, const char* op) const {
    if (int(counts.size()) != size_)
      throw ConfigError(str(op, ": counts has ", counts.size(), " entries; the group has ", size_, " ranks"));
  }

  void checkPeer(int peer, const char* op) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      throw ConfigError(str(op, ": peer ", peer, " is not another rank of this group of ", size_));
  }

  WorkPtr enqueue(std::string what, std::function<void(Deadline)> run) {
    auto work = std::make_shared<WorkImpl>();
    work->what_ = std::move(what);
    work->run_ = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(work);
    }
    cv_.notify_all();
    return work;
  }

  void latch(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failed_) failed_ = error;
  }

  void workLoop() {
    log::setRank(rank_);
    for (;;) {
      std::shared_ptr<WorkImpl> work;
      std::exception_ptr failed;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = queue_.front();
        queue_.pop_front();
        failed = failed_;
      }
      if (failed) {
        work->finish(failed, 0);
        continue;
      }
      const auto start = Clock::now();
      try {
        work->run_(start + options_.timeout);
        work->finish(nullptr, secondsSince(start));
      } catch (const std::exception& e) {
        auto error = std::current_exception();
        HETRA_WARN("comm", work->what_, " failed: ", e.what());
        latch(error);
        // Wake the peers still blocked in this operation; they report this rank and the reason.
        if (!dynamic_cast<const PeerAbortedError*>(&e)) transport_->abort(e.what());
        work->finish(error, secondsSince(start));
      }
    }
  }

  std::shared_ptr<store::Store> store_;
  int rank_;
  int size_;
  GroupOptions options_;
  std::unique_ptr<Transport> transport_;
  bool useShared_ = false;
  uint64_t seq_ = 0;  // touched only by the progress thread
  int splits_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<WorkImpl>> queue_;
  std::exception_ptr failed_;
  bool stopping_ = false;
  std::thread worker_;
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
  return std::make_shared<CommunicatorImpl>(std::make_shared<store::PrefixStore>("world", std::move(store)),
                                            rank, size, options);
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
