// The pipeline of train/config.h: TOML text, then each --set, then the field tables' reader, the
// device defaults and the checks between keys.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "common/errors.h"
#include "train/config.h"
#include "train/config/devices.h"
#include "train/config/overrides.h"
#include "train/config/toml_read.h"
#include "train/config/validate.h"

namespace hetra::train {

using namespace cfg;  // the configuration's own pieces

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
  config.warnings = checkBetweenKeys(config, caps, locate, sourceName);
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
  return checkBetweenKeys(
      resolved, caps, [](const std::string&) { return std::string(); }, "");
}

}  // namespace hetra::train
