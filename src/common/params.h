// Parameters: every tunable of hetra is declared once, with its environment variable, default and
// description (NCCL's discipline), so `hetra params` and the docs list all of them from one table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hetra {

struct ParamInfo {
  std::string env;  // e.g. "HETRA_LOG"
  std::string defaultValue;
  std::string description;
};

// Registers a parameter (idempotent) and returns its current value: the environment variable if
// set, else the default. Declare parameters as function-local statics or at namespace scope via
// Param.
class Param {
 public:
  Param(std::string env, std::string defaultValue, std::string description);
  std::string str() const;
  int64_t integer()
      const;  // throws ConfigError naming the variable when the value is not an integer
  double number() const;
  bool flag() const;  // 1/0, true/false, yes/no, on/off
  const std::string& env() const { return env_; }

 private:
  std::string env_;
  std::string default_;
};

std::vector<ParamInfo> allParams();

}  // namespace hetra
