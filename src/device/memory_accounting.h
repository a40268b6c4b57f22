// Memory accounting of an emulated device: the bytes a rank process holds, live and peak, by
// category, and the device's cap on them (docs/memory.md).
//
// Vocabulary:
//   category   what an allocation is for. Every category but host data and offloaded state is
//              *device* memory and counts against the cap: on a real accelerator the dataset, the
//              staging of batches and what ZeRO offloads stay in host memory.
//   phase      the category the process is allocating for now, set by a MemoryScope around each
//              part of a step (building the model, forward+backward, the optimizer step...), so a
//              user's module needs no change. The phase is process-wide, not per thread: LibTorch's
//              intra-op workers allocate for the phase of the thread that called them.
//   ledger     the counters of one process. One rank per process is one device; ranks that are
//              threads of one process share it, and then nothing is enforced (see claim()).
//
// The ledger knows nothing of LibTorch: train/counting_allocator.h feeds it from LibTorch's CPU
// allocator.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace hetra::device {

enum class MemoryCategory {
  kParameters,
  kGradients,
  kOptimizerState,
  kActivations,
  kCommunication,  // gradient buckets, error feedback residuals
  kHostData,       // the dataset, batches being gathered: not device memory
  kOffloaded,      // training state ZeRO keeps in host memory ([zero] offload): not device memory
};
constexpr size_t kMemoryCategories = 7;

// "parameters", "gradients", "optimizer_state", "activations", "communication", "host_data",
// "offloaded".
const char* memoryCategoryName(MemoryCategory category);
constexpr bool countsAgainstCap(MemoryCategory category) {
  return category != MemoryCategory::kHostData && category != MemoryCategory::kOffloaded;
}

// "12.3 MiB": bytes for people (formatBytes in common/units.h is the exact, parseable form).
std::string readableBytes(int64_t bytes);

struct MemoryUsage {
  std::array<int64_t, kMemoryCategories> live{}, peak{};
  int64_t deviceLive = 0;  // the categories that count against the cap, together
  int64_t devicePeak = 0;  // peak of deviceLive (not the sum of the categories' peaks)
  int64_t liveOf(MemoryCategory c) const { return live[size_t(c)]; }
  int64_t peakOf(MemoryCategory c) const { return peak[size_t(c)]; }
};

class MemoryLedger {
 public:
  // The process's ledger.
  static MemoryLedger& process();

  // Records `bytes` for `category`. Throws DeviceOutOfMemoryError (common/errors.h), recording
  // nothing, when a device category would take the device past its cap.
  void allocate(MemoryCategory category, int64_t bytes);
  void release(MemoryCategory category, int64_t bytes);
  // Bytes already recorded change category (autograd adopts an activation's gradient buffer as
  // a parameter's .grad). Host data becoming device memory is an allocation on the device: it may
  // throw as allocate() does, and then nothing changes.
  void recategorize(MemoryCategory from, MemoryCategory to, int64_t bytes);

  MemoryUsage usage() const;
  // The usage when the last allocation was refused (what the failing phase held before it
  // unwound and freed it).
  MemoryUsage usageAtLastRefusal() const;
  // Peaks restart from what is live now (a run's peaks are its own).
  void resetPeaks();
  // A window of measurement (one micro-batch), beside the peaks: its peaks restart from what is
  // live now, and window() says how high each category and the device went since (as peaks).
  void startWindow();
  MemoryUsage window() const;

  MemoryCategory phase() const { return phase_.load(std::memory_order_relaxed); }
  void setPhase(MemoryCategory category) { phase_.store(category, std::memory_order_relaxed); }

  // A rank's claim on the process's ledger for `device` with `capBytes` (0: no cap). The first
  // claim enforces the cap; a second claim while one is held means ranks share this process, so
  // the cap is lifted for all of them and enforced() says false until every claim is released.
  class Claim {
   public:
    Claim(MemoryLedger& ledger, std::string device, int64_t capBytes);
    ~Claim();
    Claim(const Claim&) = delete;
    Claim& operator=(const Claim&) = delete;
    // Whether this process's ledger counts for this device alone (caps enforced, usage real).
    bool enforced() const;

   private:
    MemoryLedger& ledger_;
  };

  // Lifts the cap for its lifetime (what a refused rank measures afterwards, to say what would
  // fit, needs more than the cap) and restores it after.
  class Uncapped {
   public:
    explicit Uncapped(MemoryLedger& ledger);
    ~Uncapped();
    Uncapped(const Uncapped&) = delete;
    Uncapped& operator=(const Uncapped&) = delete;

   private:
    MemoryLedger& ledger_;
    int64_t cap_;
  };

 private:
  void add(MemoryCategory category, int64_t bytes);
  void throwOutOfMemory(MemoryCategory category, int64_t bytes, int64_t liveBefore) const;

  std::array<std::atomic<int64_t>, kMemoryCategories> live_{}, peak_{}, windowPeak_{};
  std::atomic<int64_t> deviceLive_{0}, devicePeak_{0}, deviceWindowPeak_{0};
  std::atomic<int64_t> capBytes_{0};  // 0: none
  std::atomic<MemoryCategory> phase_{MemoryCategory::kHostData};
  mutable std::mutex claimMutex_;  // guards claims_, shared_ and device_
  int claims_ = 0;
  bool shared_ = false;  // two claims overlapped since the ledger was last free
  std::string device_;
  mutable MemoryUsage lastRefusal_;  // guarded by claimMutex_; written by a const throw
};

// Whether memory is accounted (HETRA_MEMORY_ACCOUNTING, default on). Off, no allocation reaches a
// ledger: nothing is counted, no cap can be enforced, and an allocation costs what LibTorch's own
// allocator costs (bench/compare_accounting.sh measures the difference).
bool memoryAccountingEnabled();
// The parameter's name, for messages.
const char* memoryAccountingParam();

// Sets the process's phase for its lifetime and restores the one before.
class MemoryScope {
 public:
  explicit MemoryScope(MemoryCategory category, MemoryLedger& ledger = MemoryLedger::process());
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  MemoryLedger& ledger_;
  MemoryCategory previous_;
};

}  // namespace hetra::device
