#include "common/params.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "common/errors.h"
#include "common/units.h"

namespace hetra {
namespace {

std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}
std::vector<ParamInfo>& registry() {
  static std::vector<ParamInfo> params;
  return params;
}

}  // namespace

Param::Param(std::string env, std::string defaultValue, std::string description)
    : env_(std::move(env)), default_(std::move(defaultValue)) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& params = registry();
  auto found =
      std::find_if(params.begin(), params.end(), [&](const ParamInfo& p) { return p.env == env_; });
  if (found == params.end()) params.push_back({env_, default_, std::move(description)});
}

std::string Param::str() const {
  const char* value = std::getenv(env_.c_str());
  return value ? std::string(value) : default_;
}

std::optional<std::string> environmentValue(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == 0) return std::nullopt;
  return std::string(value);
}

int64_t Param::integer() const {
  const std::string value = str();
  if (std::optional<int64_t> parsed = wholeInteger(value)) return *parsed;
  throw ConfigError(hetra::str(env_, "='", value, "' is not an integer"));
}

double Param::number() const {
  const std::string value = str();
  if (std::optional<double> parsed = wholeNumber(value)) return *parsed;
  throw ConfigError(hetra::str(env_, "='", value, "' is not a number"));
}

bool Param::flag() const {
  std::string value = str();
  std::transform(value.begin(), value.end(), value.begin(), ::tolower);
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off" || value.empty())
    return false;
  throw ConfigError(
      hetra::str(env_, "='", value, "' is not a flag; allowed: 1/0, true/false, yes/no, on/off"));
}

std::vector<ParamInfo> allParams() {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto params = registry();
  std::sort(params.begin(), params.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return a.env < b.env; });
  return params;
}

}  // namespace hetra
