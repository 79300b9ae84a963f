// Elementwise ops: the per-element math (functors the CPU kernels and a CUDA backend share) and
// the forward and raw backward kernels, defined in core/cpu/elementwise.cpp (fill, where),
// elementwise_binary.cpp, elementwise_unary.cpp and elementwise_backward.cpp over the loops of
// core/cpu/elementwise_loops.h; PyTorch's result-type rules are in core/dtype.h. No autograd here:
// autograd/elementwise_grad.cpp wires these into the public ops of autograd/ops.h.
//
// Functors take and return the compute type C = acc_t<T> of the element type T (float for the
// 2-byte floats), so f16/bf16 are rounded once per op, on store.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/detail/checks.h"
// The casts and copies (copy_, cast, to_device, ...) live there; the ops here use them, and so
// does move_cpu_scalars below. Their device kernel is this family's table's `copy`.
#include "core/detail/copy.h"
#include "core/detail/fast_math.h"
#include "core/detail/kernel_tables.h"
#include "core/macros.h"
#include "core/tensor.h"

namespace tandem::detail {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Reads an element in its compute type / writes a compute-type value as element type Out.
template <class T>
TANDEM_HOST_DEVICE TANDEM_INLINE acc_t<T> load(T v) {
  return static_cast<acc_t<T>>(v);
}
template <class Out, class V>
TANDEM_HOST_DEVICE TANDEM_INLINE Out store(V v) {
  if constexpr (is_half_v<Out>) {
    return Out(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Out, bool>) {
    return v != V(0);  // NaN is true, as in PyTorch
  } else {
    return static_cast<Out>(v);
  }
}

// ---------------------------------------------------------------- binary arithmetic
template <class C> struct Add {
  C alpha;
  TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) {
      return a || (alpha && b);
    } else {
      return a + alpha * b;
    }
  }
};
template <class C> struct Sub {  // never instantiated for bool (rejected before dispatch)
  C alpha;
  TANDEM_HOST_DEVICE C operator()(C a, C b) const { return a - alpha * b; }
};
struct Mul {
  template <class C> TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) {
      return a && b;
    } else {
      return a * b;
    }
  }
};
struct Div {  // floating only: integer division promotes to f32 first
  template <class C> TANDEM_HOST_DEVICE C operator()(C a, C b) const { return a / b; }
};
// maximum/minimum propagate NaN, as PyTorch's do.
struct Maximum {
  template <class C> TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
};
struct Minimum {
  template <class C> TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
};

// Integer power by squaring; negative exponents give what integer division would: 1 for base
// 1, +-1 for base -1, 0 otherwise (PyTorch's CPU kernel for tensor exponents).
template <class C>
TANDEM_HOST_DEVICE C int_pow(C base, C e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e % 2 == 0) ? C(1) : C(-1);
    return 0;
  }
  C result = 1;
  while (e) {
    if (e & 1) result = static_cast<C>(result * base);
    e >>= 1;
    base = static_cast<C>(base * base);
  }
  return result;
}
struct Pow {
  template <class C> TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_floating_point_v<C>) {
      return std::pow(a, b);
    } else if constexpr (std::is_same_v<C, bool>) {
      return a || !b;  // 1^b = 1, 0^0 = 1, 0^1 = 0
    } else {
      return int_pow(a, b);
    }
  }
};
// Scalar exponents: the common ones avoid std::pow (as PyTorch's pow does).
struct Square {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return x * x; }
};
struct Cube {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return x * x * x; }
};
struct Reciprocal {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return C(1) / x; }
};
template <class C> struct PowScalar {
  C e;
  TANDEM_HOST_DEVICE C operator()(C x) const { return Pow{}(x, e); }
};

// ---------------------------------------------------------------- comparisons and logic
struct Eq { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a == b; } };
struct Ne { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a != b; } };
struct Lt { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a < b; } };
struct Le { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a <= b; } };
struct Gt { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a > b; } };
struct Ge { template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return a >= b; } };
struct LogicalAnd {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return (a != C(0)) && (b != C(0)); }
};
struct LogicalOr {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return (a != C(0)) || (b != C(0)); }
};
struct LogicalXor {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a, C b) const { return (a != C(0)) != (b != C(0)); }
};
struct LogicalNot {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a) const { return a == C(0); }
};
struct IsNan {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a) const { return a != a; }
};
struct IsInf {
  template <class C> TANDEM_HOST_DEVICE bool operator()(C a) const {
    if constexpr (std::is_floating_point_v<C>) {
      return std::isinf(a);
    } else {
      return false;
    }
  }
};

// ---------------------------------------------------------------- unary math
struct Identity {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return x; }
};
struct Neg {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return -x; }
};
struct Abs {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      return std::fabs(x);  // abs(-0.0) is +0.0
    } else {
      return x < 0 ? static_cast<C>(-x) : x;
    }
  }
};
struct Exp { template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return std::exp(x); } };
struct Log { template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return std::log(x); } };
struct Sqrt { template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return std::sqrt(x); } };
struct Rsqrt {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return C(1) / std::sqrt(x); }
};
struct Tanh { template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return std::tanh(x); } };
struct Sigmoid {
  // exp(-x) overflows to inf for very negative x, giving 1/inf = 0: no NaN.
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return C(1) / (C(1) + std::exp(-x)); }
};
struct Relu {
  // `x < 0 ? 0 : x` keeps NaN (PyTorch's relu propagates it).
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return x < C(0) ? C(0) : x; }
};
// gelu(x) = x * Phi(x), Phi the standard normal CDF.
struct Gelu {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const {
    constexpr C kSqrt1_2 = C(0.70710678118654752440);
#if !defined(__CUDA_ARCH__)
    // f32 on the CPU: the vectorisable erf (PyTorch's own f32 approximation); a call to erff per
    // element made GELU a fifth of a GPT step.
    if constexpr (std::is_same_v<C, float>) return 0.5f * x * (1.0f + fast_erf(x * kSqrt1_2));
#endif
    return C(0.5) * x * (C(1) + std::erf(x * kSqrt1_2));
  }
};
// PyTorch's approximate="tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const {
    constexpr C kBeta = C(0.79788456080286535588);  // sqrt(2 / pi)
    constexpr C kKappa = C(0.044715);
    C inner = kBeta * (x + kKappa * x * x * x);
    return C(0.5) * x * (C(1) + std::tanh(inner));
  }
};
struct Silu {
  template <class C> TANDEM_HOST_DEVICE C operator()(C x) const { return x / (C(1) + std::exp(-x)); }
};
// min(max(x, lo), hi) as PyTorch: NaN passes through; lo > hi gives hi everywhere.
template <class C> struct Clamp {
  C lo, hi;
  bool has_lo, has_hi;
  TANDEM_HOST_DEVICE C operator()(C x) const {
    if (has_lo) x = x < lo ? lo : x;
    if (has_hi) x = x > hi ? hi : x;
    return x;
  }
};
struct Where {
  template <class C> TANDEM_HOST_DEVICE C operator()(bool c, C a, C b) const { return c ? a : b; }
};
// self + w (end - self), switching form at w = 0.5 so w = 1 gives end exactly (PyTorch's lerp).
template <class C> struct Lerp {
  C w;
  TANDEM_HOST_DEVICE C operator()(C self, C end) const {
    C diff = end - self;
    return (w < C(0.5)) ? self + w * diff : end - diff * (C(1) - w);
  }
};
template <class C> struct AddCMul {
  C alpha;
  TANDEM_HOST_DEVICE C operator()(C self, C a, C b) const { return self + alpha * a * b; }
};
template <class C> struct AddCDiv {
  C alpha;
  TANDEM_HOST_DEVICE C operator()(C self, C a, C b) const { return self + alpha * a / b; }
};

// ---------------------------------------------------------------- backward math
// (g, s): s is the forward input x or output y, as each name says.
struct AbsGradX {  // sign(x) g; 0 at x = 0 (PyTorch's subgradient)
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C x) const {
    return x > C(0) ? g : (x < C(0) ? -g : C(0));
  }
};
struct SqrtGradY {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C y) const { return g / (C(2) * y); }
};
struct RsqrtGradY {  // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C y) const { return C(-0.5) * g * y * y * y; }
};
struct TanhGradY {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C y) const { return g * (C(1) - y * y); }
};
struct SigmoidGradY {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C y) const { return g * y * (C(1) - y); }
};
struct ReluGradY {  // 0 at 0, as PyTorch's threshold_backward
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C y) const { return y > C(0) ? g : C(0); }
};
struct GeluGradX {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C x) const {
    constexpr C kSqrt1_2 = C(0.70710678118654752440);
    constexpr C kInvSqrt2Pi = C(0.39894228040143267794);  // 1 / sqrt(2 pi)
#if !defined(__CUDA_ARCH__)
    if constexpr (std::is_same_v<C, float>)  // as Gelu's
      return g * (0.5f * (1.0f + fast_erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * fast_exp(-0.5f * x * x));
#endif
    C cdf = C(0.5) * (C(1) + std::erf(x * kSqrt1_2));
    C pdf = kInvSqrt2Pi * std::exp(C(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct GeluTanhGradX {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C x) const {
    constexpr C kBeta = C(0.79788456080286535588);
    constexpr C kKappa = C(0.044715);
    C x2 = x * x;
    C t = std::tanh(kBeta * (x + kKappa * x2 * x));
    C left = C(0.5) * x;
    C left_derivative = C(0.5) * (C(1) + t);
    C right_derivative = left * (C(1) - t * t) * kBeta * (C(1) + C(3) * kKappa * x2);
    return g * (left_derivative + right_derivative);
  }
};
struct SiluGradX {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C x) const {
    C s = C(1) / (C(1) + std::exp(-x));
    return g * s * (C(1) + x * (C(1) - s));
  }
};
template <class C> struct ClampGradX {  // passes where lo <= x <= hi
  C lo, hi;
  bool has_lo, has_hi;
  TANDEM_HOST_DEVICE C operator()(C g, C x) const {
    bool pass = (!has_lo || x >= lo) && (!has_hi || x <= hi);
    return pass ? g : C(0);
  }
};
template <class C> struct PowScalarGradX {  // e x^(e-1) g; 0 for e = 0 (also at x = 0)
  C e;
  TANDEM_HOST_DEVICE C operator()(C g, C x) const { return e == C(0) ? C(0) : g * e * std::pow(x, e - C(1)); }
};
struct PowGradBase {  // (g, a, b): b a^(b-1) g, 0 where b = 0
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C a, C b) const {
    return b == C(0) ? C(0) : g * b * std::pow(a, b - C(1));
  }
};
struct PowGradExponent {  // (g, a, b): a^b log(a) g, 0 where a = 0 and b >= 0 (PyTorch)
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C a, C b) const {
    return (a == C(0) && b >= C(0)) ? C(0) : g * std::pow(a, b) * std::log(a);
  }
};
struct DivGradOther {  // (g, a, b): d(a/b)/db g = -a g / b^2
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C a, C b) const { return -g * a / (b * b); }
};
// maximum/minimum: the gradient goes to the selected input, split equally on ties.
template <bool kMax, bool kFirst> struct ExtremeGrad {
  template <class C> TANDEM_HOST_DEVICE C operator()(C g, C a, C b) const {
    if (a == b) return g / C(2);
    C mine = kFirst ? a : b, theirs = kFirst ? b : a;
    bool loses = kMax ? (mine < theirs) : (mine > theirs);
    return loses ? C(0) : g;
  }
};

// ================================================================ kernels (CPU)

enum class Binary : uint8_t {
  add, sub, mul, div, maximum, minimum, pow,
  eq, ne, lt, le, gt, ge,
  logical_and, logical_or, logical_xor,
};
enum class Unary : uint8_t {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu, gelu_tanh, silu,
  logical_not, isnan, isinf,
};
const char* op_name(Binary op);
const char* op_name(Unary op);

// ================================================================ device kernels
// The kernel table a device backend registers (cuda/elementwise.cu) with
// register_device_kernels<ElementwiseDeviceKernels>. Core has already validated the arguments,
// promoted and cast the operands and allocated the result exactly as for the CPU loops: every
// tensor is on out's device, broadcasts to out's shape and already has the dtype the op computes in (the
// same dtypes the CPU kernels get). `out` may be any strided view (in-place ops pass self); an
// input aliases it only element for element.
enum class Pointwise3 : uint8_t { addcmul, addcdiv };
// Raw backward kernels (g, a, b) -> gradient, of the broadcast shape.
enum class Grad3 : uint8_t { pow_base, pow_exponent, div_other, max_first, max_second, min_first, min_second };

struct ElementwiseDeviceKernels {
  virtual ~ElementwiseDeviceKernels() = default;
  // out = a op b (alpha for add/sub); out is bool for comparisons and logic.
  virtual void binary(Binary op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) = 0;
  // out = a op s, or s op a when scalar_first.
  virtual void binary_scalar(Binary op, const Tensor& out, const Tensor& a, const Scalar& s, bool scalar_first) = 0;
  // a has out's dtype, except for logical_not/isnan/isinf (out bool, a any dtype).
  virtual void unary(Unary op, const Tensor& out, const Tensor& a) = 0;
  virtual void pow_scalar(const Tensor& out, const Tensor& a, double exponent) = 0;
  virtual void clamp(const Tensor& out, const Tensor& a, std::optional<double> lo, std::optional<double> hi) = 0;
  virtual void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  // dst = src converted to dst's dtype (any pair), src broadcast to dst's shape; no overlap.
  // Every copy reaches it through strided_copy (core/detail/copy.h).
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  virtual void fill(const Tensor& self, const Scalar& value) = 0;
  virtual void pointwise3(Pointwise3 op, const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha) = 0;
  virtual void lerp(const Tensor& self, const Tensor& end, const Scalar& weight) = 0;
  virtual void unary_grad(Unary op, const Tensor& out, const Tensor& g, const Tensor& s) = 0;
  virtual void clamp_grad(const Tensor& out, const Tensor& g, const Tensor& x, std::optional<double> lo,
                          std::optional<double> hi) = 0;
  virtual void pow_scalar_grad(const Tensor& out, const Tensor& g, const Tensor& x, double exponent) = 0;
  virtual void grad3(Grad3 op, const Tensor& out, const Tensor& g, const Tensor& a, const Tensor& b) = 0;
  // out = where(cond, g, 0) (take_true) or where(cond, 0, g).
  virtual void where_grad(const Tensor& out, const Tensor& cond, const Tensor& g, bool take_true) = 0;
};

// Out of place. Operands broadcast; integer `div` gives f32; comparisons and logic give bool.
// All tensors of an op are on one device, except that (as in PyTorch) a 0-dim CPU tensor may
// join binary ops, binary_'s `other` and where on another device: it is copied there first and
// keeps the type promotion of a 0-dim tensor.
Tensor binary(Binary op, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor binary(Binary op, const Tensor& a, const Scalar& b);
Tensor binary(Binary op, const Scalar& a, const Tensor& b);  // rsub, Scalar / Tensor
Tensor unary(Unary op, const Tensor& a);
Tensor pow_scalar(const Tensor& a, const Scalar& exponent);
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi, const char* op = "clamp");
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// In place (validation of dtypes and shapes included; no autograd check, no version bump).
void binary_(Binary op, const Tensor& self, const Tensor& other, const Scalar& alpha, const char* name);
void binary_(Binary op, const Tensor& self, const Scalar& other, const char* name);
void fill(const Tensor& self, const Scalar& value, const char* name = "fill_");
// self = src / divisor in one pass (src cast to self's floating dtype first if it differs): how
// DDP's reducer folds the division by the world size into the copy into a bucket.
void copy_divided(const Tensor& self, const Tensor& src, double divisor, const char* name = "copy_divided");
void clamp_(const Tensor& self, std::optional<double> lo, std::optional<double> hi);
void addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha);
void addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha);
void lerp_(const Tensor& self, const Tensor& end, const Scalar& weight);

// ---- raw backward kernels (fresh contiguous results; g has the forward output's shape) ----
// For abs, sqrt, rsqrt, tanh, sigmoid, relu, gelu, gelu_tanh, silu: `s` is the forward input
// (abs, gelu*, silu) or output (the others), see the functors above.
Tensor unary_grad(Unary op, const Tensor& g, const Tensor& s);
Tensor clamp_grad(const Tensor& g, const Tensor& x, std::optional<double> lo, std::optional<double> hi);
Tensor pow_scalar_grad(const Tensor& g, const Tensor& x, double exponent);
// Gradients for a and b of pow(a, b) and maximum/minimum(a, b), of the broadcast shape (the
// caller sums them to the input shape).
Tensor pow_grad_base(const Tensor& g, const Tensor& a, const Tensor& b);
Tensor pow_grad_exponent(const Tensor& g, const Tensor& a, const Tensor& b);
Tensor extreme_grad(const Tensor& g, const Tensor& a, const Tensor& b, bool is_max, bool first);
Tensor div_grad_other(const Tensor& g, const Tensor& a, const Tensor& b);
// where(cond, g, 0) (take_true) or where(cond, 0, g), of the broadcast shape of cond and g.
Tensor where_grad(const Tensor& cond, const Tensor& g, bool take_true);

// ---- the argument checks the ops of core/elementwise*.cpp share ----
// The kernel table of a non-CPU tensor's device (every op's device branch: `if (!out.is_cpu())`).
inline ElementwiseDeviceKernels& elementwise_table(const Tensor& t, const char* name) {
  return device_kernels<ElementwiseDeviceKernels>(t.device(), name);
}
// a's shape when b has it too, else the broadcast of the two (throws when there is none).
Shape broadcast_or_same(const Tensor& a, const Tensor& b, const char* op);
// In-place ops write through self's memory: a self with stride-0 (expanded) dims would have
// several elements land on one location, and an operand that partially overlaps self would be
// read after being written. The first is an error (as in PyTorch); the second gets a copy.
void check_writable(const Tensor& self, const char* name);
// `other` itself, or a copy of it when it overlaps self other than element for element.
Tensor unaliased(const Tensor& self, const Tensor& other, const char* name);
// Throws "[name] <what> of shape ... cannot be broadcast to self's shape ..." unless it can.
void check_broadcasts_to(const Tensor& other, const Tensor& self, const char* what, const char* name);
// Throws "[name] result type ... can't be cast to the desired output type ..." (can_cast).
void check_cast(Dtype result, Dtype self, const char* name);
// As PyTorch, a 0-dim CPU tensor may take part in an op on another device's tensors (binary ops
// and where); it is copied to that device (one element, stream-ordered), which keeps the type
// promotion of a 0-dim tensor. Any other mix of devices is an error. Only called once the
// operands' devices are known to differ.
template <size_t N>
void move_cpu_scalars(const char* op, const std::array<Tensor*, N>& ts, const std::array<const char*, N>& names) {
  const Tensor* anchor = nullptr;
  for (Tensor* t : ts) {
    if (!(t->is_cpu() && t->dim() == 0)) {
      anchor = t;
      break;
    }
  }
  if (anchor != nullptr) {
    const Device d = anchor->device();
    for (Tensor* t : ts)
      if (!(t->device() == d) && t->is_cpu() && t->dim() == 0) *t = to_device(*t, d);
  }
  if constexpr (N == 2) {
    check_same_device(op, {{names[0], *ts[0]}, {names[1], *ts[1]}});
  } else {
    check_same_device(op, {{names[0], *ts[0]}, {names[1], *ts[1]}, {names[2], *ts[2]}});
  }
}

}  // namespace tandem::detail
