// The public convolution and pooling ops of autograd/ops.h: forward through core/detail/conv.h and
// core/detail/pool.h, backward rules here. A 3-D input [C, H, W] is one unbatched sample: the op runs on
// it as a batch of one and returns an unbatched result, as in PyTorch.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/conv.h"
#include "core/detail/pool.h"

namespace tandem {

using autograd::BackwardContext;

namespace {

// fn on input as [N, C, H, W]; a 3-D input goes in as a batch of one and its result comes out
// unbatched.
template <class Fn>
Tensor batched(const Tensor& input, const char* op, Fn&& fn) {
  TANDEM_CHECK(input.defined(), "[{}] got an undefined input", op);
  TANDEM_CHECK(input.dim() == 3 || input.dim() == 4, "[{}] expected input [N, C, H, W] or [C, H, W], got {}", op,
               input.shape());
  if (input.dim() == 4) return fn(input);
  return squeeze(fn(unsqueeze(input, 0)), 0);
}

detail::Pool2dArgs pool_args(Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation,
                             bool ceil_mode) {
  detail::Pool2dArgs a;
  a.kernel = kernel_size;
  a.stride = stride;
  a.padding = padding;
  a.dilation = dilation;
  a.ceil_mode = ceil_mode;
  return a;
}

std::pair<Tensor, Tensor> max_pool2d_4d(const Tensor& x, const detail::Pool2dArgs& args) {
  auto [y, idx] = detail::max_pool2d_kernel(x, args);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(
        "MaxPool2DWithIndicesBackward", {&x}, {&y},
        [args](BackwardContext& ctx) -> TensorList {
          return {detail::max_pool2d_backward_kernel(ctx.grads[0], ctx.saved(1), ctx.saved(0), args)};
        },
        {x, idx});
  }
  return {y, idx};
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, Size2 stride, Size2 padding,
              Size2 dilation, int64_t groups) {
  const detail::Conv2dArgs args{stride, padding, dilation, groups};
  return batched(input, "conv2d", [&](const Tensor& x) {
    Tensor y = detail::conv2d_kernel(x, weight, bias, args);
    if (autograd::any_requires_grad({&x, &weight, &bias})) {
      autograd::record(
          "ConvolutionBackward", {&x, &weight, &bias}, {&y},
          [args](BackwardContext& ctx) -> TensorList {
            auto [gx, gw, gb] = detail::conv2d_backward_kernel(ctx.grads[0], ctx.saved(0), ctx.saved(1), args,
                                                               ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                                               ctx.needs_input_grad[2]);
            return {gx, gw, gb};
          },
          {x, weight});
    }
    return y;
  });
}

std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, Size2 kernel_size, std::optional<Size2> stride,
                                                  Size2 padding, Size2 dilation, bool ceil_mode) {
  const detail::Pool2dArgs args = pool_args(kernel_size, stride, padding, dilation, ceil_mode);
  TANDEM_CHECK(input.defined(), "[max_pool2d] got an undefined input");
  TANDEM_CHECK(input.dim() == 3 || input.dim() == 4, "[max_pool2d] expected input [N, C, H, W] or [C, H, W], got {}",
               input.shape());
  if (input.dim() == 4) return max_pool2d_4d(input, args);
  auto [y, idx] = max_pool2d_4d(unsqueeze(input, 0), args);
  return {squeeze(y, 0), squeeze(idx, 0)};
}

Tensor max_pool2d(const Tensor& input, Size2 kernel_size, std::optional<Size2> stride, Size2 padding, Size2 dilation,
                  bool ceil_mode) {
  return max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode).first;
}

Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, std::optional<Size2> stride, Size2 padding, bool ceil_mode,
                  bool count_include_pad, std::optional<int64_t> divisor_override) {
  const detail::Pool2dArgs args = pool_args(kernel_size, stride, padding, 1, ceil_mode);
  const detail::AvgPoolOptions avg{count_include_pad, divisor_override};
  return batched(input, "avg_pool2d", [&](const Tensor& x) {
    Tensor y = detail::avg_pool2d_kernel(x, args, avg);
    if (autograd::any_requires_grad({&x})) {
      autograd::record(
          "AvgPool2DBackward", {&x}, {&y},
          [args, avg](BackwardContext& ctx) -> TensorList {
            return {detail::avg_pool2d_backward_kernel(ctx.grads[0], ctx.saved(0), args, avg)};
          },
          {x});
    }
    return y;
  });
}

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size) {
  return batched(input, "adaptive_avg_pool2d", [&](const Tensor& x) {
    Tensor y = detail::adaptive_avg_pool2d_kernel(x, output_size);
    if (autograd::any_requires_grad({&x})) {
      autograd::record(
          "AdaptiveAvgPool2DBackward", {&x}, {&y},
          [](BackwardContext& ctx) -> TensorList {
            return {detail::adaptive_avg_pool2d_backward_kernel(ctx.grads[0], ctx.saved(0))};
          },
          {x});
    }
    return y;
  });
}

}  // namespace tandem
