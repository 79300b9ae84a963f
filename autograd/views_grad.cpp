// The public view ops and their backward rules. Forward geometry lives in core/detail/views.cpp; every
// view shares its input's storage (and version counter) and records how to route the gradient
// back to the input's shape. contiguous/clone copy (identity gradient), as does to(Device).
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/elementwise.h"
#include "core/detail/views.h"

namespace tandem {

using autograd::BackwardContext;

namespace {

// The gradient of a view whose elements are the input's in the same order: reshape it back.
void record_reshape_like(const char* name, const Tensor& a, Tensor& out) {
  if (!autograd::any_requires_grad({&a})) return;
  Shape in_shape = a.shape();
  autograd::record(name, {&a}, {&out}, [in_shape](BackwardContext& ctx) -> TensorList {
    return {reshape(ctx.grads[0], in_shape)};
  });
}

void record_identity(const char* name, const Tensor& a, Tensor& out) {
  if (!autograd::any_requires_grad({&a})) return;
  autograd::record(name, {&a}, {&out}, [](BackwardContext& ctx) -> TensorList { return {ctx.grads[0]}; });
}

// The gradient of a strided sub-view (slice, narrow, select): zeros of the input's shape with
// the output gradient scattered into the same sub-view of them.
template <class SubView>
void record_subview(const char* name, const Tensor& a, Tensor& out, SubView sub_view) {
  if (!autograd::any_requires_grad({&a})) return;
  Shape in_shape = a.shape();
  autograd::record(name, {&a}, {&out}, [name, in_shape, sub_view](BackwardContext& ctx) -> TensorList {
    const Tensor& g = ctx.grads[0];
    Tensor full_grad = zeros(in_shape, TensorOptions(g.dtype(), g.device()));
    detail::copy_same_dtype(sub_view(full_grad), g, name);
    return {full_grad};
  });
}

}  // namespace

Tensor view(const Tensor& a, const Shape& shape) {
  Tensor out = detail::view(a, shape);
  record_reshape_like("ViewBackward", a, out);
  return out;
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  Shape s = detail::infer_size(shape, a.numel(), "reshape");
  if (detail::view_strides(a, s)) return view(a, s);
  return view(contiguous(a), s);
}

Tensor permute(const Tensor& a, const Shape& dims) {
  Tensor out = detail::permute(a, dims);
  if (autograd::any_requires_grad({&a})) {
    const int64_t n = a.dim();
    Shape inverse(n);
    for (int64_t i = 0; i < n; ++i) inverse[wrap_dim(dims[i], n, "permute")] = i;
    autograd::record("PermuteBackward", {&a}, {&out}, [inverse](BackwardContext& ctx) -> TensorList {
      return {permute(ctx.grads[0], inverse)};
    });
  }
  return out;
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  Tensor out = detail::transpose(a, d0, d1);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("TransposeBackward", {&a}, {&out}, [d0, d1](BackwardContext& ctx) -> TensorList {
      return {transpose(ctx.grads[0], d0, d1)};
    });
  }
  return out;
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  Tensor out = detail::narrow(a, dim, start, length);
  record_subview("NarrowBackward", a, out,
                 [dim, start, length](const Tensor& g) { return detail::narrow(g, dim, start, length); });
  return out;
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor out = detail::slice(a, dim, start, end, step);
  record_subview("SliceBackward", a, out,
                 [dim, start, end, step](const Tensor& g) { return detail::slice(g, dim, start, end, step); });
  return out;
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  Tensor out = detail::select(a, dim, index);
  record_subview("SelectBackward", a, out, [dim, index](const Tensor& g) { return detail::select(g, dim, index); });
  return out;
}

Tensor expand(const Tensor& a, const Shape& shape) {
  Tensor out = detail::expand(a, shape);
  if (autograd::any_requires_grad({&a})) {
    Shape in_shape = a.shape();
    autograd::record("ExpandBackward", {&a}, {&out}, [in_shape](BackwardContext& ctx) -> TensorList {
      return {autograd::sum_to(ctx.grads[0], in_shape)};
    });
  }
  return out;
}

Tensor squeeze(const Tensor& a) {
  Tensor out = detail::squeeze(a);
  record_reshape_like("SqueezeBackward", a, out);
  return out;
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  Tensor out = detail::squeeze(a, dim);
  record_reshape_like("SqueezeBackward", a, out);
  return out;
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  Tensor out = detail::unsqueeze(a, dim);
  record_reshape_like("UnsqueezeBackward", a, out);
  return out;
}

Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  Shape s = detail::flatten_shape(a, start_dim, end_dim);
  return s == a.shape() ? a : reshape(a, s);
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = detail::contiguous_copy(a, "contiguous");
  record_identity("ContiguousBackward", a, out);
  return out;
}

Tensor clone(const Tensor& a) {
  Tensor out = detail::contiguous_copy(a, "clone");
  record_identity("CloneBackward", a, out);
  return out;
}

// Moving between devices is differentiable (the gradient moves back), as in PyTorch.
Tensor Tensor::to(Device device) const {
  Tensor out = detail::to_device(*this, device);
  if (out.is_same(*this)) return out;
  if (autograd::any_requires_grad({this})) {
    Device src = this->device();
    autograd::record("ToCopyBackward", {this}, {&out}, [src](BackwardContext& ctx) -> TensorList {
      return {ctx.grads[0].to(src)};
    });
  }
  return out;
}

}  // namespace tandem
