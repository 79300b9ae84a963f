// The CUDA kernel table of the elementwise ops (detail::ElementwiseDeviceKernels, core/detail/elementwise.h), and the
// copy/cast, fill and where kernels. Binary ops live in elementwise_binary.cu, unary math in
// elementwise_unary.cu and the backward kernels in elementwise_grad.cu, so the four compile in
// parallel.
#include "cuda/detail/elementwise.cuh"

#include <cstring>

#include "core/detail/kernel_tables.h"

namespace tandem::cuda {

namespace ew_impl {
namespace {

using tandem::detail::Identity;

// Same-dtype copies move bits: one instantiation per element size instead of per dtype.
template <size_t Bytes> struct bits;
template <> struct bits<1> { using type = uint8_t; };
template <> struct bits<2> { using type = uint16_t; };
template <> struct bits<4> { using type = uint32_t; };
template <> struct bits<8> { using type = uint64_t; };

template <class U>
struct Const {
  U v;
  TANDEM_HOST_DEVICE U operator()() const { return v; }
};

void copy(const Tensor& dst, const Tensor& src) {
  const char* name = "copy_";
  if (dst.dtype() == src.dtype()) {
    if (dst.data_ptr() == src.data_ptr() && dst.shape() == src.shape() && dst.strides() == src.strides()) return;
    if (dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
      // One buffer seen through strides that differ only on size-1 dims: nothing moves, and
      // cudaMemcpy's ranges must not overlap.
      if (dst.data_ptr() == src.data_ptr()) return;
      DeviceGuard guard(dst.device());
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                        current_stream(dst.device())));
      return;
    }
    switch (dst.element_size()) {
      case 1: return launch<uint8_t, uint8_t>(name, dst, {src}, Identity{});
      case 2: return launch<uint16_t, uint16_t>(name, dst, {src}, Identity{});
      case 4: return launch<uint32_t, uint32_t>(name, dst, {src}, Identity{});
      case 8: return launch<uint64_t, uint64_t>(name, dst, {src}, Identity{});
      default: fail("[{}] internal: element size {}", name, dst.element_size());
    }
  }
  TANDEM_DISPATCH_ALL(src.dtype(), name, [&] {
    using S = scalar_t;
    TANDEM_DISPATCH_ALL(dst.dtype(), name, [&] {
      using D = scalar_t;
      if constexpr (!std::is_same_v<S, D>) launch<D, S>(name, dst, {src}, Identity{});
    });
  });
}

void fill(const Tensor& self, const Scalar& value) {
  const char* name = "fill_";
  TANDEM_DISPATCH_ALL(self.dtype(), name, [&] {
    using T = scalar_t;
    const T v = tandem::detail::store<T>(value.value);  // converted on the host, exactly as the CPU fill
    using U = typename bits<sizeof(T)>::type;
    U u;
    std::memcpy(&u, &v, sizeof(T));
    if (u == 0 && self.is_contiguous()) {
      DeviceGuard guard(self.device());
      TANDEM_CUDA_CHECK(cudaMemsetAsync(self.data_ptr(), 0, self.nbytes(), current_stream(self.device())));
      return;
    }
    launch<U>(name, self, {}, Const<U>{u});
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  TANDEM_DISPATCH_ALL(out.dtype(), "where", [&] {
    using T = scalar_t;
    launch<T, bool, T, T>("where", out, {cond, a, b}, tandem::detail::Where{});
  });
}

}  // namespace
}  // namespace ew_impl

namespace {

class CudaElementwise final : public tandem::detail::ElementwiseDeviceKernels {
 public:
  void binary(tandem::detail::Binary op, const Tensor& out, const Tensor& a, const Tensor& b,
              const Scalar& alpha) override {
    ew_impl::binary(op, out, a, b, alpha, a.dtype());
  }
  void binary_scalar(tandem::detail::Binary op, const Tensor& out, const Tensor& a, const Scalar& s,
                     bool scalar_first) override {
    // The CPU's tensor-scalar loops use add/sub with alpha 1.
    if (scalar_first) {
      ew_impl::binary(op, out, s.value, a, 1, a.dtype());
    } else {
      ew_impl::binary(op, out, a, s.value, 1, a.dtype());
    }
  }
  void unary(tandem::detail::Unary op, const Tensor& out, const Tensor& a) override { ew_impl::unary(op, out, a); }
  void pow_scalar(const Tensor& out, const Tensor& a, double exponent) override {
    ew_impl::pow_scalar(out, a, exponent);
  }
  void clamp(const Tensor& out, const Tensor& a, std::optional<double> lo, std::optional<double> hi) override {
    ew_impl::clamp(out, a, lo, hi);
  }
  void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) override {
    ew_impl::where(out, cond, a, b);
  }
  void copy(const Tensor& dst, const Tensor& src) override { ew_impl::copy(dst, src); }
  void fill(const Tensor& self, const Scalar& value) override { ew_impl::fill(self, value); }
  void pointwise3(tandem::detail::Pointwise3 op, const Tensor& self, const Tensor& a, const Tensor& b,
                  const Scalar& alpha) override {
    ew_impl::pointwise3(op, self, a, b, alpha);
  }
  void lerp(const Tensor& self, const Tensor& end, const Scalar& weight) override {
    ew_impl::lerp(self, end, weight);
  }
  void unary_grad(tandem::detail::Unary op, const Tensor& out, const Tensor& g, const Tensor& s) override {
    ew_impl::unary_grad(op, out, g, s);
  }
  void clamp_grad(const Tensor& out, const Tensor& g, const Tensor& x, std::optional<double> lo,
                  std::optional<double> hi) override {
    ew_impl::clamp_grad(out, g, x, lo, hi);
  }
  void pow_scalar_grad(const Tensor& out, const Tensor& g, const Tensor& x, double exponent) override {
    ew_impl::pow_scalar_grad(out, g, x, exponent);
  }
  void grad3(tandem::detail::Grad3 op, const Tensor& out, const Tensor& g, const Tensor& a, const Tensor& b) override {
    ew_impl::grad3(op, out, g, a, b);
  }
  void where_grad(const Tensor& out, const Tensor& cond, const Tensor& g, bool take_true) override {
    ew_impl::where_grad(out, cond, g, take_true);
  }
};

}  // namespace

void install_elementwise_kernels() {
  static CudaElementwise table;
  register_device_kernels<tandem::detail::ElementwiseDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
