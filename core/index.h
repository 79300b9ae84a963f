// Indexing and joining: the forward computations (and the raw kernels their backward rules
// reuse) behind embedding, index_select, gather, scatter_add, masked_fill, cat, stack, split
// and chunk. Everything here validates its arguments and throws "[op] ..." errors; nothing here
// records on the tape (autograd/index_grad.cpp does that).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::index_kernels {

// ---- geometry helpers (views share storage, carry no autograd history) ----
Tensor narrow_view(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor select_view(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze_view(const Tensor& a, int64_t dim);

// A zero-filled contiguous tensor.
Tensor zeros_of(const Shape& shape, Dtype dtype, Device device, const char* op);
// Copies src into dst elementwise (same shape), casting between any two dtypes.
void copy_into(const Tensor& dst, const Tensor& src, const char* op);
// A contiguous copy of src in `dtype` (src itself when it already is one and `force` is false).
Tensor cast_copy(const Tensor& src, Dtype dtype, const char* op, bool force = false);

// ---- ops ----
// weight [V, D], integer indices of any shape -> [..., D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// grad [..., D] scatter-added row by row into zeros [num_rows, D].
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_rows);

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// zeros(shape) with slice k of src (along dim) added into slice index[k]: index_select's
// backward. `dim` must already be wrapped; src's shape is `shape` with dim resized to index.numel().
Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// zeros(src_shape) whose leading index-shaped block is gather(grad, dim, index): the gradient of
// scatter_add w.r.t. src (src may be larger than index; the rest of it is never read).
Tensor gather_padded(const Tensor& grad, int64_t dim, const Tensor& index, const Shape& src_shape);

Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value);

// `op` names the caller in errors (stack reuses cat).
Tensor cat(const TensorList& tensors, int64_t dim, const char* op = "cat");
Tensor stack(const TensorList& tensors, int64_t dim);

// True for the 1-D empty tensors cat skips (PyTorch's legacy behaviour).
inline bool cat_skips(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

// Sizes of the pieces split/chunk cut a dim of size n into.
std::vector<int64_t> split_sizes(int64_t n, int64_t split_size);
std::vector<int64_t> chunk_sizes(int64_t n, int64_t chunks);
// Views of consecutive slices of `a` along dim with the given sizes (which must sum to its size).
TensorList split_with_sizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim, const char* op);

}  // namespace tandem::index_kernels
