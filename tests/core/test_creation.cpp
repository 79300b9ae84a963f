// Factories: values, dtypes (including PyTorch's arange defaults), requires_grad, from_blob
// ownership, device moves, and their error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "tandem.h"

using namespace tandem;

TEST_CASE("zeros, ones, full, empty: shape, dtype and values", "[creation]") {
  Tensor z = zeros({2, 3});
  REQUIRE(z.shape() == Shape{2, 3});
  REQUIRE(z.dtype() == f32);
  REQUIRE(z.is_contiguous());
  REQUIRE(z.to_vector<float>() == std::vector<float>(6, 0.0f));
  REQUIRE(ones({4}, i32).to_vector<int32_t>() == std::vector<int32_t>(4, 1));
  REQUIRE(ones({2}, boolean).to_vector<bool>() == std::vector<bool>{true, true});
  REQUIRE(full({3}, 2.5, f64).to_vector<double>() == std::vector<double>(3, 2.5));
  REQUIRE(full({2}, -7, i64).to_vector<int64_t>() == std::vector<int64_t>{-7, -7});
  REQUIRE(full({2}, 1.5, f16).to_vector<float>() == std::vector<float>{1.5f, 1.5f});
  REQUIRE(full({2}, 3.0, bf16).to_vector<double>() == std::vector<double>{3.0, 3.0});
  REQUIRE(std::signbit(full({1}, -0.0).item<float>()));
  Tensor e = empty({5, 0});
  REQUIRE(e.numel() == 0);
  REQUIRE(e.shape() == Shape{5, 0});
  REQUIRE(zeros({}).dim() == 0);
  REQUIRE(zeros({}).numel() == 1);
}

TEST_CASE("*_like keeps shape, dtype and device but not requires_grad", "[creation]") {
  Tensor a = ones({2, 2}, TensorOptions(f64).with_requires_grad());
  REQUIRE(a.requires_grad());
  for (Tensor l : {zeros_like(a), ones_like(a), empty_like(a), full_like(a, 4)}) {
    REQUIRE(l.shape() == a.shape());
    REQUIRE(l.dtype() == f64);
    REQUIRE(l.device() == a.device());
    REQUIRE_FALSE(l.requires_grad());
  }
  REQUIRE(full_like(a, 4).to_vector<double>() == std::vector<double>(4, 4.0));
  REQUIRE(zeros_like(from_vector<int32_t>({1, 2})).dtype() == i32);
}

TEST_CASE("arange picks i64 or f32 from its bounds, like PyTorch", "[creation]") {
  Tensor a = arange(5);
  REQUIRE(a.dtype() == i64);
  REQUIRE(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  Tensor b = arange(1, 10, 3);
  REQUIRE(b.dtype() == i64);
  REQUIRE(b.to_vector<int64_t>() == std::vector<int64_t>{1, 4, 7});
  REQUIRE(arange(5, 0, -2).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});
  Tensor c = arange(0.0, 1.0, 0.25);
  REQUIRE(c.dtype() == f32);
  REQUIRE(c.to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  REQUIRE(arange(2.5).dtype() == f32);
  REQUIRE(arange(2.5).numel() == 3);
  REQUIRE(arange(0, 3, 0.5).dtype() == f32);
  Tensor d = arange(4, f64);
  REQUIRE(d.dtype() == f64);
  REQUIRE(d.to_vector<double>() == std::vector<double>{0, 1, 2, 3});
  REQUIRE(arange(1, 3, TensorOptions(f32)).to_vector<float>() == std::vector<float>{1, 2});
  REQUIRE(arange(0, 4, 2, i32).to_vector<int32_t>() == std::vector<int32_t>{0, 2});
  REQUIRE(arange(3, 3).numel() == 0);
  REQUIRE(arange(-2, 2).to_vector<int64_t>() == std::vector<int64_t>{-2, -1, 0, 1});
  REQUIRE(arange(0, 7, 3).numel() == 3);  // ceil(7 / 3)
  REQUIRE_THROWS_WITH(arange(0, 5, 0), Catch::Contains("[arange] step must be nonzero"));
  REQUIRE_THROWS_WITH(arange(0, 5, -1), Catch::Contains("[arange]") && Catch::Contains("step sign"));
}

// Found by tools/fuzz/fuzz_ops (corpus/ops/crash-arange-count, crash-full-inf-i32,
// crash-linspace-i32): each converted an out-of-range double (undefined behaviour).
TEST_CASE("creation refuses element counts and values that do not fit", "[creation][fuzz]") {
  using Catch::Contains;
  // The count of a floating arange is checked before it becomes an int64.
  REQUIRE_THROWS_WITH(arange(0.0, 1e30, 2.0), Contains("[arange]") && Contains("more than int64 can count"));
  REQUIRE_THROWS_WITH(arange(-1e308, 1e308, 1e-300), Contains("[arange]"));  // end - start overflows to inf
  // Integral bounds: INT64_MAX arrives as 2^63 (a Scalar holds a double), and counts past int64.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  REQUIRE_THROWS_WITH(arange(kMax), Contains("[arange] value") && Contains("cannot be converted to i64"));
  REQUIRE_THROWS_WITH(arange(kMax, f32), Contains("[arange]") && Contains("must fit in int64"));
  REQUIRE_THROWS_WITH(arange(kMin, int64_t{1} << 62, 1), Contains("[arange]") && Contains("more elements"));
  // A span wider than 2^63 with few elements: each value fits though i * step alone does not.
  REQUIRE(arange(kMin, int64_t{1} << 62, int64_t{1} << 62).to_vector<int64_t>() ==
          std::vector<int64_t>{kMin, -(int64_t{1} << 62), 0});
  // Values an integer dtype cannot hold, as PyTorch refuses them.
  REQUIRE_THROWS_WITH(full({2}, INFINITY, i32), Contains("[full] value inf cannot be converted to i32"));
  REQUIRE_THROWS_WITH(full({2}, NAN, i64), Contains("[full]") && Contains("i64"));
  REQUIRE_THROWS_WITH(full({0}, 3e9, i32), Contains("[full] value 3000000000"));
  REQUIRE_THROWS_WITH(scalar_tensor(1e30, i64), Contains("[scalar_tensor]"));
  REQUIRE(full({1}, 2147483647.0, i32).item<int32_t>() == 2147483647);
  REQUIRE(full({1}, -2147483648.9, i32).item<int32_t>() == -2147483648);  // truncates toward zero
  REQUIRE(std::isinf(full({1}, INFINITY, f16).to(f32).item<float>()));    // floating dtypes take anything
  REQUIRE(full({1}, NAN, boolean).item<bool>());                          // NaN is true
  REQUIRE_THROWS_WITH(linspace(1e30, -1e30, 5, i32), Contains("[linspace] value 1e+30 cannot be converted to i32"));
  REQUIRE_THROWS_WITH(arange(0.5, 1e10, 1e9, i32), Contains("[arange] value 10000000000 cannot be converted to i32"));
}

TEST_CASE("linspace, eye, scalar_tensor", "[creation]") {
  REQUIRE(linspace(0, 1, 5).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1});
  auto l = linspace(-1, 1, 7, f64).to_vector<double>();
  REQUIRE(l.front() == -1.0);
  REQUIRE(l.back() == 1.0);
  REQUIRE(l[3] == Approx(0.0).margin(1e-15));
  REQUIRE(linspace(3, 9, 1).to_vector<float>() == std::vector<float>{3});
  REQUIRE(linspace(3, 9, 0).numel() == 0);
  REQUIRE(linspace(0, 10, 3, i64).to_vector<int64_t>() == std::vector<int64_t>{0, 5, 10});
  REQUIRE_THROWS_WITH(linspace(0, 1, -1), Catch::Contains("[linspace]") && Catch::Contains("-1"));

  Tensor i = eye(3, i32);
  REQUIRE(i.shape() == Shape{3, 3});
  REQUIRE(i.to_vector<int32_t>() == std::vector<int32_t>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  REQUIRE(eye(0).numel() == 0);
  REQUIRE_THROWS_WITH(eye(-2), Catch::Contains("[eye]"));

  Tensor s = scalar_tensor(3.5);
  REQUIRE(s.dim() == 0);
  REQUIRE(s.dtype() == f32);
  REQUIRE(s.item<float>() == 3.5f);
  REQUIRE(scalar_tensor(7, i64).item<int64_t>() == 7);
}

TEST_CASE("requires_grad in TensorOptions is honoured", "[creation]") {
  auto o = TensorOptions(f64).with_requires_grad();
  for (Tensor t : {zeros({2}, o), ones({2}, o), full({2}, 1.0, o), empty({2}, o), eye(2, o), linspace(0, 1, 3, o),
                   arange(0.0, 2.0, 1.0, o), scalar_tensor(1.0, o)}) {
    REQUIRE(t.requires_grad());
    REQUIRE(t.is_leaf());
  }
  REQUIRE_FALSE(zeros({2}).requires_grad());
  REQUIRE_THROWS_WITH(zeros({2}, TensorOptions(i64).with_requires_grad()),
                      Catch::Contains("[zeros]") && Catch::Contains("floating"));
}

TEST_CASE("from_vector for every element type", "[creation]") {
  REQUIRE(from_vector<float>({1, 2}).dtype() == f32);
  REQUIRE(from_vector<double>({1, 2, 3, 4}, {2, 2}).to_vector<double>() == std::vector<double>{1, 2, 3, 4});
  REQUIRE(from_vector<int32_t>({5}).to_vector<int32_t>() == std::vector<int32_t>{5});
  REQUIRE(from_vector<int64_t>({-1, 9}).dtype() == i64);
  REQUIRE(from_vector<bool>({true, false, true}).to_vector<bool>() == std::vector<bool>{true, false, true});
  Tensor h = from_vector<Half>({Half(1.5f), Half(-2.0f)});
  REQUIRE(h.dtype() == f16);
  REQUIRE(h.to_vector<float>() == std::vector<float>{1.5f, -2.0f});
  Tensor b = from_vector<BFloat16>({BFloat16(0.5f)});
  REQUIRE(b.dtype() == bf16);
  REQUIRE(b.item<float>() == 0.5f);
  REQUIRE_THROWS_WITH(from_vector<float>({1, 2, 3}, {2, 2}),
                      Catch::Contains("[from_vector] 3 values do not match shape [2, 2] (4 elements)"));
}

TEST_CASE("from_blob wraps caller memory and runs the deleter", "[creation]") {
  float buf[6] = {0, 1, 2, 3, 4, 5};
  int deleted = 0;
  {
    Tensor t = from_blob(buf, {2, 3}, f32, [&](void* p) {
      REQUIRE(p == buf);
      ++deleted;
    });
    REQUIRE(t.data_ptr() == buf);
    REQUIRE(t.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
    buf[4] = 40;  // shared, not copied
    REQUIRE(t.to_vector<float>()[4] == 40);
    Tensor v = t.select(0, 1);  // a view keeps the storage alive
    t = Tensor();
    REQUIRE(deleted == 0);
    REQUIRE(v.to_vector<float>() == std::vector<float>{3, 40, 5});
  }
  REQUIRE(deleted == 1);
  REQUIRE_THROWS_WITH(from_blob(nullptr, {2}, f32), Catch::Contains("[from_blob] null data pointer"));
}

TEST_CASE("to(Device): same device returns self; CUDA is refused without a backend", "[creation]") {
  Tensor a = ones({2});
  REQUIRE(a.to(kCPU).is_same(a));
#ifndef TANDEM_WITH_CUDA
  REQUIRE_THROWS_WITH(a.to(Device::cuda()), Catch::Contains("[to]") && Catch::Contains("without CUDA"));
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda()), Catch::Contains("[zeros]") && Catch::Contains("without CUDA"));
#endif
}

TEST_CASE("equal and allclose", "[creation]") {
  Tensor a = from_vector<float>({1, 2, 3});
  REQUIRE(equal(a, from_vector<double>({1, 2, 3})));  // dtype promoted
  REQUIRE(a.equal(from_vector<int64_t>({1, 2, 3})));
  REQUIRE_FALSE(equal(a, from_vector<float>({1, 2, 4})));
  REQUIRE_FALSE(equal(a, from_vector<float>({1, 2, 3}, {3, 1})));  // shapes differ
  const int64_t big = int64_t{1} << 60;
  REQUIRE_FALSE(equal(from_vector<int64_t>({big}), from_vector<int64_t>({big + 1})));
  REQUIRE_FALSE(equal(from_vector<float>({NAN}), from_vector<float>({NAN})));

  REQUIRE(allclose(a, from_vector<float>({1, 2, 3.00001f})));
  REQUIRE_FALSE(allclose(a, from_vector<float>({1, 2, 3.1f})));
  REQUIRE(a.allclose(from_vector<float>({1, 2, 3.1f}), 0, 0.2));
  REQUIRE(allclose(ones({2, 3}), ones({3})));  // broadcasts
  REQUIRE(allclose(from_vector<float>({INFINITY}), from_vector<float>({INFINITY})));
  REQUIRE_FALSE(allclose(from_vector<float>({NAN}), from_vector<float>({NAN})));
  REQUIRE_THROWS_WITH(allclose(ones({2}), ones({3})), Catch::Contains("[allclose]") && Catch::Contains("[2]"));
}
