// The CPU raw backward kernels of core/detail/elementwise.h (unary_grad, clamp_grad, the pow grads,
// div_grad_other, extreme_grad, where_grad): fresh results in g's dtype, floating dtypes only.
// autograd/elementwise_grad.cpp holds the backward rules that call them.
#include "core/detail/elementwise.h"
#include "core/cpu/elementwise_loops.h"

namespace tandem::detail {

// ---------------------------------------------------------------- backward kernels

namespace {
// out = f(g, s) over the broadcast shape of g and s, in g's dtype (s cast when it differs);
// on a device, `on_device(table, out, g, s)` instead.
template <class F, class D>
Tensor grad_map2(const Tensor& g, const Tensor& s_in, const char* name, const F& f, const D& on_device) {
  check_same_device(name, {{"grad", g}, {"input", s_in}});
  Tensor s = cast(s_in, g.dtype(), name);
  Tensor out = make_empty(broadcast_or_same(g, s, name), g.dtype(), g.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) on_device(elementwise_table(out, name), out, g, s);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(g.dtype(), name, [&] {
    using T = scalar_t;
    map<T, T, T>(out, {&g, &s}, f);
  });
  return out;
}
template <class F>
Tensor grad_map3(const Tensor& g, const Tensor& a_in, const Tensor& b_in, const char* name, const F& f, Grad3 op) {
  check_same_device(name, {{"grad", g}, {"a", a_in}, {"b", b_in}});
  Tensor a = cast(a_in, g.dtype(), name), b = cast(b_in, g.dtype(), name);
  Shape shape = broadcast_shapes(broadcast_or_same(g, a, name), b.shape(), name);
  Tensor out = make_empty(shape, g.dtype(), g.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, name).grad3(op, out, g, a, b);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(g.dtype(), name, [&] {
    using T = scalar_t;
    map<T, T, T, T>(out, {&g, &a, &b}, f);
  });
  return out;
}
}  // namespace

Tensor unary_grad(Unary op, const Tensor& g, const Tensor& s) {
  const char* name = op_name(op);
  auto dev = [op](ElementwiseDeviceKernels& k, const Tensor& out, const Tensor& g, const Tensor& s) {
    k.unary_grad(op, out, g, s);
  };
  switch (op) {
    case Unary::abs: return grad_map2(g, s, name, AbsGradX{}, dev);
    case Unary::sqrt: return grad_map2(g, s, name, SqrtGradY{}, dev);
    case Unary::rsqrt: return grad_map2(g, s, name, RsqrtGradY{}, dev);
    case Unary::tanh: return grad_map2(g, s, name, TanhGradY{}, dev);
    case Unary::sigmoid: return grad_map2(g, s, name, SigmoidGradY{}, dev);
    case Unary::relu: return grad_map2(g, s, name, ReluGradY{}, dev);
    case Unary::gelu: return grad_map2(g, s, name, GeluGradX{}, dev);
    case Unary::gelu_tanh: return grad_map2(g, s, name, GeluTanhGradX{}, dev);
    case Unary::silu: return grad_map2(g, s, name, SiluGradX{}, dev);
    default: fail("[{}] internal: no raw backward kernel for this op", name);
  }
}

Tensor clamp_grad(const Tensor& g, const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  Tensor out;
  auto dev = [lo, hi](ElementwiseDeviceKernels& k, const Tensor& out, const Tensor& g, const Tensor& x) {
    k.clamp_grad(out, g, x, lo, hi);
  };
  TANDEM_DISPATCH_FLOATING(g.dtype(), "clamp", [&] {
    using C = C_t<scalar_t>;
    out = grad_map2(g, x, "clamp",
                    ClampGradX<C>{lo ? static_cast<C>(*lo) : C(0), hi ? static_cast<C>(*hi) : C(0), lo.has_value(),
                                  hi.has_value()},
                    dev);
  });
  return out;
}

Tensor pow_scalar_grad(const Tensor& g, const Tensor& x, double exponent) {
  Tensor out;
  auto dev = [exponent](ElementwiseDeviceKernels& k, const Tensor& out, const Tensor& g, const Tensor& x) {
    k.pow_scalar_grad(out, g, x, exponent);
  };
  TANDEM_DISPATCH_FLOATING(g.dtype(), "pow", [&] {
    using C = C_t<scalar_t>;
    out = grad_map2(g, x, "pow", PowScalarGradX<C>{static_cast<C>(exponent)}, dev);
  });
  return out;
}

Tensor pow_grad_base(const Tensor& g, const Tensor& a, const Tensor& b) {
  return grad_map3(g, a, b, "pow", PowGradBase{}, Grad3::pow_base);
}
Tensor pow_grad_exponent(const Tensor& g, const Tensor& a, const Tensor& b) {
  return grad_map3(g, a, b, "pow", PowGradExponent{}, Grad3::pow_exponent);
}

Tensor div_grad_other(const Tensor& g, const Tensor& a, const Tensor& b) {
  return grad_map3(g, a, b, "div", DivGradOther{}, Grad3::div_other);
}

Tensor extreme_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max, bool first) {
  const char* name = is_max ? "maximum" : "minimum";
  if (is_max) {
    return first ? grad_map3(g, a, b, name, ExtremeGrad<true, true>{}, Grad3::max_first)
                 : grad_map3(g, a, b, name, ExtremeGrad<true, false>{}, Grad3::max_second);
  }
  return first ? grad_map3(g, a, b, name, ExtremeGrad<false, true>{}, Grad3::min_first)
               : grad_map3(g, a, b, name, ExtremeGrad<false, false>{}, Grad3::min_second);
}

Tensor where_grad(const Tensor& cond, const Tensor& g, bool take_true) {
  check_same_device("where", {{"condition", cond}, {"grad", g}});
  Tensor out = make_empty(broadcast_or_same(cond, g, "where"), g.dtype(), g.device(), "where");
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, "where").where_grad(out, cond, g, take_true);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(g.dtype(), "where", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    map<T, bool, T>(out, {&cond, &g}, [take_true](bool c, C v) { return c == take_true ? v : C(0); });
  });
  return out;
}

}  // namespace tandem::detail
