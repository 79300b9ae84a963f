// The differentiable triangles, tril and triu: forward in core/cpu/triangle.cpp, backward here.
// The output is the input times a fixed 0/1 mask, so the gradient is the incoming gradient
// through the same mask; backward saves nothing.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/triangle.h"

namespace tandem {

using autograd::BackwardContext;

namespace {
Tensor triangle_op(const Tensor& a, int64_t diagonal, detail::Triangle which) {
  Tensor out = detail::triangle(a, diagonal, which);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(detail::triangle_op_name(which), {&a}, {&out},
                     [diagonal, which](BackwardContext& ctx) -> TensorList {
                       return {detail::triangle(ctx.grads[0], diagonal, which)};
                     });
  }
  return out;
}
}  // namespace

Tensor tril(const Tensor& a, int64_t diagonal) { return triangle_op(a, diagonal, detail::Triangle::lower); }
Tensor triu(const Tensor& a, int64_t diagonal) { return triangle_op(a, diagonal, detail::Triangle::upper); }

}  // namespace tandem
