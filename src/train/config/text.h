// Text helpers of the configuration: TOML literals, numbers as people write them, lists, and the
// nearest known name for a typo.
#pragma once

#include <string>
#include <vector>

namespace hetra::train::cfg {

// A TOML basic string.
std::string quote(const std::string& s);
// Shortest text that reads back as the same double, and as a TOML float (never as an integer).
std::string formatDouble(double v);
// A number as people write it in a range: 1, 0.05, 1e+06.
std::string formatBound(double v);
std::string trim(const std::string& s);
std::string join(const std::vector<std::string>& parts, const std::string& sep);
// "a", "b", "c"
std::string quotedList(const std::vector<std::string>& values);
// The candidate closest to `name`, if it is close enough to be a typo; else "".
std::string closest(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace hetra::train::cfg
