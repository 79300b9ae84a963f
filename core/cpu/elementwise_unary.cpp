// The CPU unary ops of core/detail/elementwise.h: unary math, pow with a scalar exponent, clamp, and the
// optimizer-style in-place ternaries (addcmul_, addcdiv_, lerp_).
#include <cmath>
#include <type_traits>

#include "core/detail/elementwise.h"
#include "core/cpu/elementwise_loops.h"

namespace tandem::detail {

// ---------------------------------------------------------------- unary

Tensor unary(Unary op, const Tensor& a) {
  const char* name = op_name(op);
  switch (op) {
    case Unary::logical_not:
    case Unary::isnan:
    case Unary::isinf: {
      Tensor out = make_empty(a.shape(), boolean, a.device(), name);
      if (!out.is_cpu()) [[unlikely]] {
        if (out.numel() > 0) elementwise_table(out, name).unary(op, out, a);
        return out;
      }
      TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
        using T = scalar_t;
        if (op == Unary::logical_not) map<bool, T>(out, {&a}, LogicalNot{});
        if (op == Unary::isnan) map<bool, T>(out, {&a}, IsNan{});
        if (op == Unary::isinf) map<bool, T>(out, {&a}, IsInf{});
      });
      return out;
    }
    case Unary::neg:
    case Unary::abs:
    case Unary::relu: {
      TANDEM_CHECK(a.dtype() != boolean, "[{}] not supported for bool tensors{}", name,
                   op == Unary::neg ? "; use logical_not" : "");
      Tensor out = make_empty(a.shape(), a.dtype(), a.device(), name);
      if (!out.is_cpu()) [[unlikely]] {
        if (out.numel() > 0) elementwise_table(out, name).unary(op, out, a);
        return out;
      }
      TANDEM_DISPATCH_NUMERIC(a.dtype(), name, [&] {
        using T = scalar_t;
        if (op == Unary::neg) map<T, T>(out, {&a}, Neg{});
        if (op == Unary::abs) map<T, T>(out, {&a}, Abs{});
        if (op == Unary::relu) map<T, T>(out, {&a}, Relu{});
      });
      return out;
    }
    default: break;
  }
  // Floating math: integer and bool inputs promote to the default float, as in PyTorch.
  Tensor A = is_floating(a.dtype()) ? a : cast(a, kDefaultFloat, name);
  Tensor out = make_empty(a.shape(), A.dtype(), a.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, name).unary(op, out, A);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(A.dtype(), name, [&] {
    using T = scalar_t;
    const std::array<const Tensor*, 1> in{&A};
    switch (op) {
      case Unary::exp: map<T, T>(out, in, Exp{}); break;
      case Unary::log: map<T, T>(out, in, Log{}); break;
      case Unary::sqrt: map<T, T>(out, in, Sqrt{}); break;
      case Unary::rsqrt: map<T, T>(out, in, Rsqrt{}); break;
      case Unary::tanh: map<T, T>(out, in, Tanh{}); break;
      case Unary::sigmoid: map<T, T>(out, in, Sigmoid{}); break;
      case Unary::gelu: map<T, T>(out, in, Gelu{}); break;
      case Unary::gelu_tanh: map<T, T>(out, in, GeluTanh{}); break;
      case Unary::silu: map<T, T>(out, in, Silu{}); break;
      default: fail("[{}] internal: not a floating unary op", name);
    }
  });
  return out;
}

Tensor pow_scalar(const Tensor& a, const Scalar& exponent) {
  TANDEM_CHECK(a.dtype() != boolean, "[pow] not supported for bool tensors");
  Dtype ct = result_type(a, exponent);
  TANDEM_CHECK(!(is_integral(ct) && exponent.value < 0),
               "[pow] integers to negative integer powers are not allowed (exponent {}, tensor dtype {})",
               exponent.value, a.dtype());
  Tensor A = cast(a, ct, "pow");
  Tensor out = make_empty(a.shape(), ct, a.device(), "pow");
  const double e = exponent.value;
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, "pow").pow_scalar(out, A, e);
    return out;
  }
  TANDEM_DISPATCH_NUMERIC(ct, "pow", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    const std::array<const Tensor*, 1> in{&A};
    if (e == 1) {
      map<T, T>(out, in, Identity{});
    } else if (e == 2) {
      map<T, T>(out, in, Square{});
    } else if (e == 3) {
      map<T, T>(out, in, Cube{});
    } else if constexpr (std::is_floating_point_v<C>) {
      if (e == 0.5) {
        map<T, T>(out, in, Sqrt{});
      } else if (e == -0.5) {
        map<T, T>(out, in, Rsqrt{});
      } else if (e == -1) {
        map<T, T>(out, in, Reciprocal{});
      } else {
        map<T, T>(out, in, PowScalar<C>{static_cast<C>(e)});
      }
    } else {
      map<T, T>(out, in, PowScalar<C>{static_cast<C>(e)});
    }
  });
  return out;
}

namespace {
// Bounds given as doubles: whole numbers keep an integer tensor's dtype, fractional ones
// promote it to f32 (PyTorch decides by the bound's Python type; a double is all we get).
Dtype clamp_dtype(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  Dtype d = a.dtype();
  for (auto b : {lo, hi}) {
    if (!b) continue;
    Scalar s = *b;
    s.integral = std::isfinite(*b) && std::floor(*b) == *b;
    d = promote_types(d, result_type(a, s));
  }
  return d;
}

template <class C> Clamp<C> make_clamp(std::optional<double> lo, std::optional<double> hi) {
  return Clamp<C>{lo ? static_cast<C>(*lo) : C(0), hi ? static_cast<C>(*hi) : C(0), lo.has_value(), hi.has_value()};
}
}  // namespace

Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi, const char* op) {
  TANDEM_CHECK(lo || hi, "[{}] at least one of lo and hi must be given", op);
  TANDEM_CHECK(!(lo && std::isnan(*lo)) && !(hi && std::isnan(*hi)), "[{}] bounds must not be NaN", op);
  Dtype ct = clamp_dtype(a, lo, hi);
  TANDEM_CHECK(ct != boolean, "[{}] not supported for bool tensors", op);
  for (auto bound : {lo, hi})
    if (bound) check_scalar_fits(*bound, ct, op);  // a whole bound keeps an integer dtype
  Tensor A = cast(a, ct, op);
  Tensor out = make_empty(a.shape(), ct, a.device(), op);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, op).clamp(out, A, lo, hi);
    return out;
  }
  TANDEM_DISPATCH_NUMERIC(ct, op, [&] {
    using T = scalar_t;
    map<T, T>(out, {&A}, make_clamp<C_t<T>>(lo, hi));
  });
  return out;
}

void clamp_(const Tensor& self, std::optional<double> lo, std::optional<double> hi) {
  TANDEM_CHECK(lo || hi, "[clamp_] at least one of lo and hi must be given");
  TANDEM_CHECK(!(lo && std::isnan(*lo)) && !(hi && std::isnan(*hi)), "[clamp_] bounds must not be NaN");
  Dtype ct = clamp_dtype(self, lo, hi);
  check_cast(ct, self.dtype(), "clamp_");
  TANDEM_CHECK(ct != boolean, "[clamp_] not supported for bool tensors");
  for (auto bound : {lo, hi})
    if (bound) check_scalar_fits(*bound, ct, "clamp_");
  check_writable(self, "clamp_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, "clamp_").clamp(self, self, lo, hi);
    return;
  }
  TANDEM_DISPATCH_NUMERIC(self.dtype(), "clamp_", [&] {
    using T = scalar_t;
    map<T, T>(self, {&self}, make_clamp<C_t<T>>(lo, hi));
  });
}

namespace {
// self, a, b for the optimizer-style ternary in-place ops: floating self, operands cast to it.
struct Ternary {
  Tensor a, b;
};
Ternary prepare_ternary(const Tensor& self, const Tensor& a, const Tensor& b, const char* name) {
  check_same_device(name, {{"self", self}, {"tensor1", a}, {"tensor2", b}});
  check_floating(self, name, "self");
  check_cast(result_type(self, a, b), self.dtype(), name);
  check_broadcasts_to(a, self, "tensor1", name);
  check_broadcasts_to(b, self, "tensor2", name);
  check_writable(self, name);
  return {cast(unaliased(self, a, name), self.dtype(), name), cast(unaliased(self, b, name), self.dtype(), name)};
}
}  // namespace

void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Ternary t = prepare_ternary(self, a, b, "addcmul_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, "addcmul_").pointwise3(Pointwise3::addcmul, self, t.a, t.b, alpha);
    return;
  }
  TANDEM_DISPATCH_FLOATING(self.dtype(), "addcmul_", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    map<T, T, T, T>(self, {&self, &t.a, &t.b}, AddCMul<C>{static_cast<C>(alpha.value)});
  });
}

void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  Ternary t = prepare_ternary(self, a, b, "addcdiv_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, "addcdiv_").pointwise3(Pointwise3::addcdiv, self, t.a, t.b, alpha);
    return;
  }
  TANDEM_DISPATCH_FLOATING(self.dtype(), "addcdiv_", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    map<T, T, T, T>(self, {&self, &t.a, &t.b}, AddCDiv<C>{static_cast<C>(alpha.value)});
  });
}

void lerp_(const Tensor& self, const Tensor& end_in, const Scalar& weight) {
  check_same_device("lerp_", {{"self", self}, {"end", end_in}});
  check_floating(self, "lerp_", "self");
  TANDEM_CHECK(end_in.dtype() == self.dtype(), "[lerp_] expected end to have dtype {} like self, got {}",
               self.dtype(), end_in.dtype());
  check_broadcasts_to(end_in, self, "end", "lerp_");
  check_writable(self, "lerp_");
  Tensor end = unaliased(self, end_in, "lerp_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, "lerp_").lerp(self, end, weight);
    return;
  }
  TANDEM_DISPATCH_FLOATING(self.dtype(), "lerp_", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    map<T, T, T>(self, {&self, &end}, Lerp<C>{static_cast<C>(weight.value)});
  });
}

}  // namespace tandem::detail
