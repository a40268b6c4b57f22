// The provider table: every collective implementation the communicator can run, in one ordered
// list, and the choice of one per operation.
//
// The built-in providers are listed in registry.cc (one line each); a library or a program adds its
// own through registerProvider() before it creates communicators (a CUDA build registers NCCL this
// way). Registration is explicit, never a static initialiser: a static link, or the installed
// find_package(hetra) package, would drop those silently.
//
// HETRA_ALGO (or GroupOptions::algorithm) forces providers: "ring" for every operation that
// provider declares, or "allreduce:hierarchical,broadcast:shared" per operation, "auto" (the
// default) for none. A forced provider that does not qualify for an operation it declares is a
// ConfigError naming the provider and why.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/providers/provider.h"

namespace hetra::comm {

constexpr size_t kMaxProviders = 255;  // ids are one byte of the operation header; 0 is none

// Adds `provider` to the end of the table; its id is its position (1-based). Every process of a job
// must register the same providers in the same order (the communicator checks it when a group
// forms), best before its first group. ConfigError when the name is taken or the table is full.
void registerProvider(std::shared_ptr<Provider> provider);

// The table, in order (built-ins first). Ids: index + 1. Safe to read while another thread
// registers (entries never move).
std::span<const std::shared_ptr<Provider>> providers();
const char* providerName(uint8_t id);  // "ring", or "#id" for an unknown id
// The table's names joined by ',': what the ranks of a group compare.
std::string providerTableText();

// Per operation kind, the provider forced for it (0: chosen by cost).
struct ForcedProviders {
  std::array<uint8_t, 5> byKind{};  // indexed by OpKind
  std::string text;                 // as given, normalised ("auto" when nothing is forced)
};
// Parses a HETRA_ALGO value; ConfigError naming the value, the operations and the providers.
ForcedProviders parseForcedProviders(const std::string& text);

// The provider for `op` in `group`: the forced one (ConfigError when it does not qualify), else
// the cheapest that qualifies (on equal cost, the earlier in the table). ConfigError when none
// qualifies.
uint8_t chooseProvider(const Operation& op, const GroupFacts& group, const ForcedProviders& forced);

// "" when provider `id` qualifies for `op` in `group`, else why not.
std::string whyNotQualified(const Provider& provider, const Operation& op, const GroupFacts& group);

}  // namespace hetra::comm
