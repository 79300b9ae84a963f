// CPU kernels of the elementwise ops (core/elementwise.h).
//
// Everything funnels into `map`: out[i] = f(in0[i], in1[i], ...) with the inputs broadcast to
// out's shape. Its fast paths are plain pointer loops the compiler vectorises: all operands
// contiguous with out's numel, or (two inputs) one of them a single element. Everything else
// goes through for_each_run, which coalesces dims into 1-D runs; runs that turn out contiguous
// (or contiguous against a broadcast operand) take the same plain loops.
#include "core/elementwise.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "core/backend.h"
#include "core/iter.h"

namespace tandem::detail {

namespace {

// Blocks of 8 computed into a local buffer, then stored: the loads of a block provably come
// before its stores even when out aliases an input (in-place ops), so the block vectorises
// without runtime alias checks, also at -O2 (whose cheap cost model refuses versioned loops).
// The functor is copied so its parameters cannot alias out either.
template <class Out, class... In, class F, size_t... I>
TANDEM_INLINE void contig_loop(char* out, const std::array<const char*, sizeof...(In)>& in, int64_t n, const F& f_ref,
                               std::index_sequence<I...>) {
  const F f = f_ref;
  Out* o = reinterpret_cast<Out*>(out);
  std::tuple<const In*...> p{reinterpret_cast<const In*>(in[I])...};
  constexpr int64_t kBlock = 8;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Out tmp[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) tmp[k] = store<Out>(f(load(std::get<I>(p)[i + k])...));
    for (int64_t k = 0; k < kBlock; ++k) o[i + k] = tmp[k];
  }
  for (; i < n; ++i) o[i] = store<Out>(f(load(std::get<I>(p)[i])...));
}

template <class Out, class... In, class F, size_t... I>
TANDEM_INLINE void strided_loop_n(char* out, int64_t out_stride, const std::array<const char*, sizeof...(In)>& in,
                                  const std::array<int64_t, sizeof...(In)>& stride, int64_t n, const F& f,
                                  std::index_sequence<I...>) {
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<Out*>(out + i * out_stride) =
        store<Out>(f(load(*reinterpret_cast<const In*>(in[I] + i * stride[I]))...));
  }
}

// A 1-D run: contiguous, one-operand-broadcast (two inputs), or general strided.
template <class Out, class... In, class F>
TANDEM_INLINE void run_1d(char* out, int64_t out_stride, const std::array<const char*, sizeof...(In)>& in,
                          const std::array<int64_t, sizeof...(In)>& stride, int64_t n, const F& f) {
  constexpr size_t N = sizeof...(In);
  using Seq = std::make_index_sequence<N>;
  constexpr std::array<int64_t, N> sizes{static_cast<int64_t>(sizeof(In))...};
  if (out_stride == static_cast<int64_t>(sizeof(Out))) {
    bool contiguous = true;
    for (size_t j = 0; j < N; ++j) contiguous = contiguous && stride[j] == sizes[j];
    if (contiguous) return contig_loop<Out, In...>(out, in, n, f, Seq{});
    if constexpr (N == 2) {
      using In0 = std::tuple_element_t<0, std::tuple<In...>>;
      using In1 = std::tuple_element_t<1, std::tuple<In...>>;
      if (stride[0] == sizes[0] && stride[1] == 0) {
        auto b = load(*reinterpret_cast<const In1*>(in[1]));
        auto g = [&f, b](auto x) { return f(x, b); };
        return contig_loop<Out, In0>(out, {in[0]}, n, g, std::make_index_sequence<1>{});
      }
      if (stride[0] == 0 && stride[1] == sizes[1]) {
        auto a = load(*reinterpret_cast<const In0*>(in[0]));
        auto g = [&f, a](auto x) { return f(a, x); };
        return contig_loop<Out, In1>(out, {in[1]}, n, g, std::make_index_sequence<1>{});
      }
    }
  }
  strided_loop_n<Out, In...>(out, out_stride, in, stride, n, f, Seq{});
}

// out[i] = f(ins...[i]); every input has element type In_j and broadcasts to out's shape.
template <class Out, class... In, class F>
void map(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& ins, const F& f) {
  constexpr size_t N = sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.is_contiguous()) {
    std::array<const char*, N> p;
    std::array<int64_t, N> stride;
    bool fast = true;
    for (size_t j = 0; j < N; ++j) {
      const Tensor& t = *ins[j];
      p[j] = static_cast<const char*>(t.data_ptr());
      if (t.numel() == n && t.is_contiguous()) {
        stride[j] = static_cast<int64_t>(t.element_size());
      } else if (t.numel() == 1) {
        stride[j] = 0;
      } else {
        fast = false;
        break;
      }
    }
    if (fast) {
      return run_1d<Out, In...>(static_cast<char*>(out.data_ptr()), sizeof(Out), p, stride, n, f);
    }
  }
  std::array<const Tensor*, N + 1> all;
  all[0] = &out;
  for (size_t j = 0; j < N; ++j) all[j + 1] = ins[j];
  for_each_run<N + 1>(out.shape(), all, [&](const StridedRun<N + 1>& r) {
    std::array<const char*, N> p;
    std::array<int64_t, N> stride;
    for (size_t j = 0; j < N; ++j) {
      p[j] = r.ptr[j + 1];
      stride[j] = r.stride[j + 1];
    }
    run_1d<Out, In...>(r.ptr[0], r.stride[0], p, stride, r.n, f);
  });
}

template <class T> using C_t = acc_t<T>;

Shape broadcast_or_same(const Tensor& a, const Tensor& b, const char* op) {
  return a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), op);
}

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

// In-place ops write through self's memory: a self with stride-0 (expanded) dims would have
// several elements land on one location, and an operand that partially overlaps self would be
// read after being written. The first is an error (as in PyTorch); the second gets a copy.
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

// The kernel table of a non-CPU tensor's device (every op's device branch: `if (!out.is_cpu())`).
ElementwiseDeviceKernels& device_table(const Tensor& t, const char* name) {
  return device_kernels<ElementwiseDeviceKernels>(t.device(), name);
}

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
      if (!(t->device() == d) && t->is_cpu() && t->dim() == 0) *t = detail::to_device(*t, d);
  }
  if constexpr (N == 2) {
    check_same_device(op, {{names[0], *ts[0]}, {names[1], *ts[1]}});
  } else {
    check_same_device(op, {{names[0], *ts[0]}, {names[1], *ts[1]}, {names[2], *ts[2]}});
  }
}

}  // namespace

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

void fail_devices(const char* op, std::initializer_list<NamedTensor> ts) {
  std::string list;
  for (const NamedTensor& n : ts) {
    if (!list.empty()) list += ", ";
    list += fmt::format("{} on {}", n.name, n.t.device());
  }
  fail("[{}] tensors are on different devices: {}", op, list);
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
    copy(self, detail::to_device(src_in, self.device()), name);
    return;
  }
  Tensor src = unaliased(self, src_in, name);
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) device_table(self, name).copy(self, src);
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
    if (dst.numel() > 0) device_table(dst, op).copy(dst, src);
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

void copy_divided(const Tensor& self, const Tensor& src_in, double divisor, const char* name) {
  TANDEM_CHECK(self.defined() && src_in.defined(), "[{}] undefined tensor", name);
  TANDEM_CHECK(is_floating(self.dtype()), "[{}] the destination must be floating point, got {}", name, self.dtype());
  TANDEM_CHECK(self.shape() == src_in.shape(), "[{}] shapes differ: destination {}, source {}", name, self.shape(),
               src_in.shape());
  check_writable(self, name);
  Tensor src = src_in.device() == self.device() ? src_in : detail::to_device(src_in, self.device());
  if (src.dtype() != self.dtype()) src = cast(src, self.dtype(), name);
  src = unaliased(self, src, name);
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) device_table(self, name).binary_scalar(Binary::div, self, src, Scalar(divisor), false);
    return;
  }
  run_binary_scalar(Binary::div, self, src, Scalar(divisor), /*scalar_first=*/false);
}

void fill(const Tensor& self, const Scalar& value, const char* name) {
  TANDEM_CHECK(self.defined(), "[{}] undefined tensor", name);
  check_writable(self, name);
  if (self.numel() == 0) return;
  if (!self.is_cpu()) [[unlikely]]
    return device_table(self, name).fill(self, value);
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
    if (out.numel() > 0) device_table(out, name).binary(op, out, A, B, alpha);
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
    if (out.numel() > 0) device_table(out, name).binary_scalar(op, out, A, b, /*scalar_first=*/false);
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
    if (out.numel() > 0) device_table(out, name).binary_scalar(op, out, B, a, /*scalar_first=*/true);
    return out;
  }
  run_binary_scalar(op, out, B, a, /*scalar_first=*/true);
  return out;
}

void binary_(Binary op, const Tensor& self, const Tensor& other_in, const Scalar& alpha, const char* name) {
  if (!(self.device() == other_in.device())) [[unlikely]] {
    Tensor other = other_in;
    if (other.is_cpu() && other.dim() == 0) other = detail::to_device(other, self.device());
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
    if (self.numel() > 0) device_table(self, name).binary(op, self, self, other, alpha);
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
    if (self.numel() > 0) device_table(self, name).binary_scalar(op, self, self, other, /*scalar_first=*/false);
    return;
  }
  run_binary_scalar(op, self, self, other, /*scalar_first=*/false);
}

// ---------------------------------------------------------------- unary

Tensor unary(Unary op, const Tensor& a) {
  const char* name = op_name(op);
  switch (op) {
    case Unary::logical_not:
    case Unary::isnan:
    case Unary::isinf: {
      Tensor out = make_empty(a.shape(), boolean, a.device(), name);
      if (!out.is_cpu()) [[unlikely]] {
        if (out.numel() > 0) device_table(out, name).unary(op, out, a);
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
        if (out.numel() > 0) device_table(out, name).unary(op, out, a);
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
    if (out.numel() > 0) device_table(out, name).unary(op, out, A);
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
    if (out.numel() > 0) device_table(out, "pow").pow_scalar(out, A, e);
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
  Tensor A = cast(a, ct, op);
  Tensor out = make_empty(a.shape(), ct, a.device(), op);
  if (!out.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) device_table(out, op).clamp(out, A, lo, hi);
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
  check_writable(self, "clamp_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) device_table(self, "clamp_").clamp(self, self, lo, hi);
    return;
  }
  TANDEM_DISPATCH_NUMERIC(self.dtype(), "clamp_", [&] {
    using T = scalar_t;
    map<T, T>(self, {&self}, make_clamp<C_t<T>>(lo, hi));
  });
}

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
    if (out.numel() > 0) device_table(out, "where").where(out, cond, A, B);
    return out;
  }
  TANDEM_DISPATCH_ALL(ct, "where", [&] {
    using T = scalar_t;
    map<T, bool, T, T>(out, {&cond, &A, &B}, Where{});
  });
  return out;
}

namespace {
// self, a, b for the optimizer-style ternary in-place ops: floating self, operands cast to it.
struct Ternary {
  Tensor a, b;
};
Ternary prepare_ternary(const Tensor& self, const Tensor& a, const Tensor& b, const char* name) {
  check_same_device(name, {{"self", self}, {"tensor1", a}, {"tensor2", b}});
  TANDEM_CHECK(is_floating(self.dtype()), "[{}] self must be floating, got {}", name, self.dtype());
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
    if (self.numel() > 0) device_table(self, "addcmul_").pointwise3(Pointwise3::addcmul, self, t.a, t.b, alpha);
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
    if (self.numel() > 0) device_table(self, "addcdiv_").pointwise3(Pointwise3::addcdiv, self, t.a, t.b, alpha);
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
  TANDEM_CHECK(is_floating(self.dtype()), "[lerp_] self must be floating, got {}", self.dtype());
  TANDEM_CHECK(end_in.dtype() == self.dtype(), "[lerp_] expected end to have dtype {} like self, got {}",
               self.dtype(), end_in.dtype());
  check_broadcasts_to(end_in, self, "end", "lerp_");
  check_writable(self, "lerp_");
  Tensor end = unaliased(self, end_in, "lerp_");
  if (!self.is_cpu()) [[unlikely]] {
    if (self.numel() > 0) device_table(self, "lerp_").lerp(self, end, weight);
    return;
  }
  TANDEM_DISPATCH_FLOATING(self.dtype(), "lerp_", [&] {
    using T = scalar_t;
    using C = C_t<T>;
    map<T, T, T>(self, {&self, &end}, Lerp<C>{static_cast<C>(weight.value)});
  });
}

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
    if (out.numel() > 0) on_device(device_table(out, name), out, g, s);
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
    if (out.numel() > 0) device_table(out, name).grad3(op, out, g, a, b);
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
    if (out.numel() > 0) device_table(out, "where").where_grad(out, cond, g, take_true);
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
