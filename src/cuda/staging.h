// Staging device buffers through pinned host memory, for the levels of a hierarchy that run over
// a host transport (tcp between islands): device -> pinned slot -> network on the sender,
// network -> pinned slot -> device on the receiver, piece by piece, the copy of one piece
// overlapping the transfer of another (the plan and schedule: comm/staging_plan.h).
//
// Both sides must use the same piece size and alignment (HETRA_STAGING_PIECE_BYTES is read on each
// rank): the pieces are separate messages of one tag, matched in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/transport/transport.h"
#include "common/timing.h"
#include "cuda/gpu_runtime.h"

namespace hetra::cuda {

// Page-locked host memory (cudaHostAlloc): the device copies it by DMA at full PCIe speed, and
// cudaMemcpyAsync on it is truly asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);  // throws IoError when the allocation fails
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// Waits for `event` until `deadline`, polling (a blocking cudaEventSynchronize could not time
// out). Throws TimeoutError naming `what`, IoError when the device reports an error.
void waitEvent(cudaEvent_t event, Deadline deadline, const char* what);

class DeviceStager {
 public:
  // pieceBytes 0: HETRA_STAGING_PIECE_BYTES. slots: 2 for double buffering. Uses the calling
  // thread's current device; slots are pinned lazily, as large as the largest plan needs.
  explicit DeviceStager(size_t pieceBytes = 0, int slots = 2);
  ~DeviceStager();
  DeviceStager(const DeviceStager&) = delete;
  DeviceStager& operator=(const DeviceStager&) = delete;

  // Moves `bytes` of device memory to or from `peer` over a host transport. `alignment`: pieces
  // are whole multiples of it (4 for float32, the block's encoded size for FP8 pieces).
  void send(comm::Transport& transport, int peer, uint64_t tag, const void* device, size_t bytes,
            size_t alignment, Deadline deadline);
  void recv(comm::Transport& transport, int peer, uint64_t tag, void* device, size_t bytes,
            size_t alignment, Deadline deadline);

  size_t pieceBytes() const { return pieceBytes_; }

 private:
  void ensureSlots(size_t bytes);

  size_t pieceBytes_;
  int slots_;
  cudaStream_t stream_ = nullptr;
  std::vector<PinnedBuffer> buffers_;
  std::vector<cudaEvent_t> events_;  // per slot: its last copy
};

}  // namespace hetra::cuda
