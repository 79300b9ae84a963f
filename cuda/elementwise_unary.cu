// CUDA unary math, pow with a scalar exponent, clamp and the optimizer-style in-place ternaries
// (addcmul_, addcdiv_, lerp_).
#include "cuda/detail/elementwise.cuh"

namespace tandem::cuda::ew_impl {

using namespace tandem::detail;  // the functors

namespace {

template <class C>
Clamp<C> make_clamp(std::optional<double> lo, std::optional<double> hi) {
  return Clamp<C>{lo ? static_cast<C>(*lo) : C(0), hi ? static_cast<C>(*hi) : C(0), lo.has_value(), hi.has_value()};
}

}  // namespace

void unary(Unary op, const Tensor& out, const Tensor& a) {
  const char* name = op_name(op);
  switch (op) {
    case Unary::logical_not:
    case Unary::isnan:
    case Unary::isinf:
      TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
        using T = scalar_t;
        if (op == Unary::logical_not) launch<bool, T>(name, out, {a}, LogicalNot{});
        if (op == Unary::isnan) launch<bool, T>(name, out, {a}, IsNan{});
        if (op == Unary::isinf) launch<bool, T>(name, out, {a}, IsInf{});
      });
      return;
    case Unary::neg:
    case Unary::abs:
    case Unary::relu:
      TANDEM_DISPATCH_NUMERIC(a.dtype(), name, [&] {
        using T = scalar_t;
        if (op == Unary::neg) launch<T, T>(name, out, {a}, Neg{});
        if (op == Unary::abs) launch<T, T>(name, out, {a}, Abs{});
        if (op == Unary::relu) launch<T, T>(name, out, {a}, Relu{});
      });
      return;
    default: break;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), name, [&] {
    using T = scalar_t;
    const std::array<Operand, 1> in{a};
    switch (op) {
      case Unary::exp: launch<T, T>(name, out, in, Exp{}); break;
      case Unary::log: launch<T, T>(name, out, in, Log{}); break;
      case Unary::sqrt: launch<T, T>(name, out, in, Sqrt{}); break;
      case Unary::rsqrt: launch<T, T>(name, out, in, Rsqrt{}); break;
      case Unary::tanh: launch<T, T>(name, out, in, Tanh{}); break;
      case Unary::sigmoid: launch<T, T>(name, out, in, Sigmoid{}); break;
      case Unary::gelu: launch<T, T>(name, out, in, Gelu{}); break;
      case Unary::gelu_tanh: launch<T, T>(name, out, in, GeluTanh{}); break;
      case Unary::silu: launch<T, T>(name, out, in, Silu{}); break;
      default: fail("[{}] internal: not a floating unary op", name);
    }
  });
}

// The CPU's choice of kernel per exponent, so both give the same bits.
void pow_scalar(const Tensor& out, const Tensor& a, double e) {
  TANDEM_DISPATCH_NUMERIC(out.dtype(), "pow", [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    const std::array<Operand, 1> in{a};
    if (e == 1) {
      launch<T, T>("pow", out, in, Identity{});
    } else if (e == 2) {
      launch<T, T>("pow", out, in, Square{});
    } else if (e == 3) {
      launch<T, T>("pow", out, in, Cube{});
    } else if constexpr (std::is_floating_point_v<C>) {
      if (e == 0.5) {
        launch<T, T>("pow", out, in, Sqrt{});
      } else if (e == -0.5) {
        launch<T, T>("pow", out, in, Rsqrt{});
      } else if (e == -1) {
        launch<T, T>("pow", out, in, Reciprocal{});
      } else {
        launch<T, T>("pow", out, in, PowScalar<C>{static_cast<C>(e)});
      }
    } else {
      launch<T, T>("pow", out, in, PowScalar<C>{static_cast<C>(e)});
    }
  });
}

void clamp(const Tensor& out, const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  TANDEM_DISPATCH_NUMERIC(out.dtype(), "clamp", [&] {
    using T = scalar_t;
    launch<T, T>("clamp", out, {a}, make_clamp<acc_t<T>>(lo, hi));
  });
}

void pointwise3(Pointwise3 op, const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  const char* name = op == Pointwise3::addcmul ? "addcmul_" : "addcdiv_";
  TANDEM_DISPATCH_FLOATING(self.dtype(), name, [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    const std::array<Operand, 3> in{self, a, b};
    if (op == Pointwise3::addcmul) {
      launch<T, T, T, T>(name, self, in, AddCMul<C>{static_cast<C>(alpha.value)});
    } else {
      launch<T, T, T, T>(name, self, in, AddCDiv<C>{static_cast<C>(alpha.value)});
    }
  });
}

void lerp(const Tensor& self, const Tensor& end, const Scalar& weight) {
  TANDEM_DISPATCH_FLOATING(self.dtype(), "lerp_", [&] {
    using T = scalar_t;
    using C = acc_t<T>;
    launch<T, T, T>("lerp_", self, {self, end}, Lerp<C>{static_cast<C>(weight.value)});
  });
}

}  // namespace tandem::cuda::ew_impl
