// The GPU runtime API of src/cuda, for NVIDIA (CUDA) or AMD (HIP on ROCm) from one source.
//
// The codec kernels and the pinned staging are written against the CUDA runtime API. A ROCm build
// (HETRA_WITH_ROCM, which defines HETRA_HIP and compiles the same files as HIP with the clang that
// hipcc runs) maps the few
// CUDA names they use to their HIP equivalents here, which behave alike for these calls: streams,
// events, pinned host memory, asynchronous copies, error strings. Only this header knows both.
//
// Device code differs in two places: warp shuffles, here (CUDA's __shfl_xor_sync takes a lane mask;
// HIP 5.x has only __shfl_xor, which exchanges within `width` lanes of the wavefront as the masked
// form does within its warp; AMD wavefronts have 64 lanes, so the codec's groups of at most 32
// lanes stay inside one), and the device-pass macro, in codec_elements.h (HETRA_GPU_DEVICE_PASS:
// the CPU tests include that header without any GPU header).
#pragma once

#if defined(HETRA_HIP)

#include <hip/hip_runtime.h>

using cudaError_t = hipError_t;
using cudaStream_t = hipStream_t;
using cudaEvent_t = hipEvent_t;
using cudaMemcpyKind = hipMemcpyKind;

inline constexpr hipError_t cudaSuccess = hipSuccess;
inline constexpr hipError_t cudaErrorNotReady = hipErrorNotReady;
inline constexpr hipMemcpyKind cudaMemcpyDeviceToHost = hipMemcpyDeviceToHost;
inline constexpr hipMemcpyKind cudaMemcpyHostToDevice = hipMemcpyHostToDevice;
inline constexpr unsigned cudaEventDisableTiming = hipEventDisableTiming;
inline constexpr unsigned cudaStreamNonBlocking = hipStreamNonBlocking;
inline constexpr unsigned cudaHostAllocPortable = hipHostMallocPortable;

inline cudaError_t cudaGetLastError() {
  return hipGetLastError();
}
inline const char* cudaGetErrorName(cudaError_t e) {
  return hipGetErrorName(e);
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return hipGetErrorString(e);
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return hipStreamCreateWithFlags(s, flags);
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  return hipStreamDestroy(s);
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  return hipEventCreateWithFlags(e, flags);
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  return hipEventDestroy(e);
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return hipEventRecord(e, s);
}
inline cudaError_t cudaEventQuery(cudaEvent_t e) {
  return hipEventQuery(e);
}
inline cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags) {
  return hipHostMalloc(p, bytes, flags);
}
inline cudaError_t cudaFreeHost(void* p) {
  return hipHostFree(p);
}
inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  return hipMalloc(p, bytes);
}
inline cudaError_t cudaFree(void* p) {
  return hipFree(p);
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return hipMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaDeviceSynchronize() {
  return hipDeviceSynchronize();
}
inline cudaError_t cudaSetDevice(int device) {
  return hipSetDevice(device);
}
inline cudaError_t cudaGetDeviceCount(int* count) {
  return hipGetDeviceCount(count);
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t s) {
  return hipMemcpyAsync(dst, src, bytes, kind, s);
}

#if defined(__HIPCC__)
template <class T>
__device__ __forceinline__ T hetraShuffleXor(T value, unsigned laneMask, unsigned width) {
  return __shfl_xor(value, int(laneMask), int(width));
}
#endif

#else  // CUDA

#include <cuda_runtime_api.h>

#if defined(__CUDACC__)
// Every lane of the warp takes part (the kernels keep whole warps in step around it).
template <class T>
__device__ __forceinline__ T hetraShuffleXor(T value, unsigned laneMask, unsigned width) {
  return __shfl_xor_sync(0xffffffffu, value, laneMask, int(width));
}
#endif

#endif

namespace hetra::cuda {

// GPUs this process can use; 0 when the runtime finds none or no driver (a build machine).
inline int gpuDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" / "no driver" state
    return 0;
  }
  return count;
}

}  // namespace hetra::cuda
