// Helpers shared by the fuzz targets: a failed property aborts (libFuzzer reports it as a crash
// with the input that caused it).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hetra::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace hetra::fuzz
