// `--set key=value` overrides, applied to the parsed TOML tree before it is read, so an override
// gets the same checks as a line of the file and its messages name the --set.
//
// Grammar: key = section.name | devices.<i>.name | devices[<i>].name; value = a TOML value, or a
// plain string when it does not parse as one (equal, /tmp/x) or the key is a string setting.
// devices.<n>.name with n the number of entries adds an entry.
#pragma once

#include <string>

#include <toml++/toml.h>

namespace hetra::train::cfg {

// Throws ConfigError naming the --set.
void applySet(toml::table& root, const std::string& set);

}  // namespace hetra::train::cfg
