// Elastic restarts: when a local rank fails, `hetra run` starts the job again without the failed
// rank's device, from the newest checkpoint of this run. This is the policy, without processes:
// whether to restart, which devices remain, and what the ranks of an attempt are told.
//
// Vocabulary:
//   attempt   one local job: the listed devices started together. The first attempt runs every
//             [[devices]] entry; each restart is an attempt without the devices that failed so
//             far.
//   device    an index into the config's [[devices]] list (the rank of an attempt is the position
//             of its device in the attempt's list).
// The ranks learn their attempt from their environment (HETRA_ELASTIC_*), set by the supervising
// hetra run in each rank's environment object.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hetra::launch {

struct ElasticAttempt {
  int64_t restart = 0;          // 0: the first start
  std::vector<size_t> devices;  // the devices taking part, in rank order
  std::string resume;           // checkpoint to resume from; "" on the first attempt (argv's)

  // The variables that tell a rank of this attempt about it.
  std::map<std::string, std::string> environment() const;
};

// The first attempt: every one of `deviceCount` devices.
ElasticAttempt firstAttempt(size_t deviceCount);

// The attempt this rank belongs to, from its environment (the first attempt when none is named).
// Throws ConfigError naming HETRA_ELASTIC_DEVICES when it lists no device of the config's
// `deviceCount`.
ElasticAttempt attemptFromEnvironment(size_t deviceCount);

struct ElasticPolicy {
  int64_t maxRestarts = 0;  // [elastic] max_restarts
  int64_t minDevices = 1;   // [elastic] min_devices
};

// How an attempt ended: its exit code (128 + signal for a rank killed by one) and the rank that
// failed first (-1: none is known).
struct AttemptFailure {
  int code = 0;
  int rank = -1;
};

// Why `attempt`, ended by `failure`, gets no restart under `policy`; "" when it gets one. A
// configuration error (exit code 2) or a signal that stopped the run is no device failure.
std::string whyNoRestart(const ElasticPolicy& policy, const ElasticAttempt& attempt,
                         const AttemptFailure& failure);

// The restart after `attempt`: the failed rank's device left out, resuming from `resume`.
ElasticAttempt nextAttempt(const ElasticAttempt& attempt, int failedRank, std::string resume);

}  // namespace hetra::launch
