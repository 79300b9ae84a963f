// The public elementwise ops of autograd/ops.h: forward through core/detail/elementwise.h, backward
// rules here. Binary rules reduce broadcast gradients with sum_to and cast them back to each
// input's dtype (promotion can make the output wider than an input).
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/checks.h"
#include "core/detail/elementwise.h"

namespace tandem {

using autograd::BackwardContext;
using detail::Binary;
using detail::Unary;

namespace {

// The gradient of input i from a gradient of the (broadcast, promoted) output: summed to the
// input's shape and cast to its dtype. Shape and dtype come from the metadata the input's
// producer recorded (what the engine checks the gradient against), so the backward lambdas
// capture no Shapes: small captures fit std::function's inline buffer, which keeps the
// recording of an op free of an extra allocation.
Tensor input_grad(const Tensor& g, const BackwardContext& ctx, size_t i) {
  const autograd::Edge& e = ctx.node.next_edges[i];
  const autograd::OutputMeta& m = e.fn->outputs[e.input_nr];
  Tensor r = g.shape() == m.shape ? g : autograd::sum_to(g, m.shape);
  return r.dtype() == m.dtype ? r : detail::cast(r, m.dtype, "backward");
}

Tensor scaled(const Tensor& g, double s) { return s == 1 ? g : detail::binary(Binary::mul, g, Scalar(s)); }

// Unary ops whose raw backward kernel reads the saved input (save_output false) or output.
Tensor unary_op(Unary op, const Tensor& a, const char* node, bool save_output) {
  Tensor out = detail::unary(op, a);
  if (autograd::any_requires_grad({&a})) {
    auto fn = [op](BackwardContext& ctx) -> TensorList { return {detail::unary_grad(op, ctx.grads[0], ctx.saved(0))}; };
    if (save_output) {
      autograd::record(node, {&a}, {&out}, fn, {}, {out});
    } else {
      autograd::record(node, {&a}, {&out}, fn, {a});
    }
  }
  return out;
}

// In-place ops are not recorded on the tape: an operand that requires grad would silently
// lose its gradient, so that is an error while grad mode is on.
void check_operand(const Tensor& other, const char* op) {
  if (autograd::any_requires_grad({&other})) [[unlikely]] {
    fail("[{}] an operand (shape {}) requires grad, but in-place ops are not recorded for autograd; use the "
         "out-of-place op, or detach() the operand",
         op, other.shape());
  }
}

}  // namespace

// ---------------------------------------------------------------- arithmetic

Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Tensor out = detail::binary(Binary::add, a, b, alpha);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record("AddBackward", {&a, &b}, {&out},
                     [alpha = alpha.value](BackwardContext& ctx) -> TensorList {
                       const Tensor& g = ctx.grads[0];
                       TensorList r(2);
                       if (ctx.needs_input_grad[0]) r[0] = input_grad(g, ctx, 0);
                       if (ctx.needs_input_grad[1]) r[1] = input_grad(scaled(g, alpha), ctx, 1);
                       return r;
                     });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Tensor out = detail::binary(Binary::sub, a, b, alpha);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record("SubBackward", {&a, &b}, {&out},
                     [alpha = alpha.value](BackwardContext& ctx) -> TensorList {
                       const Tensor& g = ctx.grads[0];
                       TensorList r(2);
                       if (ctx.needs_input_grad[0]) r[0] = input_grad(g, ctx, 0);
                       if (ctx.needs_input_grad[1]) r[1] = input_grad(scaled(g, -alpha), ctx, 1);
                       return r;
                     });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = detail::binary(Binary::mul, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        "MulBackward", {&a, &b}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          TensorList r(2);
          if (ctx.needs_input_grad[0]) r[0] = input_grad(detail::binary(Binary::mul, g, ctx.saved(1)), ctx, 0);
          if (ctx.needs_input_grad[1]) r[1] = input_grad(detail::binary(Binary::mul, g, ctx.saved(0)), ctx, 1);
          return r;
        },
        {a, b});
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = detail::binary(Binary::div, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        "DivBackward", {&a, &b}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor a = ctx.saved(0), b = ctx.saved(1);
          TensorList r(2);
          if (ctx.needs_input_grad[0]) r[0] = input_grad(detail::binary(Binary::div, g, b), ctx, 0);
          if (ctx.needs_input_grad[1]) r[1] = input_grad(detail::div_grad_other(g, a, b), ctx, 1);
          return r;
        },
        {a, b});
  }
  return out;
}

Tensor add(const Tensor& a, const Scalar& b) {
  Tensor out = detail::binary(Binary::add, a, b);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("AddBackward", {&a}, {&out},
                     [](BackwardContext& ctx) -> TensorList { return {ctx.grads[0]}; });
  }
  return out;
}

Tensor sub(const Tensor& a, const Scalar& b) {
  Tensor out = detail::binary(Binary::sub, a, b);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("SubBackward", {&a}, {&out},
                     [](BackwardContext& ctx) -> TensorList { return {ctx.grads[0]}; });
  }
  return out;
}

Tensor rsub(const Tensor& a, const Scalar& b) {
  Tensor out = detail::binary(Binary::sub, b, a);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("RsubBackward", {&a}, {&out},
                     [](BackwardContext& ctx) -> TensorList { return {detail::unary(Unary::neg, ctx.grads[0])}; });
  }
  return out;
}

Tensor mul(const Tensor& a, const Scalar& b) {
  Tensor out = detail::binary(Binary::mul, a, b);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("MulBackward", {&a}, {&out}, [s = b.value](BackwardContext& ctx) -> TensorList {
      return {detail::binary(Binary::mul, ctx.grads[0], Scalar(s))};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Scalar& b) {
  Tensor out = detail::binary(Binary::div, a, b);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("DivBackward", {&a}, {&out}, [s = b.value](BackwardContext& ctx) -> TensorList {
      return {detail::binary(Binary::div, ctx.grads[0], Scalar(s))};
    });
  }
  return out;
}

Tensor operator/(const Scalar& a, const Tensor& b) {
  Tensor out = detail::binary(Binary::div, a, b);
  if (autograd::any_requires_grad({&b})) {
    // d(s/b)/db = -s / b^2 = -out / b
    autograd::record(
        "RdivBackward", {&b}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          Tensor b = ctx.saved(0), out = ctx.saved(1);
          Tensor t = detail::binary(Binary::div, detail::binary(Binary::mul, ctx.grads[0], out), b);
          return {detail::unary(Unary::neg, t)};
        },
        {b}, {out});
  }
  return out;
}

namespace {
Tensor extreme(const Tensor& a, const Tensor& b, bool is_max) {
  Tensor out = detail::binary(is_max ? Binary::maximum : Binary::minimum, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        is_max ? "MaximumBackward" : "MinimumBackward", {&a, &b}, {&out},
        [is_max](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor a = ctx.saved(0), b = ctx.saved(1);
          TensorList r(2);
          if (ctx.needs_input_grad[0]) r[0] = input_grad(detail::extreme_grad(g, a, b, is_max, true), ctx, 0);
          if (ctx.needs_input_grad[1]) r[1] = input_grad(detail::extreme_grad(g, a, b, is_max, false), ctx, 1);
          return r;
        },
        {a, b});
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extreme(a, b, true); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extreme(a, b, false); }

Tensor pow(const Tensor& a, const Scalar& exponent) {
  Tensor out = detail::pow_scalar(a, exponent);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "PowBackward", {&a}, {&out},
        [e = exponent.value](BackwardContext& ctx) -> TensorList {
          return {detail::pow_scalar_grad(ctx.grads[0], ctx.saved(0), e)};
        },
        {a});
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& exponent) {
  Tensor out = detail::binary(Binary::pow, a, exponent);
  if (autograd::any_requires_grad({&a, &exponent})) {
    autograd::record(
        "PowBackward", {&a, &exponent}, {&out},
        [](BackwardContext& ctx)
            -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor a = ctx.saved(0), b = ctx.saved(1);
          TensorList r(2);
          if (ctx.needs_input_grad[0]) r[0] = input_grad(detail::pow_grad_base(g, a, b), ctx, 0);
          if (ctx.needs_input_grad[1]) r[1] = input_grad(detail::pow_grad_exponent(g, a, b), ctx, 1);
          return r;
        },
        {a, exponent});
  }
  return out;
}

// ---------------------------------------------------------------- unary

Tensor neg(const Tensor& a) {
  Tensor out = detail::unary(Unary::neg, a);
  if (autograd::any_requires_grad({&a})) {
    autograd::record("NegBackward", {&a}, {&out},
                     [](BackwardContext& ctx) -> TensorList { return {detail::unary(Unary::neg, ctx.grads[0])}; });
  }
  return out;
}

Tensor abs(const Tensor& a) { return unary_op(Unary::abs, a, "AbsBackward", false); }

Tensor exp(const Tensor& a) {
  Tensor out = detail::unary(Unary::exp, a);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "ExpBackward", {&a}, {&out},
        [](BackwardContext& ctx) -> TensorList { return {detail::binary(Binary::mul, ctx.grads[0], ctx.saved(0))}; },
        {}, {out});
  }
  return out;
}

Tensor log(const Tensor& a) {
  Tensor out = detail::unary(Unary::log, a);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "LogBackward", {&a}, {&out},
        [](BackwardContext& ctx) -> TensorList { return {detail::binary(Binary::div, ctx.grads[0], ctx.saved(0))}; },
        {a});
  }
  return out;
}

Tensor sqrt(const Tensor& a) { return unary_op(Unary::sqrt, a, "SqrtBackward", true); }
Tensor rsqrt(const Tensor& a) { return unary_op(Unary::rsqrt, a, "RsqrtBackward", true); }
Tensor tanh(const Tensor& a) { return unary_op(Unary::tanh, a, "TanhBackward", true); }
Tensor sigmoid(const Tensor& a) { return unary_op(Unary::sigmoid, a, "SigmoidBackward", true); }
Tensor relu(const Tensor& a) { return unary_op(Unary::relu, a, "ReluBackward", true); }
Tensor gelu(const Tensor& a, bool tanh_approximation) {
  return unary_op(tanh_approximation ? Unary::gelu_tanh : Unary::gelu, a, "GeluBackward", false);
}
Tensor silu(const Tensor& a) { return unary_op(Unary::silu, a, "SiluBackward", false); }

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  Tensor out = detail::clamp(a, lo, hi);
  if (autograd::any_requires_grad({&a})) {
    autograd::record(
        "ClampBackward", {&a}, {&out},
        [lo, hi](BackwardContext& ctx) -> TensorList {
          return {detail::clamp_grad(ctx.grads[0], ctx.saved(0), lo, hi)};
        },
        {a});
  }
  return out;
}

namespace {
// A bound is applied when it is given and defined (libtorch passes an undefined optional too).
const Tensor* bound(const std::optional<Tensor>& t) { return t && t->defined() ? &*t : nullptr; }
}  // namespace

Tensor clamp(const Tensor& a, const std::optional<Tensor>& lo_in, const std::optional<Tensor>& hi_in) {
  const Tensor* lo = bound(lo_in);
  const Tensor* hi = bound(hi_in);
  TANDEM_CHECK(lo || hi, "[clamp] at least one of min and max must be given");
  // Validate here so errors name clamp rather than the maximum/minimum it is computed with.
  Shape shape = a.shape();
  for (const Tensor* b : {lo, hi}) {
    if (!b) continue;
    // A 0-dim CPU bound may join a tensor on another device, as in every binary op.
    if (!(b->device() == a.device() || (b->dim() == 0 && b->is_cpu()))) [[unlikely]]
      detail::fail_devices("clamp", {{"self", a}, {b == lo ? "min" : "max", *b}});
    shape = broadcast_shapes(shape, b->shape(), "clamp");
  }
  // One promotion over all three operands (PyTorch's result_type(self, min, max)), then the
  // forward in that dtype; the comparisons of the backward use the same converted values.
  Dtype ct = lo && hi ? detail::result_type(a, *lo, *hi) : detail::result_type(a, lo ? *lo : *hi);
  TANDEM_CHECK(ct != boolean, "[clamp] not supported for bool tensors");
  Tensor A = detail::cast(a, ct, "clamp");
  Tensor LO = lo ? detail::cast(*lo, ct, "clamp") : Tensor();
  Tensor HI = hi ? detail::cast(*hi, ct, "clamp") : Tensor();
  // maximum/minimum propagate NaN from every operand, as PyTorch's clamp kernel does, and
  // applying hi last makes lo > hi give hi.
  Tensor out = A;
  if (lo) out = detail::binary(Binary::maximum, out, LO);
  if (hi) out = detail::binary(Binary::minimum, out, HI);
  const Tensor none;
  if (autograd::any_requires_grad({&a, lo, hi})) {
    autograd::record(
        "ClampBackward", {&a, lo ? lo : &none, hi ? hi : &none}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor x = ctx.saved(0), lo = ctx.saved(1), hi = ctx.saved(2);
          auto cmp = [](Binary op, const Tensor& p, const Tensor& q) { return detail::binary(op, p, q); };
          auto pass = [&](const Tensor& mask, size_t i) {
            return input_grad(detail::where_grad(mask, g, true), ctx, i);
          };
          TensorList r(3);
          if (ctx.needs_input_grad[0]) {
            Tensor in_range;
            if (lo.defined() && hi.defined()) {
              in_range = cmp(Binary::logical_and, cmp(Binary::ge, x, lo), cmp(Binary::le, x, hi));
            } else {
              in_range = lo.defined() ? cmp(Binary::ge, x, lo) : cmp(Binary::le, x, hi);
            }
            r[0] = pass(in_range, 0);
          }
          // PyTorch 1.13's clamp_backward_min_max: lo takes the gradient where it clamped and
          // lo < hi; hi where it clamped or where it overrode lo (hi < lo). Where lo == hi and
          // x < lo, neither gets it.
          if (ctx.needs_input_grad[1]) {
            Tensor below = cmp(Binary::lt, x, lo);
            r[1] = pass(hi.defined() ? cmp(Binary::logical_and, below, cmp(Binary::lt, lo, hi)) : below, 1);
          }
          if (ctx.needs_input_grad[2]) {
            Tensor above = cmp(Binary::gt, x, hi);
            r[2] = pass(lo.defined() ? cmp(Binary::logical_or, above, cmp(Binary::lt, hi, lo)) : above, 2);
          }
          return r;
        },
        {A, LO, HI});
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = detail::where(cond, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::record(
        "WhereBackward", {&a, &b}, {&out},
        [](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor cond = ctx.saved(0);
          TensorList r(2);
          if (ctx.needs_input_grad[0]) r[0] = input_grad(detail::where_grad(cond, g, true), ctx, 0);
          if (ctx.needs_input_grad[1]) r[1] = input_grad(detail::where_grad(cond, g, false), ctx, 1);
          return r;
        },
        {cond});
  }
  return out;
}

// A Scalar branch joins as a 0-dim tensor of the result dtype: the promotion is the Scalar's
// (result_type(tensor, scalar)), and the value is converted once, straight to that dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b) {
  return where(cond, a, scalar_tensor(b, TensorOptions(detail::result_type(a, b), a.device())));
}

Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b) {
  return where(cond, scalar_tensor(a, TensorOptions(detail::result_type(b, a), b.device())), b);
}

Tensor where(const Tensor& cond, const Scalar& a, const Scalar& b) {
  const Dtype dt = a.integral && b.integral ? i64 : kDefaultFloat;
  return detail::where(cond, scalar_tensor(a, TensorOptions(dt, cond.device())),
                   scalar_tensor(b, TensorOptions(dt, cond.device())));
}

// ---------------------------------------------------------------- not differentiable

Tensor eq(const Tensor& a, const Tensor& b) { return detail::binary(Binary::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return detail::binary(Binary::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return detail::binary(Binary::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return detail::binary(Binary::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return detail::binary(Binary::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return detail::binary(Binary::ge, a, b); }
Tensor eq(const Tensor& a, const Scalar& b) { return detail::binary(Binary::eq, a, b); }
Tensor ne(const Tensor& a, const Scalar& b) { return detail::binary(Binary::ne, a, b); }
Tensor lt(const Tensor& a, const Scalar& b) { return detail::binary(Binary::lt, a, b); }
Tensor le(const Tensor& a, const Scalar& b) { return detail::binary(Binary::le, a, b); }
Tensor gt(const Tensor& a, const Scalar& b) { return detail::binary(Binary::gt, a, b); }
Tensor ge(const Tensor& a, const Scalar& b) { return detail::binary(Binary::ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return detail::binary(Binary::logical_and, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return detail::binary(Binary::logical_or, a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return detail::binary(Binary::logical_xor, a, b); }
Tensor logical_not(const Tensor& a) { return detail::unary(Unary::logical_not, a); }
Tensor isnan(const Tensor& a) { return detail::unary(Unary::isnan, a); }
Tensor isinf(const Tensor& a) { return detail::unary(Unary::isinf, a); }

namespace {
Tensor bool_only(Binary op, const Tensor& a, const Tensor& b, const char* name) {
  TANDEM_CHECK(a.dtype() == boolean && b.dtype() == boolean,
               "[{}] only bool tensors are supported (got {} of shape {} and {} of shape {}); Tandem has no "
               "bitwise ops on integers, use logical_and/logical_or/logical_xor for truth values",
               name, a.dtype(), a.shape(), b.dtype(), b.shape());
  return detail::binary(op, a, b);
}
}  // namespace

Tensor operator&(const Tensor& a, const Tensor& b) { return bool_only(Binary::logical_and, a, b, "bitwise_and"); }
Tensor operator|(const Tensor& a, const Tensor& b) { return bool_only(Binary::logical_or, a, b, "bitwise_or"); }
Tensor operator^(const Tensor& a, const Tensor& b) { return bool_only(Binary::logical_xor, a, b, "bitwise_xor"); }
Tensor operator~(const Tensor& a) {
  TANDEM_CHECK(a.dtype() == boolean,
               "[bitwise_not] only bool tensors are supported (got {} of shape {}); use logical_not for truth values",
               a.dtype(), a.shape());
  return detail::unary(Unary::logical_not, a);
}

Tensor to_dtype(const Tensor& a, Dtype dtype) {
  if (a.dtype() == dtype) return a;  // as PyTorch's .to(): no copy when nothing changes
  Tensor out = detail::cast(a, dtype, "to");
  // Only casts between floating dtypes carry a gradient (an integer result cannot require one).
  if (is_floating(a.dtype()) && is_floating(dtype) && autograd::any_requires_grad({&a})) {
    autograd::record("ToCopyBackward", {&a}, {&out}, [src = a.dtype()](BackwardContext& ctx) -> TensorList {
      return {detail::cast(ctx.grads[0], src, "to")};
    });
  }
  return out;
}

// ---------------------------------------------------------------- in place

const Tensor& add_(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  autograd::check_inplace(self, "add_");
  check_operand(other, "add_");
  detail::binary_(Binary::add, self, other, alpha, "add_");
  self.bump_version();
  return self;
}

const Tensor& add_(const Tensor& self, const Scalar& other) {
  autograd::check_inplace(self, "add_");
  detail::binary_(Binary::add, self, other, "add_");
  self.bump_version();
  return self;
}

const Tensor& sub_(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  autograd::check_inplace(self, "sub_");
  check_operand(other, "sub_");
  detail::binary_(Binary::sub, self, other, alpha, "sub_");
  self.bump_version();
  return self;
}

const Tensor& sub_(const Tensor& self, const Scalar& other) {
  autograd::check_inplace(self, "sub_");
  detail::binary_(Binary::sub, self, other, "sub_");
  self.bump_version();
  return self;
}

const Tensor& mul_(const Tensor& self, const Tensor& other) {
  autograd::check_inplace(self, "mul_");
  check_operand(other, "mul_");
  detail::binary_(Binary::mul, self, other, 1, "mul_");
  self.bump_version();
  return self;
}

const Tensor& mul_(const Tensor& self, const Scalar& other) {
  autograd::check_inplace(self, "mul_");
  detail::binary_(Binary::mul, self, other, "mul_");
  self.bump_version();
  return self;
}

const Tensor& div_(const Tensor& self, const Tensor& other) {
  autograd::check_inplace(self, "div_");
  check_operand(other, "div_");
  detail::binary_(Binary::div, self, other, 1, "div_");
  self.bump_version();
  return self;
}

const Tensor& div_(const Tensor& self, const Scalar& other) {
  autograd::check_inplace(self, "div_");
  detail::binary_(Binary::div, self, other, "div_");
  self.bump_version();
  return self;
}

const Tensor& zero_(const Tensor& self) {
  autograd::check_inplace(self, "zero_");
  detail::fill(self, 0, "zero_");
  self.bump_version();
  return self;
}

const Tensor& fill_(const Tensor& self, const Scalar& value) {
  autograd::check_inplace(self, "fill_");
  detail::fill(self, value, "fill_");
  self.bump_version();
  return self;
}

const Tensor& copy_(const Tensor& self, const Tensor& src) {
  autograd::check_inplace(self, "copy_");
  check_operand(src, "copy_");
  detail::copy(self, src, "copy_");
  self.bump_version();
  return self;
}

const Tensor& clamp_(const Tensor& self, std::optional<double> lo, std::optional<double> hi) {
  autograd::check_inplace(self, "clamp_");
  detail::clamp_(self, lo, hi);
  self.bump_version();
  return self;
}

const Tensor& addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  autograd::check_inplace(self, "addcmul_");
  check_operand(a, "addcmul_");
  check_operand(b, "addcmul_");
  detail::addcmul_(self, a, b, alpha);
  self.bump_version();
  return self;
}

const Tensor& addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  autograd::check_inplace(self, "addcdiv_");
  check_operand(a, "addcdiv_");
  check_operand(b, "addcdiv_");
  detail::addcdiv_(self, a, b, alpha);
  self.bump_version();
  return self;
}

const Tensor& lerp_(const Tensor& self, const Tensor& end, const Scalar& weight) {
  autograd::check_inplace(self, "lerp_");
  check_operand(end, "lerp_");
  detail::lerp_(self, end, weight);
  self.bump_version();
  return self;
}

}  // namespace tandem
