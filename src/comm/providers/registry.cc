#include "comm/providers/registry.h"

#include <array>
#include <atomic>
#include <mutex>
#include <sstream>

#include "common/errors.h"

namespace hetra::comm {

// The built-in providers, in table order: a provider file defines make<Name>Provider() and adds
// its name here.
#define HETRA_BUILTIN_PROVIDERS(X) \
  X(Ring) X(Shared) X(Compressed) X(Hierarchical) X(SmallShared) X(RecursiveDoubling) X(Direct)

#define HETRA_DECLARE_PROVIDER(Name) std::shared_ptr<Provider> make##Name##Provider();
HETRA_BUILTIN_PROVIDERS(HETRA_DECLARE_PROVIDER)
#undef HETRA_DECLARE_PROVIDER

namespace {

// Entries never move once added, so readers (every operation's choice) take no lock: they read
// the count, then entries below it.
struct Table {
  std::mutex mutex;  // serialises registrations
  std::array<std::shared_ptr<Provider>, kMaxProviders> entries;
  std::atomic<size_t> count{0};
};

void addLocked(Table& table, std::shared_ptr<Provider> provider) {
  HETRA_ENFORCE(provider != nullptr, "registerProvider: null provider");
  const size_t n = table.count.load(std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i)
    if (std::string(table.entries[i]->name()) == provider->name())
      throw ConfigError(str("provider '", provider->name(), "' is registered already"));
  if (n >= kMaxProviders)
    throw ConfigError(
        str("provider '", provider->name(), "': the table is full (", n, " providers)"));
  table.entries[n] = std::move(provider);
  table.count.store(n + 1, std::memory_order_release);
}

Table& table() {
  static Table* t = [] {
    auto* created = new Table;  // never destroyed: communicators may outlive static destructors
#define HETRA_ADD_PROVIDER(Name) addLocked(*created, make##Name##Provider());
    HETRA_BUILTIN_PROVIDERS(HETRA_ADD_PROVIDER)
#undef HETRA_ADD_PROVIDER
    return created;
  }();
  return *t;
}

uint8_t idOf(const std::string& name, const std::string& text) {
  const auto& all = providers();
  for (size_t i = 0; i < all.size(); ++i)
    if (name == all[i]->name()) return uint8_t(i + 1);
  throw ConfigError(str("HETRA_ALGO='", text, "': no provider '", name,
                        "'; the providers are: ", providerTableText()));
}

}  // namespace

void registerProvider(std::shared_ptr<Provider> provider) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  addLocked(t, std::move(provider));
}

std::span<const std::shared_ptr<Provider>> providers() {
  Table& t = table();
  return {t.entries.data(), t.count.load(std::memory_order_acquire)};
}

const char* providerName(uint8_t id) {
  const auto& all = providers();
  if (id >= 1 && id <= all.size()) return all[id - 1]->name();
  static thread_local std::string unknown;
  unknown = str("#", int(id));
  return unknown.c_str();
}

std::string providerTableText() {
  std::string text;
  for (const auto& p : providers()) text += (text.empty() ? "" : ",") + std::string(p->name());
  return text;
}

ForcedProviders parseForcedProviders(const std::string& text) {
  ForcedProviders forced;
  forced.text = text.empty() ? "auto" : text;
  if (forced.text == "auto") return forced;
  if (text.find(':') == std::string::npos) {
    // One provider for every operation it declares.
    const uint8_t id = idOf(text, text);
    const uint32_t ops = providers()[id - 1]->traits().ops;
    for (OpKind kind : kOpKinds)
      if (ops & bitOf(kind)) forced.byKind[size_t(kind)] = id;
    return forced;
  }
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw ConfigError(str("HETRA_ALGO='", text, "': '", item,
                            "' is not OPERATION:PROVIDER (operations: allreduce, reducescatter, "
                            "allgather, broadcast, barrier)"));
    const std::string kindName = item.substr(0, colon), name = item.substr(colon + 1);
    bool known = false;
    for (OpKind kind : kOpKinds)
      if (kindName == opKindKey(kind)) {
        known = true;
        forced.byKind[size_t(kind)] = name == "auto" ? 0 : idOf(name, text);
      }
    if (!known)
      throw ConfigError(str("HETRA_ALGO='", text, "': no operation '", kindName,
                            "'; the operations are: allreduce, reducescatter, allgather, "
                            "broadcast, barrier"));
  }
  return forced;
}

namespace {

// Why `provider` cannot run `op` in `group`, or null when it can. Static texts: the choice runs for
// every operation and must not allocate.
const char* refusal(const Provider& provider, const Operation& op, const GroupFacts& group) {
  const ProviderTraits t = provider.traits();
  if (!(t.ops & bitOf(op.kind))) return "it does not have this operation";
  const bool reduces = op.kind == OpKind::Allreduce || op.kind == OpKind::ReduceScatter;
  if (op.kind != OpKind::Barrier && !(t.dtypes & bitOf(op.dtype)))
    return "it does not take this dtype";
  if (reduces && !(t.reduceOps & bitOf(op.op))) return "it does not reduce with this op";
  if (!(t.places & bitOf(op.place))) return "it cannot reach buffers where these live";
  if (op.codec && !t.compressed) return "it does not compress, and the operation asks to";
  if (!op.codec && !t.exact) return "it only compresses, and the operation is exact";
  switch (t.needs) {
    case Needs::Transport:
      break;
    case Needs::SharedArena:
      if (!group.arena) return "the group's transport has no shared memory";
      break;
    case Needs::Hierarchy:
      if (!group.hierarchy) return "the group is not made of several islands";
      break;
    case Needs::NativeLibrary:
      if (!group.hasNativeLibrary) return "the group's transport is not its library";
      break;
  }
  return provider.whyNot(op, group);
}

}  // namespace

std::string whyNotQualified(const Provider& provider, const Operation& op,
                            const GroupFacts& group) {
  const char* why = refusal(provider, op, group);
  return why ? why : "";
}

uint8_t chooseProvider(const Operation& op, const GroupFacts& group,
                       const ForcedProviders& forced) {
  const auto all = providers();
  if (const uint8_t id = forced.byKind[size_t(op.kind)]) {
    if (const char* why = refusal(*all[id - 1], op, group))
      throw ConfigError(str("HETRA_ALGO='", forced.text, "': provider '", all[id - 1]->name(),
                            "' cannot run this ", opKindName(op.kind), " of ", op.bytes,
                            " bytes of ", dtypeName(op.dtype), ": ", why));
    return id;
  }
  uint8_t best = 0;
  double bestSeconds = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (refusal(*all[i], op, group)) continue;
    const double seconds = all[i]->seconds(op, group);
    if (best == 0 || seconds < bestSeconds) {
      best = uint8_t(i + 1);
      bestSeconds = seconds;
    }
  }
  if (best == 0) {
    std::string reasons;
    for (const auto& p : all) reasons += str("; ", p->name(), ": ", refusal(*p, op, group));
    throw ConfigError(str("no provider can run this ", opKindName(op.kind), " of ", op.bytes,
                          " bytes of ", dtypeName(op.dtype), reasons));
  }
  return best;
}

void Provider::allreduce(const GroupFacts&, const Operation&, const AllreduceArgs&) {
  throw ConfigError(str("provider '", name(), "' does not support allreduce"));
}
void Provider::reduceScatter(const GroupFacts&, const Operation&, const ReduceScatterArgs&) {
  throw ConfigError(str("provider '", name(), "' does not support reduce-scatter"));
}
void Provider::allgather(const GroupFacts&, const Operation&, const AllgatherArgs&) {
  throw ConfigError(str("provider '", name(), "' does not support allgather"));
}
void Provider::broadcast(const GroupFacts&, const Operation&, const BroadcastArgs&) {
  throw ConfigError(str("provider '", name(), "' does not support broadcast"));
}
void Provider::barrier(const GroupFacts&, const Operation&, const BarrierArgs&) {
  throw ConfigError(str("provider '", name(), "' does not support barrier"));
}

}  // namespace hetra::comm
