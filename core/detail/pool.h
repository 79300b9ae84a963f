// Pooling over [N, C, H, W] tensors (max, average and adaptive average pooling): argument checks,
// output geometry, forward kernels and the raw backward kernels their autograd rules use
// (autograd/conv_grad.cpp). Every kernel accumulates in acc_t (f32 for f16/bf16).
//
// Pooling shares conv2d's argument types (Size2) and window geometry (Window2d), so this header
// builds on core/detail/conv.h rather than the other way round.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "core/detail/conv.h"
#include "core/macros.h"
#include "core/tensor.h"

namespace tandem::detail {

struct Pool2dArgs {
  Size2 kernel = 1;
  std::optional<Size2> stride;  // nullopt: the kernel size
  Size2 padding = 0, dilation = 1;
  bool ceil_mode = false;
};

// The window of a max/avg pool over input [N, C, H, W], with PyTorch's checks and output size
// (ceil_mode: the last window must start inside the input or its left padding).
Window2d pool2d_window(const Tensor& input, const Pool2dArgs& args, const char* op);

// Values and i64 indices (h * W + w within each plane) of the window maxima: the first maximum
// in the window's row-major order, a NaN wins (PyTorch's rule).
std::pair<Tensor, Tensor> max_pool2d_kernel(const Tensor& input, const Pool2dArgs& args);
// g placed at the saved indices (summed where windows overlap), zero elsewhere.
Tensor max_pool2d_backward_kernel(const Tensor& g, const Tensor& indices, const Tensor& input,
                                  const Pool2dArgs& args);

struct AvgPoolOptions {
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override;
};
Tensor avg_pool2d_kernel(const Tensor& input, const Pool2dArgs& args, const AvgPoolOptions& avg);
Tensor avg_pool2d_backward_kernel(const Tensor& g, const Tensor& input, const Pool2dArgs& args,
                                  const AvgPoolOptions& avg);

// Output cell o of n covers input [start(o), end(o)) of in: PyTorch's floor(o in / n) and
// ceil((o + 1) in / n).
TANDEM_HOST_DEVICE inline int64_t adaptive_start(int64_t o, int64_t n, int64_t in) {
  return (o / n) * in + ((o % n) * in) / n;
}
TANDEM_HOST_DEVICE inline int64_t adaptive_end(int64_t o, int64_t n, int64_t in) { return 1 + ((o + 1) * in - 1) / n; }
Tensor adaptive_avg_pool2d_kernel(const Tensor& input, Size2 output_size);
Tensor adaptive_avg_pool2d_backward_kernel(const Tensor& g, const Tensor& input);

// Device kernels (CUDA: cuda/pool.cu). Core validates, makes every input contiguous and
// allocates the outputs. Planes are the N * C images of an [N, C, H, W] tensor; `w` gives their
// geometry.
struct PoolDeviceKernels {
  virtual ~PoolDeviceKernels() = default;
  virtual void max_pool2d(const Tensor& x, const Tensor& out, const Tensor& indices, int64_t planes,
                          const Window2d& w) = 0;
  // gx overwritten.
  virtual void max_pool2d_backward(const Tensor& g, const Tensor& indices, const Tensor& gx, int64_t planes,
                                   const Window2d& w) = 0;
  virtual void avg_pool2d(const Tensor& x, const Tensor& out, int64_t planes, const Window2d& w,
                          const AvgPoolOptions& avg) = 0;
  virtual void avg_pool2d_backward(const Tensor& g, const Tensor& gx, int64_t planes, const Window2d& w,
                                   const AvgPoolOptions& avg) = 0;
  // Only w.H, w.W, w.OH, w.OW are meaningful.
  virtual void adaptive_avg_pool2d(const Tensor& x, const Tensor& out, int64_t planes, const Window2d& w) = 0;
  virtual void adaptive_avg_pool2d_backward(const Tensor& g, const Tensor& gx, int64_t planes,
                                            const Window2d& w) = 0;
};

}  // namespace tandem::detail
