#include "common/units.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace hetra {
namespace {

struct Unit {
  const char* name;
  double scale;
};

// Powers of 1000 and of 1024, as parseBytes and the byte-based rates read them.
constexpr Unit kByteUnits[] = {{"b", 1},           {"kb", 1e3},           {"mb", 1e6},
                               {"gb", 1e9},        {"tb", 1e12},          {"kib", 1024.0},
                               {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
constexpr Unit kBitUnits[] = {
    {"bit", 1.0 / 8}, {"kbit", 1e3 / 8}, {"mbit", 1e6 / 8}, {"gbit", 1e9 / 8}};
constexpr Unit kTimeUnits[] = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};

std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::string lowered(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return text;
}

// The text in double quotes, with quotes, backslashes and control characters escaped, so an empty
// or odd value still shows in the message.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += str("\\x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

template <size_t N>
const Unit* findUnit(const Unit (&units)[N], const std::string& name) {
  for (const Unit& unit : units)
    if (name == unit.name) return &unit;
  return nullptr;
}

// The leading number of the text (strtod syntax) and the lower-cased, trimmed rest; `ok` only
// when there is a number and it is finite and >= 0.
struct NumberAndUnit {
  bool ok = false;
  double value = 0;
  std::string unit;
};

NumberAndUnit splitNumber(const std::string& text) {
  NumberAndUnit out;
  const std::string s = trimmed(text);
  size_t used = 0;
  try {
    out.value = std::stod(s, &used);
  } catch (const std::exception&) {
    return out;
  }
  out.ok = used > 0 && std::isfinite(out.value) && out.value >= 0;
  out.unit = lowered(trimmed(s.substr(used)));
  return out;
}

template <typename Parse>
auto parseWhole(const std::string& text, Parse parse)
    -> std::optional<decltype(parse(text, nullptr))> {
  try {
    size_t used = 0;
    auto parsed = parse(text, &used);
    if (used == text.size()) return parsed;
  } catch (const std::exception&) {  // invalid_argument, out_of_range: not a number either way
  }
  return std::nullopt;
}

}  // namespace

int64_t parseBytes(const std::string& text) {
  auto bad = [&]() {
    return ConfigError(str("memory size ", quoted(text),
                           ": expected a whole number of bytes with an optional unit (B, KB, MB, "
                           "GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024), e.g. "
                           "\"512MiB\", \"1.5GB\" or \"1000\""));
  };
  // Exact decimal arithmetic: "1.5GiB" must not round through a double.
  const std::string s = trimmed(text);
  size_t i = 0;
  __int128 mantissa = 0, scale = 1;
  bool digits = false;
  const __int128 kMantissaLimit = __int128(1) << 80;  // times 1 TiB still fits __int128
  for (; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
    mantissa = mantissa * 10 + (s[i] - '0');
    if (mantissa > kMantissaLimit) throw bad();
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
      if (scale > __int128(1e18)) throw bad();
      mantissa = mantissa * 10 + (s[i] - '0');
      if (mantissa > kMantissaLimit) throw bad();
      scale *= 10;
    }
  }
  if (!digits) throw bad();
  const std::string unitName = lowered(trimmed(s.substr(i)));
  const Unit* unit = unitName.empty() ? &kByteUnits[0] : findUnit(kByteUnits, unitName);
  if (!unit) throw bad();
  __int128 bytes = mantissa * __int128(unit->scale);
  if (bytes % scale != 0) throw bad();
  bytes /= scale;
  if (bytes > std::numeric_limits<int64_t>::max()) throw bad();
  return int64_t(bytes);
}

std::string formatBytes(int64_t bytes) {
  if (bytes > 0) {
    // Binary units first: 1 MiB is also a whole number of KB, but "1MiB" is what was meant.
    const std::pair<int64_t, const char*> units[] = {{int64_t(1) << 40, "TiB"},
                                                     {int64_t(1) << 30, "GiB"},
                                                     {int64_t(1) << 20, "MiB"},
                                                     {int64_t(1) << 10, "KiB"},
                                                     {int64_t(1000) * 1000 * 1000 * 1000, "TB"},
                                                     {1000 * 1000 * 1000, "GB"},
                                                     {1000 * 1000, "MB"},
                                                     {1000, "KB"}};
    for (const auto& [size, name] : units)
      if (bytes % size == 0) return str(bytes / size, name);
  }
  return std::to_string(bytes);
}

double parseRate(const std::string& text, const std::string& what, RateUnit rule) {
  NumberAndUnit parsed = splitNumber(text);
  std::string unit = parsed.unit;
  const bool perSecond = unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "/s") == 0;
  if (perSecond) unit.resize(unit.size() - 2);
  // Bits are a rate by name; bytes are one only with "/s" unless the rule lets it go unsaid.
  const Unit* found = findUnit(kBitUnits, unit);
  const bool bytesAllowed = perSecond || rule == RateUnit::kOptional;
  if (!found && bytesAllowed && !unit.empty()) found = findUnit(kByteUnits, unit);
  if (!found && unit.empty() && !perSecond && rule == RateUnit::kOptional) found = &kByteUnits[0];
  if (!parsed.ok || !found)
    throw ConfigError(str(what, " ", quoted(text),
                          " is not a rate; use a number with B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, "
                          "MiB/s, GiB/s, TiB/s, bit, kbit, mbit or gbit",
                          rule == RateUnit::kOptional ? " (\"/s\" optional; no unit = B/s)" : "",
                          ", e.g. \"125MB/s\" or \"1gbit\""));
  return parsed.value * found->scale;
}

double parseSeconds(const std::string& text, const std::string& what) {
  const NumberAndUnit parsed = splitNumber(text);
  const Unit* unit = findUnit(kTimeUnits, parsed.unit);
  if (!parsed.ok || !unit)
    throw ConfigError(str(what, " ", quoted(text),
                          " is not a duration; use a number >= 0 with s, ms, us or ns, e.g. "
                          "\"5us\" or \"0.5ms\""));
  return parsed.value * unit->scale;
}

std::optional<int64_t> wholeInteger(const std::string& text) {
  return parseWhole(
      text, [](const std::string& t, size_t* used) -> int64_t { return std::stoll(t, used); });
}

std::optional<double> wholeNumber(const std::string& text) {
  return parseWhole(text, [](const std::string& t, size_t* used) { return std::stod(t, used); });
}

}  // namespace hetra
