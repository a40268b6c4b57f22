// One table of names per enum. The name of a value, the value of a name and the "allowed:" list of
// an error all read the same table, so the directions cannot drift apart when a value is added.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "common/errors.h"

namespace hetra {

template <typename Enum>
struct NamedValue {
  Enum value;
  const char* name;
};

// True when `table` lists every value of Enum from 0 to `last`, in order, each once: a table that
// misses a value added later fails the static_assert next to it, as a switch would warn.
template <typename Enum, size_t N>
constexpr bool coversEnum(const NamedValue<Enum> (&table)[N], Enum last) {
  if (N != size_t(last) + 1) return false;
  for (size_t i = 0; i < N; ++i)
    if (size_t(table[i].value) != i) return false;
  return true;
}

// The name of `value`, or `unknown` for a value outside the table (a cast from a bad integer).
template <typename Enum, size_t N>
const char* nameOf(Enum value, const NamedValue<Enum> (&table)[N], const char* unknown = "?") {
  for (const auto& entry : table)
    if (entry.value == value) return entry.name;
  return unknown;
}

template <typename Enum, size_t N>
std::optional<Enum> findName(std::string_view text, const NamedValue<Enum> (&table)[N]) {
  for (const auto& entry : table)
    if (text == entry.name) return entry.value;
  return std::nullopt;
}

// "a, b, c": the names in table order, for the "allowed:" part of an error.
template <typename Enum, size_t N>
std::string allowedNames(const NamedValue<Enum> (&table)[N]) {
  std::string list;
  for (const auto& entry : table) list += (list.empty() ? "" : ", ") + std::string(entry.name);
  return list;
}

// The value named `text`, else ConfigError "<what> '<text>' is not supported; allowed: a, b, c".
template <typename Enum, size_t N>
Enum parseName(std::string_view text, const NamedValue<Enum> (&table)[N], std::string_view what) {
  if (std::optional<Enum> value = findName(text, table)) return *value;
  throw ConfigError(str(what, " '", text, "' is not supported; allowed: ", allowedNames(table)));
}

}  // namespace hetra
