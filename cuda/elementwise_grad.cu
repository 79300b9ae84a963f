// CUDA raw backward kernels of core/detail/elementwise.h (unary_grad, clamp_grad, pow grads, div_grad_other,
// extreme_grad, where_grad): floating dtypes only, g's dtype throughout.
#include "cuda/detail/elementwise.cuh"

namespace tandem::cuda::ew_impl {

using namespace tandem::detail;  // the functors

namespace {
template <class C>
struct WhereGrad {  // the CPU's `c == take_true ? v : 0`
  bool take_true;
  TANDEM_HOST_DEVICE C operator()(bool c, C v) const { return c == take_true ? v : C(0); }
};
}  // namespace

void unary_grad(Unary op, const Tensor& out, const Tensor& g, const Tensor& s) {
  const char* name = op_name(op);
  TANDEM_DISPATCH_FLOATING(out.dtype(), name, [&] {
    using T = scalar_t;
    const std::array<Operand, 2> in{g, s};
    switch (op) {
      case Unary::abs: launch<T, T, T>(name, out, in, AbsGradX{}); break;
      case Unary::sqrt: launch<T, T, T>(name, out, in, SqrtGradY{}); break;
      case Unary::rsqrt: launch<T, T, T>(name, out, in, RsqrtGradY{}); break;
      case Unary::tanh: launch<T, T, T>(name, out, in, TanhGradY{}); break;
      case Unary::sigmoid: launch<T, T, T>(name, out, in, SigmoidGradY{}); break;
      case Unary::relu: launch<T, T, T>(name, out, in, ReluGradY{}); break;
      case Unary::gelu: launch<T, T, T>(name, out, in, GeluGradX{}); break;
      case Unary::gelu_tanh: launch<T, T, T>(name, out, in, GeluTanhGradX{}); break;
      case Unary::silu: launch<T, T, T>(name, out, in, SiluGradX{}); break;
      default: fail("[{}] internal: no raw backward kernel for this op", name);
    }
  });
}

void clamp_grad(const Tensor& out, const Tensor& g, const Tensor& x, std::optional<double> lo,
                std::optional<double> hi) {
  TANDEM_DISPATCH_FLOATING(out.dtype(), "clamp", [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    launch<T, T, T>("clamp", out, {g, x},
                    ClampGradX<C>{lo ? static_cast<C>(*lo) : C(0), hi ? static_cast<C>(*hi) : C(0), lo.has_value(),
                                  hi.has_value()});
  });
}

void pow_scalar_grad(const Tensor& out, const Tensor& g, const Tensor& x, double exponent) {
  TANDEM_DISPATCH_FLOATING(out.dtype(), "pow", [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    launch<T, T, T>("pow", out, {g, x}, PowScalarGradX<C>{static_cast<C>(exponent)});
  });
}

void grad3(Grad3 op, const Tensor& out, const Tensor& g, const Tensor& a, const Tensor& b) {
  const char* name = op == Grad3::pow_base || op == Grad3::pow_exponent ? "pow"
                     : op == Grad3::div_other                          ? "div"
                     : op == Grad3::max_first || op == Grad3::max_second ? "maximum"
                                                                          : "minimum";
  TANDEM_DISPATCH_FLOATING(out.dtype(), name, [&] {
    using T = scalar_t;
    const std::array<Operand, 3> in{g, a, b};
    switch (op) {
      case Grad3::pow_base: launch<T, T, T, T>(name, out, in, PowGradBase{}); break;
      case Grad3::pow_exponent: launch<T, T, T, T>(name, out, in, PowGradExponent{}); break;
      case Grad3::div_other: launch<T, T, T, T>(name, out, in, DivGradOther{}); break;
      case Grad3::max_first: launch<T, T, T, T>(name, out, in, ExtremeGrad<true, true>{}); break;
      case Grad3::max_second: launch<T, T, T, T>(name, out, in, ExtremeGrad<true, false>{}); break;
      case Grad3::min_first: launch<T, T, T, T>(name, out, in, ExtremeGrad<false, true>{}); break;
      case Grad3::min_second: launch<T, T, T, T>(name, out, in, ExtremeGrad<false, false>{}); break;
    }
  });
}

void where_grad(const Tensor& out, const Tensor& cond, const Tensor& g, bool take_true) {
  TANDEM_DISPATCH_FLOATING(out.dtype(), "where", [&] {
    using T = scalar_t;
    launch<T, bool, T>("where", out, {cond, g}, WhereGrad<acc_t<T>>{take_true});
  });
}

}  // namespace tandem::cuda::ew_impl
