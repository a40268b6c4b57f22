#include "comm/topology.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::comm {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "hetra-topology";
constexpr int kVersion = 1;
// Tags of the measurement's messages (user tags of the groups it uses).
constexpr uint32_t kTagPing = 1, kTagCount = 2;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

json rankToJson(const RankInfo& r) {
  return {{"rank", r.rank},
          {"host", r.host},
          {"host_identity", r.hostIdentity},
          {"vendor", r.vendor},
          {"device_kind", r.deviceKind},
          {"island", r.island}};
}

// One field of a topology file, with the message naming the file and the field.
template <class T>
T field(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key))
    throw ConfigError(str(where, ": '", key, "' is missing"));
  const json& value = object.at(key);
  try {
    return value.get<T>();
  } catch (const json::exception&) {
    throw ConfigError(str(where, ".", key, " = ", value.dump(), ": wrong type"));
  }
}

bool knownVendor(const std::string& vendor) {
  return vendor == "cpu" || vendor == "nvidia" || vendor == "amd";
}

// Rank a's side of a ping-pong series with rank b (both ranks of `group`): the median round trip
// in seconds. The number of timed round trips follows from the first one's time and the budget,
// and is sent to b so that both stop together.
double pingSeries(Communicator& group, int peer, bool first, std::vector<uint8_t>& buffer,
                  int maxIters, double budgetSeconds) {
  const size_t n = buffer.size();
  auto roundTrip = [&] {
    const auto start = Clock::now();
    if (first) {
      group.send(buffer.data(), n, DType::U8, peer, kTagPing)->wait();
      group.recv(buffer.data(), n, DType::U8, peer, kTagPing)->wait();
    } else {
      group.recv(buffer.data(), n, DType::U8, peer, kTagPing)->wait();
      group.send(buffer.data(), n, DType::U8, peer, kTagPing)->wait();
    }
    return secondsSince(start);
  };
  roundTrip();  // warm-up: first touch of the buffers and of the pair's path
  std::vector<double> times{roundTrip()};
  int64_t iters = 0;
  if (first) {
    iters = std::clamp<int64_t>(int64_t(budgetSeconds / std::max(times[0], 1e-9)), 1, maxIters);
    group.send(&iters, 1, DType::I64, peer, kTagCount)->wait();
  } else {
    group.recv(&iters, 1, DType::I64, peer, kTagCount)->wait();
  }
  for (int64_t i = 1; i < iters; ++i) times.push_back(roundTrip());
  return median(times);
}

std::string formatLinkCost(double latencyUs, double bandwidthGBs) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.6gus,%.6gGB/s", latencyUs, bandwidthGBs);
  return buf;
}

}  // namespace

int Topology::islandCount() const {
  std::set<int> islands;
  for (const auto& r : ranks) islands.insert(r.island);
  return int(islands.size());
}

const LinkMeasurement* Topology::link(int a, int b) const {
  if (a > b) std::swap(a, b);
  for (const auto& l : links)
    if (l.a == a && l.b == b) return &l;
  return nullptr;
}

void assignIslands(Topology& topology) {
  std::vector<std::string> keys;  // island i's (host identity, vendor)
  for (auto& r : topology.ranks) {
    const std::string key = r.hostIdentity + "|" + r.vendor;
    auto it = std::find(keys.begin(), keys.end(), key);
    r.island = int(it - keys.begin());
    if (it == keys.end()) keys.push_back(key);
  }
}

std::vector<int> islandsOf(const Topology& topology) {
  std::vector<int> islands;
  for (const auto& r : topology.ranks) islands.push_back(r.island);
  return islands;
}

Topology gatherTopology(Communicator& world, const std::string& vendor,
                        const std::string& deviceKind) {
  if (!knownVendor(vendor))
    throw ConfigError(str("vendor '", vendor, "' is not allowed; allowed: cpu, nvidia, amd"));
  const int n = world.size();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  RankInfo mine;
  mine.rank = world.rank();
  mine.host = host;
  mine.hostIdentity = hostIdentity();
  mine.vendor = vendor;
  mine.deviceKind = deviceKind;
  const std::string text = rankToJson(mine).dump();

  // Lengths first, then the texts themselves (an allgather of uneven counts).
  int64_t length = int64_t(text.size());
  std::vector<int64_t> lengths(n);
  world.allgather(&length, lengths.data(), std::vector<size_t>(n, 1), DType::I64)->wait();
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, '\0');
  world.allgather(text.data(), all.data(), counts, DType::U8)->wait();

  Topology topology;
  size_t offset = 0;
  for (int r = 0; r < n; ++r) {
    const json entry = json::parse(all.substr(offset, counts[r]));
    offset += counts[r];
    RankInfo info;
    info.rank = r;
    info.host = entry.at("host").get<std::string>();
    info.hostIdentity = entry.at("host_identity").get<std::string>();
    info.vendor = entry.at("vendor").get<std::string>();
    info.deviceKind = entry.at("device_kind").get<std::string>();
    HETRA_ENFORCE_EQ(entry.at("rank").get<int>(), r, "rank order of the gathered topology");
    topology.ranks.push_back(std::move(info));
  }
  assignIslands(topology);
  return topology;
}

void measureLinks(Communicator& world, Topology& topology, const LinkOptions& options) {
  const int n = world.size(), me = world.rank();
  HETRA_ENFORCE_EQ(int(topology.ranks.size()), n, "topology from gatherTopology on this group");
  HETRA_ENFORCE(options.latencyBytes > 0 && options.bandwidthBytes > 0, "message sizes ",
                options.latencyBytes, ", ", options.bandwidthBytes);
  HETRA_ENFORCE(options.latencyIters > 0 && options.bandwidthIters > 0, "iterations ",
                options.latencyIters, ", ", options.bandwidthIters);

  // Pairs on one host go over a group of that host's ranks, as the island groups carry them;
  // one group when every rank shares a host.
  std::vector<int> hostOf(n), localRank(n);
  std::map<std::string, int> firstRankOf;
  std::map<std::string, int> seen;
  for (int r = 0; r < n; ++r) {
    const std::string& id = topology.ranks[r].hostIdentity;
    hostOf[r] = firstRankOf.emplace(id, r).first->second;
    localRank[r] = seen[id]++;
  }
  const bool oneHost = firstRankOf.size() == 1;
  std::shared_ptr<Communicator> hostGroup;
  if (!oneHost) hostGroup = world.split(hostOf[me], me, options.hostGroup);

  std::vector<std::pair<int, int>> pairs;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) pairs.push_back({a, b});
  // Rank a of each pair records (latency us, bandwidth GB/s); a sum over ranks shares them.
  std::vector<double> results(2 * pairs.size(), 0.0);
  std::vector<uint8_t> small(options.latencyBytes), large(options.bandwidthBytes);
  for (size_t i = 0; i < large.size(); ++i) large[i] = uint8_t(i * 131 + me);
  for (size_t p = 0; p < pairs.size(); ++p) {
    world.barrier()->wait();  // the others idle while the pair measures
    const auto [a, b] = pairs[p];
    if (me != a && me != b) continue;
    const bool sameHost = hostOf[a] == hostOf[b];
    Communicator& group = sameHost && hostGroup ? *hostGroup : world;
    const int peer = sameHost && hostGroup ? localRank[me == a ? b : a] : (me == a ? b : a);
    const double rtt =
        pingSeries(group, peer, me == a, small, options.latencyIters, options.secondsPerSeries);
    const double bigRtt =
        pingSeries(group, peer, me == a, large, options.bandwidthIters, options.secondsPerSeries);
    if (me == a) {
      results[2 * p] = rtt / 2 * 1e6;
      results[2 * p + 1] = double(options.bandwidthBytes) / (bigRtt / 2) / 1e9;
      HETRA_DEBUG("comm", "link ", a, "-", b, ": ", results[2 * p], " us, ", results[2 * p + 1],
                  " GB/s");
    }
  }
  world.allreduce(results.data(), results.data(), results.size(), DType::F64, ReduceOp::Sum)
      ->wait();
  topology.links.clear();
  for (size_t p = 0; p < pairs.size(); ++p)
    topology.links.push_back({pairs[p].first, pairs[p].second, results[2 * p], results[2 * p + 1]});
  topology.latencyBytes = options.latencyBytes;
  topology.bandwidthBytes = options.bandwidthBytes;
}

LinkCosts linkCostsOf(const Topology& topology) {
  struct Worst {
    bool any = false;
    double latencyUs = 0, bandwidthGBs = 0;
    void add(const LinkMeasurement& l) {
      latencyUs = any ? std::max(latencyUs, l.latencyUs) : l.latencyUs;
      bandwidthGBs = any ? std::min(bandwidthGBs, l.bandwidthGBs) : l.bandwidthGBs;
      any = true;
    }
  } inside, across;
  for (const auto& l : topology.links) {
    HETRA_ENFORCE(l.a >= 0 && l.b < int(topology.ranks.size()), "link ", l.a, "-", l.b);
    (topology.ranks[l.a].island == topology.ranks[l.b].island ? inside : across).add(l);
  }
  LinkCosts costs;
  if (inside.any) costs.island = formatLinkCost(inside.latencyUs, inside.bandwidthGBs);
  if (across.any) costs.cross = formatLinkCost(across.latencyUs, across.bandwidthGBs);
  return costs;
}

std::string topologyToJson(const Topology& topology) {
  json doc = {{"format", kFormat}, {"version", kVersion}};
  json ranks = json::array();
  for (const auto& r : topology.ranks) ranks.push_back(rankToJson(r));
  doc["ranks"] = ranks;
  json links = json::array();
  for (const auto& l : topology.links)
    links.push_back(
        {{"a", l.a}, {"b", l.b}, {"latency_us", l.latencyUs}, {"bandwidth_gbs", l.bandwidthGBs}});
  doc["links"] = links;
  doc["measurement"] = {{"latency_bytes", topology.latencyBytes},
                        {"bandwidth_bytes", topology.bandwidthBytes}};
  // Derived, for people reading the file; readers recompute them from the links.
  const LinkCosts costs = linkCostsOf(topology);
  doc["link_costs"] = {{"island", costs.island}, {"cross", costs.cross}};
  return doc.dump(2) + "\n";
}

Topology topologyFromJson(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(str(source, ": not valid JSON: ", e.what()));
  }
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != kFormat)
    throw ConfigError(str(source, ": not a topology file (no \"format\": \"", kFormat,
                          "\"); write one with `hetra probe --links --out FILE`"));
  const int version = field<int>(doc, "version", source);
  if (version != kVersion)
    throw ConfigError(str(source, ": topology version ", version,
                          " is not supported (this hetra reads ", kVersion, ")"));
  Topology topology;
  const json ranks = field<json>(doc, "ranks", source);
  if (!ranks.is_array() || ranks.empty())
    throw ConfigError(str(source, ": 'ranks' must be a non-empty list"));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string where = str(source, ": ranks[", i, "]");
    RankInfo r;
    r.rank = field<int>(ranks[i], "rank", where);
    if (r.rank != int(i))
      throw ConfigError(
          str(where, ".rank = ", r.rank, ": ranks must be listed in order 0, 1, ..."));
    r.host = field<std::string>(ranks[i], "host", where);
    r.hostIdentity = field<std::string>(ranks[i], "host_identity", where);
    r.vendor = field<std::string>(ranks[i], "vendor", where);
    if (!knownVendor(r.vendor))
      throw ConfigError(str(where, ".vendor = \"", r.vendor, "\": allowed: cpu, nvidia, amd"));
    r.deviceKind = field<std::string>(ranks[i], "device_kind", where);
    r.island = field<int>(ranks[i], "island", where);
    if (r.island < 0) throw ConfigError(str(where, ".island = ", r.island, ": must be >= 0"));
    topology.ranks.push_back(std::move(r));
  }
  const int n = int(topology.ranks.size());
  const json links = doc.contains("links") ? doc["links"] : json::array();
  if (!links.is_array()) throw ConfigError(str(source, ": 'links' must be a list"));
  for (size_t i = 0; i < links.size(); ++i) {
    const std::string where = str(source, ": links[", i, "]");
    LinkMeasurement l;
    l.a = field<int>(links[i], "a", where);
    l.b = field<int>(links[i], "b", where);
    if (l.a < 0 || l.a >= l.b || l.b >= n)
      throw ConfigError(
          str(where, ": a = ", l.a, ", b = ", l.b, ": need 0 <= a < b < ", n, " (the ranks)"));
    if (topology.link(l.a, l.b))
      throw ConfigError(str(where, ": the pair ", l.a, "-", l.b, " is listed twice"));
    l.latencyUs = field<double>(links[i], "latency_us", where);
    l.bandwidthGBs = field<double>(links[i], "bandwidth_gbs", where);
    if (!(std::isfinite(l.latencyUs) && l.latencyUs > 0 && std::isfinite(l.bandwidthGBs) &&
          l.bandwidthGBs > 0))
      throw ConfigError(str(where, ": latency_us = ", l.latencyUs,
                            ", bandwidth_gbs = ", l.bandwidthGBs, ": both must be finite and > 0"));
    topology.links.push_back(l);
  }
  std::sort(topology.links.begin(), topology.links.end(),
            [](const auto& x, const auto& y) { return std::pair(x.a, x.b) < std::pair(y.a, y.b); });
  if (doc.contains("measurement")) {
    const json& m = doc["measurement"];
    topology.latencyBytes = field<size_t>(m, "latency_bytes", source + ": measurement");
    topology.bandwidthBytes = field<size_t>(m, "bandwidth_bytes", source + ": measurement");
  }
  return topology;
}

void writeTopology(const Topology& topology, const std::string& path) {
  std::ofstream out(path);
  out << topologyToJson(topology);
  out.close();
  if (!out) throw IoError(str("cannot write the topology file '", path, "'"));
}

Topology readTopology(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(str(path, ": cannot read the topology file"));
  std::ostringstream text;
  text << in.rdbuf();
  return topologyFromJson(text.str(), path);
}

std::string formatRanks(const Topology& topology) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "# %4s  %-20s %-7s %6s  %s\n", "rank", "host", "vendor",
                "island", "device");
  os << line;
  for (const auto& r : topology.ranks) {
    std::snprintf(line, sizeof line, "  %4d  %-20s %-7s %6d  %s\n", r.rank, r.host.c_str(),
                  r.vendor.c_str(), r.island, r.deviceKind.c_str());
    os << line;
  }
  return os.str();
}

std::string formatLinkMatrices(const Topology& topology) {
  const int n = int(topology.ranks.size());
  std::ostringstream os;
  auto matrix = [&](const std::string& title, auto value) {
    char cell[64];
    os << "# " << title << "\n" << str("  ", std::string(6, ' '));
    for (int b = 0; b < n; ++b) {
      std::snprintf(cell, sizeof cell, "%9d", b);
      os << cell;
    }
    os << "\n";
    for (int a = 0; a < n; ++a) {
      std::snprintf(cell, sizeof cell, "  %6d", a);
      os << cell;
      for (int b = 0; b < n; ++b) {
        const LinkMeasurement* l = a == b ? nullptr : topology.link(a, b);
        if (l)
          std::snprintf(cell, sizeof cell, "%9.4g", value(*l));
        else
          std::snprintf(cell, sizeof cell, "%9s", "-");
        os << cell;
      }
      os << "\n";
    }
  };
  matrix(str("latency (us): half the round trip of ", topology.latencyBytes, " bytes, median"),
         [](const LinkMeasurement& l) { return l.latencyUs; });
  matrix(str("bandwidth (GB/s): ", topology.bandwidthBytes,
             " bytes over half the round trip of a ping-pong, median"),
         [](const LinkMeasurement& l) { return l.bandwidthGBs; });
  return os.str();
}

std::string formatIslandMap(const Topology& topology) {
  std::map<int, std::vector<int>> members;
  for (const auto& r : topology.ranks) members[r.island].push_back(r.rank);
  std::ostringstream os;
  os << "# islands: " << members.size() << "\n";
  for (const auto& [island, ranks] : members) {
    const RankInfo& first = topology.ranks[ranks.front()];
    os << "  island " << island << ": host " << first.host << ", vendor " << first.vendor
       << ", ranks";
    for (int r : ranks) os << " " << r;
    os << "\n";
  }
  const LinkCosts costs = linkCostsOf(topology);
  if (!costs.island.empty()) os << "  inside islands (worst pair): " << costs.island << "\n";
  if (!costs.cross.empty()) os << "  between islands (worst pair): " << costs.cross << "\n";
  return os.str();
}

}  // namespace hetra::comm
