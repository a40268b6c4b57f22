// The mpi transport's process-wide side: MPI initialisation (once per process), the envelope
// codec, and the reaper of communicators of destroyed transports (see mpi_transport.cc, "Freeing a
// communicator").
#include "comm/transport/mpi_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "comm/transport/mpi_transport.h"
#include "common/bytes.h"
#include "common/errors.h"
#include "common/logging.h"
#include "common/net.h"

namespace hetra::comm {
namespace mpi {
namespace {

const char* threadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown level";
  }
}

// --- the process-wide MPI runtime ---

std::mutex gRuntimeMutex;
std::optional<MpiProcess> gProcess;
int gTagUb = 32767;

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string jobIdentity() {
  if (const char* ns = std::getenv("PMIX_NAMESPACE"); ns && *ns) return str("pmix:", ns);
  if (const char* id = std::getenv("OMPI_MCA_ess_base_jobid"); id && *id) return str("ompi:", id);
  return str("singleton:", net::hostName(), ":", getpid());
}

std::mutex gParkedMutex;
std::vector<Parked> gParked;

void reapLocked();

}  // namespace

bool isInline(const Envelope& e) {
  return e.type == EnvelopeType::Abort || (e.type == EnvelopeType::Data && e.bytes <= kInlineBytes);
}

std::vector<uint8_t> encodeEnvelope(const Envelope& e, const void* payload) {
  const size_t extra = isInline(e) ? size_t(e.bytes) : 0;
  std::vector<uint8_t> out(kEnvelopeHeaderBytes + extra, 0);
  storeU32(out.data(), kEnvelopeMagic);
  storeU16(out.data() + 4, uint16_t(e.type));
  storeU64(out.data() + 8, e.group);
  storeU64(out.data() + 16, e.seq);
  storeU64(out.data() + 24, e.tag);
  storeU64(out.data() + 32, e.bytes);
  if (extra) std::memcpy(out.data() + kEnvelopeHeaderBytes, payload, extra);
  return out;
}

std::string decodeEnvelope(const uint8_t* p, size_t size, Envelope& out) {
  if (size < kEnvelopeHeaderBytes)
    return str("an envelope needs ", kEnvelopeHeaderBytes, " bytes, got ", size);
  if (loadU32(p) != kEnvelopeMagic) return str("bad envelope magic 0x", std::hex, loadU32(p));
  const uint16_t type = loadU16(p + 4);
  if (type < uint16_t(EnvelopeType::Data) || type > uint16_t(EnvelopeType::Close))
    return str("unknown envelope type ", type);
  if (loadU16(p + 6) != 0) return "non-zero padding in an envelope";
  out.type = EnvelopeType(type);
  out.group = loadU64(p + 8);
  out.seq = loadU64(p + 16);
  out.tag = loadU64(p + 24);
  out.bytes = loadU64(p + 32);
  if (isInline(out) && out.bytes > kInlineBytes)
    return str("an abort envelope announces ", out.bytes, " bytes, more than ", kInlineBytes);
  if (out.bytes > kMaxMessageBytes)
    return str("an envelope announces ", out.bytes, " bytes, more than ", kMaxMessageBytes);
  const size_t expected = kEnvelopeHeaderBytes + (isInline(out) ? size_t(out.bytes) : 0);
  if (size != expected)
    return str("an envelope of ", size, " bytes announces ", out.bytes, " payload bytes");
  return "";
}

std::string mpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str("MPI error code ", code);
  return std::string(text, size_t(length));
}

void leak(std::vector<uint8_t>&& buffer) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::vector<uint8_t>>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(buffer));
}

int tagUpperBound() {
  std::lock_guard<std::mutex> lock(gRuntimeMutex);
  return gTagUb;
}

void park(Parked&& parked) {
  std::lock_guard<std::mutex> lock(gParkedMutex);
  if (parked.failed) {
    // Peers of a failed group may still send (aborts, data) and never send Close: the communicator
    // is never freed (a late message to a freed communicator can reach a later one that reuses its
    // context id, which Open MPI 4.1 does not survive). Its inboxes are cancelled.
    for (auto& in : parked.inboxes)
      if (in.request != MPI_REQUEST_NULL) MPI_Cancel(&in.request);
    const Deadline until = deadlineAfter(kReleaseGrace);
    for (;;) {
      bool pending = false;
      for (auto& in : parked.inboxes) {
        int flag = 1;
        if (in.request != MPI_REQUEST_NULL) MPI_Test(&in.request, &flag, MPI_STATUS_IGNORE);
        pending = pending || !flag;
      }
      if (!pending || Clock::now() >= until) break;
      sched_yield();
    }
    for (auto& in : parked.inboxes)
      if (in.request != MPI_REQUEST_NULL) {
        MPI_Request_free(&in.request);
        leak(std::move(in.buffer));
      }
    for (auto& o : parked.orphans) {
      MPI_Request_free(&o.request);
      leak(std::move(o.buffer));
    }
    HETRA_DEBUG("comm", "mpi: the communicator of a failed group stays allocated");
    return;
  }
  gParked.push_back(std::move(parked));
  reapLocked();
}

namespace {

// Frees the parked communicators whose peers all closed: no message can reach them any more.
void reapLocked() {
  for (auto it = gParked.begin(); it != gParked.end();) {
    Parked& p = *it;
    for (auto& in : p.inboxes) {
      while (in.request != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status status;
        if (MPI_Test(&in.request, &flag, &status) != MPI_SUCCESS) {
          in.request = MPI_REQUEST_NULL;
          in.closed = true;  // an error here: the peer is gone
          break;
        }
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        Envelope e;
        if (decodeEnvelope(in.buffer.data(), size_t(std::max(count, 0)), e).empty() &&
            e.group == p.group && e.type == EnvelopeType::Close) {
          in.closed = true;
          break;
        }
        // Anything else (a message nobody received any more) is dropped.
        MPI_Irecv(in.buffer.data(), int(kEnvelopeBytes), MPI_BYTE, in.peer, kEnvelopeTag, p.comm,
                  &in.request);
      }
    }
    for (auto& o : p.orphans) {
      int flag = 0;
      if (MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        o.request = MPI_REQUEST_NULL;
    }
    p.orphans.erase(std::remove_if(p.orphans.begin(), p.orphans.end(),
                                   [](const Orphan& o) { return o.request == MPI_REQUEST_NULL; }),
                    p.orphans.end());
    const bool done =
        p.orphans.empty() && std::all_of(p.inboxes.begin(), p.inboxes.end(),
                                         [](const Parked::Inbox& in) { return in.closed; });
    if (!done) {
      ++it;
      continue;
    }
    MPI_Comm_free(&p.comm);
    it = gParked.erase(it);
  }
}

}  // namespace

void reapParked() {
  std::lock_guard<std::mutex> lock(gParkedMutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) reapLocked();
}

}  // namespace mpi

using namespace mpi;

MpiProcess initMpi() {
  std::lock_guard<std::mutex> lock(gRuntimeMutex);
  if (gProcess) return *gProcess;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) throw ConfigError("mpi transport: MPI was already finalised in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    // The application owns MPI: it initialised it and finalises it.
    MPI_Query_thread(&provided);
  } else {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      throw IoError(str("mpi transport: MPI_Init_thread failed (code ", rc, ")"));
    std::atexit(finalizeAtExit);
    // Our calls on MPI_COMM_WORLD (creating group communicators) report errors instead of ending
    // the job; each group communicator gets the same handler below.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw ConfigError(str("mpi transport: the MPI library provides ", threadLevelName(provided),
                          "; hetra needs MPI_THREAD_MULTIPLE (a communicator's progress thread and "
                          "its callers use MPI at once). Use an MPI built with thread support, or "
                          "initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)"));
  MpiProcess process;
  MPI_Comm_rank(MPI_COMM_WORLD, &process.worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &process.worldSize);
  process.job = jobIdentity();
  int* tagUb = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tagUb, &found) == MPI_SUCCESS && found &&
      tagUb)
    gTagUb = std::max(32767, *tagUb);
  HETRA_DEBUG("comm", "mpi: initialised, world rank ", process.worldRank, " of ", process.worldSize,
              ", job ", process.job, ", tag upper bound ", gTagUb);
  gProcess = process;
  return process;
}

}  // namespace hetra::comm
