// NN functional ops (softmax, log_softmax, layer_norm, dropout): forward kernels and the raw
// backward kernels their autograd rules use (autograd/nn_ops_grad.cpp). All accumulate in acc_t
// (f32 for f16/bf16).
#pragma once

#include <array>
#include <utility>

#include "core/tensor.h"

namespace tandem::detail {

// Stable: each slice is shifted by its max before exp.
Tensor softmax_kernel(const Tensor& a, int64_t dim, bool log, const char* op);
// softmax: y (g - sum(g y)); log_softmax: g - exp(y) sum(g). `y` is the forward's output.
Tensor softmax_backward_kernel(const Tensor& g, const Tensor& y, int64_t dim, bool log, const char* op);

struct LayerNormForward {
  Tensor y;
  Tensor mean;  // [rows], acc dtype (f32 for f16/bf16 inputs)
  Tensor rstd;  // 1 / sqrt(var + eps), biased variance
};
// Normalises over the trailing dims given by normalized_shape; weight/bias may be undefined.
LayerNormForward layer_norm_kernel(const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                                   const Tensor& bias, double eps);
std::array<Tensor, 3> layer_norm_backward_kernel(const Tensor& g, const Tensor& x, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& weight, const Shape& normalized_shape,
                                                 bool need_x, bool need_w, bool need_b);

// out = x * mask with mask = (uniform >= p) / (1 - p) (0 where dropped); `uniform` holds
// samples of U[0, 1) of x's shape. Returns {out, mask}.
std::pair<Tensor, Tensor> dropout_kernel(const Tensor& x, const Tensor& uniform, double p);
Tensor dropout_backward_kernel(const Tensor& g, const Tensor& mask);

// Fused cross-entropy over rows of class scores, for device tensors (nn/loss.cpp uses it for
// class-index targets on CUDA; the CPU composes log_softmax and nll_loss). logits [M, C], target
// [M] (i64), weight [C] or undefined. Per row r with t = target[r] and w_c the class weights (1
// without weight):
//   loss_r = (1 - eps) w_t (lse_r - x_rt) + eps / C * sum_c w_c (lse_r - x_rc), 0 if t == ignore_index.
// Returns {loss [M] in the logits' dtype, lse [M] in the stat dtype, kept [M] = w_t or 0 if ignored}.
struct CrossEntropyRows {
  Tensor loss, lse, kept;
};
CrossEntropyRows cross_entropy_rows_kernel(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                           int64_t ignore_index, double label_smoothing);
// d loss_r / d logits times g_r.
Tensor cross_entropy_rows_backward_kernel(const Tensor& g, const Tensor& logits, const Tensor& target,
                                          const Tensor& weight, const Tensor& lse, int64_t ignore_index,
                                          double label_smoothing);

// Device kernels for the ops above (CUDA: cuda/nn_ops.cu). Core validates, makes every input
// contiguous and allocates the outputs as for the CPU; the kernels only compute. Softmax works
// on a viewed as [outer, n, inner] around its dim; layer norm on [rows, cols].
struct NnDeviceKernels {
  virtual ~NnDeviceKernels() = default;
  virtual void softmax(const Tensor& a, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) = 0;
  virtual void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& gx, int64_t outer, int64_t n,
                                int64_t inner, bool log) = 0;
  // weight/bias may be undefined; out.mean/out.rstd are [rows] in the stat dtype (f32, f64 for f64).
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, int64_t rows,
                          int64_t cols, const LayerNormForward& out) = 0;
  // out[i] undefined where that gradient is not needed; weight may be undefined.
  virtual void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight, int64_t rows, int64_t cols,
                                   const std::array<Tensor, 3>& out) = 0;
  virtual void dropout(const Tensor& x, const Tensor& uniform, double p, const Tensor& out, const Tensor& mask) = 0;
  virtual void dropout_backward(const Tensor& g, const Tensor& mask, const Tensor& out) = 0;
  // Inputs contiguous; weight may be undefined.
  virtual void cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                             double label_smoothing, const CrossEntropyRows& out) = 0;
  virtual void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& weight,
                                      const Tensor& lse, int64_t ignore_index, double label_smoothing,
                                      const Tensor& grad_logits) = 0;
};

}  // namespace tandem::detail
