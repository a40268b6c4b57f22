// LibTorch's CPU allocator wrapped so that every tensor's bytes reach the process's memory ledger
// (device/memory_accounting.h) under the phase in effect when it was allocated, and leave it when
// the tensor's storage is freed.
#pragma once

#include <ATen/core/Tensor.h>

#include "device/memory_accounting.h"

namespace hetra::train {

// Puts the counting allocator in front of LibTorch's CPU allocator, once per process (later calls
// do nothing), unless the accounting is off (device::memoryAccountingEnabled()). Tensors allocated
// before stay uncounted, and so do their frees.
void installCountingAllocator();

// Moves the bytes of `tensor`'s storage to `category` (a parameter's .grad that autograd adopted
// from an activation's gradient). False, changing nothing, for storage the counting allocator did
// not allocate (undefined tensors, from_blob, tensors older than installCountingAllocator()).
// May throw DeviceOutOfMemoryError as MemoryLedger::recategorize does.
bool recategorize(const at::Tensor& tensor, device::MemoryCategory category);

}  // namespace hetra::train
