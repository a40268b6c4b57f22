// Reading a parsed TOML document into a RunConfig, key by key through the field tables: type and
// range errors name the key, its value and where it came from; unknown keys get a suggestion.
#pragma once

#include <toml++/toml.h>

#include "train/config.h"
#include "train/config/schema.h"

namespace hetra::train::cfg {

// Records each key's origin in `reader` for the checks between keys. Throws ConfigError.
void readRoot(RunConfig& config, const toml::table& root, Reader& reader);

}  // namespace hetra::train::cfg
