// Convolution over [N, C, H, W] tensors (conv2d): argument checks, output geometry, the forward
// kernel and the raw backward kernel its autograd rule uses (autograd/conv_grad.cpp). Pooling is
// core/detail/pool.h, which shares Window2d and the input checks declared here.
//
// conv2d is im2col + GEMM on every device: a chunk of samples is unfolded into column matrices
// [C kh kw, OH OW] (a 1x1 convolution with stride 1 and no padding reads the input as its own
// column matrix), and core/detail/matmul.h's batched_gemm multiplies them by the weight, one GEMM per
// sample and group (OpenBLAS on the CPU, cuBLAS on CUDA). Backward: grad_input = col2im(W^T g),
// grad_weight = sum over the batch of g col^T, grad_bias = the sum of g over N, OH, OW.
// f16/bf16 go through f32 where the GEMM does (see core/detail/matmul.h).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace tandem::detail {

// A sliding window over an H x W plane giving an OH x OW one: output (oh, ow) reads input rows
// oh * sh - ph + i * dh (i < kh) and columns likewise.
struct Window2d {
  int64_t H = 0, W = 0, OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

// The input checks conv2d and pooling (core/cpu/pool.cpp) share, one message each: "[op] expected
// input [N, C, H, W] (or [C, H, W]), got [...]" and "[op] <what> must be positive, got [h, w]".
void check_4d(const Tensor& t, const char* op);
void check_positive(Size2 s, const char* what, const char* op);

struct Conv2dArgs {
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
};

// Validated geometry of a conv2d: input [N, C, H, W], weight [O, C / groups, kh, kw].
struct Conv2dGeometry {
  int64_t N = 0, C = 0, O = 0, groups = 1;
  Window2d win;
  int64_t col_rows() const { return C * win.kh * win.kw; }  // of one sample, all groups
  int64_t out_plane() const { return win.OH * win.OW; }
  // A 1x1, stride-1, unpadded convolution: the input is its own column matrix.
  bool direct() const {
    return win.kh == 1 && win.kw == 1 && win.sh == 1 && win.sw == 1 && win.ph == 0 && win.pw == 0;
  }
};

// Throws "[conv2d] ..." for every malformed argument; input must be 4-D here (the public op
// adds the unbatched 3-D form).
Conv2dGeometry conv2d_geometry(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args);
Tensor conv2d_kernel(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args);
// {grad_input, grad_weight, grad_bias}, undefined where not needed.
std::array<Tensor, 3> conv2d_backward_kernel(const Tensor& g, const Tensor& input, const Tensor& weight,
                                             const Conv2dArgs& args, bool need_input, bool need_weight,
                                             bool need_bias);

// Device kernels (CUDA: cuda/conv.cu). Core validates, makes every input contiguous and
// allocates the outputs; the GEMMs of conv2d go through MatmulDeviceKernels.
struct ConvDeviceKernels {
  virtual ~ConvDeviceKernels() = default;
  // col [n, C kh kw, OH OW] from x [n, C, H, W]: zero where the window is in the padding.
  virtual void im2col(const Tensor& x, const Tensor& col, int64_t n, int64_t C, const Window2d& w) = 0;
  // x [n, C, H, W] (overwritten) = the sum of the col entries that im2col would copy from each element.
  virtual void col2im(const Tensor& col, const Tensor& x, int64_t n, int64_t C, const Window2d& w) = 0;
};

}  // namespace tandem::detail
