// The fused cross-entropy of rows of class scores as a differentiable op: forward through
// core/detail/nn_ops.h's cross_entropy_rows_kernel, backward rule in autograd/detail/loss_grad.cpp.
// nn::cross_entropy (nn/loss.cpp) calls it for class-index targets on a device; on the CPU it
// composes log_softmax and nll_loss instead.
#pragma once

#include <cstdint>
#include <utility>

#include "core/tensor.h"

namespace tandem::autograd {

// logits [M, C], target [M] (i64), weight [C] or undefined (not differentiated). Returns
// {loss [M], differentiable in logits; kept [M] = the target's class weight, 0 where ignored}.
std::pair<Tensor, Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                             int64_t ignore_index, double label_smoothing);

}  // namespace tandem::autograd
