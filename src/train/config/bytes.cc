// parseBytes and formatBytes of train/config.h: the config's names for the byte parser of
// common/units.h, which every setting of a size shares (the messages name the text and the units;
// the memory key's reader adds the key).
#include "common/units.h"
#include "train/config.h"

namespace hetra::train {

int64_t parseBytes(const std::string& text) {
  return hetra::parseBytes(text);
}

std::string formatBytes(int64_t bytes) {
  return hetra::formatBytes(bytes);
}

}  // namespace hetra::train
