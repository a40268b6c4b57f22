#include "device/host_heap.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "common/logging.h"
#include "common/params.h"

namespace hetra::device {
namespace {

const Param kKeepHostHeap("HETRA_KEEP_HOST_HEAP", "1",
                          "1: a rank process pins glibc's mmap and trim thresholds, so that the "
                          "tensors a step frees stay in the heap for the next (src/device/"
                          "host_heap.h); 0: glibc's own adaptive thresholds.");

// glibc's largest mmap threshold on 64-bit machines (DEFAULT_MMAP_THRESHOLD_MAX): mallopt refuses
// more.
constexpr int kMmapThreshold = 32 << 20;

bool userTunedMalloc() {
  for (const char* name :
       {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"})
    if (std::getenv(name)) return true;
  return false;
}

}  // namespace

bool keepHostHeap() {
  static std::once_flag once;
  static bool pinned = false;
  std::call_once(once, [] {
    if (!kKeepHostHeap.flag() || userTunedMalloc()) return;
// Under a sanitizer, malloc is the sanitizer's own: there is no glibc heap to keep.
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    pinned =
        mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1;
    if (!pinned) HETRA_WARN("device", "glibc refused to pin its mmap and trim thresholds");
#endif
  });
  return pinned;
}

}  // namespace hetra::device
