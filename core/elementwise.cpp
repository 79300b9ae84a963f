// The CPU side of core/elementwise.h shared by every elementwise op: op names, the device and
// in-place argument checks, casts and copies (also across devices), fill and where. Binary ops
// are in elementwise_binary.cpp, unary math and the in-place ternaries in elementwise_unary.cpp,
// the raw backward kernels in elementwise_backward.cpp (as cuda/ splits them), and the loops
// they all run in core/elementwise_loops.h.
#include "core/elementwise.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/backend.h"
#include "core/elementwise_loops.h"
#include "core/iter.h"

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

// ---------------------------------------------------------------- casts and copies

Tensor cast(const Tensor& a, Dtype dtype, const char* op) {
  if (a.dtype() == dtype) return a;
  Tensor out = make_empty(a.shape(), dtype, a.device(), op);
  copy(out, a, op);
  return out;
}

void copy(const Tensor& self, const Tensor& src_in, const char* name) {
  TANDEM_CHECK(self.defined() && src_in.defined(), "[{}] undefined tensor", name);
  check_broadcasts_to(src_in, self, "source", name);
  check_writable(self, name);
  if (!(self.device() == src_in.device())) [[unlikely]] {
    // Across devices: the bytes move in src's dtype and shape, then convert on self's device.
    copy(self, to_device(src_in, self.device()), name);
    return;
  }
  Tensor src = unaliased(self, src_in, name);
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) elementwise_table(self, name).copy(self, src);
    return;
  }
  TANDEM_DISPATCH_ALL(src.dtype(), name, [&] {
    using S = scalar_t;
    TANDEM_DISPATCH_ALL(self.dtype(), name, [&] {
      using D = scalar_t;
      map<D, S>(self, {&src}, Identity{});
    });
  });
}

void copy_same_dtype(const Tensor& dst, const Tensor& src, const char* op) {
  TANDEM_CHECK(dst.dtype() == src.dtype(), "[{}] copy between dtypes {} and {} (expected one dtype)", op, dst.dtype(),
               src.dtype());
  if (!(dst.is_cpu() && src.is_cpu())) [[unlikely]] {
    check_same_device(op, {{"dst", dst}, {"src", src}});
    if (dst.numel() > 0) elementwise_table(dst, op).copy(dst, src);
    return;
  }
  if (dst.numel() == 0) return;
  if (dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  TANDEM_DISPATCH_ALL(dst.dtype(), op, [&] {
    for_each_run<2>(dst.shape(), {&dst, &src}, [&](const StridedRun<2>& r) {
      char* d = r.ptr[0];
      const char* s = r.ptr[1];
      if (r.stride[0] == sizeof(scalar_t) && r.stride[1] == sizeof(scalar_t)) {
        std::memcpy(d, s, r.n * sizeof(scalar_t));
        return;
      }
      for (int64_t i = 0; i < r.n; ++i, d += r.stride[0], s += r.stride[1])
        *reinterpret_cast<scalar_t*>(d) = *reinterpret_cast<const scalar_t*>(s);
    });
  });
}

Tensor contiguous_copy(const Tensor& a, const char* op) {
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  copy_same_dtype(out, a, op);
  return out;
}

Tensor to_device(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Backend& dst_backend = backend_for(device, "to");
  Backend& src_backend = backend_for(a.device(), "to");
  // The backends copy raw bytes, so a strided source is made contiguous on its own device.
  Tensor src = a.is_contiguous() ? a : contiguous_copy(a, "to");
  Tensor out = make_empty(a.shape(), a.dtype(), device, "to");
  Backend& b = device.is_cpu() ? src_backend : dst_backend;  // the device-side backend does the copy
  b.copy_bytes(out.data_ptr(), device, src.data_ptr(), a.device(), src.nbytes());
  return out;
}

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
    for_each_run<1>(self.shape(), {&self}, [v](const StridedRun<1>& r) {
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
