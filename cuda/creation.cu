// CUDA kernels of the factory functions (core/detail/creation.h): arange, linspace and eye, each element
// computed by the CPU loop's formula in the same order of operations (unfused multiply and add),
// so both devices give the same bits. zeros/ones/full go through the elementwise fill.
#include "core/detail/kernel_tables.h"
#include "core/detail/creation.h"
#include "cuda/detail/launch.h"

namespace tandem::cuda {

namespace {

template <class T>
__device__ inline T from_acc(acc_t<T> v) {
  return static_cast<T>(v);
}

template <class T>
__global__ void arange_kernel(T* out, int64_t n, bool integral, int64_t istart, int64_t istep, double start,
                              double step) {
  using C = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (integral) {
      out[i] = from_acc<T>(static_cast<C>(istart + i * istep));
    } else {
      out[i] = from_acc<T>(static_cast<C>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step))));
    }
  }
}

template <class T>
__global__ void linspace_kernel(T* out, int64_t steps, double start, double end, double step, int64_t half) {
  using C = acc_t<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < steps; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = i < half ? __dadd_rn(start, __dmul_rn(step, static_cast<double>(i)))
                              : __dsub_rn(end, __dmul_rn(step, static_cast<double>(steps - 1 - i)));
    out[i] = from_acc<T>(static_cast<C>(v));
  }
}

template <class T>
__global__ void eye_kernel(T* out, int64_t n) {
  using C = acc_t<T>;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n * n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = from_acc<T>(static_cast<C>(e / n == e % n ? 1 : 0));
}

class CudaCreationKernels final : public detail::CreationDeviceKernels {
 public:
  void arange(const Tensor& out, bool integral, int64_t istart, int64_t istep, double start, double step) override {
    const int64_t n = out.numel();
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    TANDEM_DISPATCH_NUMERIC(out.dtype(), "arange", [&] {
      arange_kernel<scalar_t><<<blocks_for(n), kBlockThreads, 0, stream>>>(static_cast<scalar_t*>(out.data_ptr()), n,
                                                                           integral, istart, istep, start, step);
      TANDEM_CUDA_CHECK_LAUNCH("arange_kernel");
    });
  }
  void linspace(const Tensor& out, double start, double end, double step, int64_t half) override {
    const int64_t steps = out.numel();
    if (steps == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    TANDEM_DISPATCH_NUMERIC(out.dtype(), "linspace", [&] {
      linspace_kernel<scalar_t><<<blocks_for(steps), kBlockThreads, 0, stream>>>(
          static_cast<scalar_t*>(out.data_ptr()), steps, start, end, step, half);
      TANDEM_CUDA_CHECK_LAUNCH("linspace_kernel");
    });
  }
  void eye(const Tensor& out) override {
    const int64_t n = out.size(0);
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    TANDEM_DISPATCH_ALL(out.dtype(), "eye", [&] {
      eye_kernel<scalar_t><<<blocks_for(n * n), kBlockThreads, 0, stream>>>(static_cast<scalar_t*>(out.data_ptr()), n);
      TANDEM_CUDA_CHECK_LAUNCH("eye_kernel");
    });
  }
};

}  // namespace

void install_creation_kernels() {
  static CudaCreationKernels table;
  register_device_kernels<detail::CreationDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
