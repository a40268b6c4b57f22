// toToml of train/config.h: the effective config, one line per field with its description.
#include <sstream>

#include "train/config.h"
#include "train/config/fields.h"

namespace hetra::train {

using namespace cfg;  // the configuration's own helpers
namespace {

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

}  // namespace

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

}  // namespace hetra::train
