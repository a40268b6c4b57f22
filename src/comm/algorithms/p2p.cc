#include "comm/algorithms/p2p.h"

#include <algorithm>

#include "common/errors.h"
#include "common/params.h"

namespace hetra::comm {
namespace {

const Param kSegmentBytes(
    "HETRA_RING_SEGMENT_BYTES", "1048576",
    "Largest message of the ring collectives and the pipelined broadcast: blocks "
    "are cut into segments of at most this many bytes.");

std::vector<uint8_t>& scratchCache() {
  static thread_local std::vector<uint8_t> buffer;
  return buffer;
}

}  // namespace

std::vector<size_t> evenSplit(size_t count, int n) {
  std::vector<size_t> counts(n, count / n);
  for (size_t b = 0; b < count % n; ++b) ++counts[b];
  return counts;
}

// Read once, the first time a pipelined collective runs: not per collective.
size_t segmentBytes() {
  static const size_t bytes = [] {
    const int64_t value = kSegmentBytes.integer();
    if (value < 64)
      throw ConfigError(
          str(kSegmentBytes.env(), "=", value, " is not allowed; use at least 64 (bytes)"));
    return size_t(value);
  }();
  return bytes;
}

Scratch::Scratch(size_t bytes) {
  constexpr size_t kKeepBytes = size_t(64) << 20;
  auto& cached = scratchCache();
  if (bytes <= kKeepBytes) {
    if (cached.size() < bytes) cached.resize(bytes);
    data_ = cached.data();
  } else {
    own_.reset(new uint64_t[(bytes + 7) / 8]);
    data_ = reinterpret_cast<uint8_t*>(own_.get());
  }
}

void waitAll(std::vector<RequestPtr>& requests, Deadline deadline) {
  for (auto& request : requests)
    if (request) request->wait(deadline);
}

void exchangeHeaders(Transport& transport, const OpHeader& mine, Deadline deadline, bool allPeers) {
  const int n = transport.size(), r = transport.rank();
  if (n == 1) return;
  std::vector<int> peers{mod(r - 1, n)};
  if (mod(r + 1, n) != peers[0]) peers.push_back(mod(r + 1, n));
  const size_t neighbours = peers.size();
  if (allPeers)
    for (int p = 0; p < n; ++p)
      if (p != r && std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);

  std::vector<OpHeader> theirs(peers.size());
  std::vector<RequestPtr> recvs, sends;
  for (size_t i = 0; i < peers.size(); ++i) {
    const uint64_t tag = i < neighbours ? kHeaderTag : kHeaderAllTag;
    recvs.push_back(transport.irecv(peers[i], tag, &theirs[i], sizeof(OpHeader)));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    const uint64_t tag = i < neighbours ? kHeaderTag : kHeaderAllTag;
    sends.push_back(transport.isend(peers[i], tag, &mine, sizeof(OpHeader)));
  }
  waitAll(recvs, deadline);
  waitAll(sends, deadline);
  try {
    for (size_t i = 0; i < peers.size(); ++i) checkHeaders(mine, r, theirs[i], peers[i]);
  } catch (const MismatchError& e) {
    transport.abort(e.what());
    throw;
  }
}

}  // namespace hetra::comm
