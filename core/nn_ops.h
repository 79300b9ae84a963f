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

}  // namespace tandem::detail
