// CUDA kernels of core/detail/conv.h: im2col and col2im for conv2d, whose GEMMs core runs through
// MatmulDeviceKernels, i.e. cuBLAS. Pooling's kernels are cuda/pool.cu.
//
// im2col takes one thread per column entry. col2im gathers: one thread per input element sums the
// column entries im2col copied from it, so no atomics are needed, the result is deterministic and
// the sums accumulate in acc_t (f32 for f16/bf16), as on the CPU.
#include "core/detail/kernel_tables.h"
#include "core/detail/conv.h"
#include "cuda/detail/window.cuh"

namespace tandem::cuda {

namespace {

using detail::Window2d;
using window_impl::launch;
using window_impl::ptr;

// col [n, C kh kw, OH OW]: one thread per entry.
template <class T>
__global__ void im2col_kernel(const T* __restrict__ x, T* __restrict__ col, int64_t total, int64_t C, Window2d w) {
  const int64_t ohw = w.OH * w.OW, khw = w.kh * w.kw;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t p = i % ohw, r = i / ohw;
    const int64_t row = r % (C * khw), n = r / (C * khw);
    const int64_t kj = row % w.kw, ki = (row / w.kw) % w.kh, c = row / khw;
    const int64_t oh = p / w.OW, ow = p % w.OW;
    const int64_t ih = oh * w.sh - w.ph + ki * w.dh, iw = ow * w.sw - w.pw + kj * w.dw;
    col[i] = (ih >= 0 && ih < w.H && iw >= 0 && iw < w.W) ? x[((n * C + c) * w.H + ih) * w.W + iw]
                                                           : static_cast<T>(0.0f);
  }
}

// x [n, C, H, W]: one thread per element, summing the column entries taken from it.
template <class T>
__global__ void col2im_kernel(const T* __restrict__ col, T* __restrict__ x, int64_t total, int64_t C, Window2d w) {
  using A = acc_t<T>;
  const int64_t ohw = w.OH * w.OW, khw = w.kh * w.kw;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t iw = i % w.W, ih = (i / w.W) % w.H, c = (i / (w.W * w.H)) % C, n = i / (w.W * w.H * C);
    const T* cs = col + (n * C + c) * khw * ohw;
    A acc = A(0);
    for (int64_t ki = 0; ki < w.kh; ++ki) {
      const int64_t h = ih + w.ph - ki * w.dh;
      if (h < 0 || h % w.sh != 0 || h / w.sh >= w.OH) continue;
      const int64_t oh = h / w.sh;
      for (int64_t kj = 0; kj < w.kw; ++kj) {
        const int64_t q = iw + w.pw - kj * w.dw;
        if (q < 0 || q % w.sw != 0 || q / w.sw >= w.OW) continue;
        acc += static_cast<A>(cs[(ki * w.kw + kj) * ohw + oh * w.OW + q / w.sw]);
      }
    }
    x[i] = static_cast<T>(acc);
  }
}

class CudaConvKernels final : public detail::ConvDeviceKernels {
 public:
  void im2col(const Tensor& x, const Tensor& col, int64_t n, int64_t C, const Window2d& w) override {
    launch(x, "im2col", n * C * w.kh * w.kw * w.OH * w.OW, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      im2col_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(x), ptr<T>(col), total, C, w);
      TANDEM_CUDA_CHECK_LAUNCH("im2col_kernel");
    });
  }

  void col2im(const Tensor& col, const Tensor& x, int64_t n, int64_t C, const Window2d& w) override {
    launch(x, "col2im", n * C * w.H * w.W, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      col2im_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(col), ptr<T>(x), total, C, w);
      TANDEM_CUDA_CHECK_LAUNCH("col2im_kernel");
    });
  }
};

}  // namespace

void install_conv_kernels() {
  static CudaConvKernels kernels;
  register_device_kernels<detail::ConvDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
