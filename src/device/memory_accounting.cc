#include "device/memory_accounting.h"

#include <cstdio>
#include <iterator>

#include "common/errors.h"
#include "common/names.h"
#include "common/params.h"

namespace hetra::device {
namespace {

void raiseToAtLeast(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

const Param kAccountingParam(
    "HETRA_MEMORY_ACCOUNTING", "1",
    "Count each rank's memory by category (docs/memory.md); 0 turns the counting allocator off, "
    "and then no devices[i].memory cap can be enforced");

}  // namespace

constexpr NamedValue<MemoryCategory> kMemoryCategoryNames[] = {
    {MemoryCategory::kParameters, "parameters"},
    {MemoryCategory::kGradients, "gradients"},
    {MemoryCategory::kOptimizerState, "optimizer_state"},
    {MemoryCategory::kActivations, "activations"},
    {MemoryCategory::kCommunication, "communication"},
    {MemoryCategory::kHostData, "host_data"},
    {MemoryCategory::kOffloaded, "offloaded"}};
static_assert(std::size(kMemoryCategoryNames) == kMemoryCategories &&
              coversEnum(kMemoryCategoryNames, MemoryCategory::kOffloaded));
bool memoryAccountingEnabled() {
  static const bool enabled = kAccountingParam.flag();  // read once: the allocator is per process
  return enabled;
}

const char* memoryAccountingParam() {
  return "HETRA_MEMORY_ACCOUNTING";
}

const char* memoryCategoryName(MemoryCategory category) {
  return nameOf(category, kMemoryCategoryNames);
}

std::string readableBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  size_t unit = 0;
  while ((value >= 1024 || value <= -1024) && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

MemoryLedger& MemoryLedger::process() {
  static MemoryLedger* ledger = new MemoryLedger;  // never destroyed: tensors outlive main()
  return *ledger;
}

void MemoryLedger::add(MemoryCategory category, int64_t bytes) {
  const int64_t now = live_[size_t(category)].fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raiseToAtLeast(peak_[size_t(category)], now);
  raiseToAtLeast(windowPeak_[size_t(category)], now);
}

void MemoryLedger::allocate(MemoryCategory category, int64_t bytes) {
  if (countsAgainstCap(category)) {
    const int64_t before = deviceLive_.fetch_add(bytes, std::memory_order_relaxed);
    const int64_t cap = capBytes_.load(std::memory_order_relaxed);
    if (cap > 0 && before + bytes > cap) {
      deviceLive_.fetch_sub(bytes, std::memory_order_relaxed);
      throwOutOfMemory(category, bytes, before);
    }
    raiseToAtLeast(devicePeak_, before + bytes);
    raiseToAtLeast(deviceWindowPeak_, before + bytes);
  }
  add(category, bytes);
}

void MemoryLedger::release(MemoryCategory category, int64_t bytes) {
  if (countsAgainstCap(category)) deviceLive_.fetch_sub(bytes, std::memory_order_relaxed);
  live_[size_t(category)].fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryLedger::recategorize(MemoryCategory from, MemoryCategory to, int64_t bytes) {
  if (from == to) return;
  if (!countsAgainstCap(from) && countsAgainstCap(to)) {
    allocate(to, bytes);
    live_[size_t(from)].fetch_sub(bytes, std::memory_order_relaxed);
    return;
  }
  if (countsAgainstCap(from) && !countsAgainstCap(to))
    deviceLive_.fetch_sub(bytes, std::memory_order_relaxed);
  live_[size_t(from)].fetch_sub(bytes, std::memory_order_relaxed);
  add(to, bytes);
}

void MemoryLedger::throwOutOfMemory(MemoryCategory category, int64_t bytes,
                                    int64_t liveBefore) const {
  const MemoryUsage now = usage();
  std::string device;
  {
    std::lock_guard<std::mutex> lock(claimMutex_);
    device = device_;
    lastRefusal_ = now;
  }
  const int64_t cap = capBytes_.load(std::memory_order_relaxed);
  std::string held;
  for (size_t c = 0; c < kMemoryCategories; ++c)
    if (countsAgainstCap(MemoryCategory(c)))
      held += str(held.empty() ? "" : ", ", memoryCategoryName(MemoryCategory(c)), " ",
                  readableBytes(now.live[c]));
  throw DeviceOutOfMemoryError(
      str("device ", device, " is out of memory: ", readableBytes(bytes), " more for ",
          memoryCategoryName(category), " would pass its cap of ", readableBytes(cap), " (", cap,
          " bytes); it holds ", readableBytes(liveBefore), " (", held, "), peak so far ",
          readableBytes(now.devicePeak)),
      device, cap, memoryCategoryName(category), bytes, now.devicePeak);
}

MemoryUsage MemoryLedger::usage() const {
  MemoryUsage u;
  for (size_t c = 0; c < kMemoryCategories; ++c) {
    u.live[c] = live_[c].load(std::memory_order_relaxed);
    u.peak[c] = peak_[c].load(std::memory_order_relaxed);
  }
  u.deviceLive = deviceLive_.load(std::memory_order_relaxed);
  u.devicePeak = devicePeak_.load(std::memory_order_relaxed);
  return u;
}

MemoryUsage MemoryLedger::usageAtLastRefusal() const {
  std::lock_guard<std::mutex> lock(claimMutex_);
  return lastRefusal_;
}

void MemoryLedger::resetPeaks() {
  for (size_t c = 0; c < kMemoryCategories; ++c)
    peak_[c].store(live_[c].load(std::memory_order_relaxed), std::memory_order_relaxed);
  devicePeak_.store(deviceLive_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void MemoryLedger::startWindow() {
  for (size_t c = 0; c < kMemoryCategories; ++c)
    windowPeak_[c].store(live_[c].load(std::memory_order_relaxed), std::memory_order_relaxed);
  deviceWindowPeak_.store(deviceLive_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

MemoryUsage MemoryLedger::window() const {
  MemoryUsage u = usage();
  for (size_t c = 0; c < kMemoryCategories; ++c)
    u.peak[c] = windowPeak_[c].load(std::memory_order_relaxed);
  u.devicePeak = deviceWindowPeak_.load(std::memory_order_relaxed);
  return u;
}

MemoryLedger::Uncapped::Uncapped(MemoryLedger& ledger)
    : ledger_(ledger), cap_(ledger.capBytes_.exchange(0, std::memory_order_relaxed)) {}

MemoryLedger::Uncapped::~Uncapped() {
  ledger_.capBytes_.store(cap_, std::memory_order_relaxed);
}

MemoryLedger::Claim::Claim(MemoryLedger& ledger, std::string device, int64_t capBytes)
    : ledger_(ledger) {
  std::lock_guard<std::mutex> lock(ledger_.claimMutex_);
  if (++ledger_.claims_ == 1) {
    ledger_.device_ = std::move(device);
    ledger_.capBytes_.store(capBytes, std::memory_order_relaxed);
  } else {
    ledger_.shared_ = true;
    ledger_.capBytes_.store(0, std::memory_order_relaxed);
  }
}

MemoryLedger::Claim::~Claim() {
  std::lock_guard<std::mutex> lock(ledger_.claimMutex_);
  if (--ledger_.claims_ > 0) return;
  ledger_.shared_ = false;
  ledger_.capBytes_.store(0, std::memory_order_relaxed);
}

bool MemoryLedger::Claim::enforced() const {
  std::lock_guard<std::mutex> lock(ledger_.claimMutex_);
  return ledger_.claims_ == 1 && !ledger_.shared_;
}

MemoryScope::MemoryScope(MemoryCategory category, MemoryLedger& ledger)
    : ledger_(ledger), previous_(ledger.phase()) {
  ledger_.setPhase(category);
}

MemoryScope::~MemoryScope() {
  ledger_.setPhase(previous_);
}

}  // namespace hetra::device
