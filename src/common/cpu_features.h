// CPU features that __builtin_cpu_supports cannot name on every compiler we build with (clang 14
// does not know "f16c"), read from CPUID directly.
#pragma once

#include <cpuid.h>

namespace hetra {

// The F16C half-precision conversion instructions (CPUID leaf 1, ECX bit 29).
inline bool cpuHasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_F16C) != 0;
}

}  // namespace hetra
