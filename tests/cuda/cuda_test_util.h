// CUDA tests: tagged [cuda]; without a usable device they skip at run time and say so. The
// helpers below are what every tests/cuda/test_cuda_*.cpp compares with: inputs made on the CPU
// and copied to the device, and CUDA results checked against the same op on the CPU.
#pragma once

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "cuda/runtime.h"
#include "tandem.h"
#include "test_util.h"

// First line of every CUDA test case.
#define TANDEM_REQUIRE_CUDA_OR_SKIP()                                                               \
  do {                                                                                              \
    if (!::tandem::cuda::is_available()) {                                                          \
      WARN("SKIP: no usable CUDA device (" << ::tandem::cuda::unavailable_reason() << ")");         \
      return;                                                                                       \
    }                                                                                               \
  } while (0)

namespace cuda_test {

// The device the tests run on.
inline const tandem::Device kGPU = tandem::Device::cuda(0);

// Relative-plus-absolute tolerance per dtype; integers and bool compare exactly. A file whose ops
// lose more precision (long sums, products) names its own, e.g.
//   constexpr cuda_test::Tolerances tol_for{.f16 = 2e-3, .bf16 = 2e-2};  ... tol_for(dtype)
struct Tolerances {
  double f64 = 1e-12, f32 = 1e-5, f16 = 1e-3, bf16 = 1e-2, exact = 0;
  constexpr double operator()(tandem::Dtype d) const {
    switch (d) {
      case tandem::f64: return f64;
      case tandem::f32: return f32;
      case tandem::f16: return f16;
      case tandem::bf16: return bf16;
      default: return exact;
    }
  }
};

// Fresh random values of dtype, made on the CPU (copy them to kGPU): normals (times scale) for
// the floating types, integers in [-4, 4], bools at random.
inline tandem::Tensor random(const tandem::Shape& shape, tandem::Dtype dtype, double scale = 1) {
  using namespace tandem;
  if (dtype == boolean) return randint(0, 2, shape, boolean);
  if (is_integral(dtype)) return randint(-4, 5, shape, dtype);
  Tensor n = randn(shape);
  return to_dtype(scale == 1 ? n : n * scale, dtype);
}

// The values of t (on any device) as f64, in logical order.
inline std::vector<double> host_values(const tandem::Tensor& t) {
  return tandem::to_dtype(t.is_cpu() ? t : t.to(tandem::kCPU), tandem::f64).contiguous().to_vector<double>();
}

// got (on the GPU) equals want (on the CPU): dtype, shape, and values within tol relative (NaN
// matches NaN, infinities match exactly). One REQUIRE for the whole tensor, naming the first
// element that differs.
inline void require_match(const tandem::Tensor& got, const tandem::Tensor& want, double tol) {
  REQUIRE(got.defined());
  REQUIRE(got.device() == kGPU);
  REQUIRE(got.dtype() == want.dtype());
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = host_values(got), w = host_values(want);
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    bool ok;
    if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
    } else if (std::isinf(w[i])) {
      ok = g[i] == w[i];
    } else {
      ok = std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i]));
    }
    if (!ok) {
      INFO("element " << i << " of " << g.size() << ": cuda " << g[i] << ", cpu " << w[i] << " (dtype "
                      << want.dtype() << ", shape " << fmt::format("{}", want.shape()) << ")");
      REQUIRE(ok);
    }
  }
}

// Element bits of a contiguous CPU copy: exact comparisons of copies, in-order sums, RNG streams.
inline std::vector<unsigned char> bits(const tandem::Tensor& t) {
  tandem::Tensor c = (t.is_cpu() ? t : t.to(tandem::kCPU)).contiguous();
  std::vector<unsigned char> b(c.nbytes());
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}

inline void require_bit_equal(const tandem::Tensor& gpu, const tandem::Tensor& cpu) {
  REQUIRE(gpu.device() == kGPU);
  REQUIRE(cpu.is_cpu());
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  REQUIRE(bits(gpu) == bits(cpu));
}

// fn(inputs) on the CPU vs on copies moved to the GPU: the output, then the gradient of
// sum(fn(inputs) * w) for every input (w random, the same on both devices).
inline void check_op(const std::function<tandem::Tensor(const tandem::TensorList&)>& fn,
                     const tandem::TensorList& in, double tol) {
  using namespace tandem;
  TensorList c, d;
  for (const Tensor& t : in) {
    c.push_back(test_util::leaf(t.clone()));
    d.push_back(test_util::leaf(t.to(kGPU).detach()));
  }
  Tensor yc = fn(c), yd = fn(d);
  require_match(yd, yc, tol);
  Tensor w = random(yc.shape(), yc.dtype());
  yc.backward(w);
  yd.backward(w.to(kGPU));
  for (size_t i = 0; i < in.size(); ++i) {
    INFO("gradient of input " << i);
    require_match(d[i].grad(), c[i].grad(), tol);
  }
}

}  // namespace cuda_test
