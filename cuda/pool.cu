// CUDA kernels of core/detail/pool.h: max, average and adaptive-average pooling, forward and backward.
//
// Forward kernels take one thread per output element. Backward kernels gather: one thread per
// input element sums the outputs whose windows cover it, so no atomics are needed, the result is
// deterministic and the sums accumulate in acc_t (f32 for f16/bf16), as on the CPU.
#include "core/detail/kernel_tables.h"
#include "core/detail/pool.h"
#include "cuda/detail/block_reduce.cuh"
#include "cuda/detail/window.cuh"

namespace tandem::cuda {

namespace {

using detail::Window2d;
using window_impl::launch;
using window_impl::ptr;

// ---- max pooling ----

template <class T>
__global__ void max_pool2d_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t* __restrict__ idx, int64_t total,
                                  Window2d w) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t ow = i % w.OW, oh = (i / w.OW) % w.OH, p = i / (w.OW * w.OH);
    const T* xs = x + p * w.H * w.W;
    int64_t h0 = oh * w.sh - w.ph, w0 = ow * w.sw - w.pw;
    const int64_t h1 = min(h0 + (w.kh - 1) * w.dh + 1, w.H), w1 = min(w0 + (w.kw - 1) * w.dw + 1, w.W);
    while (h0 < 0) h0 += w.dh;
    while (w0 < 0) w0 += w.dw;
    int64_t best = h0 * w.W + w0;
    A m = -dinf<A>();
    for (int64_t ih = h0; ih < h1; ih += w.dh) {
      for (int64_t iw = w0; iw < w1; iw += w.dw) {
        const A v = static_cast<A>(xs[ih * w.W + iw]);
        if (v > m || dnan(v)) {  // first maximum; a NaN wins (the CPU's rule)
          m = v;
          best = ih * w.W + iw;
        }
      }
    }
    y[i] = static_cast<T>(m);
    idx[i] = best;
  }
}

// First output index along a dim whose window (extent e, stride s, padding p) can cover input i,
// and one past the last.
__device__ inline void covering(int64_t i, int64_t e, int64_t s, int64_t p, int64_t n_out, int64_t& lo, int64_t& hi) {
  lo = i + p < e ? 0 : (i + p - e) / s + 1;
  hi = min((i + p) / s + 1, n_out);
}

template <class T>
__global__ void max_pool2d_backward_kernel(const T* __restrict__ g, const int64_t* __restrict__ idx, T* __restrict__ gx,
                                           int64_t total, Window2d w) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t iw = i % w.W, ih = (i / w.W) % w.H, p = i / (w.W * w.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, (w.kh - 1) * w.dh + 1, w.sh, w.ph, w.OH, oh0, oh1);
    covering(iw, (w.kw - 1) * w.dw + 1, w.sw, w.pw, w.OW, ow0, ow1);
    const int64_t me = ih * w.W + iw, base = p * w.OH * w.OW;
    A acc = A(0);
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t o = base + oh * w.OW + ow;
        if (idx[o] == me) acc += static_cast<A>(g[o]);
      }
    gx[i] = static_cast<T>(acc);
  }
}

// ---- average pooling ----

// avg_pool2d's clipped window of output (oh, ow) and its divisor (core/cpu/pool.cpp's avg_cell).
struct AvgCell {
  int64_t h0, h1, w0, w1, divisor;
};

__device__ inline AvgCell avg_cell(int64_t oh, int64_t ow, const Window2d& w, bool count_include_pad,
                                   int64_t divisor_override) {
  AvgCell c;
  c.h0 = oh * w.sh - w.ph;
  c.w0 = ow * w.sw - w.pw;
  c.h1 = min(c.h0 + w.kh, w.H + w.ph);
  c.w1 = min(c.w0 + w.kw, w.W + w.pw);
  const int64_t padded = (c.h1 - c.h0) * (c.w1 - c.w0);
  c.h0 = max(c.h0, int64_t(0));
  c.w0 = max(c.w0, int64_t(0));
  c.h1 = min(c.h1, w.H);
  c.w1 = min(c.w1, w.W);
  if (divisor_override != 0) {
    c.divisor = divisor_override;
  } else {
    c.divisor = count_include_pad ? padded : (c.h1 - c.h0) * (c.w1 - c.w0);
  }
  return c;
}

template <class T>
__global__ void avg_pool2d_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t total, Window2d w, bool cip,
                                  int64_t divisor_override) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t ow = i % w.OW, oh = (i / w.OW) % w.OH, p = i / (w.OW * w.OH);
    const T* xs = x + p * w.H * w.W;
    const AvgCell c = avg_cell(oh, ow, w, cip, divisor_override);
    A s = A(0);
    for (int64_t ih = c.h0; ih < c.h1; ++ih)
      for (int64_t iw = c.w0; iw < c.w1; ++iw) s += static_cast<A>(xs[ih * w.W + iw]);
    const bool empty = c.h0 >= c.h1 || c.w0 >= c.w1;
    y[i] = static_cast<T>(empty ? A(0) : s / static_cast<A>(c.divisor));
  }
}

template <class T>
__global__ void avg_pool2d_backward_kernel(const T* __restrict__ g, T* __restrict__ gx, int64_t total, Window2d w,
                                           bool cip, int64_t divisor_override) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t iw = i % w.W, ih = (i / w.W) % w.H, p = i / (w.W * w.H);
    int64_t oh0, oh1, ow0, ow1;
    covering(ih, w.kh, w.sh, w.ph, w.OH, oh0, oh1);
    covering(iw, w.kw, w.sw, w.pw, w.OW, ow0, ow1);
    const T* gs = g + p * w.OH * w.OW;
    A acc = A(0);
    for (int64_t oh = oh0; oh < oh1; ++oh)
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const AvgCell c = avg_cell(oh, ow, w, cip, divisor_override);
        if (ih < c.h0 || ih >= c.h1 || iw < c.w0 || iw >= c.w1) continue;
        acc += static_cast<A>(gs[oh * w.OW + ow]) / static_cast<A>(c.divisor);
      }
    gx[i] = static_cast<T>(acc);
  }
}

// ---- adaptive average pooling ----

template <class T>
__global__ void adaptive_avg_pool2d_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t total, Window2d w) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t ow = i % w.OW, oh = (i / w.OW) % w.OH, p = i / (w.OW * w.OH);
    const T* xs = x + p * w.H * w.W;
    const int64_t h0 = detail::adaptive_start(oh, w.OH, w.H), h1 = detail::adaptive_end(oh, w.OH, w.H);
    const int64_t w0 = detail::adaptive_start(ow, w.OW, w.W), w1 = detail::adaptive_end(ow, w.OW, w.W);
    A s = A(0);
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) s += static_cast<A>(xs[ih * w.W + iw]);
    y[i] = static_cast<T>(s / static_cast<A>((h1 - h0) * (w1 - w0)));
  }
}

template <class T>
__global__ void adaptive_avg_pool2d_backward_kernel(const T* __restrict__ g, T* __restrict__ gx, int64_t total,
                                                    Window2d w) {
  using A = acc_t<T>;
  TANDEM_GRID_LOOP(i, total) {
    const int64_t iw = i % w.W, ih = (i / w.W) % w.H, p = i / (w.W * w.H);
    // Cells whose [start, end) can hold ih: floor(ih OH / H) .. ceil((ih + 1) OH / H).
    const int64_t oh0 = ih * w.OH / w.H, oh1 = min(((ih + 1) * w.OH + w.H - 1) / w.H, w.OH);
    const int64_t ow0 = iw * w.OW / w.W, ow1 = min(((iw + 1) * w.OW + w.W - 1) / w.W, w.OW);
    const T* gs = g + p * w.OH * w.OW;
    A acc = A(0);
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t h0 = detail::adaptive_start(oh, w.OH, w.H), h1 = detail::adaptive_end(oh, w.OH, w.H);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t w0 = detail::adaptive_start(ow, w.OW, w.W), w1 = detail::adaptive_end(ow, w.OW, w.W);
        if (iw < w0 || iw >= w1) continue;
        acc += static_cast<A>(gs[oh * w.OW + ow]) / static_cast<A>((h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = static_cast<T>(acc);
  }
}

class CudaPoolKernels final : public detail::PoolDeviceKernels {
 public:
  void max_pool2d(const Tensor& x, const Tensor& out, const Tensor& indices, int64_t planes,
                  const Window2d& w) override {
    launch(x, "max_pool2d", planes * w.OH * w.OW, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      max_pool2d_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(x), ptr<T>(out), ptr<int64_t>(indices),
                                                            total, w);
      TANDEM_CUDA_CHECK_LAUNCH("max_pool2d_kernel");
    });
  }

  void max_pool2d_backward(const Tensor& g, const Tensor& indices, const Tensor& gx, int64_t planes,
                           const Window2d& w) override {
    launch(gx, "max_pool2d_backward", planes * w.H * w.W, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      max_pool2d_backward_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(g), ptr<const int64_t>(indices),
                                                                     ptr<T>(gx), total, w);
      TANDEM_CUDA_CHECK_LAUNCH("max_pool2d_backward_kernel");
    });
  }

  void avg_pool2d(const Tensor& x, const Tensor& out, int64_t planes, const Window2d& w,
                  const detail::AvgPoolOptions& avg) override {
    const int64_t div = avg.divisor_override.value_or(0);
    launch(x, "avg_pool2d", planes * w.OH * w.OW, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      avg_pool2d_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(x), ptr<T>(out), total, w,
                                                            avg.count_include_pad, div);
      TANDEM_CUDA_CHECK_LAUNCH("avg_pool2d_kernel");
    });
  }

  void avg_pool2d_backward(const Tensor& g, const Tensor& gx, int64_t planes, const Window2d& w,
                           const detail::AvgPoolOptions& avg) override {
    const int64_t div = avg.divisor_override.value_or(0);
    launch(gx, "avg_pool2d_backward", planes * w.H * w.W, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      avg_pool2d_backward_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(g), ptr<T>(gx), total, w,
                                                                     avg.count_include_pad, div);
      TANDEM_CUDA_CHECK_LAUNCH("avg_pool2d_backward_kernel");
    });
  }

  void adaptive_avg_pool2d(const Tensor& x, const Tensor& out, int64_t planes, const Window2d& w) override {
    launch(x, "adaptive_avg_pool2d", planes * w.OH * w.OW, [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
      using T = decltype(t);
      adaptive_avg_pool2d_kernel<T><<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(x), ptr<T>(out), total, w);
      TANDEM_CUDA_CHECK_LAUNCH("adaptive_avg_pool2d_kernel");
    });
  }

  void adaptive_avg_pool2d_backward(const Tensor& g, const Tensor& gx, int64_t planes, const Window2d& w) override {
    launch(gx, "adaptive_avg_pool2d_backward", planes * w.H * w.W,
           [&](auto t, int64_t total, unsigned blocks, cudaStream_t s) {
             using T = decltype(t);
             adaptive_avg_pool2d_backward_kernel<T>
                 <<<blocks, kBlockThreads, 0, s>>>(ptr<const T>(g), ptr<T>(gx), total, w);
             TANDEM_CUDA_CHECK_LAUNCH("adaptive_avg_pool2d_backward_kernel");
           });
  }
};

}  // namespace

void install_pool_kernels() {
  static CudaPoolKernels kernels;
  register_device_kernels<detail::PoolDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
