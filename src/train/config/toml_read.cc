#include "train/config/toml_read.h"

#include <algorithm>

#include "train/config/fields.h"

namespace hetra::train::cfg {
namespace {

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

}  // namespace

void readRoot(RunConfig& config, const toml::table& root, Reader& reader) {
  for (auto&& [k, node] : root) {
    std::string name(k.str());
    Site site{reader, name, node};
    if (name == "devices") {
      readDevices(config, site);
      continue;
    }
    bool known = false;
    forEachSection([&](const char* section, auto member, const auto& fields) {
      if (name != section) return;
      readSection(config.*member, site, fields);
      known = true;
    });
    if (known) continue;
    std::string near = closest(name, sectionNames());
    if (!near.empty()) site.fail(str("unknown section (did you mean ", near, "?)"));
    for (const auto& [leaf, full] : allKeys())
      if (leaf == name) site.fail(str("unknown key (did you mean ", full, "?)"));
    site.fail(str("unknown key; the sections are ", join(sectionNames(), ", ")));
  }
}

}  // namespace hetra::train::cfg
