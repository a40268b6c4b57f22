#include "train/counting_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <mutex>

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::train {
namespace {

using device::MemoryCategory;
using device::MemoryLedger;

// A counted allocation is the inner allocator's block with a header in front that says its size
// and the category its bytes are recorded under; the tensor's data starts after the header. Data
// and context are the same pointer, as LibTorch's raw_allocate() (used for kernels' scratch
// buffers) requires. The header keeps the inner allocator's 64-byte alignment.
struct Header {
  int64_t bytes;
  MemoryCategory category;
};
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(Header) <= kHeaderBytes);

c10::Allocator* innerAllocator = nullptr;  // set once, before the counting allocator is installed

Header* headerOf(void* data) {
  return reinterpret_cast<Header*>(static_cast<char*>(data) - kHeaderBytes);
}

void freeCounted(void* data) {
  if (!data) return;
  Header* header = headerOf(data);
  MemoryLedger::process().release(header->category, header->bytes);
  innerAllocator->raw_deallocate(header);
}

class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) const override {
    auto& ledger = MemoryLedger::process();
    const MemoryCategory category = ledger.phase();
    ledger.allocate(category, int64_t(bytes));  // throws past the cap, before anything is taken
    void* block = nullptr;
    try {
      block = innerAllocator->raw_allocate(bytes + kHeaderBytes);
    } catch (...) {
      ledger.release(category, int64_t(bytes));
      throw;
    }
    auto* header = static_cast<Header*>(block);
    header->bytes = int64_t(bytes);
    header->category = category;
    void* data = static_cast<char*>(block) + kHeaderBytes;
    return {data, data, &freeCounted, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &freeCounted; }
};

}  // namespace

void installCountingAllocator() {
  if (!device::memoryAccountingEnabled()) return;
  static std::once_flag once;
  std::call_once(once, [] {
    innerAllocator = c10::GetCPUAllocator();
    HETRA_ENFORCE(innerAllocator->raw_deleter() != nullptr,
                  "LibTorch's CPU allocator has no raw deleter; it cannot be wrapped");
    static CountingAllocator counting;
    // Above LibTorch's default (priority 0), so that nothing registered later at the default
    // priority replaces it.
    c10::SetCPUAllocator(&counting, /*priority=*/100);
    if (c10::GetCPUAllocator() != &counting)
      HETRA_WARN("train", "another CPU allocator has a higher priority: memory is not accounted");
  });
}

bool recategorize(const at::Tensor& tensor, device::MemoryCategory category) {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const c10::DataPtr& data = tensor.storage().data_ptr();
  if (data.get_deleter() != &freeCounted) return false;
  Header* header = headerOf(data.get());
  MemoryLedger::process().recategorize(header->category, category, header->bytes);
  header->category = category;
  return true;
}

}  // namespace hetra::train
