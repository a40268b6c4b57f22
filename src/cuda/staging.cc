#include "cuda/staging.h"

#include <memory>
#include <thread>

#include "comm/staging_plan.h"
#include "common/errors.h"
#include "common/params.h"
#include "cuda/cuda_check.h"

namespace hetra::cuda {

namespace {

const Param kPieceBytes("HETRA_STAGING_PIECE_BYTES", "4194304",
                        "Bytes per piece when device buffers are staged through pinned host "
                        "memory for a host transport (the same on every rank)");

}  // namespace

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  void* p = nullptr;
  HETRA_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  data_ = static_cast<uint8_t*>(p);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) (void)cudaFreeHost(data_);  // freeing: nothing to do about a failure
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) (void)cudaFreeHost(data_);  // a destructor: nothing to do about a failure
}

void waitEvent(cudaEvent_t event, Deadline deadline, const char* what) {
  // Spin briefly (a copy of a small piece completes in microseconds), then sleep in short steps.
  for (int spins = 0;; ++spins) {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) HETRA_CUDA_CHECK(state);
    if (Clock::now() >= deadline)
      throw TimeoutError(str("CUDA: ", what, " did not complete before the deadline"));
    if (spins < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

DeviceStager::DeviceStager(size_t pieceBytes, int slots)
    : pieceBytes_(pieceBytes ? pieceBytes : size_t(kPieceBytes.integer())), slots_(slots) {
  if (pieceBytes_ == 0) throw ConfigError("HETRA_STAGING_PIECE_BYTES=0: a piece needs 1 byte");
  if (slots < 1) throw ConfigError(str("staging: ", slots, " slots; at least 1 is needed"));
  HETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  events_.resize(size_t(slots), nullptr);
  for (auto& event : events_)
    HETRA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
}

DeviceStager::~DeviceStager() {
  for (auto event : events_)
    if (event) (void)cudaEventDestroy(event);
  // Every started copy was waited for (runStaged* drain on failure), so the slots are idle.
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void DeviceStager::ensureSlots(size_t bytes) {
  if (buffers_.size() == size_t(slots_) && buffers_[0].size() >= bytes) return;
  buffers_.clear();
  for (int s = 0; s < slots_; ++s) buffers_.emplace_back(bytes);
}

void DeviceStager::send(comm::Transport& transport, int peer, uint64_t tag, const void* device,
                        size_t bytes, size_t alignment, Deadline deadline) {
  const comm::StagingPlan plan(bytes, pieceBytes_, slots_, alignment);
  if (plan.pieces() == 0) return;  // the peer's plan has no piece either: nothing is sent
  ensureSlots(plan.pieceBytes());
  const auto* src = static_cast<const uint8_t*>(device);
  std::vector<std::unique_ptr<comm::Request>> sends(static_cast<size_t>(slots_));
  comm::StagingSteps steps;
  steps.startCopy = [&](const comm::StagingPiece& p) {
    HETRA_CUDA_CHECK(cudaMemcpyAsync(buffers_[size_t(p.slot)].data(), src + p.offset, p.bytes,
                                     cudaMemcpyDeviceToHost, stream_));
    HETRA_CUDA_CHECK(cudaEventRecord(events_[size_t(p.slot)], stream_));
  };
  steps.waitCopy = [&](const comm::StagingPiece& p) {
    waitEvent(events_[size_t(p.slot)], deadline, "staging copy device->host");
  };
  steps.startTransfer = [&](const comm::StagingPiece& p) {
    sends[size_t(p.slot)] = transport.isend(peer, tag, buffers_[size_t(p.slot)].data(), p.bytes);
  };
  steps.waitTransfer = [&](const comm::StagingPiece& p) {
    auto request = std::move(sends[size_t(p.slot)]);
    request->wait(deadline);
  };
  comm::runStagedSend(plan, steps);
}

void DeviceStager::recv(comm::Transport& transport, int peer, uint64_t tag, void* device,
                        size_t bytes, size_t alignment, Deadline deadline) {
  const comm::StagingPlan plan(bytes, pieceBytes_, slots_, alignment);
  if (plan.pieces() == 0) return;
  ensureSlots(plan.pieceBytes());
  auto* dst = static_cast<uint8_t*>(device);
  std::vector<std::unique_ptr<comm::Request>> recvs(static_cast<size_t>(slots_));
  comm::StagingSteps steps;
  steps.startTransfer = [&](const comm::StagingPiece& p) {
    recvs[size_t(p.slot)] = transport.irecv(peer, tag, buffers_[size_t(p.slot)].data(), p.bytes);
  };
  steps.waitTransfer = [&](const comm::StagingPiece& p) {
    auto request = std::move(recvs[size_t(p.slot)]);
    request->wait(deadline);
  };
  steps.startCopy = [&](const comm::StagingPiece& p) {
    HETRA_CUDA_CHECK(cudaMemcpyAsync(dst + p.offset, buffers_[size_t(p.slot)].data(), p.bytes,
                                     cudaMemcpyHostToDevice, stream_));
    HETRA_CUDA_CHECK(cudaEventRecord(events_[size_t(p.slot)], stream_));
  };
  steps.waitCopy = [&](const comm::StagingPiece& p) {
    waitEvent(events_[size_t(p.slot)], deadline, "staging copy host->device");
  };
  comm::runStagedRecv(plan, steps);
}

}  // namespace hetra::cuda
