// ChoiceCache: the provider the table chose for an operation shape, remembered per group, so that a
// group that issues the same operations again and again (a training step's buckets, a benchmark)
// does not price every provider of the table for each call.
//
// Vocabulary:
//   shape  what the choice depends on besides the group facts, which do not change in a group's
//          life: the operation's kind, dtype, reduce op, buffer place and size in bytes. Only
//          exact operations have a shape (a compressed one also depends on its codec); they are
//          what small, latency-bound calls are.
//   entry  one 64-bit word holding a shape and the provider chosen for it, so that a reader sees
//          both or neither without a lock (a group's calls may come from several threads).
// The cache is direct-mapped: a shape that meets another in the same entry replaces it, which
// costs the other one a new choice, never a wrong one.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "comm/providers/provider.h"

namespace hetra::comm {

class ChoiceCache {
 public:
  // The provider remembered for `op`'s shape, or 0 when none is.
  uint8_t find(const Operation& op) const {
    const uint64_t key = keyOf(op);
    if (key == kNoKey) return 0;
    const uint64_t entry = entries_[indexOf(key)].load(std::memory_order_relaxed);
    return (entry >> kIdBits) == key ? uint8_t(entry & kIdMask) : 0;
  }

  void remember(const Operation& op, uint8_t provider) {
    const uint64_t key = keyOf(op);
    if (key == kNoKey || provider == 0) return;
    entries_[indexOf(key)].store(key << kIdBits | provider, std::memory_order_relaxed);
  }

 private:
  static constexpr size_t kEntries = 16;
  static constexpr unsigned kIdBits = 8;  // provider ids are one byte
  static constexpr uint64_t kIdMask = (uint64_t(1) << kIdBits) - 1;
  static constexpr unsigned kFieldBits = 4;  // each of kind, dtype, op, place
  static constexpr unsigned kBytesBits = 64 - kIdBits - 4 * kFieldBits;  // 40: up to 1 TiB
  static constexpr uint64_t kNoKey = ~uint64_t(0);

  // The shape as 56 bits, or kNoKey for an operation that has none (compressed, or a size or an
  // enum value beyond the fields).
  static uint64_t keyOf(const Operation& op) {
    const unsigned fields[] = {unsigned(op.kind), unsigned(op.dtype), unsigned(op.op),
                               unsigned(op.place)};
    if (op.codec || op.bytes >= (uint64_t(1) << kBytesBits)) return kNoKey;
    uint64_t key = op.bytes;
    for (unsigned field : fields) {
      if (field >= (1u << kFieldBits)) return kNoKey;
      key = key << kFieldBits | field;
    }
    return key;
  }

  static size_t indexOf(uint64_t key) {
    // Sizes often differ only in their high bits (powers of two): mix before taking the low bits.
    return size_t((key * 0x9E3779B97F4A7C15ull) >> 60) % kEntries;
  }

  std::array<std::atomic<uint64_t>, kEntries> entries_{};
};

}  // namespace hetra::comm
