// The forward half of the view ops: geometry only (shape, strides, offset over the same
// storage), no autograd. autograd/views_grad.cpp wraps each into the public differentiable op.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace tandem::detail {

// Resolves one -1 in `shape` against `numel`; throws "[op] shape ... is invalid for input of
// size n" when it cannot.
Shape infer_size(const Shape& shape, int64_t numel, const char* op);
// Strides that let `a` be viewed as `shape` without copying (PyTorch's computeStride), or none.
std::optional<Strides> view_strides(const Tensor& a, const Shape& shape);

Tensor view(const Tensor& a, const Shape& shape);  // shape may hold one -1
Tensor reshape(const Tensor& a, const Shape& shape);  // a view when possible, else a copy
Tensor permute(const Tensor& a, const Shape& dims);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor squeeze(const Tensor& a);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor unsqueeze(const Tensor& a, int64_t dim);
// The shape flatten(start, end) produces (dims wrapped and checked).
Shape flatten_shape(const Tensor& a, int64_t start_dim, int64_t end_dim);

// Normalised arguments, shared with the backward rules.
struct SliceArgs {
  int64_t dim, start, end, step;
};
SliceArgs slice_args(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step, const char* op);

}  // namespace tandem::detail
