// NCCL transport (see nccl_transport.h for the contract).
//
// Vocabulary:
//   pending - isend/irecv calls not yet given to NCCL;
//   batch   - the pending operations launched together in one ncclGroupStart/ncclGroupEnd on the
//             transport's stream, with one CUDA event recorded after them: the requests of a
//             batch complete together;
//   failure - the first fault (timeout, NCCL or CUDA error, abort, a peer's abort record) is
//             latched: the NCCL communicator is aborted once, the record is published in the
//             store, and every later call throws the same error.
#include "cuda/nccl_transport.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/transport/abort_record.h"
#include "comm/transport/group_join.h"
#include "comm/transport/registry.h"
#include "common/errors.h"
#include "common/logging.h"
#include "cuda/cuda_check.h"

namespace hetra::cuda {

namespace {

constexpr const char* kIdKey = "nccl-id";
// A waiter reads the group's abort record after this long, and again at this interval.
constexpr Millis kProbeInterval{200};
// Destruction finalises the communicator (flushing its work) for at most this long, then aborts.
constexpr Millis kFinalizeTimeout{10000};

std::string ncclText(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) text += str(" (", last, ")");
  return text;
}

// NCCL's names for hetra's element types and reduce ops, indexed by the enum (declaration order).
constexpr ncclDataType_t kNcclTypes[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                         ncclInt32,   ncclInt64,   ncclUint8};
static_assert(std::size(kNcclTypes) == size_t(DType::U8) + 1);
constexpr ncclRedOp_t kNcclOps[] = {ncclSum, ncclAvg, ncclMin, ncclMax};
static_assert(std::size(kNcclOps) == size_t(comm::ReduceOp::Max) + 1);

ncclDataType_t ncclType(DType dtype) {
  if (size_t(dtype) < std::size(kNcclTypes)) return kNcclTypes[size_t(dtype)];
  throw EnforceError(str("nccl transport: unknown dtype ", int(dtype)));
}

ncclRedOp_t ncclOp(comm::ReduceOp op) {
  if (size_t(op) < std::size(kNcclOps)) return kNcclOps[size_t(op)];
  throw EnforceError(str("nccl transport: unknown reduce op ", int(op)));
}

struct Batch {
  cudaEvent_t event = nullptr;
  ~Batch() {
    if (event) cudaEventDestroy(event);
  }
};

// What a request waits for: its batch, once launched.
struct Slot {
  std::shared_ptr<Batch> batch;
};

struct PendingOp {
  bool send;
  int peer;
  void* data;
  size_t bytes;
  std::shared_ptr<Slot> slot;
};

class NcclTransportImpl;

class NcclRequest final : public comm::Request {
 public:
  NcclRequest(NcclTransportImpl* transport, std::shared_ptr<Slot> slot)
      : transport_(transport), slot_(std::move(slot)) {}
  void wait(Deadline deadline) override;

 private:
  NcclTransportImpl* transport_;
  std::shared_ptr<Slot> slot_;
};

class NcclTransportImpl final : public NcclTransport {
 public:
  NcclTransportImpl(std::shared_ptr<store::Store> store, int rank, int size, int device)
      : store_(std::move(store)), rank_(rank), size_(size), device_(device) {}

  ~NcclTransportImpl() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_.empty())
      HETRA_WARN("comm", "nccl: ", pending_.size(),
                 " send/receive(s) never waited for were dropped at destruction");
    pending_.clear();
    if (comm_) {
      cudaSetDevice(device_);
      if (failure_) {
        abortCommLocked();
      } else {
        // Finalise flushes outstanding work; bounded, so a stuck peer cannot hang destruction.
        ncclResult_t result = ncclCommFinalize(comm_);
        const Deadline deadline = deadlineAfter(kFinalizeTimeout);
        ncclResult_t state = result;
        while (result == ncclInProgress || result == ncclSuccess) {
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
          if (Clock::now() >= deadline) break;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        if (result != ncclSuccess && result != ncclInProgress) state = result;
        if (state == ncclSuccess) {
          ncclCommDestroy(comm_);
          comm_ = nullptr;
        } else {
          HETRA_WARN("comm", "nccl: finalising the communicator failed or timed out (",
                     ncclText(state, comm_), "); aborting it");
          abortCommLocked();
        }
      }
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Creates the stream and the non-blocking NCCL communicator, polling it until the deadline.
  void init(const ncclUniqueId& id, Deadline deadline) {
    HETRA_CUDA_CHECK(cudaSetDevice(device_));
    HETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t result = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      const std::string text = ncclText(result, comm_);
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      throw IoError(str("nccl transport: rank ", rank_, ": ncclCommInitRankConfig: ", text));
    }
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
      if (query != ncclSuccess) state = query;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string text = ncclText(state, comm_);
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw IoError(str("nccl transport: rank ", rank_, " of ", size_,
                          ": initialising the communicator failed: ", text));
      }
      if (Clock::now() >= deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError(str("nccl transport: rank ", rank_, " of ", size_,
                               ": the NCCL communicator did not form before the deadline (did "
                               "every rank of the group reach it, each on its own GPU?)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  cudaStream_t stream() const override { return stream_; }
  int device() const override { return device_; }

  std::unique_ptr<comm::Request> isend(int peer, uint64_t tag, const void* data,
                                       size_t bytes) override {
    return post(true, peer, const_cast<void*>(data), bytes);
  }
  std::unique_ptr<comm::Request> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    return post(false, peer, data, bytes);
  }

  void abort(const std::string& reason) override {
    latch(std::make_exception_ptr(
              PeerAbortedError(rank_, str("rank ", rank_, " aborted the group: ", reason))),
          rank_, reason);
  }

  uint64_t bytesSent() const override { return sent_.load(); }
  uint64_t bytesReceived() const override { return received_.load(); }

  void allreduce(const void* in, void* out, size_t count, DType dtype, comm::ReduceOp op,
                 Deadline deadline) override {
    flush(deadline);  // earlier point-to-point operations first, in issue order
    std::shared_ptr<Batch> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      throwIfFailedLocked();
      HETRA_CUDA_CHECK(cudaSetDevice(device_));
      const ncclResult_t result =
          ncclAllReduce(in, out, count, ncclType(dtype), ncclOp(op), comm_, stream_);
      batch = finishLaunchLocked(result, "ncclAllReduce", deadline);
    }
    const uint64_t bytes = count * dtypeSize(dtype);
    sent_ += bytes;
    received_ += bytes;
    waitBatch(*batch, deadline);
  }

  void waitSlot(Slot& slot, Deadline deadline) {
    if (!slot.batch) flush(deadline);
    std::shared_ptr<Batch> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      batch = slot.batch;
    }
    HETRA_ENFORCE(batch != nullptr, "nccl transport: a request was not launched by its flush");
    waitBatch(*batch, deadline);
  }

 private:
  std::unique_ptr<comm::Request> post(bool send, int peer, void* data, size_t bytes) {
    HETRA_ENFORCE(peer >= 0 && peer < size_, "nccl transport: peer ", peer,
                  " is outside a group of ", size_);
    std::lock_guard<std::mutex> lock(mutex_);
    throwIfFailedLocked();
    auto slot = std::make_shared<Slot>();
    pending_.push_back(PendingOp{send, peer, data, bytes, slot});
    return std::make_unique<NcclRequest>(this, std::move(slot));
  }

  // Launches every pending operation in one group.
  void flush(Deadline deadline) {
    std::lock_guard<std::mutex> lock(mutex_);
    throwIfFailedLocked();
    if (pending_.empty()) return;
    HETRA_CUDA_CHECK(cudaSetDevice(device_));
    std::vector<PendingOp> ops;
    ops.swap(pending_);
    ncclResult_t result = ncclGroupStart();
    uint64_t sent = 0, received = 0;
    for (const PendingOp& op : ops) {
      if (result != ncclSuccess) break;
      // Bytes as ncclUint8: a count per call is a size_t, so any size goes in one operation.
      result = op.send ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_)
                       : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_);
      (op.send ? sent : received) += op.bytes;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (result == ncclSuccess) result = end;
    auto batch = finishLaunchLocked(result, "ncclSend/ncclRecv group", deadline);
    for (const PendingOp& op : ops) op.slot->batch = batch;
    sent_ += sent;
    received_ += received;
  }

  // After a launch: waits (polling) until NCCL has enqueued it, then records the batch's event.
  std::shared_ptr<Batch> finishLaunchLocked(ncclResult_t result, const char* what,
                                            Deadline deadline) {
    while (result == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
      result = query != ncclSuccess ? query : state;
      if (result != ncclInProgress) break;
      if (Clock::now() >= deadline)
        failLocked(
            std::make_exception_ptr(TimeoutError(str("nccl transport: rank ", rank_, ": ", what,
                                                     " was not enqueued before the deadline"))),
            rank_, str(what, " timed out"));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (result != ncclSuccess) {
      const std::string message =
          str("nccl transport: rank ", rank_, ": ", what, ": ", ncclText(result, comm_));
      failLocked(std::make_exception_ptr(IoError(message)), rank_, message);
    }
    auto batch = std::make_shared<Batch>();
    HETRA_CUDA_CHECK(cudaEventCreateWithFlags(&batch->event, cudaEventDisableTiming));
    HETRA_CUDA_CHECK(cudaEventRecord(batch->event, stream_));
    return batch;
  }

  // Polls the batch's event, NCCL's asynchronous error, the local abort and (every
  // kProbeInterval) the group's abort record, until done or the deadline.
  void waitBatch(Batch& batch, Deadline deadline) {
    Deadline nextProbe = deadlineAfter(kProbeInterval);
    for (int spins = 0;; ++spins) {
      const cudaError_t state = cudaEventQuery(batch.event);
      if (state == cudaSuccess) return;
      std::unique_lock<std::mutex> lock(mutex_);
      throwIfFailedLocked();
      if (state != cudaErrorNotReady) {
        const std::string message = str("nccl transport: rank ", rank_, ": CUDA error ",
                                        cudaGetErrorName(state), ": ", cudaGetErrorString(state));
        failLocked(std::make_exception_ptr(IoError(message)), rank_, message);
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &async);
      if (query != ncclSuccess) async = query;
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string message =
            str("nccl transport: rank ", rank_, ": ", ncclText(async, comm_));
        failLocked(std::make_exception_ptr(IoError(message)), rank_, message);
      }
      const Clock::time_point now = Clock::now();
      if (now >= nextProbe) {
        int culprit = -1;
        std::string record;
        if (readAbortRecord(culprit, record))
          failLocked(std::make_exception_ptr(
                         PeerAbortedError(culprit, str(record, " (seen by rank ", rank_, ")"))),
                     -1, "");
        nextProbe = now + kProbeInterval;
      }
      if (now >= deadline)
        failLocked(std::make_exception_ptr(
                       TimeoutError(str("nccl transport: rank ", rank_, " of ", size_,
                                        ": an operation did not complete before the deadline"))),
                   rank_, "an operation timed out");
      lock.unlock();
      if (spins >= 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void throwIfFailedLocked() {
    if (!failure_) return;
    abortCommLocked();  // an abort() from another thread leaves this to a thread using the comm
    std::rethrow_exception(failure_);
  }

  // Latches the failure, aborts the communicator, publishes the record (culprit >= 0), throws.
  [[noreturn]] void failLocked(std::exception_ptr error, int culprit, const std::string& reason) {
    if (!failure_) {
      failure_ = error;
      if (culprit >= 0) publishRecord(culprit, reason);
    }
    abortCommLocked();
    std::rethrow_exception(failure_);
  }

  // From any thread: latches and publishes; the communicator is aborted by the next thread that
  // uses it (NCCL calls on one communicator are not made from two threads at once).
  void latch(std::exception_ptr error, int culprit, const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_) return;
      failure_ = error;
    }
    publishRecord(culprit, reason);
  }

  void abortCommLocked() {
    if (!comm_ || commAborted_) return;
    commAborted_ = true;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void publishRecord(int culprit, const std::string& reason) {
    const std::string record = str(culprit, "\nrank ", culprit, " failed the group: ", reason);
    comm::publishAbortRecord(*store_, record, "nccl");
  }

  bool readAbortRecord(int& culprit, std::string& message) {
    return comm::readAbortRecord(*store_, culprit, message);
  }

  std::shared_ptr<store::Store> store_;
  const int rank_;
  const int size_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool commAborted_ = false;
  std::mutex mutex_;
  std::vector<PendingOp> pending_;
  std::exception_ptr failure_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

void NcclRequest::wait(Deadline deadline) {
  transport_->waitSlot(*slot_, deadline);
}

}  // namespace

std::unique_ptr<NcclTransport> createNcclTransport(std::shared_ptr<store::Store> store, int rank,
                                                   int size, const NcclOptions& options) {
  comm::enforceGroupMember("nccl transport", store.get(), rank, size);
  const Deadline deadline = deadlineAfter(options.timeout);
  int device = options.device;
  if (device >= 0)
    HETRA_CUDA_CHECK(cudaSetDevice(device));
  else
    HETRA_CUDA_CHECK(cudaGetDevice(&device));

  // A record left by an earlier group under this prefix would fail this one; rank 0 clears it
  // before publishing the id, and the other ranks read the id only after that.
  if (rank == 0) store->deleteKey(comm::kAbortKey);
  const store::Bytes idBytes = comm::exchangeRootId(
      *store, kIdKey, rank,
      [] {
        ncclUniqueId id;
        const ncclResult_t result = ncclGetUniqueId(&id);
        if (result != ncclSuccess)
          throw IoError(str("nccl transport: ncclGetUniqueId: ", ncclGetErrorString(result)));
        return store::Bytes(id.internal, id.internal + sizeof id.internal);
      },
      deadline, sizeof(ncclUniqueId));
  ncclUniqueId id;
  std::copy(idBytes.begin(), idBytes.end(), id.internal);

  auto transport = std::make_unique<NcclTransportImpl>(store, rank, size, device);
  transport->init(id, deadline);
  return transport;
}

void registerTransports() {
  comm::registerTransport(
      {"nccl", -1,
       [](const comm::TransportRequest&) -> std::string {
         return gpuDeviceCount() > 0 ? "" : "no CUDA device is visible to this process";
       },
       [](const comm::TransportRequest& r) -> std::unique_ptr<comm::Transport> {
         NcclOptions options;
         options.timeout = r.timeout;
         return createNcclTransport(std::make_shared<store::PrefixStore>("nccl", r.store), r.rank,
                                    r.size, options);
       }});
}

}  // namespace hetra::cuda
