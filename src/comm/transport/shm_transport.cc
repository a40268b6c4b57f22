// Shared-memory transport. Vocabulary:
//   segment   the POSIX shared-memory object of the group: a SegmentHeader, then per-rank records
//             (process identity, step word, doorbell, header areas), the pair rings and the slots.
//   ring      the byte stream of one ordered pair (src -> dst): `head` counts bytes the sender has
//             written, `tail` bytes the receiver has consumed; both only grow. A message is a frame
//             (tag, size) followed by its payload, streamed in as many pieces as the ring needs.
//   doorbell  per rank: a word a rank sleeps on when none of its pending requests can move. A peer
//             that moves one of its rings (writes toward it, or frees space in a ring from it)
//             rings the doorbell, but only when the rank said that it sleeps.
//   unexpected  a message that arrived before a matching irecv was posted; it is drained into heap
//             memory so that a sender never waits on a receiver that waits on the sender.
#include "comm/transport/shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/transport/futex.h"
#include "comm/transport/peer_request.h"
#include "comm/transport/shared_arena.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/process.h"

namespace hetra::comm {
namespace {

const Param kSlotBytes(
    "HETRA_SHM_SLOT_BYTES", "1048576",
    "Bytes of each rank's slot in the shared-memory arena (the pipelined collectives "
    "move pieces of about a third of it).");
const Param kRingBytes(
    "HETRA_SHM_RING_BYTES", "131072",
    "Bytes of the shared-memory ring of each ordered pair of ranks (point-to-point); "
    "a power of two, reduced for large groups.");
const Param kSpinUs("HETRA_SHM_SPIN_US", "2",
                    "Microseconds a shared-memory waiter spins (pause loop) before it starts to "
                    "yield its CPU (0 with more ranks than CPUs).");
const Param kYieldUs("HETRA_SHM_YIELD_US", "100",
                     "Microseconds a shared-memory waiter then keeps checking between sched_yield "
                     "calls before it sleeps on a futex.");

constexpr uint64_t kMagic = 0x3161726174656800ull;  // "\0hetra1"
constexpr uint32_t kVersion = 1;
constexpr size_t kPage = 4096;
constexpr size_t kFrameBytes = 16;  // tag, size
constexpr Millis kSleepSlice{50};
constexpr Millis kLivenessPeriod{50};  // how often a waiter looks at /proc for its peer
constexpr size_t kReasonBytes = 240;

size_t alignUp(size_t value, size_t to) {
  return (value + to - 1) / to * to;
}

struct SegmentHeader {
  std::atomic<uint64_t> magic;  // written last by the creator (release)
  uint32_t version;
  int32_t size;
  uint64_t slotBytes;
  uint64_t ringBytes;
  uint64_t totalBytes;
  std::atomic<int32_t> attached;  // ranks that mapped the segment
  std::atomic<int32_t> unlinked;
  alignas(64) std::atomic<uint32_t> abortState;  // 0 none, 1 being written, 2 published
  int32_t abortRank;                             // the rank that aborted or died
  char abortMessage[kReasonBytes];               // what every waiter reports
};
static_assert(sizeof(SegmentHeader) <= kPage);

struct alignas(64) PeerRecord {
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> startTime;  // from /proc/<pid>/stat, so a reused pid is not taken as alive
};

struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleepers;
};

struct alignas(64) RingIndex {
  std::atomic<uint64_t> pos;
};

struct RingControl {
  RingIndex head;  // written by the sender
  RingIndex tail;  // written by the receiver
};

// Where everything lives in the segment; computed identically by every rank from the header.
struct SegmentLayout {
  int size = 0;
  size_t slotBytes = 0, slotStride = 0, ringBytes = 0;
  size_t peers = 0, steps = 0, doorbells = 0, headers = 0, ringControls = 0, rings = 0, slots = 0;
  size_t smallSlots = 0;
  size_t total = 0;

  static SegmentLayout of(int size, size_t slotBytes, size_t ringBytes) {
    SegmentLayout l;
    l.size = size;
    l.slotBytes = slotBytes;
    l.slotStride = alignUp(slotBytes, kPage);
    l.ringBytes = ringBytes;
    const size_t n = size_t(size);
    size_t at = kPage;
    l.peers = at;
    at += n * sizeof(PeerRecord);
    l.steps = at;
    at += n * sizeof(SharedArena::StepWord);
    l.doorbells = at;
    at += n * sizeof(Doorbell);
    l.headers = alignUp(at, 64);
    at = l.headers + 2 * n * 64;  // two OpHeaders per rank, a cache line per rank
    l.ringControls = at;
    at += n * n * sizeof(RingControl);
    l.rings = alignUp(at, kPage);
    at = l.rings + n * n * ringBytes;
    l.slots = alignUp(at, kPage);
    l.smallSlots = l.slots + n * l.slotStride;
    l.total = l.smallSlots + 2 * n * SharedArena::kSmallSlotBytes;
    return l;
  }
};

size_t defaultRingBytes(int size) {
  size_t ring = size_t(std::max<int64_t>(kRingBytes.integer(), 4096));
  if (ring & (ring - 1))
    throw ConfigError(
        str("HETRA_SHM_RING_BYTES=", ring, " is not allowed; it must be a power of two"));
  // Keep all pair rings of a large group within about 64 MiB.
  while (ring > 16384 && size_t(size) * size_t(size) * ring > (size_t(64) << 20)) ring /= 2;
  return ring;
}

int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

// Removes /dev/shm/hetra-<pid>-* segments whose creator no longer exists (a job that was killed
// before its ranks could unlink them).
void removeStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, "hetra-", 6) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name + 6, &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    if (kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(str("/", name).c_str()) == 0)
      HETRA_INFO("comm", "removed stale shared-memory segment /dev/shm/", name);
  }
  closedir(dir);
}

void ringWrite(uint8_t* ring, size_t capacity, uint64_t pos, const void* src, size_t n) {
  if (n == 0) return;  // src may be null
  const size_t offset = pos & (capacity - 1);
  const size_t first = std::min(n, capacity - offset);
  std::memcpy(ring + offset, src, first);
  if (n > first) std::memcpy(ring, static_cast<const uint8_t*>(src) + first, n - first);
}

void ringRead(const uint8_t* ring, size_t capacity, uint64_t pos, void* dst, size_t n) {
  if (n == 0) return;
  const size_t offset = pos & (capacity - 1);
  const size_t first = std::min(n, capacity - offset);
  if (dst) {
    std::memcpy(dst, ring + offset, first);
    if (n > first) std::memcpy(static_cast<uint8_t*>(dst) + first, ring, n - first);
  }
}

class ShmTransport;

class ShmRequest : public PeerRequest<ShmRequest, ShmTransport> {
 public:
  using PeerRequest::PeerRequest;
  ~ShmRequest() override;

 private:
  friend class ShmTransport;
  // Guarded by the transport's mutex:
  bool framed_ = false;  // send: its frame is in the ring
  size_t moved_ = 0;     // payload bytes written (send) or delivered (recv)
  std::exception_ptr error_;
  std::atomic<bool> complete_{false};
};

// A message that arrived before its irecv.
struct Unexpected {
  uint64_t tag = 0;
  std::vector<uint8_t> data;
  size_t got = 0;
  ShmRequest* claimedBy = nullptr;  // an irecv posted while the message was still arriving
};

// Receive state of the ring from one peer.
struct Inbound {
  bool inMessage = false;
  uint64_t tag = 0;
  size_t bytes = 0, got = 0;
  uint8_t* dst = nullptr;         // nullptr: discard
  ShmRequest* request = nullptr;  // the irecv being filled, if any
  Unexpected* unexpected = nullptr;
  uint64_t tail = 0;  // local copy of the ring's tail
  std::deque<ShmRequest*> posted;
  std::deque<std::unique_ptr<Unexpected>> unexpectedQueue;
};

struct Outbound {
  std::deque<ShmRequest*> queue;
  uint64_t head = 0;  // local copy of the ring's head
  bool broken = false;
};

class ShmTransport : public Transport, public SharedArena::Monitor {
 public:
  // `created` runs once the creator has initialised the segment (rank 0 publishes its name there).
  // Opening and attaching end by `deadline`.
  ShmTransport(const std::string& name, bool create, int rank, int size, const ShmOptions& options,
               Deadline deadline, bool retryOpen, const std::function<void()>& created)
      : name_(name), rank_(rank), size_(size) {
    HETRA_ENFORCE(rank >= 0 && rank < size, "rank ", rank, " is outside a group of ", size);
    try {
      if (create) {
        createSegment(options);
        if (created) created();
      } else {
        openSegment(deadline, retryOpen);
      }
      attach(deadline);
    } catch (...) {
      release();
      throw;
    }

    // With more ranks than CPUs do not spin: spinning only delays the rank being waited for,
    // which may need this CPU (4 ranks on 2 CPUs, 8 B allreduce: 5.6-13 us spinning 1 us, 3.4-3.6
    // without, 2026-12-02). Yielding keeps the latency of a spin when the CPU has nothing else to
    // run and hands it to the awaited rank when that rank waits for it. Sleeping comes last
    // because a futex wake-up takes 5-50 us here (more in a VM): ranks in step that slept on every
    // sync point would pay that on each one.
    spinNs_ = uint64_t(std::max<int64_t>(kSpinUs.integer(), 0)) * 1000;
    yieldNs_ = uint64_t(std::max<int64_t>(kYieldUs.integer(), 0)) * 1000;
    const bool oversubscribed = size_ > usableCpus();
    if (oversubscribed) spinNs_ = 0;
    SharedArena::Layout arena;
    arena.oversubscribed = oversubscribed;
    arena.rank = rank_;
    arena.size = size_;
    arena.steps = reinterpret_cast<SharedArena::StepWord*>(base_ + layout_.steps);
    arena.headers = reinterpret_cast<OpHeader*>(base_ + layout_.headers);
    arena.slots = base_ + layout_.slots;
    arena.slotBytes = layout_.slotBytes;
    arena.slotStride = layout_.slotStride;
    arena.spinNs = spinNs_;
    arena.yieldNs = yieldNs_;
    arena.monitor = this;
    arena.smallSlots = base_ + layout_.smallSlots;
    arena_ = std::make_unique<SharedArena>(arena);
    inbound_ = std::vector<Inbound>(size_);
    outbound_ = std::vector<Outbound>(size_);
    HETRA_DEBUG("comm", "shm transport rank ", rank_, "/", size_, " segment ", name_, " (",
                layout_.total >> 10, " KiB, slot ", layout_.slotBytes, " B, ring ",
                layout_.ringBytes, " B, spin ", spinNs_, " ns, yield ", yieldNs_, " ns)");
  }

  ~ShmTransport() override { release(); }

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  SharedArena* sharedArena() override { return arena_.get(); }

  std::unique_ptr<Request> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    checkPeerIndex(peer);
    auto request = ShmRequest::send(*this, peer, tag, data, bytes);
    checkAborted();
    std::lock_guard<std::mutex> lock(mutex_);
    Outbound& out = outbound_[peer];
    if (out.broken) {
      request->error_ = std::make_exception_ptr(
          IoError(str("shm: the stream from rank ", rank_, " to rank ", peer,
                      " was broken by a send abandoned before it completed")));
      request->complete_.store(true, std::memory_order_release);
      return request;
    }
    out.queue.push_back(request.get());
    progressSend(peer);
    return request;
  }

  std::unique_ptr<Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    checkPeerIndex(peer);
    auto request = ShmRequest::receive(*this, peer, tag, data, bytes);
    checkAborted();
    std::lock_guard<std::mutex> lock(mutex_);
    Inbound& in = inbound_[peer];
    for (auto it = in.unexpectedQueue.begin(); it != in.unexpectedQueue.end(); ++it) {
      Unexpected& message = **it;
      if (message.tag != tag || message.claimedBy) continue;
      message.claimedBy = request.get();
      if (message.got == message.data.size()) deliverUnexpected(in, it);
      return request;
    }
    in.posted.push_back(request.get());
    progressRecv(peer);
    return request;
  }

  void abort(const std::string& reason) override {
    publishAbort(rank_, str("rank ", rank_, " aborted the group: ", reason));
  }

  uint64_t bytesSent() const override {
    return sent_.load(std::memory_order_relaxed) + arena_->bytesSent();
  }
  uint64_t bytesReceived() const override {
    return received_.load(std::memory_order_relaxed) + arena_->bytesReceived();
  }

  // SharedArena::Monitor
  void checkAborted() override {
    const SegmentHeader& h = header();
    if (h.abortState.load(std::memory_order_acquire) != 2) return;
    throw PeerAbortedError(h.abortRank, h.abortMessage);
  }

  // Looks at every peer, not only the awaited one: that one may itself be blocked on the dead rank.
  // The first rank to notice a death publishes it like an abort, so every waiter of the group
  // reports the dead rank, not the rank it happened to wait for.
  void checkPeersAlive() override {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      PeerRecord& record = peers()[peer];
      const int pid = record.pid.load(std::memory_order_acquire);
      if (processAlive(pid, record.startTime.load(std::memory_order_relaxed))) continue;
      publishAbort(peer, str("rank ", peer, " (pid ", pid, ") died"));
      checkAborted();
    }
  }

  void wait(ShmRequest& request, Deadline deadline) {
    if (!request.complete_.load(std::memory_order_acquire)) waitSlow(request, deadline);
    if (request.error_) std::rethrow_exception(request.error_);
  }

  // A request dropped before it completed must not be touched again by the progress engine.
  void forget(ShmRequest& request) {
    if (request.complete_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (request.isSend_) {
      Outbound& out = outbound_[request.peer_];
      out.queue.erase(std::remove(out.queue.begin(), out.queue.end(), &request), out.queue.end());
      // The receiver would wait for the rest of a half-written message forever: poison the stream.
      if (request.framed_) out.broken = true;
      return;
    }
    Inbound& in = inbound_[request.peer_];
    in.posted.erase(std::remove(in.posted.begin(), in.posted.end(), &request), in.posted.end());
    if (in.request == &request) {
      in.request = nullptr;
      in.dst = nullptr;  // drain the rest of the message
    }
    for (auto& message : in.unexpectedQueue)
      if (message->claimedBy == &request) message->claimedBy = nullptr;
  }

 private:
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  PeerRecord* peers() const { return reinterpret_cast<PeerRecord*>(base_ + layout_.peers); }
  SharedArena::StepWord* steps() const {
    return reinterpret_cast<SharedArena::StepWord*>(base_ + layout_.steps);
  }
  Doorbell* doorbells() const { return reinterpret_cast<Doorbell*>(base_ + layout_.doorbells); }
  RingControl& ring(int src, int dst) const {
    return reinterpret_cast<RingControl*>(base_ + layout_.ringControls)[src * size_ + dst];
  }
  uint8_t* ringData(int src, int dst) const {
    return base_ + layout_.rings + size_t(src * size_ + dst) * layout_.ringBytes;
  }

  // The first abort (or death) wins; every sleeper of the group is woken to see it.
  void publishAbort(int rank, const std::string& message) {
    SegmentHeader& h = header();
    uint32_t expected = 0;
    if (h.abortState.compare_exchange_strong(expected, 1)) {
      h.abortRank = rank;
      std::strncpy(h.abortMessage, message.c_str(), kReasonBytes - 1);
      h.abortMessage[kReasonBytes - 1] = 0;
      h.abortState.store(2, std::memory_order_seq_cst);
    }
    // A sleeper that misses the wake (it was about to sleep) wakes within a sleep slice anyway.
    for (int r = 0; r < size_; ++r) {
      futex::wakeAll(futex::lowHalf(&steps()[r].value));
      doorbells()[r].seq.fetch_add(1);
      futex::wakeAll(&doorbells()[r].seq);
    }
  }

  void release() {
    if (!base_) return;
    if (header().unlinked.load() == 0) shm_unlink(name_.c_str());
    munmap(base_, layout_.total);
    base_ = nullptr;
  }

  void checkPeerIndex(int peer) const {
    HETRA_ENFORCE(peer >= 0 && peer < size_, "peer ", peer, " is outside a group of ", size_);
  }

  void createSegment(const ShmOptions& options) {
    removeStaleSegments();
    const size_t slotBytes =
        alignUp(std::max<size_t>(
                    options.slotBytes ? options.slotBytes : size_t(kSlotBytes.integer()), 4096),
                64);
    const size_t ringBytes = options.ringBytes ? options.ringBytes : defaultRingBytes(size_);
    HETRA_ENFORCE(ringBytes >= 64 && (ringBytes & (ringBytes - 1)) == 0,
                  "ring bytes must be a power of two >= 64, got ", ringBytes);
    layout_ = SegmentLayout::of(size_, slotBytes, ringBytes);
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      throw IoError(str("shm: cannot create segment ", name_, ": ", std::strerror(errno)));
    // Reserve the memory now: a full /dev/shm then fails here, not with SIGBUS mid-collective.
    const int rc = posix_fallocate(fd, 0, off_t(layout_.total));
    if (rc != 0) {
      close(fd);
      shm_unlink(name_.c_str());
      throw IoError(str("shm: cannot reserve ", layout_.total >> 20, " MiB for segment ", name_,
                        " in /dev/shm: ", std::strerror(rc),
                        " (lower HETRA_SHM_SLOT_BYTES or enlarge /dev/shm)"));
    }
    mapOrThrow(fd, layout_.total);
    SegmentHeader& h = header();
    h.version = kVersion;
    h.size = size_;
    h.slotBytes = slotBytes;
    h.ringBytes = ringBytes;
    h.totalBytes = layout_.total;
    h.magic.store(kMagic, std::memory_order_release);
  }

  void openSegment(Deadline deadline, bool retry) {
    for (;;) {
      const int fd = shm_open(name_.c_str(), O_RDWR, 0);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && size_t(st.st_size) >= kPage) {
          mapOrThrow(fd, size_t(st.st_size));
          layout_.total = size_t(st.st_size);
          if (header().magic.load(std::memory_order_acquire) == kMagic) break;
          munmap(base_, layout_.total);
          base_ = nullptr;
        } else {
          close(fd);
        }
      } else if (errno != ENOENT || !retry) {
        throw IoError(str("shm: cannot open segment ", name_, ": ", std::strerror(errno)));
      }
      if (Clock::now() >= deadline)
        throw TimeoutError(str("shm: rank ", rank_, " timed out waiting for segment ", name_,
                               " to be created by rank 0"));
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    const SegmentHeader& h = header();
    if (h.version != kVersion || h.size != size_)
      throw ConfigError(str("shm: segment ", name_, " is for a group of ", h.size,
                            " ranks (version ", h.version, "); rank ", rank_, " expected ", size_,
                            " ranks (version ", kVersion, ")"));
    const size_t total = layout_.total;
    layout_ = SegmentLayout::of(size_, h.slotBytes, h.ringBytes);
    if (layout_.total != h.totalBytes || total < layout_.total) {
      layout_.total = total;  // what was mapped, for munmap
      throw IoError(str("shm: segment ", name_, " has an inconsistent layout"));
    }
    layout_.total = total;
  }

  void mapOrThrow(int fd, size_t bytes) {
    // Populated now, so the first collectives do not pay thousands of page faults.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int err = errno;
    close(fd);
    if (p == MAP_FAILED)
      throw IoError(str("shm: cannot map segment ", name_, ": ", std::strerror(err)));
    base_ = static_cast<uint8_t*>(p);
    layout_.total = bytes;
  }

  void attach(Deadline deadline) {
    SegmentHeader& h = header();
    PeerRecord& me = peers()[rank_];
    int32_t none = 0;
    me.startTime.store(ownStartTime(), std::memory_order_relaxed);
    if (!me.pid.compare_exchange_strong(none, getpid()))
      throw ConfigError(str("shm: rank ", rank_, " of segment ", name_,
                            " was already taken by pid ", none,
                            "; are two processes using one rank?"));
    // The last rank to map the segment unlinks it: from now on it lives exactly as long as a
    // mapping.
    if (h.attached.fetch_add(1) + 1 == size_) {
      shm_unlink(name_.c_str());
      h.unlinked.store(1);
    }
    while (h.attached.load(std::memory_order_acquire) < size_) {
      checkAborted();
      if (Clock::now() >= deadline) {
        std::string missing;
        for (int r = 0; r < size_; ++r)
          if (peers()[r].pid.load() == 0) missing += str(missing.empty() ? "" : ", ", r);
        throw TimeoutError(str("shm: rank ", rank_, " timed out waiting for ranks ", missing,
                               " to map segment ", name_));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  // Rings a peer's doorbell if it sleeps. Called after a seq_cst store of a ring index.
  void notify(int peer) {
    Doorbell& bell = doorbells()[peer];
    if (bell.sleepers.load(std::memory_order_seq_cst) == 0) return;
    bell.seq.fetch_add(1, std::memory_order_seq_cst);
    futex::wakeAll(&bell.seq);
  }

  // Writes as much of the queued sends to `peer` as its ring takes. Holds mutex_.
  bool progressSend(int peer) {
    Outbound& out = outbound_[peer];
    if (out.queue.empty()) return false;
    RingControl& control = ring(rank_, peer);
    uint8_t* data = ringData(rank_, peer);
    const size_t capacity = layout_.ringBytes;
    uint64_t tail = control.tail.pos.load(std::memory_order_acquire);
    bool moved = false;
    while (!out.queue.empty()) {
      ShmRequest& request = *out.queue.front();
      size_t space = capacity - size_t(out.head - tail);
      if (space < kFrameBytes || (request.framed_ && space == 0)) {
        tail = control.tail.pos.load(std::memory_order_acquire);
        space = capacity - size_t(out.head - tail);
        if (space < kFrameBytes) break;
      }
      if (!request.framed_) {
        const uint64_t frame[2] = {request.tag_, uint64_t(request.bytes_)};
        ringWrite(data, capacity, out.head, frame, kFrameBytes);
        out.head += kFrameBytes;
        space -= kFrameBytes;
        request.framed_ = true;
      }
      // Publish in pieces of at most half the ring, so the receiver copies while we write.
      const size_t n = std::min({space, request.bytes_ - request.moved_, capacity / 2});
      ringWrite(data, capacity, out.head, request.data_ + request.moved_, n);
      out.head += n;
      request.moved_ += n;
      control.head.pos.store(out.head, std::memory_order_seq_cst);
      moved = true;
      if (request.moved_ == request.bytes_) {
        sent_.fetch_add(request.bytes_, std::memory_order_relaxed);
        out.queue.pop_front();
        request.complete_.store(true, std::memory_order_release);
      }
    }
    if (moved) notify(peer);
    return moved;
  }

  // Consumes whatever the ring from `peer` holds. Holds mutex_.
  bool progressRecv(int peer) {
    Inbound& in = inbound_[peer];
    RingControl& control = ring(peer, rank_);
    const uint8_t* data = ringData(peer, rank_);
    const size_t capacity = layout_.ringBytes;
    uint64_t head = control.head.pos.load(std::memory_order_acquire);
    bool moved = false;
    while (head != in.tail) {
      if (!in.inMessage) {
        uint64_t frame[2];
        ringRead(data, capacity, in.tail, frame, kFrameBytes);
        in.tail += kFrameBytes;
        startMessage(in, peer, frame[0], size_t(frame[1]));
      }
      const size_t n = std::min(size_t(head - in.tail), in.bytes - in.got);
      ringRead(data, capacity, in.tail, in.dst ? in.dst + in.got : nullptr, n);
      in.tail += n;
      in.got += n;
      moved = true;
      if (in.got == in.bytes) finishMessage(in);
      if (head == in.tail) head = control.head.pos.load(std::memory_order_acquire);
    }
    if (moved) {
      control.tail.pos.store(in.tail, std::memory_order_seq_cst);
      notify(peer);
    }
    return moved;
  }

  void startMessage(Inbound& in, int peer, uint64_t tag, size_t bytes) {
    in.inMessage = true;
    in.tag = tag;
    in.bytes = bytes;
    in.got = 0;
    in.request = nullptr;
    in.unexpected = nullptr;
    in.dst = nullptr;
    auto match = std::find_if(in.posted.begin(), in.posted.end(),
                              [&](ShmRequest* r) { return r->tag_ == tag; });
    if (match != in.posted.end()) {
      ShmRequest* request = *match;
      in.posted.erase(match);
      if (request->bytes_ != bytes) {
        // Drain the message and fail the receive: its buffer cannot hold what was sent.
        request->error_ = std::make_exception_ptr(MismatchError(
            str("shm: rank ", rank_, " posted a receive of ", request->bytes_, " bytes (tag ", tag,
                ") but rank ", peer, " sent ", bytes, " bytes")));
        request->complete_.store(true, std::memory_order_release);
        return;
      }
      in.request = request;
      in.dst = request->data_;
      return;
    }
    auto message = std::make_unique<Unexpected>();
    message->tag = tag;
    message->data.resize(bytes);
    in.unexpected = message.get();
    in.dst = message->data.data();
    in.unexpectedQueue.push_back(std::move(message));
  }

  void finishMessage(Inbound& in) {
    in.inMessage = false;
    if (in.request) {
      received_.fetch_add(in.bytes, std::memory_order_relaxed);
      in.request->moved_ = in.bytes;
      in.request->complete_.store(true, std::memory_order_release);
      in.request = nullptr;
    } else if (in.unexpected) {
      in.unexpected->got = in.bytes;
      auto it = std::find_if(in.unexpectedQueue.begin(), in.unexpectedQueue.end(),
                             [&](const auto& m) { return m.get() == in.unexpected; });
      in.unexpected = nullptr;
      if ((*it)->claimedBy) deliverUnexpected(in, it);
    }
  }

  // Copies a fully arrived unexpected message to the receive that claimed it.
  void deliverUnexpected(Inbound& in, std::deque<std::unique_ptr<Unexpected>>::iterator it) {
    Unexpected& message = **it;
    ShmRequest& request = *message.claimedBy;
    if (request.bytes_ != message.data.size()) {
      request.error_ = std::make_exception_ptr(MismatchError(
          str("shm: rank ", rank_, " posted a receive of ", request.bytes_, " bytes (tag ",
              message.tag, ") but rank ", request.peer_, " sent ", message.data.size(), " bytes")));
    } else {
      if (!message.data.empty())
        std::memcpy(request.data_, message.data.data(), message.data.size());
      received_.fetch_add(message.data.size(), std::memory_order_relaxed);
      request.moved_ = message.data.size();
    }
    request.complete_.store(true, std::memory_order_release);
    in.unexpectedQueue.erase(it);
  }

  bool progressAll() {
    std::lock_guard<std::mutex> lock(mutex_);
    bool moved = false;
    for (int peer = 0; peer < size_; ++peer) {
      moved |= progressSend(peer);
      moved |= progressRecv(peer);
    }
    return moved;
  }

  void waitSlow(ShmRequest& request, Deadline deadline) {
    Doorbell& bell = doorbells()[rank_];
    auto spinStart = Clock::now();
    auto nextLivenessCheck = spinStart + kLivenessPeriod;
    for (;;) {
      const uint32_t seq = bell.seq.load(std::memory_order_acquire);
      const bool moved = progressAll();
      if (request.complete_.load(std::memory_order_acquire)) return;
      if (moved) {
        spinStart = Clock::now();
        continue;
      }
      const auto now = Clock::now();
      const uint64_t idleNs =
          uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(now - spinStart).count());
      if (idleNs < spinNs_) {
        for (int i = 0; i < 16; ++i) _mm_pause();
        continue;
      }
      if (idleNs < spinNs_ + yieldNs_) {
        sched_yield();
        continue;
      }
      checkAborted();
      if (now >= nextLivenessCheck) {
        checkPeersAlive();
        nextLivenessCheck = now + kLivenessPeriod;
      }
      if (now >= deadline)
        throw TimeoutError(str("shm: rank ", rank_, " timed out ",
                               request.isSend_ ? "sending " : "receiving ", request.bytes_,
                               " bytes (tag ", request.tag_, ") ", request.isSend_ ? "to" : "from",
                               " rank ", request.peer_, " after ", request.moved_, " bytes"));
      bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
      // Orders the announcement before the ring loads of progressAll(), against notify()'s store
      // of a ring index then load of `sleepers`: one of the two sides sees the other.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const bool movedNow = progressAll();
      if (!movedNow && !request.complete_.load(std::memory_order_acquire))
        futex::wait(&bell.seq, seq,
                    std::max(Millis(1), std::min(kSleepSlice, remaining(deadline))));
      bell.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (movedNow) spinStart = Clock::now();
    }
  }

  std::string name_;
  int rank_;
  int size_;
  SegmentLayout layout_;
  uint8_t* base_ = nullptr;
  uint64_t spinNs_ = 0;
  uint64_t yieldNs_ = 0;
  std::unique_ptr<SharedArena> arena_;

  std::mutex mutex_;  // the progress engine: inbound_, outbound_, request states
  std::vector<Inbound> inbound_;
  std::vector<Outbound> outbound_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

ShmRequest::~ShmRequest() {
  transport_.forget(*this);
}

void checkSegmentName(const std::string& name) {
  if (name.rfind("/hetra-", 0) != 0 || name.find('/', 1) != std::string::npos || name.size() > 200)
    throw ConfigError(str("shm segment name '", name,
                          "' is not allowed; it must look like /hetra-<pid>-<suffix>"));
}

}  // namespace

void SharedArena::waitSlow(int peer, uint64_t target, Deadline deadline, const char* what) {
  StepWord& word = l_.steps[peer];
  // A peer on its way arrives within a few pauses: they come before the first clock read, which in
  // a VM costs about as much as a small collective's own work.
  for (int i = 0; i < kPausesBeforeClock && l_.spinNs > 0; ++i) {
    if (word.value.load(std::memory_order_acquire) >= target) return;
    _mm_pause();
  }
  const auto start = Clock::now();
  auto nextLivenessCheck = start + kLivenessPeriod;
  if (l_.spinNs > 0) {
    const auto spinUntil = start + std::chrono::nanoseconds(l_.spinNs);
    do {
      for (int i = 0; i < 16; ++i) {
        if (word.value.load(std::memory_order_acquire) >= target) return;
        _mm_pause();
      }
    } while (Clock::now() < spinUntil);
  }
  if (l_.yieldNs > 0) {
    const auto yieldUntil = start + std::chrono::nanoseconds(l_.spinNs + l_.yieldNs);
    do {
      if (word.value.load(std::memory_order_acquire) >= target) return;
      sched_yield();
    } while (Clock::now() < yieldUntil);
  }
  for (;;) {
    uint64_t seen = word.value.load(std::memory_order_acquire);
    if (seen >= target) return;
    // The condition is checked before the abort word, so a peer that finished this sync point and
    // then failed (a mismatched header) does not turn a completed wait into an abort.
    l_.monitor->checkAborted();
    const auto now = Clock::now();
    if (now >= nextLivenessCheck) {
      l_.monitor->checkPeersAlive();
      nextLivenessCheck = now + kLivenessPeriod;
    }
    if (now >= deadline)
      throw TimeoutError(str("shm: rank ", l_.rank, " timed out waiting for rank ", peer, " (",
                             what, "; it is at step ", seen, ", this rank waits for step ", target,
                             ")"));
    word.sleepers.fetch_add(1, std::memory_order_seq_cst);
    seen = word.value.load(std::memory_order_seq_cst);
    if (seen < target)
      futex::wait(futex::lowHalf(&word.value), uint32_t(seen),
                  std::max(Millis(1), std::min(kSleepSlice, remaining(deadline))));
    word.sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
}

std::string newShmSegmentName() {
  uint8_t random[16];
  size_t got = 0;
  while (got < sizeof random) {
    const ssize_t n = getrandom(random + got, sizeof random - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(str("getrandom failed: ", std::strerror(errno)));
    got += size_t(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string name = str("/hetra-", getpid(), "-");
  for (uint8_t byte : random) {
    name += kHex[byte >> 4];
    name += kHex[byte & 15];
  }
  return name;
}

std::unique_ptr<Transport> createShmTransport(store::Store& store, int rank, int size,
                                              const ShmOptions& options) {
  // Reading the segment's name and attaching to it share one budget.
  const Deadline deadline = deadlineAfter(options.timeout);
  if (rank == 0) {
    const std::string name = newShmSegmentName();
    auto transport =
        std::make_unique<ShmTransport>(name, true, rank, size, options, deadline, false,
                                       [&] { store.setString("segment", name); });
    // Every rank has mapped the segment, so every rank has read its name: drop the key, so that a
    // later group on the same store prefix cannot pick up this one's (already unlinked) name.
    store.deleteKey("segment");
    return transport;
  }
  const std::string name = store.getString("segment", deadline);
  checkSegmentName(name);
  return std::make_unique<ShmTransport>(name, false, rank, size, options, deadline, false, nullptr);
}

std::unique_ptr<Transport> createShmTransport(const std::string& segmentName, int rank, int size,
                                              const ShmOptions& options) {
  checkSegmentName(segmentName);
  return std::make_unique<ShmTransport>(segmentName, rank == 0, rank, size, options,
                                        deadlineAfter(options.timeout), true, nullptr);
}

}  // namespace hetra::comm
