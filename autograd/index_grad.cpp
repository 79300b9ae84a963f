// The differentiable indexing and joining ops: forward in core/cpu/index.cpp, backward rules here.
// Integer index tensors and bool masks are saved for backward but never differentiated.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/copy.h"
#include "core/detail/index.h"
#include "core/detail/views.h"

namespace tandem {

using autograd::BackwardContext;

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = detail::embedding(weight, indices);
  if (autograd::any_requires_grad({&weight})) {
    const int64_t rows = weight.size(0);
    autograd::record(
        "embedding", {&weight}, {&out},
        [rows](BackwardContext& ctx) -> TensorList {
          return {detail::embedding_backward(ctx.grads[0], ctx.saved(0), rows)};
        },
        {indices});
  }
  return out;
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = detail::index_select(a, dim, index);
  if (autograd::any_requires_grad({&a})) {
    const int64_t d = wrap_dim(dim, a.dim(), "index_select");
    const Shape shape = a.shape();
    autograd::record(
        "index_select", {&a}, {&out},
        [d, shape](BackwardContext& ctx) -> TensorList {
          return {detail::index_add_zeros(shape, d, ctx.saved(0), ctx.grads[0])};
        },
        {index});
  }
  return out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = detail::gather(a, dim, index);
  if (autograd::any_requires_grad({&a})) {
    const int64_t d = wrap_dim(dim, a.dim(), "gather");
    const Shape shape = a.shape();
    autograd::record(
        "gather", {&a}, {&out},
        [d, shape](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor zeros = detail::zeros_of(shape, g.dtype(), g.device(), "gather_backward");
          return {detail::scatter_add(zeros, d, ctx.saved(0), g)};
        },
        {index});
  }
  return out;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = detail::scatter_add(a, dim, index, src);
  if (autograd::any_requires_grad({&a, &src})) {
    const int64_t d = wrap_dim(dim, a.dim(), "scatter_add");
    const Shape src_shape = src.shape();
    autograd::record(
        "scatter_add", {&a, &src}, {&out},
        [d, src_shape](BackwardContext& ctx) -> TensorList {
          TensorList grads(2);
          if (ctx.needs_input_grad[0]) grads[0] = ctx.grads[0];
          if (ctx.needs_input_grad[1]) grads[1] = detail::gather_padded(ctx.grads[0], d, ctx.saved(0), src_shape);
          return grads;
        },
        {index});
  }
  return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value) {
  Tensor out = detail::masked_fill(a, mask, value);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "masked_fill", {&a}, {&out},
        [](BackwardContext& ctx) -> TensorList { return {detail::masked_fill(ctx.grads[0], ctx.saved(0), 0)}; },
        {mask});
  }
  return out;
}

namespace {
// Each input's gradient is its slice of the output gradient, cast back to the input's dtype when
// cat promoted it.
Tensor slice_grad(const Tensor& slice, Dtype dtype) {
  return slice.dtype() == dtype ? slice : detail::cast_copy(slice, dtype, "cat_backward");
}
}  // namespace

Tensor cat(const TensorList& tensors, int64_t dim) {
  Tensor out = detail::cat(tensors, dim);
  if (!autograd::any_requires_grad(tensors)) return out;
  struct Piece {
    Shape shape;
    Dtype dtype;
    bool skipped;
  };
  std::vector<Piece> pieces;
  pieces.reserve(tensors.size());
  int64_t d = 0;
  bool found = false;
  for (const Tensor& t : tensors) {
    const bool skipped = detail::cat_skips(t);
    if (!skipped && !found) {
      d = wrap_dim(dim, t.dim(), "cat");
      found = true;
    }
    pieces.push_back({t.shape(), t.dtype(), skipped});
  }
  TensorList outs{out};
  autograd::record("cat", tensors, outs, [d, pieces = std::move(pieces)](BackwardContext& ctx) -> TensorList {
    const Tensor& g = ctx.grads[0];
    TensorList grads(pieces.size());
    int64_t offset = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (p.skipped) {
        if (ctx.needs_input_grad[i]) grads[i] = detail::zeros_of(p.shape, p.dtype, g.device(), "cat_backward");
        continue;
      }
      const int64_t len = p.shape[d];
      if (ctx.needs_input_grad[i]) grads[i] = slice_grad(detail::narrow(g, d, offset, len), p.dtype);
      offset += len;
    }
    return grads;
  });
  return outs[0];
}

Tensor stack(const TensorList& tensors, int64_t dim) {
  Tensor out = detail::stack(tensors, dim);
  if (!autograd::any_requires_grad(tensors)) return out;
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Dtype> dtypes;
  dtypes.reserve(tensors.size());
  for (const Tensor& t : tensors) dtypes.push_back(t.dtype());
  TensorList outs{out};
  autograd::record("stack", tensors, outs, [d, dtypes = std::move(dtypes)](BackwardContext& ctx) -> TensorList {
    TensorList grads(dtypes.size());
    for (size_t i = 0; i < dtypes.size(); ++i)
      if (ctx.needs_input_grad[i])
        grads[i] = slice_grad(detail::select(ctx.grads[0], d, static_cast<int64_t>(i)), dtypes[i]);
    return grads;
  });
  return outs[0];
}

namespace {
// One node for all pieces: the engine zero-fills the gradients of unused pieces, so the input's
// gradient is simply their concatenation.
TensorList split_impl(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim, const char* op) {
  TensorList outs = detail::split_with_sizes(a, sizes, dim, op);
  // (An empty size list, valid for an empty dim, gives no outputs and nothing to record.)
  if (!outs.empty() && autograd::any_requires_grad({&a})) {
    const int64_t d = wrap_dim(dim, a.dim(), op);
    autograd::record(op, TensorList{a}, outs, [d](BackwardContext& ctx) -> TensorList {
      // Pieces are never skipped by cat unless 1-D and empty, and those add nothing to the input.
      return {detail::cat(ctx.grads, d, "split_backward")};
    });
  }
  return outs;
}

int64_t split_dim(const Tensor& a, int64_t dim, const char* op) {
  TANDEM_CHECK(a.defined(), "[{}] input is an undefined tensor", op);
  TANDEM_CHECK(a.dim() > 0, "[{}] expects a tensor with at least one dim, got a 0-dim tensor", op);
  return wrap_dim(dim, a.dim(), op);
}
}  // namespace

TensorList split(const Tensor& a, int64_t split_size, int64_t dim) {
  const int64_t d = split_dim(a, dim, "split");
  return split_impl(a, detail::split_sizes(a.size(d), split_size), d, "split");
}

TensorList split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  return split_impl(a, sizes, dim, "split");
}

TensorList chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  const int64_t d = split_dim(a, dim, "chunk");
  return split_impl(a, detail::chunk_sizes(a.size(d), chunks), d, "chunk");
}

}  // namespace tandem
