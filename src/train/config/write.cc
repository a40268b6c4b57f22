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
  forEachSection([&](const char* section, auto member, const auto& fields) {
    os << "\n[" << section << "]\n";
    writeTable(os, config.*member, fields);
  });
  for (const auto& device : config.devices) {
    os << "\n[[devices]]\n";
    writeTable(os, device, deviceFields());
  }
  return os.str();
}

}  // namespace hetra::train
