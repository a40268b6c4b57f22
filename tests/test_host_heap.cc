// device::keepHostHeap: a freed block of a few megabytes stays in the heap, so allocating it again
// faults no page in; with glibc's adaptive thresholds the second allocation faults every page in
// (the first is mapped and unmapped, the next comes from fresh heap). Each case runs in a child
// process of its own: the thresholds are the process's, and so is glibc's history.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>

#include <gtest/gtest.h>

#include "device/host_heap.h"

namespace hetra::device {
namespace {

constexpr size_t kBlockBytes = 8 << 20;  // above glibc's initial mmap threshold, below the pinned
constexpr long kPages = long(kBlockBytes / 4096);

long minorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The page faults of allocating, touching and freeing the block a second time.
long faultsOfSecondAllocation() {
  for (int round = 0;; ++round) {
    const long before = minorFaults();
    char* block = static_cast<char*>(std::malloc(kBlockBytes));
    if (!block) std::abort();
    std::memset(block, round + 1, kBlockBytes);
    asm volatile("" : : "r"(block) : "memory");  // the writes happen
    std::free(block);
    if (round == 1) return minorFaults() - before;
  }
}

// Runs `body` in a child process; its result comes back as the exit code's bucket (0-255).
int inChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// 0: at most a tenth of the block's pages faulted; 1: at least half; 2: in between.
int faultClass(long faults) {
  if (faults <= kPages / 10) return 0;
  return faults >= kPages / 2 ? 1 : 2;
}

TEST(HostHeap, AKeptHeapServesAFreedBlockAgainWithoutFaults) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's malloc has no glibc heap to keep";
#endif
  const int kept = inChild([] {
    unsetenv("HETRA_KEEP_HOST_HEAP");
    if (!keepHostHeap()) return 3;
    return faultClass(faultsOfSecondAllocation());
  });
  EXPECT_EQ(kept, 0) << "(3: not pinned; 1 or 2: the second allocation faulted its pages in)";
}

TEST(HostHeap, GlibcsAdaptiveHeapFaultsTheSecondAllocationIn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's malloc is not glibc's";
#endif
  // The case keepHostHeap exists for, so that the test above can tell the difference.
  const int adaptive = inChild([] { return faultClass(faultsOfSecondAllocation()); });
  EXPECT_EQ(adaptive, 1);
}

TEST(HostHeap, TheUsersOwnTuningAndTheSwitchAreLeftAlone) {
  EXPECT_EQ(inChild([] {
              setenv("MALLOC_TRIM_THRESHOLD_", "131072", 1);
              return keepHostHeap() ? 1 : 0;
            }),
            0);
  EXPECT_EQ(inChild([] {
              setenv("HETRA_KEEP_HOST_HEAP", "0", 1);
              return keepHostHeap() ? 1 : 0;
            }),
            0);
}

}  // namespace
}  // namespace hetra::device
