// The public reductions of autograd/ops.h: forward through core/detail/reduce.h, backward rules here.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/reduce.h"

namespace tandem {

using autograd::BackwardContext;
using detail::ReducePlan;

namespace {

Tensor sum_impl(const Tensor& a, ReducePlan pl) {
  Tensor out = detail::sum_kernel(a, pl);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("SumBackward", {&a}, {&out},
                     [pl = std::move(pl), in_shape = a.shape()](BackwardContext& ctx) -> TensorList {
                       return {detail::expand_grad(ctx.grads[0], pl, in_shape, 1.0)};
                     });
  }
  return out;
}

Tensor mean_impl(const Tensor& a, ReducePlan pl) {
  Tensor out = detail::mean_kernel(a, pl);
  if (autograd::any_requires_grad({&a})) {
    // The mean of an empty set is NaN; its (empty) gradient needs no scale.
    double scale = pl.count > 0 ? 1.0 / static_cast<double>(pl.count) : 0.0;
    autograd::record("MeanBackward", {&a}, {&out},
                     [pl = std::move(pl), in_shape = a.shape(), scale](BackwardContext& ctx) -> TensorList {
                       return {detail::expand_grad(ctx.grads[0], pl, in_shape, scale)};
                     });
  }
  return out;
}

// max/min/amax/amin: the gradient is shared evenly among the elements equal to the result.
Tensor extreme_impl(const Tensor& a, ReducePlan pl, detail::Extreme which, const char* op, const char* node) {
  Tensor out = detail::extreme_kernel(a, pl, which, op);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        node, {&a}, {&out},
        [pl = std::move(pl)](BackwardContext& ctx) -> TensorList {
          return {detail::extreme_grad(ctx.grads[0], ctx.saved(0), ctx.saved(1), pl)};
        },
        {a}, {out});
  }
  return out;
}

std::pair<Tensor, Tensor> extreme_dim_impl(const Tensor& a, int64_t dim, bool keepdim, detail::Extreme which,
                                           const char* op, const char* node) {
  int64_t d = wrap_dim(dim, a.dim(), op);
  ReducePlan pl = detail::plan_reduction(a, Shape{d}, keepdim, op);
  auto [values, indices] = detail::extreme_with_index_kernel(a, pl, which, /*want_values=*/true, op);
  if (autograd::any_requires_grad({&a})) {
    // Indices are not differentiable: only the values get history.
    autograd::record(
        node, {&a}, {&values},
        [pl = std::move(pl), in_shape = a.shape(), d](BackwardContext& ctx) -> TensorList {
          return {detail::index_grad(ctx.grads[0], ctx.saved(0), pl, in_shape, d)};
        },
        {indices});
  }
  return {values, indices};
}

Tensor var_impl(const Tensor& a, ReducePlan pl, int64_t correction, bool is_std) {
  Tensor out = detail::var_kernel(a, pl, correction, is_std);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        is_std ? "StdBackward" : "VarBackward", {&a}, {&out},
        [pl = std::move(pl), correction, is_std](BackwardContext& ctx) -> TensorList {
          return {detail::var_grad(ctx.grads[0], ctx.saved(0), ctx.saved(1), pl, correction, is_std)};
        },
        {a}, {out});
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& a) { return sum_impl(a, detail::plan_full_reduction(a, "sum")); }
Tensor sum(const Tensor& a, const Shape& dims, bool keepdim) {
  return sum_impl(a, detail::plan_reduction(a, dims, keepdim, "sum"));
}
Tensor mean(const Tensor& a) { return mean_impl(a, detail::plan_full_reduction(a, "mean")); }
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) {
  return mean_impl(a, detail::plan_reduction(a, dims, keepdim, "mean"));
}

Tensor max(const Tensor& a) {
  return extreme_impl(a, detail::plan_full_reduction(a, "max"), detail::Extreme::max, "max", "MaxBackward");
}
Tensor min(const Tensor& a) {
  return extreme_impl(a, detail::plan_full_reduction(a, "min"), detail::Extreme::min, "min", "MinBackward");
}
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim_impl(a, dim, keepdim, detail::Extreme::max, "max", "MaxBackward");
}
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim_impl(a, dim, keepdim, detail::Extreme::min, "min", "MinBackward");
}
Tensor amax(const Tensor& a, const Shape& dims, bool keepdim) {
  return extreme_impl(a, detail::plan_reduction(a, dims, keepdim, "amax"), detail::Extreme::max, "amax",
                      "AmaxBackward");
}
Tensor amin(const Tensor& a, const Shape& dims, bool keepdim) {
  return extreme_impl(a, detail::plan_reduction(a, dims, keepdim, "amin"), detail::Extreme::min, "amin",
                      "AminBackward");
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  int64_t d = wrap_dim(dim, a.dim(), "argmax");
  return detail::extreme_with_index_kernel(a, detail::plan_reduction(a, Shape{d}, keepdim, "argmax"),
                                           detail::Extreme::max, false, "argmax")
      .second;
}
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) {
  int64_t d = wrap_dim(dim, a.dim(), "argmin");
  return detail::extreme_with_index_kernel(a, detail::plan_reduction(a, Shape{d}, keepdim, "argmin"),
                                           detail::Extreme::min, false, "argmin")
      .second;
}
Tensor argmax(const Tensor& a) {
  return detail::extreme_with_index_kernel(a, detail::plan_full_reduction(a, "argmax"), detail::Extreme::max, false,
                                           "argmax")
      .second;
}
Tensor argmin(const Tensor& a) {
  return detail::extreme_with_index_kernel(a, detail::plan_full_reduction(a, "argmin"), detail::Extreme::min, false,
                                           "argmin")
      .second;
}

Tensor var(const Tensor& a, const Shape& dims, int64_t correction, bool keepdim) {
  return var_impl(a, detail::plan_reduction(a, dims, keepdim, "var"), correction, false);
}
Tensor std(const Tensor& a, const Shape& dims, int64_t correction, bool keepdim) {
  return var_impl(a, detail::plan_reduction(a, dims, keepdim, "std"), correction, true);
}
Tensor var(const Tensor& a) {
  const int64_t correction = 1;
  return var_impl(a, detail::plan_full_reduction(a, "var"), correction, false);
}
Tensor std(const Tensor& a) {
  const int64_t correction = 1;
  return var_impl(a, detail::plan_full_reduction(a, "std"), correction, true);
}

Tensor logsumexp(const Tensor& a, const Shape& dims, bool keepdim) {
  ReducePlan pl = detail::plan_reduction(a, dims, keepdim, "logsumexp");
  Tensor out = detail::logsumexp_kernel(a, pl);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "LogsumexpBackward", {&a}, {&out},
        [pl = std::move(pl)](BackwardContext& ctx) -> TensorList {
          return {detail::logsumexp_grad(ctx.grads[0], ctx.saved(0), ctx.saved(1), pl)};
        },
        {a}, {out});
  }
  return out;
}

Tensor norm(const Tensor& a) {
  ReducePlan pl = detail::plan_full_reduction(a, "norm");
  Tensor out = detail::norm_kernel(a, pl);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "NormBackward", {&a}, {&out},
        [pl = std::move(pl)](BackwardContext& ctx) -> TensorList {
          return {detail::norm_grad(ctx.grads[0], ctx.saved(0), ctx.saved(1), pl)};
        },
        {a}, {out});
  }
  return out;
}

}  // namespace tandem
