// Parameters: every tunable of hetra is declared once, with its environment variable, default and
// description (NCCL's discipline), so `hetra params` and the docs list all of them from one table.
#pragma once

#include <cstdint>
#include <optional>
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

// The environment's value of `name`, nullopt when it is unset or empty: the one place hetra reads
// its environment. A parameter declared here is read through its Param; this is for variables of
// other programs (a launcher's RANK, MPI's OMPI_COMM_WORLD_RANK) and for asking whether a parameter
// declared in another library is set at all.
std::optional<std::string> environmentValue(const std::string& name);

}  // namespace hetra
