// NCCL transport: point-to-point messages between NVIDIA GPUs (ncclSend / ncclRecv), for groups
// whose ranks are all NVIDIA GPUs; plus a device allreduce, which such a group runs as one NCCL
// collective instead of a host algorithm.
//
// Requirements and limits, for callers:
// - Buffers are device memory of this rank's GPU (the device current when the transport was
//   created; each rank of the group on a different GPU).
// - NCCL has no tags: messages between a pair match in the order they are issued. Every algorithm
//   of hetra issues the messages of a pair in the same order on both sides (the tag only
//   separates streams that are themselves issued in a fixed order), which is what this needs.
//   Sizes are not sent: the Transport contract (same size on both sides) is checked by the
//   collectives' header exchange (algorithms/args.h, OpHeader) before any data moves.
// - Operations are not started by isend/irecv but batched: the first wait() on any pending
//   request launches every pending send and receive in one ncclGroupStart/ncclGroupEnd, so that a
//   ring step (send right, receive left, then wait) cannot deadlock on the stream. Hence a request
//   that is never waited for is started by the next wait on the transport (or allreduce); one
//   still pending when the transport is destroyed is dropped, with a warning.
// - Nothing blocks without a deadline: the communicator is non-blocking (ncclConfig_t blocking =
//   0); initialisation, group launches and completion are polled with ncclCommGetAsyncError and
//   cudaEventQuery against the deadline. A timeout, an NCCL error or abort() aborts the NCCL
//   communicator (ncclCommAbort), publishes an abort record in the store, and peers that see the
//   record (read while they wait) abort theirs too, so the group fails everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/reduce.h"
#include "comm/transport/transport.h"
#include "common/dtype.h"
#include "cuda/gpu_runtime.h"
#include "store/store.h"

namespace hetra::cuda {

struct NcclOptions {
  Millis timeout{30000};  // for forming the group
  int device = -1;        // CUDA device of this rank; -1: the calling thread's current device
};

class NcclTransport : public comm::Transport {
 public:
  // The stream every NCCL operation of this transport runs on (the caller orders its own work
  // with it through events).
  virtual cudaStream_t stream() const = 0;
  virtual int device() const = 0;
  // A device allreduce (in may equal out), complete when it returns. Avg is a sum followed by a
  // division on the device (ncclAvg). Throws like Request::wait.
  virtual void allreduce(const void* in, void* out, size_t count, DType dtype, comm::ReduceOp op,
                         Deadline deadline) = 0;
};

// Forms the group: rank 0 creates the NCCL unique id and publishes it in `store` (the group's
// prefixed store), every rank initialises its communicator. Throws TimeoutError when a rank does
// not arrive within options.timeout, IoError on a CUDA or NCCL error.
std::unique_ptr<NcclTransport> createNcclTransport(std::shared_ptr<store::Store> store, int rank,
                                                   int size, const NcclOptions& options = {});

// Adds "nccl" to the transport table (comm/transport/registry.h), so that a group forced to
// transport "nccl" is built on it; never chosen by "auto" (its buffers must be device memory).
// hetra_comm does not link this library: a program built with CUDA calls this once, early.
void registerTransports();

}  // namespace hetra::cuda
