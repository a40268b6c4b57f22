// Building blocks shared by the collectives written over point-to-point transfers (ring.cc,
// compressed.cc): message tags, the header exchange, scratch memory. Internal to the comm layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/algorithms/args.h"
#include "comm/transport/transport.h"

namespace hetra::comm {

// Tags: headers use fixed tags (independent of seq, so a rank that skipped an operation is caught
// by the header check rather than waiting on a tag nobody sends); data tags are derived from seq.
// User point-to-point tags start at 2^63; everything here stays below 2^62 + 256.
constexpr uint64_t kHeaderTag = (uint64_t(1) << 62) | 1;     // with left and right
constexpr uint64_t kHeaderAllTag = (uint64_t(1) << 62) | 2;  // with every other rank
enum Phase : uint64_t {
  kReducePhase = 1,
  kGatherPhase = 2,
  kDirectPhase = 3,
  kBroadcastPhase = 4,
  kCompressedReducePhase = 5,
  kCompressedGatherPhase = 6,
  kBarrierPhase = 16
};

inline uint64_t opTag(uint64_t seq, uint64_t phase) {
  return ((seq & ((uint64_t(1) << 53) - 1)) << 8) | phase;
}

using RequestPtr = std::unique_ptr<Request>;

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// count elements cut into n blocks whose sizes differ by at most one (the first ones larger).
std::vector<size_t> evenSplit(size_t count, int n);

// Largest message of the pipelined collectives (HETRA_RING_SEGMENT_BYTES).
size_t segmentBytes();

// A scratch area per thread, reused across calls so that large operations do not pay page faults
// every time; above 64 MiB it is released after the call. Not zeroed.
class Scratch {
 public:
  explicit Scratch(size_t bytes);
  uint8_t* data() const { return data_; }

 private:
  std::unique_ptr<uint64_t[]> own_;  // 8-byte aligned for every dtype
  uint8_t* data_ = nullptr;
};

void waitAll(std::vector<RequestPtr>& requests, Deadline deadline);

// Exchanges headers with left and right (and, when `allPeers`, with every other rank) and checks
// them. On a mismatch the transport is aborted with the reason, so ranks still waiting for data
// from this one fail now with a PeerAbortedError that names it, instead of at their deadline.
void exchangeHeaders(Transport& transport, const OpHeader& mine, Deadline deadline, bool allPeers);

}  // namespace hetra::comm
