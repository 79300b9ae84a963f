// The CPU binary ops of core/detail/elementwise.h: arithmetic, comparisons and logic, tensor-tensor and
// tensor-scalar, out of place and in place, and copy_divided (a converting copy fused with a
// division by a scalar).
#include <type_traits>

#include "core/detail/elementwise.h"
#include "core/cpu/elementwise_loops.h"

namespace tandem::detail {

namespace {

bool is_comparison(Binary op) { return op >= Binary::eq && op <= Binary::ge; }
bool is_logical(Binary op) { return op >= Binary::logical_and && op <= Binary::logical_xor; }

// The dtype the op computes in, given the promoted operand dtype, and checks on it.
Dtype compute_dtype(Binary op, Dtype promoted, const Scalar& alpha, const char* name) {
  switch (op) {
    case Binary::div:
      return is_floating(promoted) ? promoted : kDefaultFloat;
    case Binary::sub:
      TANDEM_CHECK(promoted != boolean,
                   "[{}] subtraction with bool tensors is not supported; use logical_xor or logical_not", name);
      [[fallthrough]];
    case Binary::add:
      TANDEM_CHECK(!(is_integral(promoted, true) && !alpha.integral),
                   "[{}] alpha must be an integral number for a {} result, got {}", name, promoted, alpha.value);
      return promoted;
    case Binary::pow:
      TANDEM_CHECK(promoted != boolean, "[{}] not supported for bool tensors", name);
      return promoted;
    default:
      return promoted;
  }
}

// out = a op b, with a and b already of dtype `dt` (out may be bool for comparisons).
void run_binary(Binary op, const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  const char* name = op_name(op);
  TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
    using T = scalar_t;
    using C = C_t<T>;
    const std::array<const Tensor*, 2> ab{&a, &b};
    switch (op) {
      case Binary::add: map<T, T, T>(out, ab, Add<C>{static_cast<C>(alpha.value)}); break;
      case Binary::sub:
        if constexpr (!std::is_same_v<T, bool>) map<T, T, T>(out, ab, Sub<C>{static_cast<C>(alpha.value)});
        break;
      case Binary::mul: map<T, T, T>(out, ab, Mul{}); break;
      case Binary::div:
        if constexpr (std::is_floating_point_v<C>) map<T, T, T>(out, ab, Div{});
        break;
      case Binary::maximum: map<T, T, T>(out, ab, Maximum{}); break;
      case Binary::minimum: map<T, T, T>(out, ab, Minimum{}); break;
      case Binary::pow:
        if constexpr (!std::is_same_v<T, bool>) map<T, T, T>(out, ab, Pow{});
        break;
      case Binary::eq: map<bool, T, T>(out, ab, Eq{}); break;
      case Binary::ne: map<bool, T, T>(out, ab, Ne{}); break;
      case Binary::lt: map<bool, T, T>(out, ab, Lt{}); break;
      case Binary::le: map<bool, T, T>(out, ab, Le{}); break;
      case Binary::gt: map<bool, T, T>(out, ab, Gt{}); break;
      case Binary::ge: map<bool, T, T>(out, ab, Ge{}); break;
      case Binary::logical_and: map<bool, T, T>(out, ab, LogicalAnd{}); break;
      case Binary::logical_or: map<bool, T, T>(out, ab, LogicalOr{}); break;
      case Binary::logical_xor: map<bool, T, T>(out, ab, LogicalXor{}); break;
    }
  });
}

// out = a op s (or s op a when scalar_first), a already of dtype `dt`.
void run_binary_scalar(Binary op, const Tensor& out, const Tensor& a, const Scalar& s, bool scalar_first) {
  const char* name = op_name(op);
  TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
    using T = scalar_t;
    using C = C_t<T>;
    const C sv = static_cast<C>(s.value);
    auto apply = [&]<class O>(auto f) {
      if (scalar_first) {
        map<O, T>(out, {&a}, [f, sv](C x) { return f(sv, x); });
      } else {
        map<O, T>(out, {&a}, [f, sv](C x) { return f(x, sv); });
      }
    };
    switch (op) {
      case Binary::add: apply.template operator()<T>(Add<C>{C(1)}); break;
      case Binary::sub:
        if constexpr (!std::is_same_v<T, bool>) apply.template operator()<T>(Sub<C>{C(1)});
        break;
      case Binary::mul: apply.template operator()<T>(Mul{}); break;
      case Binary::div:
        if constexpr (std::is_floating_point_v<C>) apply.template operator()<T>(Div{});
        break;
      case Binary::maximum: apply.template operator()<T>(Maximum{}); break;
      case Binary::minimum: apply.template operator()<T>(Minimum{}); break;
      case Binary::pow:
        if constexpr (!std::is_same_v<T, bool>) apply.template operator()<T>(Pow{});
        break;
      case Binary::eq: apply.template operator()<bool>(Eq{}); break;
      case Binary::ne: apply.template operator()<bool>(Ne{}); break;
      case Binary::lt: apply.template operator()<bool>(Lt{}); break;
      case Binary::le: apply.template operator()<bool>(Le{}); break;
      case Binary::gt: apply.template operator()<bool>(Gt{}); break;
      case Binary::ge: apply.template operator()<bool>(Ge{}); break;
      case Binary::logical_and: apply.template operator()<bool>(LogicalAnd{}); break;
      case Binary::logical_or: apply.template operator()<bool>(LogicalOr{}); break;
      case Binary::logical_xor: apply.template operator()<bool>(LogicalXor{}); break;
    }
  });
}

Dtype out_dtype(Binary op, Dtype compute) { return is_comparison(op) || is_logical(op) ? boolean : compute; }

}  // namespace

// ---------------------------------------------------------------- binary

Tensor binary(Binary op, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  const char* name = op_name(op);
  if (!(a.device() == b.device())) [[unlikely]] {
    Tensor a2 = a, b2 = b;
    move_cpu_scalars<2>(name, {&a2, &b2}, {"a", "b"});
    return binary(op, a2, b2, alpha);
  }
  Dtype ct = compute_dtype(op, result_type(a, b), alpha, name);
  Tensor ac, bc;  // converted operands, only when the dtype differs
  if (a.dtype() != ct) ac = cast(a, ct, name);
  if (b.dtype() != ct) bc = cast(b, ct, name);
  const Tensor& A = ac.defined() ? ac : a;
  const Tensor& B = bc.defined() ? bc : b;
  Tensor out = a.shape() == b.shape()
                   ? make_empty(a.shape(), out_dtype(op, ct), a.device(), name)
                   : make_empty(broadcast_shapes(a.shape(), b.shape(), name), out_dtype(op, ct), a.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, name).binary(op, out, A, B, alpha);
    return out;
  }
  run_binary(op, out, A, B, alpha);
  return out;
}

Tensor binary(Binary op, const Tensor& a, const Scalar& b) {
  const char* name = op_name(op);
  Dtype ct = compute_dtype(op, result_type(a, b), 1, name);
  Tensor A = cast(a, ct, name);
  Tensor out = make_empty(a.shape(), out_dtype(op, ct), a.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, name).binary_scalar(op, out, A, b, /*scalar_first=*/false);
    return out;
  }
  run_binary_scalar(op, out, A, b, /*scalar_first=*/false);
  return out;
}

Tensor binary(Binary op, const Scalar& a, const Tensor& b) {
  const char* name = op_name(op);
  Dtype ct = compute_dtype(op, result_type(b, a), 1, name);
  Tensor B = cast(b, ct, name);
  Tensor out = make_empty(b.shape(), out_dtype(op, ct), b.device(), name);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, name).binary_scalar(op, out, B, a, /*scalar_first=*/true);
    return out;
  }
  run_binary_scalar(op, out, B, a, /*scalar_first=*/true);
  return out;
}

void binary_(Binary op, const Tensor& self, const Tensor& other_in, const Scalar& alpha, const char* name) {
  if (!(self.device() == other_in.device())) [[unlikely]] {
    Tensor other = other_in;
    if (other.is_cpu() && other.dim() == 0) other = to_device(other, self.device());
    check_same_device(name, {{"self", self}, {"other", other}});
    return binary_(op, self, other, alpha, name);
  }
  Dtype ct = compute_dtype(op, result_type(self, other_in), alpha, name);
  Dtype out_dt = out_dtype(op, ct);
  check_cast(out_dt, self.dtype(), name);
  check_broadcasts_to(other_in, self, "other", name);
  check_writable(self, name);
  if (ct != self.dtype() || out_dt != ct) {
    // Computed in the promoted type, then cast into self (PyTorch's in-place semantics).
    copy(self, binary(op, self, other_in, alpha), name);
    return;
  }
  Tensor other = unaliased(self, other_in, name);
  if (other.dtype() != ct) other = cast(other, ct, name);
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, name).binary(op, self, self, other, alpha);
    return;
  }
  run_binary(op, self, self, other, alpha);
}

void binary_(Binary op, const Tensor& self, const Scalar& other, const char* name) {
  Dtype ct = compute_dtype(op, result_type(self, other), 1, name);
  Dtype out_dt = out_dtype(op, ct);
  check_cast(out_dt, self.dtype(), name);
  check_writable(self, name);
  if (ct != self.dtype() || out_dt != ct) {
    copy(self, binary(op, self, other), name);
    return;
  }
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, name).binary_scalar(op, self, self, other, /*scalar_first=*/false);
    return;
  }
  run_binary_scalar(op, self, self, other, /*scalar_first=*/false);
}

void copy_divided(const Tensor& self, const Tensor& src_in, double divisor, const char* name) {
  TANDEM_CHECK(self.defined() && src_in.defined(), "[{}] undefined tensor", name);
  check_floating(self, name, "destination");
  TANDEM_CHECK(self.shape() == src_in.shape(), "[{}] shapes differ: destination {}, source {}", name, self.shape(),
               src_in.shape());
  check_writable(self, name);
  Tensor src = src_in.device() == self.device() ? src_in : to_device(src_in, self.device());
  if (src.dtype() != self.dtype()) src = cast(src, self.dtype(), name);
  src = unaliased(self, src, name);
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, name).binary_scalar(Binary::div, self, src, Scalar(divisor), false);
    return;
  }
  run_binary_scalar(Binary::div, self, src, Scalar(divisor), /*scalar_first=*/false);
}

}  // namespace tandem::detail
