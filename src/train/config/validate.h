// The checks between keys, run on a config that read without errors: each rule is one function of
// validate.cc, and each failure a ConfigError naming the key where the user can fix it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "train/config.h"

namespace hetra::train::cfg {

// Where the value of `key` came from ("run.toml:12", "--set ..."), "" when unknown.
using Locate = std::function<std::string(const std::string& key)>;

// Throws ConfigError (messages start with locate(key), or `sourceName` for what no key holds);
// returns the warnings.
std::vector<std::string> checkBetweenKeys(const RunConfig& config, const Capabilities& caps,
                                          const Locate& locate, const std::string& sourceName);

}  // namespace hetra::train::cfg
