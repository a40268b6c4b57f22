#include "common/errors.h"

namespace hetra {

void throwEnforce(const char* file, int line, const std::string& condition,
                  const std::string& message) {
  std::string what = str(file, ":", line, ": enforce failed: ", condition);
  if (!message.empty()) what += ": " + message;
  throw EnforceError(what);
}

}  // namespace hetra
