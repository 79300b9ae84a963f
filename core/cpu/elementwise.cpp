// The CPU side of core/detail/elementwise.h shared by every elementwise op: op names, the device and
// in-place argument checks, fill and where. Binary ops are in elementwise_binary.cpp, unary math
// and the in-place ternaries in elementwise_unary.cpp, the raw backward kernels in
// elementwise_backward.cpp (as cuda/ splits them), and the loops they all run in
// core/cpu/elementwise_loops.h. Casts and copies (copy_ included) are core/detail/copy.cpp.
#include "core/detail/elementwise.h"

#include <algorithm>
#include <string>

#include "core/cpu/elementwise_loops.h"
#include "core/detail/iter.h"

namespace tandem::detail {

// ---------------------------------------------------------------- op names

const char* op_name(Binary op) {
  switch (op) {
    case Binary::add: return "add";
    case Binary::sub: return "sub";
    case Binary::mul: return "mul";
    case Binary::div: return "div";
    case Binary::maximum: return "maximum";
    case Binary::minimum: return "minimum";
    case Binary::pow: return "pow";
    case Binary::eq: return "eq";
    case Binary::ne: return "ne";
    case Binary::lt: return "lt";
    case Binary::le: return "le";
    case Binary::gt: return "gt";
    case Binary::ge: return "ge";
    case Binary::logical_and: return "logical_and";
    case Binary::logical_or: return "logical_or";
    case Binary::logical_xor: return "logical_xor";
  }
  return "?";
}

const char* op_name(Unary op) {
  switch (op) {
    case Unary::neg: return "neg";
    case Unary::abs: return "abs";
    case Unary::exp: return "exp";
    case Unary::log: return "log";
    case Unary::sqrt: return "sqrt";
    case Unary::rsqrt: return "rsqrt";
    case Unary::tanh: return "tanh";
    case Unary::sigmoid: return "sigmoid";
    case Unary::relu: return "relu";
    case Unary::gelu: return "gelu";
    case Unary::gelu_tanh: return "gelu";
    case Unary::silu: return "silu";
    case Unary::logical_not: return "logical_not";
    case Unary::isnan: return "isnan";
    case Unary::isinf: return "isinf";
  }
  return "?";
}

// ---------------------------------------------------------------- argument checks

Shape broadcast_or_same(const Tensor& a, const Tensor& b, const char* op) {
  return a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), op);
}

void check_writable(const Tensor& self, const char* name) {
  for (size_t d = 0; d < self.shape().size(); ++d) {
    TANDEM_CHECK(!(self.strides()[d] == 0 && self.shape()[d] > 1),
                 "[{}] self (shape {}, strides {}) has elements that share memory (an expanded view); clone it "
                 "before writing in place",
                 name, self.shape(), self.strides());
  }
}
Tensor unaliased(const Tensor& self, const Tensor& other, const char* name) {
  if (other.storage() != self.storage()) return other;
  bool same_geometry = other.storage_offset() == self.storage_offset() && other.shape() == self.shape() &&
                       other.strides() == self.strides() && other.dtype() == self.dtype();
  if (same_geometry) return other;  // element i reads what element i writes: safe
  Tensor copy = make_empty(other.shape(), other.dtype(), other.device(), name);
  detail::copy(copy, other, name);
  return copy;
}
void check_broadcasts_to(const Tensor& other, const Tensor& self, const char* what, const char* name) {
  if (other.shape() == self.shape()) return;
  Shape s = broadcast_shapes(self.shape(), other.shape(), name);
  TANDEM_CHECK(s == self.shape(), "[{}] {} of shape {} cannot be broadcast to self's shape {}", name, what,
               other.shape(), self.shape());
}
void check_cast(Dtype result, Dtype self, const char* name) {
  TANDEM_CHECK(can_cast(result, self), "[{}] result type {} can't be cast to the desired output type {}", name, result,
               self);
}

// ---------------------------------------------------------------- fill

void fill(const Tensor& self, const Scalar& value, const char* name) {
  TANDEM_CHECK(self.defined(), "[{}] undefined tensor", name);
  check_writable(self, name);
  check_scalar_fits(value.value, self.dtype(), name);
  if (self.numel() == 0) return;
  if (!self.is_cpu()) [[unlikely]]
    return elementwise_table(self, name).fill(self, value);
  TANDEM_DISPATCH_ALL(self.dtype(), name, [&] {
    using T = scalar_t;
    const T v = store<T>(value.value);
    if (self.is_contiguous()) {
      std::fill_n(static_cast<T*>(self.data_ptr()), self.numel(), v);
      return;
    }
    for_each_output_run<1>(self.shape(), {&self}, [v](const StridedRun<1>& r) {
      char* p = r.ptr[0];
      for (int64_t i = 0; i < r.n; ++i, p += r.stride[0]) *reinterpret_cast<T*>(p) = v;
    });
  });
}

// ---------------------------------------------------------------- where

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (!(cond.device() == a.device() && a.device() == b.device())) [[unlikely]] {
    Tensor c2 = cond, a2 = a, b2 = b;
    move_cpu_scalars<3>("where", {&c2, &a2, &b2}, {"condition", "a", "b"});
    return where(c2, a2, b2);
  }
  TANDEM_CHECK(cond.dtype() == boolean, "[where] condition must be a bool tensor, got {} (shape {})", cond.dtype(),
               cond.shape());
  Shape shape = broadcast_shapes(broadcast_or_same(cond, a, "where"), b.shape(), "where");
  Dtype ct = result_type(a, b);
  Tensor A = cast(a, ct, "where"), B = cast(b, ct, "where");
  Tensor out = make_empty(shape, ct, a.device(), "where");
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) elementwise_table(out, "where").where(out, cond, A, B);
    return out;
  }
  TANDEM_DISPATCH_ALL(ct, "where", [&] {
    using T = scalar_t;
    map<T, bool, T, T>(out, {&cond, &A, &B}, Where{});
  });
  return out;
}

}  // namespace tandem::detail
