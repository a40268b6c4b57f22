#include "comm/transport/gloo_store.h"

#include <algorithm>

namespace hetra::comm {

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  inner_->set(key, store::Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  const store::Bytes value = inner_->get(key, remaining(deadline_));
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  inner_->wait(keys, remaining(deadline_));
}

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) {
  // Gloo passes its per-pair timeout; the setup deadline is the one budget that counts.
  inner_->wait(keys, remaining(deadline_));
}

}  // namespace hetra::comm
