// The host heap of a rank process. glibc serves a block above its mmap threshold with mmap and
// hands the top of its heap back to the kernel past its trim threshold, and raises both as it sees
// large blocks freed. A training step frees and allocates the same megabytes of tensors every step;
// in some layouts glibc then gives them back every step and the next step faults every page in
// again: bench/accounting_cost saw three times the page faults and steps up to 30% slower, which
// the counting allocator's 64-byte header could trigger (docs/benchmarks.md). With both thresholds
// pinned, freed tensors stay in the heap for the next step; the process's resident memory stays at
// its peak, which a training step reaches every step anyway.
#pragma once

namespace hetra::device {

// Pins glibc's mmap threshold (at its largest, 32 MiB: larger blocks are still mapped) and trim
// threshold for this process, once; later calls do nothing. Leaves glibc alone where the user tuned
// it (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or GLIBC_TUNABLES is set) and
// with HETRA_KEEP_HOST_HEAP=0, and under a sanitizer (its malloc is its own). Returns whether the
// thresholds are pinned, by this call or an earlier one.
bool keepHostHeap();

}  // namespace hetra::device
