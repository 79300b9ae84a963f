#include "cuda/detail/check.h"

namespace tandem::cuda {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a sticky-free error so the next, unrelated call does not report it again.
  (void)cudaGetLastError();
  fail("[cuda] {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(err), cudaGetErrorName(err));
}

namespace {
const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}
}  // namespace

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  fail("[cuda] {} failed at {}:{}: {} ({})", call, file, line, cublasGetStatusString(status),
       cublas_status_name(status));
}

}  // namespace tandem::cuda
