#include "train/config/schema.h"

#include <sstream>

namespace hetra::train::cfg {

std::string show(const toml::node& node) {
  if (auto* v = node.as_string()) return quote(v->get());
  if (auto* v = node.as_integer()) return std::to_string(v->get());
  if (auto* v = node.as_floating_point()) return formatDouble(v->get());
  if (auto* v = node.as_boolean()) return v->get() ? "true" : "false";
  if (auto* a = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + show(*a->get(i));
    return out + "]";
  }
  if (auto* t = node.as_table()) {
    std::string out = "{";
    bool first = true;
    for (auto&& [k, v] : *t) {
      out += str(first ? " " : ", ", k.str(), " = ", show(v));
      first = false;
    }
    return out + (first ? "}" : " }");
  }
  std::ostringstream os;  // dates and times
  node.visit([&](auto&& v) { os << v; });
  return os.str();
}

std::string originOf(const toml::node& node, const Reader& reader) {
  const auto& source = node.source();
  if (source.path && source.path->rfind(kSetPrefix, 0) == 0) return *source.path;
  if (source.begin.line > 0 && !reader.sourceName.empty())
    return str(reader.sourceName, ":", source.begin.line);
  return reader.sourceName;
}

std::string prefixed(const std::string& origin) {
  return origin.empty() ? "" : origin + ": ";
}

void Site::fail(const std::string& what) const {
  throw ConfigError(str(prefixed(originOf(node, reader)), key, " = ", show(node), ": ", what));
}

int64_t readInt(const Site& site, const Bound& bound) {
  auto* v = site.node.as_integer();
  if (!v) site.fail(str("expected an integer ", bound.describe()));
  if (!bound.contains(double(v->get()))) site.fail(str("out of range: must be ", bound.describe()));
  return v->get();
}

double readNumber(const Site& site, const Bound& bound) {
  double value;
  if (auto* i = site.node.as_integer()) {
    value = double(i->get());
  } else if (auto* f = site.node.as_floating_point()) {
    value = f->get();
  } else {
    site.fail(str("expected a number ", bound.describe()));
  }
  if (!bound.contains(value)) site.fail(str("out of range: must be ", bound.describe()));
  return value;
}

std::string readString(const Site& site) {
  auto* v = site.node.as_string();
  if (!v) site.fail("expected a string (in quotes)");
  if (v->get().empty()) site.fail("must not be empty");
  return v->get();
}

}  // namespace hetra::train::cfg
