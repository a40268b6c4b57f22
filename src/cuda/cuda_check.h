// Turning CUDA runtime and NCCL status codes into hetra errors (internal to src/cuda).
#pragma once

#include "cuda/gpu_runtime.h"

#include "common/errors.h"

namespace hetra::cuda {

// A failed CUDA runtime call: IoError naming the call, the error and where it was made.
[[noreturn]] inline void throwCudaError(cudaError_t error, const char* call, const char* file,
                                        int line) {
  throw IoError(str("CUDA: ", call, " failed: ", cudaGetErrorName(error), " (",
                    cudaGetErrorString(error), ") at ", file, ":", line));
}

}  // namespace hetra::cuda

#define HETRA_CUDA_CHECK(call)                                                   \
  do {                                                                           \
    const cudaError_t hetraCudaError_ = (call);                                  \
    if (hetraCudaError_ != cudaSuccess)                                          \
      ::hetra::cuda::throwCudaError(hetraCudaError_, #call, __FILE__, __LINE__); \
  } while (0)
