// Vocabulary: see elastic.h.
#include "launch/elastic.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>

#include "common/errors.h"
#include "common/params.h"

namespace hetra::launch {
namespace {

const Param kElasticRestart(
    "HETRA_ELASTIC_RESTART", "0",
    "Set by hetra run for its ranks: the elastic restart they belong to "
    "(0: the first start; > 0: append to --metrics, resume from HETRA_ELASTIC_RESUME).");
const Param kElasticDevices("HETRA_ELASTIC_DEVICES", "",
                            "Set by hetra run on an elastic restart: the [[devices]] entries that "
                            "take part, as indices into the config's list (\"0,2\").");
const Param kElasticResume("HETRA_ELASTIC_RESUME", "",
                           "Set by hetra run on an elastic restart: the checkpoint the ranks "
                           "resume from (empty: start over, no checkpoint was written yet).");

}  // namespace

std::map<std::string, std::string> ElasticAttempt::environment() const {
  std::string list;
  for (size_t i = 0; i < devices.size(); ++i) list += (i ? "," : "") + std::to_string(devices[i]);
  return {{kElasticRestart.env(), std::to_string(restart)},
          {kElasticDevices.env(), list},
          {kElasticResume.env(), resume}};
}

ElasticAttempt firstAttempt(size_t deviceCount) {
  ElasticAttempt attempt;
  for (size_t i = 0; i < deviceCount; ++i) attempt.devices.push_back(i);
  return attempt;
}

ElasticAttempt attemptFromEnvironment(size_t deviceCount) {
  ElasticAttempt attempt;
  attempt.restart = kElasticRestart.integer();
  if (attempt.restart < 0)
    throw ConfigError(str(kElasticRestart.env(), "=", attempt.restart, " is negative"));
  attempt.resume = kElasticResume.str();
  const std::string devices = kElasticDevices.str();
  if (devices.empty()) {
    attempt.devices = firstAttempt(deviceCount).devices;
    return attempt;
  }
  size_t begin = 0;
  while (begin <= devices.size()) {
    const size_t comma = std::min(devices.find(',', begin), devices.size());
    const std::string item = devices.substr(begin, comma - begin);
    char* end = nullptr;
    const long index = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != 0 || index < 0 || size_t(index) >= deviceCount)
      throw ConfigError(str(kElasticDevices.env(), "=", devices, ": '", item,
                            "' is not an index of the config's ", deviceCount, " devices"));
    attempt.devices.push_back(size_t(index));
    begin = comma + 1;
  }
  return attempt;
}

std::string whyNoRestart(const ElasticPolicy& policy, const ElasticAttempt& attempt,
                         const AttemptFailure& failure) {
  const bool stopped =
      failure.code == 128 + SIGINT || failure.code == 128 + SIGTERM || failure.code == 128 + SIGHUP;
  if (attempt.restart >= policy.maxRestarts)
    return str("no elastic restart left (elastic.max_restarts = ", policy.maxRestarts, ")");
  if (failure.rank < 0 || size_t(failure.rank) >= attempt.devices.size())
    return "no rank is known to have failed";
  if (stopped) return "the run was stopped by a signal";
  if (failure.code == 2)
    return "a configuration error is no device failure: a restart would fail the same way";
  if (int64_t(attempt.devices.size()) - 1 < policy.minDevices)
    return str("only ", attempt.devices.size() - 1,
               " devices would remain (elastic.min_devices = ", policy.minDevices, ")");
  return "";
}

ElasticAttempt nextAttempt(const ElasticAttempt& attempt, int failedRank, std::string resume) {
  HETRA_ENFORCE(failedRank >= 0 && size_t(failedRank) < attempt.devices.size(), "rank ", failedRank,
                " is not one of the attempt's ", attempt.devices.size());
  ElasticAttempt next;
  next.restart = attempt.restart + 1;
  next.devices = attempt.devices;
  next.devices.erase(next.devices.begin() + failedRank);
  next.resume = std::move(resume);
  return next;
}

}  // namespace hetra::launch
