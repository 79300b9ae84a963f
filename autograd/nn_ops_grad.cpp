// The public NN functional ops of autograd/ops.h: forward through core/detail/nn_ops.h, backward rules here.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/checks.h"
#include "core/detail/nn_ops.h"

namespace tandem {

using autograd::BackwardContext;

namespace {

Tensor softmax_impl(const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  Tensor y = detail::softmax_kernel(a, dim, log, op);
  if (autograd::any_requires_grad({&a})) {
    // Both backwards need only the output.
    autograd::record(
        log ? "LogSoftmaxBackward" : "SoftmaxBackward", {&a}, {&y},
        [dim, log](BackwardContext& ctx) -> TensorList {
          return {detail::softmax_backward_kernel(ctx.grads[0], ctx.saved(0), dim, log,
                                                  log ? "log_softmax_backward" : "softmax_backward")};
        },
        {}, {y});
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl(a, dim, true); }

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  auto fwd = detail::layer_norm_kernel(x, normalized_shape, weight, bias, eps);
  Tensor y = fwd.y;
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    autograd::record(
        "LayerNormBackward", {&x, &weight, &bias}, {&y},
        [ns = normalized_shape](BackwardContext& ctx) -> TensorList {
          auto [dx, dw, db] = detail::layer_norm_backward_kernel(
              ctx.grads[0], ctx.saved(0), ctx.saved(2), ctx.saved(3), ctx.saved(1), ns, ctx.needs_input_grad[0],
              ctx.needs_input_grad[1], ctx.needs_input_grad[2]);
          return {dx, dw, db};
        },
        {x, weight, fwd.mean, fwd.rstd});
  }
  return y;
}

Tensor dropout(const Tensor& x, double p, bool training) {
  TANDEM_CHECK(x.defined(), "[dropout] got an undefined tensor");
  TANDEM_CHECK(p >= 0 && p <= 1, "[dropout] p must be in [0, 1], got {}", p);
  detail::check_floating(x, "dropout");
  if (!training || p == 0) return x;
  Tensor uniform = rand(x.shape(), TensorOptions(f32, x.device()));
  auto [out, mask] = detail::dropout_kernel(x, uniform, p);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(
        "DropoutBackward", {&x}, {&out},
        [](BackwardContext& ctx) -> TensorList { return {detail::dropout_backward_kernel(ctx.grads[0], ctx.saved(0))}; },
        {mask});
  }
  return out;
}

}  // namespace tandem
