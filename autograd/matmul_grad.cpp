// The public matrix products of autograd/ops.h: forward through core/detail/matmul.h; every backward
// is GEMMs on strided operands (no transposes materialised) plus, for biases, one reduction.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/matmul.h"
#include "core/detail/reduce.h"

namespace tandem {

using autograd::BackwardContext;

namespace {

Tensor record_matmul(Tensor out, const Tensor& a, const Tensor& b, const char* node) {
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        node, {&a, &b}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          auto [ga, gb] = detail::matmul_backward(ctx.grads[0], ctx.saved(0), ctx.saved(1), ctx.needs_input_grad[0],
                                                  ctx.needs_input_grad[1]);
          return {ga, gb};
        },
        {a, b});
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) { return record_matmul(detail::matmul_kernel(a, b), a, b, "MatmulBackward"); }
Tensor mm(const Tensor& a, const Tensor& b) { return record_matmul(detail::mm_kernel(a, b), a, b, "MmBackward"); }
Tensor bmm(const Tensor& a, const Tensor& b) { return record_matmul(detail::bmm_kernel(a, b), a, b, "BmmBackward"); }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = detail::linear_kernel(x, weight, bias);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(
        "LinearBackward", {&x, &weight, &bias}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          auto [gx, gw, gb] = detail::linear_backward(ctx.grads[0], ctx.saved(0), ctx.saved(1), ctx.needs_input_grad[0],
                                                      ctx.needs_input_grad[1], ctx.needs_input_grad[2]);
          return {gx, gw, gb};
        },
        {x, weight});
  }
  return out;
}

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  Tensor out = detail::addmm_kernel(bias, a, b);
  if (autograd::any_requires_grad({&bias, &a, &b})) {
    autograd::record(
        "AddmmBackward", {&bias, &a, &b}, {&out},
        [bias_shape = bias.shape()](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor gbias = ctx.needs_input_grad[0] ? detail::sum_to_shape(g, bias_shape, "addmm_backward") : Tensor();
          auto [ga, gb] =
              detail::matmul_backward(g, ctx.saved(0), ctx.saved(1), ctx.needs_input_grad[1], ctx.needs_input_grad[2]);
          return {gbias, ga, gb};
        },
        {a, b});
  }
  return out;
}

}  // namespace tandem
