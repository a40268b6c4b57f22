// Test helpers for GPU tests, CUDA or HIP (src/cuda/gpu_runtime.h): device memory that frees
// itself, and skipping on a machine without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/gpu_runtime.h"

namespace hetra::cuda::test {

#define HETRA_SKIP_WITHOUT_GPU()                                                         \
  do {                                                                                   \
    if (::hetra::cuda::gpuDeviceCount() == 0)                                            \
      GTEST_SKIP() << "no GPU visible (the runtime counts 0 devices): GPU test skipped"; \
  } while (0)

// Device memory that frees itself.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : bytes(bytes) {
    HETRA_CUDA_CHECK(cudaMalloc(&ptr, bytes ? bytes : 1));
  }
  ~DeviceBuffer() { (void)cudaFree(ptr); }
  uint8_t* data() const { return static_cast<uint8_t*>(ptr); }
  void upload(const void* from, size_t n, size_t offset = 0) {
    HETRA_CUDA_CHECK(cudaMemcpy(data() + offset, from, n, cudaMemcpyHostToDevice));
  }
  void download(void* to, size_t n, size_t offset = 0) const {
    HETRA_CUDA_CHECK(cudaMemcpy(to, data() + offset, n, cudaMemcpyDeviceToHost));
  }
  void* ptr = nullptr;
  size_t bytes;
};

}  // namespace hetra::cuda::test
