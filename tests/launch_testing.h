// Helpers of the launcher's tests (test_launch, test_rank_environment).
#pragma once

#include <string>

#include "common/errors.h"

namespace hetra::test {

// The message of the ConfigError `fn` throws ("" when it throws none).
template <typename Fn>
std::string configError(Fn fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace hetra::test
