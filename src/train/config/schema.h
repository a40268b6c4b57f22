// The schema language of the configuration: typed fields with ranges, read from TOML nodes with
// messages that say where a bad value came from.
//
// Vocabulary (beyond train/config.h):
//   field    one key of a section: its name, a description, a reader (type and range checks, with
//            the node's location for messages) and a writer (the value as TOML text). The tables of
//            fields (fields.h) are the single list of keys: reading, unknown-key suggestions and
//            toToml all use them, so a key cannot be readable but unprintable.
//   site     one value being read: its full key (devices[2].slowdown), its node and where it came
//            from, the file and line, or the --set that put it there (kept in the node's source
//            path, which toml++ carries along when a node is moved).
//   origin   "run.toml:12" or "--set train.lr=x": the prefix of a message.
//   bound    the range a number must lie in, printed in messages as "in [1, 1024]" or ">= 0".
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "common/errors.h"
#include "train/config/text.h"

namespace hetra::train::cfg {

// The source path of the values a --set puts in the tree starts with this.
constexpr const char* kSetPrefix = "--set ";
constexpr double kInf = std::numeric_limits<double>::infinity();

// A node's value as it would be written in TOML, for messages.
std::string show(const toml::node& node);

struct Reader {
  std::string sourceName;  // empty when the text is not a user's (validateConfig of a struct)
  std::map<std::string, std::string> origins;  // key -> origin of its value, for later checks
};

std::string originOf(const toml::node& node, const Reader& reader);
// "origin: ", or "" for no origin.
std::string prefixed(const std::string& origin);

struct Site {
  Reader& reader;
  std::string key;
  const toml::node& node;

  // Throws ConfigError "<origin>: <key> = <value>: <what>".
  [[noreturn]] void fail(const std::string& what) const;
  Site element(size_t i, const toml::node& n) const { return {reader, str(key, "[", i, "]"), n}; }
};

struct Bound {
  double lo = -kInf;
  bool loOpen = false;
  double hi = kInf;
  bool hiOpen = false;

  bool contains(double v) const {
    return std::isfinite(v) && (loOpen ? v > lo : v >= lo) && (hiOpen ? v < hi : v <= hi);
  }
  std::string describe() const {
    if (std::isfinite(lo) && std::isfinite(hi))
      return str("in ", loOpen ? "(" : "[", formatBound(lo), ", ", formatBound(hi),
                 hiOpen ? ")" : "]");
    if (std::isfinite(lo)) return str(loOpen ? "> " : ">= ", formatBound(lo));
    if (std::isfinite(hi)) return str(hiOpen ? "< " : "<= ", formatBound(hi));
    return "finite";
  }
};

inline Bound atLeast(double lo) {
  return {lo, false, kInf, false};
}  // [lo, inf)
inline Bound above(double lo) {
  return {lo, true, kInf, false};
}  // (lo, inf)
inline Bound within(double lo, double hi) {
  return {lo, false, hi, false};
}  // [lo, hi]
inline Bound upTo(double lo, double hi) {
  return {lo, false, hi, true};
}  // [lo, hi)
inline Bound between(double lo, double hi) {
  return {lo, true, hi, true};
}  // (lo, hi)

int64_t readInt(const Site& site, const Bound& bound);
double readNumber(const Site& site, const Bound& bound);
// A non-empty string.
std::string readString(const Site& site);

template <class S>
struct Field {
  std::string key;
  std::string help;
  // A string-valued key: a --set value that is not a TOML string is taken verbatim (--set
  // train.checkpoint_dir=2024 sets the string "2024").
  bool text = false;
  std::function<void(S&, const Site&)> read;
  std::function<std::string(const S&)> write;  // the value as TOML text; empty: not printed
};

template <class S>
using Fields = std::vector<Field<S>>;

template <class S>
Field<S> intField(std::string key, int64_t S::*m, Bound bound, std::string help) {
  return {std::move(key), std::move(help), false,
          [m, bound](S& s, const Site& site) { s.*m = readInt(site, bound); },
          [m](const S& s) { return std::to_string(s.*m); }};
}

template <class S>
Field<S> numField(std::string key, double S::*m, Bound bound, std::string help) {
  return {std::move(key), std::move(help), false,
          [m, bound](S& s, const Site& site) { s.*m = readNumber(site, bound); },
          [m](const S& s) { return formatDouble(s.*m); }};
}

template <class S>
Field<S> boolField(std::string key, bool S::*m, std::string help) {
  return {std::move(key), std::move(help), false,
          [m](S& s, const Site& site) {
            auto* v = site.node.as_boolean();
            if (!v) site.fail("expected true or false");
            s.*m = v->get();
          },
          [m](const S& s) { return std::string(s.*m ? "true" : "false"); }};
}

template <class S>
Field<S> stringField(std::string key, std::string S::*m, std::string help) {
  return {std::move(key), std::move(help), true,
          [m](S& s, const Site& site) { s.*m = readString(site); },
          [m](const S& s) { return quote(s.*m); }};
}

// One of `allowed`; a value of `planned` is named as known but not implemented yet.
template <class S>
Field<S> choiceField(std::string key, std::string S::*m, std::vector<std::string> allowed,
                     std::string help, std::vector<std::string> planned = {}) {
  return {std::move(key), std::move(help), true,
          [m, allowed, planned](S& s, const Site& site) {
            auto* v = site.node.as_string();
            std::string what = str("must be one of ", quotedList(allowed));
            if (!v) site.fail(str("expected a string: ", what));
            if (std::find(planned.begin(), planned.end(), v->get()) != planned.end())
              site.fail(str("not supported yet; ", what, " (planned: ", quotedList(planned), ")"));
            if (std::find(allowed.begin(), allowed.end(), v->get()) == allowed.end())
              site.fail(what);
            s.*m = v->get();
          },
          [m](const S& s) { return quote(s.*m); }};
}

// The elements of a TOML list, each read by `readOne` at its own site ("key[i]").
template <class T, class ReadOne>
std::vector<T> readList(const Site& site, const toml::array& list, ReadOne readOne) {
  std::vector<T> values;
  for (size_t i = 0; i < list.size(); ++i) values.push_back(readOne(site.element(i, *list.get(i))));
  return values;
}

// "[a, b]": each element as `formatOne` writes it.
template <class T, class FormatOne>
std::string formatList(const std::vector<T>& values, FormatOne formatOne) {
  std::vector<std::string> parts;
  for (const T& v : values) parts.push_back(formatOne(v));
  return "[" + join(parts, ", ") + "]";
}

template <class S>
Field<S> intListField(std::string key, std::vector<int64_t> S::*m, Bound bound, std::string help) {
  return {
      std::move(key), std::move(help), false,
      [m, bound](S& s, const Site& site) {
        auto* a = site.node.as_array();
        if (!a)
          site.fail(str("expected a list of integers ", bound.describe(), ", e.g. [256, 128]"));
        s.*m = readList<int64_t>(site, *a, [&](const Site& e) { return readInt(e, bound); });
      },
      [m](const S& s) { return formatList(s.*m, [](int64_t v) { return std::to_string(v); }); }};
}

template <class S>
Field<S> stringListField(std::string key, std::vector<std::string> S::*m, std::string help) {
  return {std::move(key), std::move(help), false,
          [m](S& s, const Site& site) {
            auto* a = site.node.as_array();
            if (!a)
              site.fail("expected a list of strings, e.g. [\"--mca\", \"btl\", \"tcp,self\"]");
            s.*m = readList<std::string>(site, *a, [](const Site& e) {
              auto* v = e.node.as_string();
              if (!v) e.fail("expected a string");
              return v->get();
            });
          },
          [m](const S& s) {
            if ((s.*m).empty()) return std::string();
            return formatList(s.*m, [](const std::string& v) { return quote(v); });
          }};
}

template <class S>
Field<S> numListField(std::string key, std::vector<double> S::*m, Bound bound, size_t size,
                      std::string help) {
  return {std::move(key), std::move(help), false,
          [m, bound, size](S& s, const Site& site) {
            auto* a = site.node.as_array();
            if (!a || a->size() != size)
              site.fail(str("expected a list of ", size, " numbers ", bound.describe()));
            s.*m = readList<double>(site, *a, [&](const Site& e) { return readNumber(e, bound); });
          },
          [m](const S& s) { return formatList(s.*m, [](double v) { return formatDouble(v); }); }};
}

// A string key whose empty default means "not set" (not printed, so the printed config reads
// back the same). `problem` returns what is wrong with a value, "" when it is fine.
template <class S>
Field<S> optionalStringField(std::string key, std::string S::*m, std::string help,
                             std::function<std::string(const std::string&)> problem = nullptr) {
  return {std::move(key), std::move(help), true,
          [m, problem](S& s, const Site& site) {
            s.*m = readString(site);
            if (problem && !problem(s.*m).empty()) site.fail(problem(s.*m));
          },
          [m](const S& s) { return (s.*m).empty() ? std::string() : quote(s.*m); }};
}

}  // namespace hetra::train::cfg
