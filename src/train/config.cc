// Reading, overriding, validating and printing the `hetra run` configuration.
//
// Vocabulary (beyond config.h):
//   field    one key of a section: its name, a description, a reader (type and range checks, with
//            the node's location for messages) and a writer (the value as TOML text). The tables of
//            fields are the single list of keys: reading, unknown-key suggestions and toToml all
//            use them, so a key cannot be readable but unprintable.
//   site     one value being read: its full key (devices[2].slowdown), its node and where it came
//            from, the file and line, or the --set that put it there (kept in the node's source
//            path, which toml++ carries along when a node is moved).
//   origin   "run.toml:12" or "--set train.lr=x": the prefix of a message.
#include "train/config.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <toml++/toml.h>

#include "common/errors.h"

namespace hetra::train {
namespace {

constexpr const char* kSetPrefix = "--set ";
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- Text
// -----------------------------------------------------------------------------------------

// A TOML basic string.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double, and as a TOML float (never as an integer).
std::string formatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// A number as people write it in a range: 1, 0.05, 1e+06.
std::string formatBound(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  return formatDouble(v);
}

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

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string quotedList(const std::vector<std::string>& values) {
  std::vector<std::string> q;
  for (const auto& v : values) q.push_back(quote(v));
  return join(q, ", ");
}

// Edit distance counting a swap of neighbours as one edit (slowdwon -> slowdown).
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The candidate closest to `name`, if it is close enough to be a typo.
std::string closest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t bestDistance = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = editDistance(name, c);
    if (d < bestDistance) bestDistance = d, best = c;
  }
  size_t allowed = std::max<size_t>(1, std::min<size_t>(3, name.size() / 3));
  return bestDistance <= allowed ? best : "";
}

// ---- Where a value came from
// ----------------------------------------------------------------------

struct Reader {
  std::string sourceName;  // empty when the text is not a user's (validateConfig of a struct)
  std::map<std::string, std::string> origins;  // key -> origin of its value, for later checks
};

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

struct Site {
  Reader& reader;
  std::string key;
  const toml::node& node;

  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(str(prefixed(originOf(node, reader)), key, " = ", show(node), ": ", what));
  }
  Site element(size_t i, const toml::node& n) const { return {reader, str(key, "[", i, "]"), n}; }
};

// ---- Ranges and typed reads
// -----------------------------------------------------------------------

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

Bound atLeast(double lo) {
  return {lo, false, kInf, false};
}
Bound above(double lo) {
  return {lo, true, kInf, false};
}
Bound within(double lo, double hi) {
  return {lo, false, hi, false};
}
Bound upTo(double lo, double hiOpen) {
  return {lo, false, hiOpen, true};
}  // [lo, hi)
Bound between(double lo, double hi) {
  return {lo, true, hi, true};
}  // (lo, hi)

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

// ---- Fields
// ---------------------------------------------------------------------------------------

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

template <class S>
Field<S> intListField(std::string key, std::vector<int64_t> S::*m, Bound bound, std::string help) {
  return {std::move(key), std::move(help), false,
          [m, bound](S& s, const Site& site) {
            auto* a = site.node.as_array();
            if (!a)
              site.fail(str("expected a list of integers ", bound.describe(), ", e.g. [256, 128]"));
            std::vector<int64_t> values;
            for (size_t i = 0; i < a->size(); ++i)
              values.push_back(readInt(site.element(i, *a->get(i)), bound));
            s.*m = std::move(values);
          },
          [m](const S& s) {
            std::vector<std::string> parts;
            for (int64_t v : s.*m) parts.push_back(std::to_string(v));
            return "[" + join(parts, ", ") + "]";
          }};
}

template <class S>
Field<S> stringListField(std::string key, std::vector<std::string> S::*m, std::string help) {
  return {std::move(key), std::move(help), false,
          [m](S& s, const Site& site) {
            auto* a = site.node.as_array();
            if (!a)
              site.fail("expected a list of strings, e.g. [\"--mca\", \"btl\", \"tcp,self\"]");
            std::vector<std::string> values;
            for (size_t i = 0; i < a->size(); ++i) {
              auto* v = a->get(i)->as_string();
              if (!v) site.element(i, *a->get(i)).fail("expected a string");
              values.push_back(v->get());
            }
            s.*m = std::move(values);
          },
          [m](const S& s) {
            if ((s.*m).empty()) return std::string();
            std::vector<std::string> parts;
            for (const auto& v : s.*m) parts.push_back(quote(v));
            return "[" + join(parts, ", ") + "]";
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
            std::vector<double> values;
            for (size_t i = 0; i < a->size(); ++i)
              values.push_back(readNumber(site.element(i, *a->get(i)), bound));
            s.*m = std::move(values);
          },
          [m](const S& s) {
            std::vector<std::string> parts;
            for (double v : s.*m) parts.push_back(formatDouble(v));
            return "[" + join(parts, ", ") + "]";
          }};
}

const Fields<ModelConfig>& modelFields() {
  using M = ModelConfig;
  static const Fields<M> fields = {
      choiceField("name", &M::name, {"mlp", "cnn", "transformer"}, "mlp | cnn | transformer"),
      intListField("hidden", &M::hidden, atLeast(1), "mlp: hidden layer widths ([]: linear model)"),
      intListField("channels", &M::channels, atLeast(1),
                   "cnn: output channels of each conv 3x3 + max-pool 2x2 block"),
      intField("layers", &M::layers, within(1, 1024), "transformer: encoder layers"),
      intField("heads", &M::heads, within(1, 1024), "transformer: attention heads (divide dim)"),
      intField("dim", &M::dim, within(1, 1 << 20), "transformer: model width"),
      intField("seq_len", &M::seqLen, within(1, 1 << 20),
               "transformer: tokens per sample (its features cut into seq_len tokens)"),
  };
  return fields;
}

const Fields<DataConfig>& dataFields() {
  using D = DataConfig;
  static const Fields<D> fields = {
      choiceField("name", &D::name, {"fashion-mnist", "synthetic"}, "fashion-mnist | synthetic"),
      stringField("path", &D::path, "fashion-mnist: folder of the IDX .gz files"),
      intField("samples", &D::samples, atLeast(1), "synthetic: training samples"),
      intField("test_samples", &D::testSamples, atLeast(1), "synthetic: test samples"),
      intField("features", &D::features, within(1, 1 << 24), "synthetic: features per sample"),
      intField("classes", &D::classes, within(2, 1 << 24), "synthetic: classes"),
  };
  return fields;
}

const Fields<TrainConfig>& trainFields() {
  using T = TrainConfig;
  static const Fields<T> fields = {
      intField("global_batch", &T::globalBatch, atLeast(1), "samples per step over all devices"),
      numField("epochs", &T::epochs, atLeast(0), "passes over the training set"),
      intField("steps", &T::steps, atLeast(0), "> 0: exactly this many steps (epochs ignored)"),
      numField("lr", &T::lr, above(0), "learning rate (peak, after warm-up)"),
      choiceField("optimizer", &T::optimizer, {"sgd", "adam", "adamw"}, "sgd | adam | adamw"),
      numField("momentum", &T::momentum, upTo(0, 1), "sgd momentum"),
      boolField("nesterov", &T::nesterov, "sgd Nesterov momentum (needs momentum > 0)"),
      numField("weight_decay", &T::weightDecay, atLeast(0), "L2 (sgd, adam) or decoupled (adamw)"),
      numListField("betas", &T::betas, upTo(0, 1), 2, "adam, adamw: [beta1, beta2]"),
      numField("eps", &T::eps, above(0), "adam, adamw: denominator epsilon"),
      choiceField("lr_schedule", &T::lrSchedule, {"constant", "cosine"},
                  "constant | cosine (decays to 0 at the last step)"),
      intField("warmup_steps", &T::warmupSteps, atLeast(0), "linear warm-up from 0 to lr"),
      numField("grad_clip", &T::gradClip, atLeast(0), "max global gradient L2 norm; 0 = off"),
      intField("seed", &T::seed, atLeast(0), "model init, data order, synthetic data"),
      intField("eval_every", &T::evalEvery, atLeast(0), "evaluate every N steps; 0 = at the end"),
      intField("log_every", &T::logEvery, atLeast(0), "console line every N steps; 0 = none"),
      intField("checkpoint_every", &T::checkpointEvery, atLeast(0), "save every N steps; 0 = off"),
      stringField("checkpoint_dir", &T::checkpointDir, "where checkpoints go"),
      intField("keep_checkpoints", &T::keepCheckpoints, atLeast(1),
               "the newest N checkpoints stay, older ones are removed"),
      numField("bucket_mib", &T::bucketMib, within(0.001, 65536),
               "gradient bucket size (MiB) of the overlapped allreduce"),
  };
  return fields;
}

const Fields<BalanceConfig>& balanceFields() {
  using B = BalanceConfig;
  static const Fields<B> fields = {
      choiceField("mode", &B::mode, {"dynamic", "static", "equal"},
                  "dynamic | static (decide once after profiling) | equal (as DDP)"),
      numField("threshold", &B::threshold, between(0, 1), "least predicted gain worth a change"),
      intField("min_steps_between", &B::minStepsBetween, atLeast(0), "steps between changes"),
      intField("persist_steps", &B::persistSteps, atLeast(1), "dynamic: steps a gain must persist"),
      intField("profile_steps", &B::profileSteps, atLeast(1), "steps on the equal split first"),
  };
  return fields;
}

const Fields<CommConfig>& commFields() {
  using C = CommConfig;
  static const Fields<C> fields = {
      choiceField("transport", &C::transport, {"auto", "shm", "tcp", "mpi"},
                  "auto (shm on one host, else tcp) | shm | tcp | mpi (a build with MPI)"),
      numField("timeout_s", &C::timeoutS, within(0.001, 1e6), "deadline of blocking comm calls"),
      choiceField("compression", &C::compression, {"none", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"},
                  "gradient bytes on the wire: none | fp16 | bf16 | fp8-e4m3 | fp8-e5m2"),
      boolField("error_feedback", &C::errorFeedback,
                "carry each bucket's compression error into the next step"),
      intField("compression_block", &C::compressionBlock, within(1, 1 << 20),
               "fp8: elements per fp32 scale"),
      intField("compression_min_bytes", &C::compressionMinBytes, atLeast(0),
               "gradient buckets smaller than this travel uncompressed"),
  };
  return fields;
}

const Fields<ElasticConfig>& elasticFields() {
  using E = ElasticConfig;
  static const Fields<E> fields = {
      intField(
          "max_restarts", &E::maxRestarts, within(0, 1000),
          "restarts after a rank fails: from the last checkpoint, without its device; 0 = off"),
      intField("min_devices", &E::minDevices, within(1, 1 << 16),
               "no restart when fewer devices than this would remain"),
  };
  return fields;
}

// A "LATENCY,BANDWIDTH" link cost such as "5us,5GB/s": the forms comm::parseLinkCost reads (this
// library does not link hetra_comm, so the check is repeated here). Empty: the text is fine.
std::string linkCostProblem(const std::string& text) {
  auto unitOk = [](const std::string& part, const std::vector<std::string>& units, bool positive) {
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(part, &used);
    } catch (const std::exception&) {
      return false;
    }
    std::string unit = part.substr(used);
    std::transform(unit.begin(), unit.end(), unit.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return used > 0 && std::isfinite(value) && (positive ? value > 0 : value >= 0) &&
           std::find(units.begin(), units.end(), unit) != units.end();
  };
  const size_t comma = text.find(',');
  if (comma == std::string::npos ||
      !unitOk(text.substr(0, comma), {"s", "ms", "us", "ns"}, false) ||
      !unitOk(text.substr(comma + 1), {"b/s", "kb/s", "mb/s", "gb/s", "kbit", "mbit", "gbit"},
              true))
    return "expected \"LATENCY,BANDWIDTH\" such as \"5us,5GB/s\" or \"50us,1gbit\" (latency in "
           "s, ms, us or ns; bandwidth > 0 in B/s, KB/s, MB/s, GB/s, kbit, mbit or gbit)";
  return "";
}

// A string key whose empty default means "not set" (not printed, so the printed config reads
// back the same).
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

const Fields<TopologyConfig>& topologyFields() {
  using T = TopologyConfig;
  static const Fields<T> fields = {
      optionalStringField("file", &T::file,
                          "topology JSON from `hetra probe --links --out`: islands, link costs"),
      intListField("islands", &T::islands, atLeast(0),
                   "island id of each [[devices]] entry ([]: by host and vendor, or the file's)"),
      choiceField("algorithm", &T::algorithm, {"auto", "ring", "hierarchical"},
                  "auto (cost model; HETRA_ALGO) | ring | hierarchical"),
      optionalStringField("island_link", &T::islandLink,
                          "\"LATENCY,BANDWIDTH\" inside islands, e.g. \"5us,5GB/s\"",
                          linkCostProblem),
      optionalStringField("cross_link", &T::crossLink,
                          "\"LATENCY,BANDWIDTH\" between islands, e.g. \"50us,1gbit\"",
                          linkCostProblem),
  };
  return fields;
}

Field<DeviceConfig> memoryField() {
  return {"memory", "memory cap: \"512MiB\", \"2GiB\", bytes, or \"unlimited\"", false,
          [](DeviceConfig& d, const Site& site) {
            const std::string allowed =
                "expected a size such as \"512MiB\", \"2GiB\" or \"1.5GB\", an integer number of "
                "bytes > 0, or \"unlimited\"";
            int64_t bytes = 0;
            if (auto* s = site.node.as_string()) {
              if (s->get() == "unlimited") {
                d.memoryBytes = 0;
                return;
              }
              try {
                bytes = parseBytes(s->get());
              } catch (const ConfigError&) {
                site.fail(allowed);
              }
            } else if (auto* i = site.node.as_integer()) {
              bytes = i->get();
            } else {
              site.fail(allowed);
            }
            if (bytes <= 0) site.fail(allowed);
            d.memoryBytes = bytes;
          },
          [](const DeviceConfig& d) {
            if (d.memoryBytes == 0) return std::string("\"unlimited\"");
            std::string s = formatBytes(d.memoryBytes);
            return s.find_first_not_of("0123456789") == std::string::npos ? s : quote(s);
          }};
}

Field<DeviceConfig> scheduleField() {
  return {"slowdown_schedule", "[[step, factor], ...]: slowdown from each step on", false,
          [](DeviceConfig& d, const Site& site) {
            auto* a = site.node.as_array();
            if (!a)
              site.fail("expected a list of [step, factor] pairs, e.g. [[100, 2.0], [300, 1]]");
            std::vector<SlowdownChange> changes;
            for (size_t i = 0; i < a->size(); ++i) {
              Site entry = site.element(i, *a->get(i));
              auto* pair = entry.node.as_array();
              if (!pair || pair->size() != 2)
                entry.fail("expected a [step, factor] pair: step an integer >= 0, factor >= 1");
              SlowdownChange c;
              c.step = readInt(entry.element(0, *pair->get(0)), atLeast(0));
              c.factor = readNumber(entry.element(1, *pair->get(1)), within(1, 1e6));
              if (!changes.empty() && c.step <= changes.back().step)
                entry.fail(str("steps must increase: step ", c.step, " follows step ",
                               changes.back().step));
              changes.push_back(c);
            }
            d.slowdownSchedule = std::move(changes);
          },
          [](const DeviceConfig& d) {
            std::vector<std::string> parts;
            for (const auto& c : d.slowdownSchedule)
              parts.push_back(str("[", c.step, ", ", formatDouble(c.factor), "]"));
            return "[" + join(parts, ", ") + "]";
          }};
}

const Fields<LaunchConfig>& launchFields() {
  using L = LaunchConfig;
  static const Fields<L> fields = {
      stringField("mpirun", &L::mpirun, "the mpirun that starts ranks on named hosts"),
      stringListField("mpi_args", &L::mpiArgs, "extra mpirun arguments, as a list of strings"),
  };
  return fields;
}

const Fields<DeviceConfig>& deviceFields() {
  using D = DeviceConfig;
  static const Fields<D> fields = [] {
    Fields<D> f = {
        choiceField("kind", &D::kind, {"cpu", "cuda", "rocm"}, "cpu | cuda | rocm"),
        stringField("name", &D::name, "unique name in logs and metrics"),
        intField("threads", &D::threads, within(1, 1024), "intra-op threads of this rank"),
        numField("slowdown", &D::slowdown, within(1, 1e6),
                 "emulation: runs this many times slower"),
        scheduleField(),
        memoryField(),
        intField("max_micro_batch", &D::maxMicroBatch, within(1, int64_t(1) << 40),
                 "most samples per micro-batch (besides the memory cap)"),
        intField("index", &D::index, within(0, 1 << 16), "cuda/rocm: GPU index"),
        stringField("host", &D::host, "host of this rank (\"\" = this one); hosts: via mpirun"),
    };
    // Unset (0) is not written back; only GPUs have an index (a cpu device keeps -1).
    f[f.size() - 3].write = [](const D& d) {
      return d.maxMicroBatch == 0 ? std::string() : std::to_string(d.maxMicroBatch);
    };
    f[f.size() - 2].write = [](const D& d) {
      return d.kind == "cpu" ? std::string() : std::to_string(d.index);
    };
    f.back().write = [](const D& d) { return d.host.empty() ? std::string() : quote(d.host); };
    return f;
  }();
  return fields;
}

const std::vector<std::string> kSections = {"model",   "data",     "train",  "balance", "comm",
                                            "elastic", "topology", "launch", "devices"};

template <class S>
std::vector<std::string> keysOf(const Fields<S>& fields) {
  std::vector<std::string> keys;
  for (const auto& f : fields) keys.push_back(f.key);
  return keys;
}

// Every known key as "section.key" (devices as "devices[i].key"), for suggestions across sections.
std::vector<std::pair<std::string, std::string>> allKeys() {
  std::vector<std::pair<std::string, std::string>> keys;  // (leaf, full key)
  auto add = [&](const std::string& section, const std::vector<std::string>& leaves) {
    for (const auto& l : leaves) keys.push_back({l, section + "." + l});
  };
  add("model", keysOf(modelFields()));
  add("data", keysOf(dataFields()));
  add("train", keysOf(trainFields()));
  add("balance", keysOf(balanceFields()));
  add("comm", keysOf(commFields()));
  add("elastic", keysOf(elasticFields()));
  add("topology", keysOf(topologyFields()));
  add("launch", keysOf(launchFields()));
  add("devices[i]", keysOf(deviceFields()));
  return keys;
}

// "did you mean ...?" for an unknown `leaf` among `known` leaves; else the same leaf in another
// section (lr at the top level -> train.lr); else the list of known keys of `where`.
std::string suggestion(const std::string& leaf, const std::vector<std::string>& known,
                       const std::string& prefix, const std::string& where) {
  std::string near = closest(leaf, known);
  if (!near.empty()) return str("unknown key (did you mean ", prefix, near, "?)");
  for (const auto& [l, full] : allKeys())
    if (l == leaf) return str("unknown key (did you mean ", full, "?)");
  return str("unknown key; the keys of ", where, " are ", join(known, ", "));
}

// ---- Reading
// --------------------------------------------------------------------------------------

template <class S>
void readTable(S& out, const toml::table& table, const Fields<S>& fields, const std::string& prefix,
               const std::string& label, Reader& reader) {
  for (auto&& [k, node] : table) {
    std::string leaf(k.str());
    Site site{reader, prefix + "." + leaf, node};
    auto it =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.key == leaf; });
    if (it == fields.end()) site.fail(suggestion(leaf, keysOf(fields), prefix + ".", label));
    reader.origins[site.key] = originOf(node, reader);
    it->read(out, site);
  }
}

template <class S>
void readSection(S& out, const Site& site, const Fields<S>& fields) {
  auto* table = site.node.as_table();
  if (!table) site.fail(str("expected a table: write [", site.key, "] with its keys below it"));
  readTable(out, *table, fields, site.key, str("[", site.key, "]"), site.reader);
}

void readDevices(RunConfig& config, const Site& site) {
  auto* array = site.node.as_array();
  if (!array)
    site.fail("expected a list of tables: write one [[devices]] (double brackets) per device");
  config.devices.clear();
  for (size_t i = 0; i < array->size(); ++i) {
    Site entry = site.element(i, *array->get(i));
    auto* table = entry.node.as_table();
    if (!table) entry.fail("expected a table: write one [[devices]] per device");
    DeviceConfig device;
    entry.reader.origins[entry.key] = originOf(entry.node, entry.reader);
    readTable(device, *table, deviceFields(), entry.key, "[[devices]]", entry.reader);
    config.devices.push_back(std::move(device));
  }
}

void readRoot(RunConfig& config, const toml::table& root, Reader& reader) {
  for (auto&& [k, node] : root) {
    std::string name(k.str());
    Site site{reader, name, node};
    if (name == "model") {
      readSection(config.model, site, modelFields());
    } else if (name == "data") {
      readSection(config.data, site, dataFields());
    } else if (name == "train") {
      readSection(config.train, site, trainFields());
    } else if (name == "balance") {
      readSection(config.balance, site, balanceFields());
    } else if (name == "comm") {
      readSection(config.comm, site, commFields());
    } else if (name == "elastic") {
      readSection(config.elastic, site, elasticFields());
    } else if (name == "topology") {
      readSection(config.topology, site, topologyFields());
    } else if (name == "launch") {
      readSection(config.launch, site, launchFields());
    } else if (name == "devices") {
      readDevices(config, site);
    } else {
      std::string near = closest(name, kSections);
      if (!near.empty()) site.fail(str("unknown section (did you mean ", near, "?)"));
      for (const auto& [leaf, full] : allKeys())
        if (leaf == name) site.fail(str("unknown key (did you mean ", full, "?)"));
      site.fail(str("unknown key; the sections are ", join(kSections, ", ")));
    }
  }
}

// Default names and GPU indices: the n-th device of a kind gets name <kind>n and, for a GPU, the
// lowest index not taken by an explicit one.
void resolveDevices(RunConfig& config) {
  std::map<std::string, std::set<int64_t>> taken;
  for (const auto& d : config.devices)
    if (d.kind != "cpu" && d.index >= 0) taken[d.kind].insert(d.index);
  std::map<std::string, int64_t> ordinal;
  for (auto& d : config.devices) {
    int64_t n = ordinal[d.kind]++;
    if (d.kind != "cpu" && d.index < 0) {
      int64_t index = 0;
      while (taken[d.kind].count(index)) ++index;
      d.index = index;
      taken[d.kind].insert(index);
    }
    if (d.name.empty()) d.name = d.kind == "cpu" ? str("cpu", n) : str(d.kind, d.index);
  }
}

// ---- --set
// ----------------------------------------------------------------------------------------

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

// Whether the key names a string setting (its --set value is then taken verbatim if not quoted).
bool isTextKey(const std::vector<std::string>& path) {
  auto textIn = [](const auto& fields, const std::string& leaf) {
    for (const auto& f : fields)
      if (f.key == leaf) return f.text;
    return false;
  };
  if (path.size() == 3 && path[0] == "devices") return textIn(deviceFields(), path[2]);
  if (path.size() != 2) return false;
  if (path[0] == "model") return textIn(modelFields(), path[1]);
  if (path[0] == "data") return textIn(dataFields(), path[1]);
  if (path[0] == "train") return textIn(trainFields(), path[1]);
  if (path[0] == "balance") return textIn(balanceFields(), path[1]);
  if (path[0] == "comm") return textIn(commFields(), path[1]);
  if (path[0] == "elastic") return textIn(elasticFields(), path[1]);
  if (path[0] == "topology") return textIn(topologyFields(), path[1]);
  if (path[0] == "launch") return textIn(launchFields(), path[1]);
  return false;
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

void applySet(toml::table& root, const std::string& set) {
  const std::string origin = kSetPrefix + set;
  size_t eq = set.find('=');
  if (eq == std::string::npos)
    throw ConfigError(str(origin, ": expected key=value, e.g. --set train.lr=0.05"));
  std::vector<std::string> path = splitKey(trim(set.substr(0, eq)), origin);
  std::string text = trim(set.substr(eq + 1));
  if (std::find(kSections.begin(), kSections.end(), path[0]) == kSections.end()) {
    std::string near = closest(path[0], kSections);
    throw ConfigError(str(origin, ": unknown key ", join(path, "."),
                          near.empty() ? str(" (sections: ", join(kSections, ", "), ")")
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

// ---- Checks between keys
// --------------------------------------------------------------------------

using Locate = std::function<std::string(const std::string& key)>;

[[noreturn]] void failKey(const Locate& locate, const std::string& key, const std::string& value,
                          const std::string& what) {
  throw ConfigError(str(prefixed(locate(key)), key, " = ", value, ": ", what));
}

std::vector<std::string> validateImpl(const RunConfig& c, const Capabilities& caps,
                                      const Locate& locate, const std::string& sourceName) {
  std::vector<std::string> warnings;
  if (c.devices.empty())
    throw ConfigError(str(prefixed(sourceName),
                          "no devices: add one [[devices]] table per rank, e.g.\n  [[devices]]\n"
                          "  kind = \"cpu\"\n  threads = 1"));

  std::map<std::string, size_t> names;
  std::map<std::pair<std::string, int64_t>, size_t> gpus;
  double dutyCycles = 0;
  for (size_t i = 0; i < c.devices.size(); ++i) {
    const DeviceConfig& d = c.devices[i];
    const std::string key = str("devices[", i, "]");
    if (d.kind == "cuda" && !caps.cuda)
      failKey(locate, key + ".kind", quote(d.kind),
              "this hetra was not built with CUDA support (build with -DHETRA_WITH_CUDA=ON)");
    if (d.kind == "rocm" && !caps.rocm)
      failKey(locate, key + ".kind", quote(d.kind),
              "this hetra was not built with ROCm support (build with -DHETRA_WITH_ROCM=ON)");
    if (d.kind == "cpu" && d.index >= 0)
      failKey(locate, key + ".index", std::to_string(d.index),
              "only cuda and rocm devices have an index (this one is kind = \"cpu\")");
    if (d.kind != "cpu") {
      auto [it, fresh] = gpus.insert({{d.kind, d.index}, i});
      if (!fresh)
        failKey(locate, key + ".index", std::to_string(d.index),
                str("already used by devices[", it->second, "] (one rank per GPU)"));
    }
    auto [it, fresh] = names.insert({d.name, i});
    if (!fresh)
      failKey(locate, key + ".name", quote(d.name),
              str("already used by devices[", it->second, "]; names must be unique"));
    if (d.slowdown < 1)
      failKey(locate, key + ".slowdown", formatDouble(d.slowdown), "out of range: must be >= 1");
    if (d.kind == "cpu") {
      double fastest = d.slowdown;
      for (const auto& change : d.slowdownSchedule) fastest = std::min(fastest, change.factor);
      dutyCycles += double(d.threads) / std::max(1.0, fastest);
    }
  }
  if (caps.cores > 0 && dutyCycles > caps.cores + 1e-9)
    warnings.push_back(str("the cpu devices keep about ",
                           formatBound(std::round(dutyCycles * 100) / 100),
                           " cores busy (sum of threads / slowdown) but this process may use ",
                           caps.cores, ": ranks will compete for CPU and timings will be skewed"));

  const TrainConfig& t = c.train;
  if (t.globalBatch < int64_t(c.devices.size()))
    failKey(locate, "train.global_batch", std::to_string(t.globalBatch),
            str("below the number of devices (", c.devices.size(),
                "): every device needs at least one sample per step"));
  if (t.steps == 0 && t.epochs <= 0)
    failKey(locate, "train.epochs", formatDouble(t.epochs),
            "nothing to train: set train.epochs > 0 or train.steps > 0");
  if (t.nesterov && (t.optimizer != "sgd" || t.momentum <= 0))
    failKey(locate, "train.nesterov", "true",
            str("needs train.optimizer = \"sgd\" and train.momentum > 0 (they are ",
                quote(t.optimizer), " and ", formatDouble(t.momentum), ")"));
  if (t.optimizer != "sgd" && t.momentum != 0)
    warnings.push_back(str("train.momentum = ", formatDouble(t.momentum), " is ignored by ",
                           "train.optimizer = ", quote(t.optimizer)));
  if (t.steps > 0 && t.warmupSteps >= t.steps)
    warnings.push_back(str("train.warmup_steps = ", t.warmupSteps,
                           " covers the whole run (train.steps = ", t.steps, ")"));

  const ModelConfig& m = c.model;
  if (m.name == "cnn" && m.channels.empty())
    failKey(locate, "model.channels", "[]", "a cnn needs at least one conv block, e.g. [32, 64]");
  if (m.name == "transformer") {
    if (m.dim % m.heads != 0)
      failKey(locate, "model.heads", std::to_string(m.heads),
              str("must divide model.dim = ", m.dim));
    int64_t features = c.data.name == "synthetic" ? c.data.features : 28 * 28;
    if (features % m.seqLen != 0)
      failKey(locate, "model.seq_len", std::to_string(m.seqLen),
              str("must divide the input features (", features,
                  " for data.name = ", quote(c.data.name), ")"));
  }
  if (!c.topology.islands.empty() && c.topology.islands.size() != c.devices.size()) {
    std::vector<std::string> ids;
    for (int64_t id : c.topology.islands) ids.push_back(std::to_string(id));
    failKey(locate, "topology.islands", "[" + join(ids, ", ") + "]",
            str("has ", ids.size(), ids.size() == 1 ? " entry" : " entries", " for ",
                c.devices.size(), " devices: give one island id per [[devices]] entry"));
  }
  // Hosts: all devices name one or none do, and a host's devices are listed together (mpirun's
  // --map-by slot places ranks in order, filling one host before the next).
  for (size_t i = 1; i < c.devices.size(); ++i) {
    const std::string key = str("devices[", i, "].host");
    const std::string& host = c.devices[i].host;
    if (host.empty() != c.devices[0].host.empty())
      failKey(locate, key, quote(host),
              "name a host for every device or for none (devices[0].host is " +
                  quote(c.devices[0].host) + ")");
    if (host != c.devices[i - 1].host)
      for (size_t j = 0; j + 1 < i; ++j)
        if (c.devices[j].host == host)
          failKey(locate, key, quote(host),
                  str("list the devices of one host together (devices[", j,
                      "] is on it too, and devices[", i - 1, "] is not)"));
  }
  if (!c.devices.empty() && !c.devices[0].host.empty() && c.elastic.maxRestarts > 0)
    failKey(locate, "elastic.max_restarts", std::to_string(c.elastic.maxRestarts),
            "elastic restarts work for ranks on this host only, not with devices[i].host");
  if (c.train.checkpointEvery > 0 && c.train.checkpointDir.empty())
    failKey(locate, "train.checkpoint_dir", "\"\"", "needed when train.checkpoint_every > 0");
  // A restart continues from this run's newest checkpoint: without checkpoints it would start over.
  if (c.elastic.maxRestarts > 0 && c.train.checkpointEvery == 0)
    failKey(locate, "elastic.max_restarts", std::to_string(c.elastic.maxRestarts),
            "elastic restarts resume from a checkpoint: set train.checkpoint_every > 0 too");
  if (c.elastic.minDevices > int64_t(c.devices.size()))
    failKey(locate, "elastic.min_devices", std::to_string(c.elastic.minDevices),
            str("more than the ", c.devices.size(), " devices listed"));
  return warnings;
}

template <class S>
void writeTable(std::ostringstream& os, const S& s, const Fields<S>& fields) {
  for (const auto& f : fields) {
    std::string value = f.write(s);
    if (value.empty()) continue;
    std::string line = f.key + " = " + value;
    if (line.size() < 34)
      line.resize(34, ' ');
    else
      line += "  ";
    os << line << "# " << f.help << "\n";
  }
}

std::string approxBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace

// ---- Public
// ---------------------------------------------------------------------------------------

Capabilities Capabilities::ofThisBuild() {
  Capabilities caps;
#ifdef HETRA_WITH_CUDA
  caps.cuda = true;
#endif
#ifdef HETRA_WITH_ROCM
  caps.rocm = true;
#endif
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) caps.cores = CPU_COUNT(&set);
  if (caps.cores <= 0) caps.cores = int(std::thread::hardware_concurrency());
  return caps;
}

RunConfig parseConfig(const std::string& tomlText, const std::string& sourceName,
                      const std::vector<std::string>& sets, const Capabilities& caps) {
  toml::table root;
  try {
    root = toml::parse(tomlText, sourceName);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigError(
        str(sourceName, ":", where.line, ":", where.column, ": not valid TOML: ", e.description()));
  }
  for (const auto& set : sets) applySet(root, set);

  RunConfig config;
  Reader reader{sourceName, {}};
  readRoot(config, root, reader);
  resolveDevices(config);
  Locate locate = [&](const std::string& key) {
    auto it = reader.origins.find(key);
    if (it != reader.origins.end()) return it->second;
    // A key set by neither: name its device entry, else the file.
    auto bracket = key.find(']');
    if (bracket != std::string::npos) {
      it = reader.origins.find(key.substr(0, bracket + 1));
      if (it != reader.origins.end()) return it->second;
    }
    return sourceName;
  };
  config.warnings = validateImpl(config, caps, locate, sourceName);
  return config;
}

RunConfig loadConfig(const std::string& path, const std::vector<std::string>& sets,
                     const Capabilities& caps) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(str(path, ": cannot read the config file: ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    throw ConfigError(str(path, ": cannot read the config file: ", std::strerror(errno)));
  return parseConfig(text.str(), path, sets, caps);
}

std::vector<std::string> validateConfig(const RunConfig& config, const Capabilities& caps) {
  // The range checks of the reader, for a config built in code, by reading its printed form.
  RunConfig resolved = config;
  resolveDevices(resolved);
  RunConfig reread;
  Reader reader{"", {}};
  readRoot(reread, toml::parse(toToml(resolved)), reader);
  return validateImpl(
      resolved, caps, [](const std::string&) { return std::string(); }, "");
}

std::string toToml(const RunConfig& config) {
  std::ostringstream os;
  os << "# hetra run: the effective configuration (defaults, then the file, then each --set).\n";
  os << "\n[model]\n";
  writeTable(os, config.model, modelFields());
  os << "\n[data]\n";
  writeTable(os, config.data, dataFields());
  os << "\n[train]\n";
  writeTable(os, config.train, trainFields());
  os << "\n[balance]\n";
  writeTable(os, config.balance, balanceFields());
  os << "\n[comm]\n";
  writeTable(os, config.comm, commFields());
  os << "\n[elastic]\n";
  writeTable(os, config.elastic, elasticFields());
  os << "\n[topology]\n";
  writeTable(os, config.topology, topologyFields());
  os << "\n[launch]\n";
  writeTable(os, config.launch, launchFields());
  for (const auto& device : config.devices) {
    os << "\n[[devices]]\n";
    writeTable(os, device, deviceFields());
  }
  return os.str();
}

int64_t parseBytes(const std::string& text) {
  auto bad = [&]() -> ConfigError {
    return ConfigError(str("memory size ", quote(text),
                           ": expected a whole number of bytes with an optional unit (B, KB, MB, "
                           "GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024), e.g. "
                           "\"512MiB\", \"1.5GB\" or \"1000\""));
  };
  std::string s = trim(text);
  size_t i = 0;
  __int128 mantissa = 0, scale = 1;
  bool digits = false;
  for (; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
    mantissa = mantissa * 10 + (s[i] - '0');
    if (mantissa > (__int128(1) << 80)) throw bad();
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit((unsigned char)s[i]); ++i, digits = true) {
      if (scale > __int128(1e18)) throw bad();
      mantissa = mantissa * 10 + (s[i] - '0');
      // Bounded like the integer part: 2^80 * 1 TiB still fits __int128 (found by fuzzing).
      if (mantissa > (__int128(1) << 80)) throw bad();
      scale *= 10;
    }
  }
  if (!digits) throw bad();
  std::string unit = trim(s.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, int64_t> kUnits = {
      {"", 1},
      {"b", 1},
      {"kb", 1000},
      {"mb", 1000 * 1000},
      {"gb", 1000 * 1000 * 1000},
      {"tb", int64_t(1000) * 1000 * 1000 * 1000},
      {"kib", int64_t(1) << 10},
      {"mib", int64_t(1) << 20},
      {"gib", int64_t(1) << 30},
      {"tib", int64_t(1) << 40},
  };
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) throw bad();
  __int128 bytes = mantissa * it->second;
  if (bytes % scale != 0) throw bad();
  bytes /= scale;
  if (bytes > std::numeric_limits<int64_t>::max()) throw bad();
  return int64_t(bytes);
}

std::string formatBytes(int64_t bytes) {
  if (bytes > 0) {
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

int64_t maxMicroBatch(const DeviceConfig& device, int64_t fixedBytes, int64_t bytesPerSample) {
  HETRA_ENFORCE(fixedBytes >= 0 && bytesPerSample >= 0, "fixedBytes ", fixedBytes,
                ", bytesPerSample ", bytesPerSample);
  if (device.memoryBytes == 0) return std::numeric_limits<int64_t>::max();
  if (device.memoryBytes < fixedBytes) return 0;
  if (bytesPerSample == 0) return std::numeric_limits<int64_t>::max();
  return (device.memoryBytes - fixedBytes) / bytesPerSample;
}

void checkMemoryCaps(const RunConfig& config, int64_t fixedBytes, int64_t bytesPerSample) {
  for (size_t i = 0; i < config.devices.size(); ++i) {
    const DeviceConfig& d = config.devices[i];
    if (d.memoryBytes == 0 || maxMicroBatch(d, fixedBytes, bytesPerSample) >= 1) continue;
    int64_t need = fixedBytes + bytesPerSample;
    throw ConfigError(str("devices[", i, "].memory = ", quote(formatBytes(d.memoryBytes)), " (",
                          d.memoryBytes, " bytes): too small for one sample of this model: needs ",
                          "at least ", need, " bytes (", approxBytes(need), ": ", fixedBytes,
                          " for parameters, gradients and optimizer state + ", bytesPerSample,
                          " per sample)"));
  }
}

double slowdownAt(const DeviceConfig& device, int64_t step) {
  double factor = device.slowdown;
  for (const auto& change : device.slowdownSchedule) {
    if (change.step > step) break;
    factor = change.factor;
  }
  return factor;
}

}  // namespace hetra::train
