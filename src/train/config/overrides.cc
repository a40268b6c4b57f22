#include "train/config/overrides.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "common/errors.h"
#include "train/config/fields.h"
#include "train/config/schema.h"

namespace hetra::train::cfg {
namespace {

bool isIndex(const std::string& s) {
  return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
}

// "devices[1].slowdown" and "devices.1.slowdown" -> {devices, 1, slowdown}.
std::vector<std::string> splitKey(const std::string& key, const std::string& origin) {
  std::string dotted;
  for (char c : key) {
    if (c == '[')
      dotted += '.';
    else if (c != ']')
      dotted += c;
  }
  std::vector<std::string> path;
  std::string part;
  std::istringstream in(dotted);
  while (std::getline(in, part, '.')) {
    part = trim(part);
    if (part.empty()) break;
    path.push_back(part);
  }
  if (path.empty() || dotted.back() == '.' ||
      std::count(dotted.begin(), dotted.end(), '.') + 1 != std::ptrdiff_t(path.size()))
    throw ConfigError(str(origin, ": key '", key,
                          "' is not a dotted key such as train.lr or devices.1.slowdown"));
  return path;
}

// The value of a --set as a one-key TOML document whose source path is the --set itself, so every
// message about the value names the --set it came from.
toml::table parseSetValue(const std::string& text, bool asText, const std::string& origin) {
  if (!asText) {
    try {
      toml::table doc = toml::parse("v = " + text, origin);
      if (doc.size() == 1 && doc.contains("v")) return doc;
    } catch (const toml::parse_error&) {
      // Not a TOML value: a bare word such as equal or /tmp/x, taken as a string below.
    }
  }
  try {
    return toml::parse("v = " + quote(text), origin);
  } catch (const toml::parse_error& e) {
    // Even as a quoted string the value is no TOML, e.g. invalid UTF-8 (found by fuzzing).
    throw ConfigError(str(origin, ": ", e.description()));
  }
}

// An empty table (or list) that carries the --set as its source, for the tables a --set creates.
toml::table containerFrom(const std::string& origin, bool list) {
  return toml::parse(list ? "v = []" : "v = {}", origin);
}

}  // namespace

void applySet(toml::table& root, const std::string& set) {
  const std::string origin = kSetPrefix + set;
  size_t eq = set.find('=');
  if (eq == std::string::npos)
    throw ConfigError(str(origin, ": expected key=value, e.g. --set train.lr=0.05"));
  std::vector<std::string> path = splitKey(trim(set.substr(0, eq)), origin);
  std::string text = trim(set.substr(eq + 1));
  const std::vector<std::string>& sections = sectionNames();
  if (std::find(sections.begin(), sections.end(), path[0]) == sections.end()) {
    std::string near = closest(path[0], sections);
    throw ConfigError(str(origin, ": unknown key ", join(path, "."),
                          near.empty() ? str(" (sections: ", join(sections, ", "), ")")
                                       : str(" (did you mean ", near, "?)")));
  }
  const bool wasText = isTextKey(path);
  toml::table doc = parseSetValue(text, false, origin);
  if (wasText && !doc.get("v")->is_string()) doc = parseSetValue(text, true, origin);
  toml::node& value = *doc.get("v");

  // Walk to the parent of the last key, creating tables (or, before an index, lists) on the way.
  toml::node* current = &root;
  std::string walked;
  for (size_t i = 0; i < path.size(); ++i) {
    const std::string& part = path[i];
    const bool last = i + 1 == path.size();
    const bool nextIsIndex = !last && isIndex(path[i + 1]);
    std::string here = walked.empty() ? part : walked + "." + part;
    if (auto* table = current->as_table()) {
      if (last) {
        table->insert_or_assign(part, std::move(value));
        return;
      }
      if (!table->contains(part))
        table->insert(part, std::move(*containerFrom(origin, nextIsIndex).get("v")));
      current = table->get(part);
    } else if (auto* array = current->as_array()) {
      if (!isIndex(part))
        throw ConfigError(
            str(origin, ": ", walked, " is a list: address its entries as ", walked, ".<index>"));
      size_t index = std::stoul(part);
      if (index > array->size())
        throw ConfigError(str(origin, ": ", walked, " has ", array->size(),
                              array->size() == 1 ? " entry" : " entries", ": index ", index,
                              " is out of range (0..", array->size(),
                              ", where the last one adds an entry)"));
      if (last) {
        if (index == array->size())
          array->push_back(std::move(value));
        else
          array->replace(array->cbegin() + std::ptrdiff_t(index), std::move(value));
        return;
      }
      if (index == array->size())
        array->push_back(std::move(*containerFrom(origin, nextIsIndex).get("v")));
      current = array->get(index);
    } else {
      throw ConfigError(
          str(origin, ": ", walked, " is a single value, so ", here, " cannot be set"));
    }
    walked = here;
  }
}

}  // namespace hetra::train::cfg
