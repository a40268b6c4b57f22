// The process-wide side of the mpi transport, shared by mpi_transport.cc (the transport) and
// mpi_runtime.cc: MPI initialisation, the envelope wire format, and the communicators of destroyed
// transports (parked until every peer closed). Internal to hetra_comm; includes mpi.h.
#pragma once

// The C API only: MPI's deprecated C++ bindings would need their own library.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/timing.h"

namespace hetra::comm::mpi {

constexpr uint32_t kEnvelopeMagic = 0x314d5448;  // "HTM1" on the wire
constexpr size_t kEnvelopeHeaderBytes = 40;
// Messages up to this size travel inside their envelope: one MPI message instead of two.
constexpr size_t kInlineBytes = 4096;
constexpr size_t kEnvelopeBytes = kEnvelopeHeaderBytes + kInlineBytes;
constexpr int kEnvelopeTag = 0;
constexpr size_t kChunkBytes = size_t(1) << 30;
// A larger size is a corrupt envelope.
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 40;
// How long a destructor waits for cancelled or abandoned MPI requests, over all of them.
constexpr Millis kReleaseGrace{250};

enum class EnvelopeType : uint16_t { Data = 1, Abort = 2, Close = 3 };

// The envelope's header (40 bytes, little-endian): magic (u32), type (u16), zero (u16), group id
// (u64), seq (u64; for Abort the culprit rank), hetra tag (u64), payload bytes (u64). An inline
// data payload or an abort reason follows.
struct Envelope {
  EnvelopeType type = EnvelopeType::Data;
  uint64_t group = 0;
  uint64_t seq = 0;
  uint64_t tag = 0;
  uint64_t bytes = 0;
};

bool isInline(const Envelope& e);

std::vector<uint8_t> encodeEnvelope(const Envelope& e, const void* payload);

// "" and `out` filled, or what is wrong with the `size` bytes received.
std::string decodeEnvelope(const uint8_t* p, size_t size, Envelope& out);

// Buffers of MPI requests that did not complete in time and were freed with MPI_Request_free:
// MPI may still use them, so they live until the process ends.
void leak(std::vector<uint8_t>&& buffer);

std::string mpiErrorText(int code);

// MPI_TAG_UB of MPI_COMM_WORLD (at least 32767), known once initMpi() ran.
int tagUpperBound();

// An MPI send nobody waits for (abort and close envelopes), with its buffer.
struct Orphan {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<uint8_t> buffer;
};

// The communicator of a destroyed transport, kept until every peer's Close arrived.
struct Parked {
  struct Inbox {
    int peer = -1;
    std::vector<uint8_t> buffer;
    MPI_Request request = MPI_REQUEST_NULL;
    bool closed = false;
  };
  MPI_Comm comm = MPI_COMM_NULL;
  uint64_t group = 0;
  bool failed = false;
  std::vector<Inbox> inboxes;  // peers whose Close has not arrived yet
  std::vector<Orphan> orphans;
};

// Keeps a destroyed transport's communicator until its peers closed (a failed one for good).
void park(Parked&& parked);
// Frees the parked communicators whose peers all closed.
void reapParked();

}  // namespace hetra::comm::mpi
