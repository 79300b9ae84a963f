// Factory functions: empty/zeros/ones/full (+ *_like), arange, linspace, eye, scalar_tensor,
// from_blob and from_vector. Declared in autograd/ops.h with the other public ops; defined here
// because they record nothing (a new tensor has no history), so core needs nothing above it.
//
// Values are written where the tensor lives: by the CPU loops here, or by the device's fill
// (detail::fill) and creation kernels (core/detail/creation.h), which compute every element as the CPU
// does, so every device gets the same numbers. requires_grad is applied last.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/detail/kernel_tables.h"
#include "core/detail/creation.h"
#include "core/detail/elementwise.h"
#include "core/tensor.h"

namespace tandem {

namespace {

Tensor new_empty(const Shape& shape, const TensorOptions& opts, const char* op) {
  backend_for(opts.device, op);  // fail early ("built without CUDA") before any work
  return make_empty(shape, opts.dtype, opts.device, op);
}

detail::CreationDeviceKernels& kernels_for(const Tensor& t, const char* op) {
  return device_kernels<detail::CreationDeviceKernels>(t.device(), op);
}

Tensor finish(Tensor t, const TensorOptions& opts, const char* op) {
  if (opts.requires_grad) {
    TANDEM_CHECK(is_floating(t.dtype()), "[{}] only floating tensors can require grad, got {}", op, t.dtype());
    t.requires_grad_();
  }
  return t;
}

void fill_contiguous(const Tensor& t, const Scalar& value, const char* op) {
  check_scalar_fits(value.value, t.dtype(), op);
  if (t.numel() == 0) return;
  if (!t.is_cpu()) [[unlikely]] {
    detail::fill(t, value, op);  // the same conversion of value as below
    return;
  }
  if (value.value == 0 && !std::signbit(value.value)) {  // all-zero bits is 0 in every dtype
    std::memset(t.data_ptr(), 0, t.nbytes());
    return;
  }
  TANDEM_DISPATCH_ALL(t.dtype(), op, [&] {
    scalar_t v = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(value.value));
    scalar_t* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = v;
  });
}

TensorOptions like(const Tensor& t) { return TensorOptions(t.dtype(), t.device()); }

// PyTorch's rule for arange without a dtype: all-integral bounds give i64, any floating one the
// default float type.
Dtype arange_dtype(const Scalar& start, const Scalar& end, const Scalar& step) {
  return start.integral && end.integral && step.integral ? i64 : kDefaultFloat;
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions opts) {
  backend_for(opts.device, "empty");
  Tensor t = make_empty(shape, opts.dtype, opts.device, "empty");
  if (opts.requires_grad) {
    TANDEM_CHECK(is_floating(t.dtype()), "[empty] only floating tensors can require grad, got {}", t.dtype());
    t.requires_grad_();
  }
  return t;
}

Tensor full(const Shape& shape, const Scalar& value, TensorOptions opts) {
  Tensor t = new_empty(shape, opts, "full");
  fill_contiguous(t, value, "full");
  return finish(t, opts, "full");
}

Tensor zeros(const Shape& shape, TensorOptions opts) {
  Tensor t = new_empty(shape, opts, "zeros");
  fill_contiguous(t, 0, "zeros");
  return finish(t, opts, "zeros");
}

Tensor ones(const Shape& shape, TensorOptions opts) {
  Tensor t = new_empty(shape, opts, "ones");
  fill_contiguous(t, 1, "ones");
  return finish(t, opts, "ones");
}

// *_like: same shape, dtype and device; never requires grad (as in PyTorch).
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), like(t)); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), like(t)); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), like(t)); }
Tensor full_like(const Tensor& t, const Scalar& value) { return full(t.shape(), value, like(t)); }

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions opts) {
  const double a = start.value, b = end.value, s = step.value;
  TANDEM_CHECK(std::isfinite(a) && std::isfinite(b), "[arange] bounds must be finite, got start={} end={}", a, b);
  TANDEM_CHECK(s != 0 && std::isfinite(s), "[arange] step must be nonzero and finite, got {}", s);
  TANDEM_CHECK((s > 0 && b >= a) || (s < 0 && b <= a),
               "[arange] upper bound and lower bound are inconsistent with the step sign: start={} end={} step={}",
               a, b, s);
  TANDEM_CHECK(opts.dtype != boolean, "[arange] dtype bool is not supported");
  // Every value lies between the bounds, so the bounds fitting the dtype is enough.
  check_scalar_fits(a, opts.dtype, "arange");
  check_scalar_fits(b, opts.dtype, "arange");
  const bool integral = start.integral && end.integral && step.integral;
  // Integral bounds: integer length and values, no accumulated floating error. The count is
  // computed where it cannot overflow and checked before it is converted ("invalid size" in
  // PyTorch); a Scalar holds its integer as a double, so INT64_MAX arrives as 2^63.
  constexpr double kTwo63 = 9223372036854775808.0;
  int64_t n;
  if (integral) {
    TANDEM_CHECK(a >= -kTwo63 && a < kTwo63 && b >= -kTwo63 && b < kTwo63 && s >= -kTwo63 && s < kTwo63,
                 "[arange] integral start={} end={} step={} must fit in int64", a, b, s);
    const auto ia = static_cast<int64_t>(a), ib = static_cast<int64_t>(b), is = static_cast<int64_t>(s);
    const __int128 count = is > 0 ? (static_cast<__int128>(ib) - ia + is - 1) / is
                                   : (static_cast<__int128>(ia) - ib - is - 1) / -static_cast<__int128>(is);
    TANDEM_CHECK(count <= std::numeric_limits<int64_t>::max(),
                 "[arange] start={} end={} step={} gives more elements than int64 can count", a, b, s);
    n = static_cast<int64_t>(count);
  } else {
    const double count = std::ceil((b - a) / s);  // b - a may overflow to inf
    TANDEM_CHECK(count >= 0 && count < kTwo63,
                 "[arange] start={} end={} step={} gives {} elements, more than int64 can count", a, b, s, count);
    n = static_cast<int64_t>(count);
  }
  Tensor t = new_empty({n}, opts, "arange");
  if (!t.is_cpu()) [[unlikely]] {
    if (n > 0)
      kernels_for(t, "arange").arange(t, integral, integral ? static_cast<int64_t>(a) : 0,
                                       integral ? static_cast<int64_t>(s) : 0, a, s);
    return finish(t, opts, "arange");
  }
  TANDEM_DISPATCH_NUMERIC(t.dtype(), "arange", [&] {
    scalar_t* p = static_cast<scalar_t*>(t.data_ptr());
    if (integral) {
      // Each value lies between the bounds, but i * step alone may not fit: wrap-free in uint64.
      const auto ua = static_cast<uint64_t>(static_cast<int64_t>(a));
      const auto us = static_cast<uint64_t>(static_cast<int64_t>(s));
      for (int64_t i = 0; i < n; ++i) {
        const auto v = static_cast<int64_t>(ua + static_cast<uint64_t>(i) * us);
        p[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(v));
      }
    } else {
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(a + i * s));
    }
  });
  return finish(t, opts, "arange");
}

Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step) {
  return arange(start, end, step, arange_dtype(start, end, step));
}
Tensor arange(const Scalar& start, const Scalar& end, TensorOptions opts) { return arange(start, end, 1, opts); }
Tensor arange(const Scalar& end, TensorOptions opts) { return arange(0, end, 1, opts); }
Tensor arange(const Scalar& end) { return arange(0, end, 1, arange_dtype(0, end, 1)); }

Tensor linspace(double start, double end, int64_t steps, TensorOptions opts) {
  TANDEM_CHECK(steps >= 0, "[linspace] number of steps must be non-negative, got {}", steps);
  TANDEM_CHECK(opts.dtype != boolean, "[linspace] dtype bool is not supported");
  check_scalar_fits(start, opts.dtype, "linspace");  // every value lies between the two
  check_scalar_fits(end, opts.dtype, "linspace");
  Tensor t = new_empty({steps}, opts, "linspace");
  const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  // Like PyTorch: the first half counts up from start, the second half down from end, so both
  // endpoints come out exact.
  const int64_t half = steps == 1 ? 1 : steps / 2;
  if (!t.is_cpu()) [[unlikely]] {
    if (steps > 0) kernels_for(t, "linspace").linspace(t, start, end, step, half);
    return finish(t, opts, "linspace");
  }
  TANDEM_DISPATCH_NUMERIC(t.dtype(), "linspace", [&] {
    scalar_t* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < steps; ++i) {
      double v = i < half ? start + step * static_cast<double>(i) : end - step * static_cast<double>(steps - 1 - i);
      p[i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(v));
    }
  });
  return finish(t, opts, "linspace");
}

Tensor eye(int64_t n, TensorOptions opts) {
  TANDEM_CHECK(n >= 0, "[eye] n must be non-negative, got {}", n);
  Tensor t = new_empty({n, n}, opts, "eye");
  if (!t.is_cpu()) [[unlikely]] {
    if (n > 0) kernels_for(t, "eye").eye(t);
    return finish(t, opts, "eye");
  }
  fill_contiguous(t, 0, "eye");
  TANDEM_DISPATCH_ALL(t.dtype(), "eye", [&] {
    scalar_t* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) p[i * n + i] = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(1));
  });
  return finish(t, opts, "eye");
}

Tensor scalar_tensor(const Scalar& value, TensorOptions opts) {
  Tensor t = new_empty({}, opts, "scalar_tensor");
  fill_contiguous(t, value, "scalar_tensor");
  return finish(t, opts, "scalar_tensor");
}

Tensor from_blob(void* data, const Shape& shape, Dtype dtype, std::function<void(void*)> deleter) {
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "[from_blob] negative dimension in shape {}", shape);
  const int64_t numel = numel_of(shape);
  TANDEM_CHECK(data != nullptr || numel == 0, "[from_blob] null data pointer for shape {}", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(data, static_cast<size_t>(numel) * itemsize(dtype), kCPU, std::move(deleter));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->numel = numel;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <class T> Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "[from_vector] negative dimension in shape {}", shape);
  TANDEM_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape),
               "[from_vector] {} values do not match shape {} ({} elements)", values.size(), shape, numel_of(shape));
  Tensor t = make_empty(shape, dtype_v<T>, kCPU, "from_vector");
  T* p = static_cast<T*>(t.data_ptr());
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];  // indexed: std::vector<bool> has no data()
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&);

}  // namespace tandem
