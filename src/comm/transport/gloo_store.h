// GlooStore: lets Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) exchange pair
// addresses through a hetra Store. Every wait is bounded by one deadline shared by the whole
// connection setup, whatever timeout Gloo passes, so a missing rank fails within the caller's
// budget.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/timing.h"
#include "store/store.h"

namespace hetra::comm {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<store::Store> inner, Deadline deadline)
      : inner_(std::move(inner)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<store::Store> inner_;
  Deadline deadline_;
};

}  // namespace hetra::comm
