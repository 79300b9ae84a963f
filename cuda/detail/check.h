// Checked CUDA and cuBLAS calls: a failure becomes a tandem::Error naming the call, file and line,
// e.g. "[cuda] cudaMalloc(&p, n) failed at cuda/allocator.cpp:88: out of memory (cudaErrorMemoryAllocation)".
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace tandem::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) [[unlikely]]
    throw_cuda_error(err, call, file, line);
}
inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    throw_cublas_error(status, call, file, line);
}

}  // namespace tandem::cuda

#define TANDEM_CUDA_CHECK(call) ::tandem::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define TANDEM_CUBLAS_CHECK(call) ::tandem::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here, with the kernel's name.
#define TANDEM_CUDA_CHECK_LAUNCH(name) ::tandem::cuda::check_cuda(cudaGetLastError(), name, __FILE__, __LINE__)
