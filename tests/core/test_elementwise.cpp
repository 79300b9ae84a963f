// Elementwise ops: values against hand-computed references, broadcasting, non-contiguous
// operands, type promotion, gradients (gradcheck in f64, ties and kinks), in-place semantics
// and error messages.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <limits>

#include "core/detail/elementwise.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::require_close;
using test_util::vals;
using Catch::Contains;

namespace {
Tensor T(std::vector<double> v, Shape shape) { return from_vector(v, shape); }
Tensor T(std::vector<double> v) { return from_vector(v); }
Tensor leaf(std::vector<double> v, Shape shape) {
  Tensor t = from_vector(v, shape);
  t.requires_grad_();
  return t;
}
Tensor rnd(Shape shape, double lo = -1, double hi = 1) {
  Tensor t = rand(shape, f64);
  NoGradGuard ng;
  t = t * (hi - lo) + lo;
  t.requires_grad_();
  return t;
}
void check_grad(const std::function<Tensor(const TensorList&)>& fn, const TensorList& in) {
  GradcheckResult r = gradcheck(fn, in);
  INFO(r.report);
  REQUIRE(r.ok);
}
}  // namespace

// ---------------------------------------------------------------- values

TEST_CASE("binary arithmetic with broadcasting", "[elementwise]") {
  Tensor a = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor row = T({10, 20, 30}, {3});
  Tensor col = T({100, 200}, {2, 1});
  REQUIRE(vals(a + row) == std::vector<double>{11, 22, 33, 14, 25, 36});
  REQUIRE(vals(a - col) == std::vector<double>{-99, -98, -97, -196, -195, -194});
  REQUIRE(vals(a * row) == std::vector<double>{10, 40, 90, 40, 100, 180});
  require_close(vals(row / a), {10, 10, 10, 2.5, 4, 5});
  REQUIRE(vals(add(a, row, 2)) == std::vector<double>{21, 42, 63, 24, 45, 66});
  REQUIRE(vals(sub(a, row, 0.5)) == std::vector<double>{-4, -8, -12, -1, -5, -9});
  // [2, 1] with [3] broadcasts to [2, 3] in both operands.
  Tensor outer = col + row;
  REQUIRE(outer.shape() == Shape{2, 3});
  REQUIRE(vals(outer) == std::vector<double>{110, 120, 130, 210, 220, 230});
  // A 0-dim operand and an empty one.
  REQUIRE(vals(a * scalar_tensor(2.0, f64)) == std::vector<double>{2, 4, 6, 8, 10, 12});
  Tensor empty = zeros({0, 3}, f64);
  REQUIRE((empty + row).shape() == Shape{0, 3});
}

TEST_CASE("Scalar operands", "[elementwise]") {
  Tensor a = T({1, 2, 4});
  REQUIRE(vals(a + 1) == std::vector<double>{2, 3, 5});
  REQUIRE(vals(1 + a) == std::vector<double>{2, 3, 5});
  REQUIRE(vals(a - 1) == std::vector<double>{0, 1, 3});
  REQUIRE(vals(10 - a) == std::vector<double>{9, 8, 6});
  REQUIRE(vals(rsub(a, 10)) == std::vector<double>{9, 8, 6});
  REQUIRE(vals(a * 0.5) == std::vector<double>{0.5, 1, 2});
  REQUIRE(vals(2 * a) == std::vector<double>{2, 4, 8});
  REQUIRE(vals(a / 4) == std::vector<double>{0.25, 0.5, 1});
  REQUIRE(vals(4 / a) == std::vector<double>{4, 2, 1});
  REQUIRE(vals(-a) == std::vector<double>{-1, -2, -4});
}

TEST_CASE("type promotion follows PyTorch", "[elementwise][promotion]") {
  Tensor i32t = from_vector<int32_t>({1, 2, 3});
  Tensor i64t = from_vector<int64_t>({1, 2, 3});
  Tensor f32t = from_vector<float>({1, 2, 3});
  Tensor f64t = T({1, 2, 3});
  Tensor f16t = f32t.to(f16);
  Tensor bf16t = f32t.to(bf16);
  Tensor bools = from_vector<bool>({true, false, true});

  REQUIRE((i32t + i64t).dtype() == i64);
  REQUIRE((i32t + f16t).dtype() == f16);
  REQUIRE((f16t + bf16t).dtype() == f32);
  REQUIRE((f32t + f64t).dtype() == f64);
  REQUIRE((bools + bools).dtype() == boolean);
  REQUIRE(vals(bools + bools) == std::vector<double>{1, 0, 1});
  REQUIRE((bools + i32t).dtype() == i32);
  // Scalars do not widen within their category; a floating one lifts integers to f32.
  REQUIRE((i32t + 2).dtype() == i32);
  REQUIRE((i32t * 2.5).dtype() == f32);
  REQUIRE(vals(i32t * 2.5) == std::vector<double>{2.5, 5, 7.5});
  REQUIRE((f16t * 2.5).dtype() == f16);
  REQUIRE((bools + 1).dtype() == i64);
  // 0-dim tensors count like Scalars against dimensioned tensors, but keep their own dtype.
  REQUIRE((f32t + scalar_tensor(1.0, f64)).dtype() == f32);
  REQUIRE((i32t + scalar_tensor(1.0, f64)).dtype() == f64);
  REQUIRE((i32t + scalar_tensor(1, i64)).dtype() == i32);
  REQUIRE((bools + scalar_tensor(1, i64)).dtype() == i64);
  REQUIRE((scalar_tensor(1.0, f64) + scalar_tensor(1.0, f32)).dtype() == f64);
  // True division of integers gives the default float.
  REQUIRE((i64t / i64t).dtype() == f32);
  REQUIRE(vals(i64t / 2) == std::vector<double>{0.5, 1, 1.5});
  REQUIRE((f16t / 2).dtype() == f16);
  REQUIRE(detail::result_type(i32t, Scalar(1.5)) == f32);
  REQUIRE(detail::result_type(i64t, f16t, bools) == f16);
  // Unary floating math promotes integers.
  REQUIRE(exp(i32t).dtype() == f32);
  REQUIRE(relu(i32t).dtype() == i32);
  REQUIRE(abs(from_vector<int64_t>({-3, 2})).to_vector<int64_t>() == std::vector<int64_t>{3, 2});
}

TEST_CASE("2-byte floats compute in f32 and round once", "[elementwise][half]") {
  // 1 + 2^-11 is not representable in f16: the tie rounds to even (1.0).
  Tensor one = full({2}, 1.0, f16);
  Tensor tiny = full({2}, std::ldexp(1.0, -11), f16);
  REQUIRE(vals(one + tiny) == std::vector<double>{1, 1});
  // 3 * 2^-11 above 1: mantissa 1.5 ulps rounds to the even 2 ulps.
  REQUIRE(vals(one + tiny * 3) == std::vector<double>{1 + std::ldexp(1.0, -9), 1 + std::ldexp(1.0, -9)});
  Tensor big = full({1}, 60000.0, f16);
  REQUIRE(std::isinf(vals(big + big)[0]));
  Tensor b = from_vector<float>({1, 2, 3}).to(bf16);
  require_close(vals(exp(b)), {2.71875, 7.375, 20.125});  // exp rounded to 8 significant bits
  REQUIRE(exp(b).dtype() == bf16);
}

TEST_CASE("non-contiguous operands", "[elementwise]") {
  Tensor base = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = base.transpose(0, 1);  // [3, 2], strides [1, 3]
  REQUIRE_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  Tensor other = T({1, -1}, {2});
  REQUIRE(vals(t + other) == vals(c + other));
  REQUIRE(vals(t * t) == std::vector<double>{1, 16, 4, 25, 9, 36});
  REQUIRE(vals(exp(t)) == vals(exp(c)));
  // A strided view built by hand: every second element of a [2, 4] row-major buffer.
  Tensor buf = T({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4});
  Tensor every2 = make_view(buf, {2, 2}, {4, 2}, 1);  // 1 3 / 5 7
  REQUIRE(vals(every2) == std::vector<double>{1, 3, 5, 7});
  REQUIRE(vals(every2 * T({10, 100}, {2, 1})) == std::vector<double>{10, 30, 500, 700});
  REQUIRE(vals(maximum(every2, t.slice(0, 0, 2))) == std::vector<double>{1, 4, 5, 7});
  // Expanded (stride 0) operands.
  Tensor e = T({1, 2}, {2, 1}).expand({2, 3});
  REQUIRE(vals(e + base) == std::vector<double>{2, 3, 4, 6, 7, 8});
  // Large enough for the contiguous fast path and the strided path to both run.
  Tensor big = rand({64, 33}, f64);
  Tensor bt = big.transpose(0, 1);
  require_close(vals(bt * 2 + bt), vals((bt.contiguous() * 3)));
}

TEST_CASE("unary math values", "[elementwise]") {
  Tensor x = T({-2, -0.5, 0, 0.5, 2});
  require_close(vals(abs(x)), {2, 0.5, 0, 0.5, 2});
  require_close(vals(relu(x)), {0, 0, 0, 0.5, 2});
  require_close(vals(tanh(x)), {std::tanh(-2.0), std::tanh(-0.5), 0, std::tanh(0.5), std::tanh(2.0)});
  require_close(vals(sigmoid(x)), {0.11920292202211755, 0.3775406687981454, 0.5, 0.6224593312018546,
                                   0.8807970779778823});
  // gelu(x) = x Phi(x); Phi(2) = 0.9772498680518208, Phi(0.5) = 0.6914624612740131.
  require_close(vals(gelu(x)), {-2 * (1 - 0.9772498680518208), -0.5 * (1 - 0.6914624612740131), 0,
                                0.5 * 0.6914624612740131, 2 * 0.9772498680518208});
  // tanh approximation at 1: 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)).
  require_close(vals(gelu(T({1.0}), true)), {0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715))});
  require_close(vals(gelu(T({1.0}), true)), {0.8411919906082768}, 1e-12);
  require_close(vals(silu(x)), {-2 * 0.11920292202211755, -0.5 * 0.3775406687981454, 0, 0.5 * 0.6224593312018546,
                                2 * 0.8807970779778823});
  Tensor p = T({0.25, 1, 4});
  require_close(vals(sqrt(p)), {0.5, 1, 2});
  require_close(vals(rsqrt(p)), {2, 1, 0.5});
  require_close(vals(log(p)), {std::log(0.25), 0, std::log(4.0)});
  require_close(vals(exp(T({0, 1}))), {1, M_E});
  require_close(vals(clamp(x, -1.0, 1.0)), {-1, -0.5, 0, 0.5, 1});
  require_close(vals(clamp(x, std::nullopt, 0.0)), {-2, -0.5, 0, 0, 0});
  require_close(vals(clamp(x, 1.0, std::nullopt)), {1, 1, 1, 1, 2});
  require_close(vals(clamp(x, 1.0, -1.0)), {-1, -1, -1, -1, -1});  // lo > hi: hi everywhere, as PyTorch
  // NaN propagates through relu, clamp, maximum and minimum.
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = T({nan, 1});
  REQUIRE(std::isnan(vals(relu(n))[0]));
  REQUIRE(std::isnan(vals(clamp(n, 0.0, 0.5))[0]));
  REQUIRE(std::isnan(vals(maximum(n, T({0, 0})))[0]));
  REQUIRE(std::isnan(vals(minimum(T({0, 0}), n))[0]));
  // Integer clamp keeps the dtype for whole bounds, promotes for fractional ones.
  Tensor ints = from_vector<int64_t>({-5, 0, 5});
  REQUIRE(clamp(ints, -1.0, 1.0).to_vector<int64_t>() == std::vector<int64_t>{-1, 0, 1});
  REQUIRE(clamp(ints, -1.0, 1.0).dtype() == i64);
  REQUIRE(clamp(ints, 0.5, std::nullopt).dtype() == f32);
}

// Found by tools/fuzz/fuzz_ops (corpus/ops/crash-fill-inf-i32, crash-clamp-bound-i32): the value
// was converted to the integer type unchecked (undefined behaviour); PyTorch refuses it.
TEST_CASE("fill_ and integer clamp bounds refuse values the dtype cannot hold", "[elementwise][fuzz]") {
  using Catch::Contains;
  Tensor i = zeros({3}, i32);
  REQUIRE_THROWS_WITH(fill_(i, INFINITY), Contains("[fill_] value inf cannot be converted to i32"));
  REQUIRE_THROWS_WITH(fill_(i, 1e10), Contains("[fill_]") && Contains("i32"));
  REQUIRE_THROWS_WITH(fill_(zeros({2}, i64), NAN), Contains("[fill_] value nan cannot be converted to i64"));
  REQUIRE(i.to_vector<int32_t>() == std::vector<int32_t>{0, 0, 0});  // untouched
  fill_(i, -7.9);
  REQUIRE(i.to_vector<int32_t>() == std::vector<int32_t>{-7, -7, -7});
  // A whole bound keeps an integer tensor's dtype, so it has to fit it.
  REQUIRE_THROWS_WITH(clamp(i, 1e30, std::nullopt), Contains("[clamp] value 1e+30 cannot be converted to i32"));
  REQUIRE_THROWS_WITH(clamp(from_vector<int64_t>({1}), std::nullopt, 1e19), Contains("[clamp]") && Contains("i64"));
  REQUIRE_THROWS_WITH(clamp_(i, -1e12, 0.0), Contains("[clamp_]") && Contains("i32"));
  REQUIRE(clamp(i, -2147483648.0, 2147483647.0).to_vector<int32_t>() == std::vector<int32_t>{-7, -7, -7});
}

TEST_CASE("pow with scalar and tensor exponents", "[elementwise]") {
  Tensor x = T({1, 2, 3});
  require_close(vals(pow(x, 2)), {1, 4, 9});
  require_close(vals(pow(x, 3)), {1, 8, 27});
  require_close(vals(pow(x, 0.5)), {1, std::sqrt(2.0), std::sqrt(3.0)});
  require_close(vals(pow(x, -1)), {1, 0.5, 1.0 / 3});
  require_close(vals(pow(x, -0.5)), {1, 1 / std::sqrt(2.0), 1 / std::sqrt(3.0)});
  require_close(vals(pow(x, 1.5)), {1, std::pow(2.0, 1.5), std::pow(3.0, 1.5)});
  require_close(vals(pow(x, 0)), {1, 1, 1});
  require_close(vals(pow(x, T({2, 0.5}, {2, 1}))), {1, 4, 9, 1, std::sqrt(2.0), std::sqrt(3.0)});
  Tensor ints = from_vector<int64_t>({-2, 3, 5});
  REQUIRE(pow(ints, 3).to_vector<int64_t>() == std::vector<int64_t>{-8, 27, 125});
  REQUIRE(pow(ints, 3).dtype() == i64);
  REQUIRE(pow(ints, from_vector<int64_t>({2, 0, -1})).to_vector<int64_t>() == std::vector<int64_t>{4, 1, 0});
  REQUIRE(pow(ints, 0.5).dtype() == f32);
  REQUIRE_THROWS_WITH(pow(ints, -2), Contains("[pow]") && Contains("negative integer powers"));
}

TEST_CASE("comparisons, logic, isnan, isinf", "[elementwise]") {
  Tensor a = T({1, 2, 3});
  Tensor b = T({3, 2, 1});
  auto bools = [](const Tensor& t) {
    REQUIRE(t.dtype() == boolean);
    return t.to_vector<bool>();
  };
  using V = std::vector<bool>;
  REQUIRE(bools(eq(a, b)) == V{false, true, false});
  REQUIRE(bools(ne(a, b)) == V{true, false, true});
  REQUIRE(bools(lt(a, b)) == V{true, false, false});
  REQUIRE(bools(le(a, b)) == V{true, true, false});
  REQUIRE(bools(gt(a, b)) == V{false, false, true});
  REQUIRE(bools(ge(a, b)) == V{false, true, true});
  REQUIRE(bools(a == 2) == V{false, true, false});
  REQUIRE(bools(ne(a, 2)) == V{true, false, true});
  REQUIRE(bools(a < 2) == V{true, false, false});
  REQUIRE(bools(le(a, 2)) == V{true, true, false});
  REQUIRE(bools(a > 2) == V{false, false, true});
  REQUIRE(bools(ge(a, 2)) == V{false, true, true});
  // An integer tensor compared with a fractional Scalar compares in f32, not truncated.
  Tensor ints = from_vector<int32_t>({0, 1, 2});
  REQUIRE(bools(lt(ints, 0.5)) == V{true, false, false});
  REQUIRE(bools(eq(ints, 1.5)) == V{false, false, false});
  // Broadcast comparison of mixed dtypes.
  REQUIRE(bools(eq(T({1, 2}, {2, 1}), ints)) == V{false, true, false, false, false, true});
  Tensor p = from_vector<bool>({true, true, false, false});
  Tensor q = from_vector<bool>({true, false, true, false});
  REQUIRE(bools(logical_and(p, q)) == V{true, false, false, false});
  REQUIRE(bools(logical_or(p, q)) == V{true, true, true, false});
  REQUIRE(bools(logical_xor(p, q)) == V{false, true, true, false});
  REQUIRE(bools(logical_not(p)) == V{false, false, true, true});
  REQUIRE(bools(p && q) == V{true, false, false, false});
  REQUIRE(bools(logical_and(T({0, 0.5}), from_vector<int64_t>({3, 3}))) == V{false, true});
  REQUIRE(bools(!T({0, -2})) == V{true, false});
  double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  Tensor s = T({1, inf, -inf, nan});
  REQUIRE(bools(isnan(s)) == V{false, false, false, true});
  REQUIRE(bools(isinf(s)) == V{false, true, true, false});
  REQUIRE(bools(isnan(s.to(f16))) == V{false, false, false, true});
  REQUIRE(bools(isinf(ints)) == V{false, false, false});
  // Comparisons are not differentiable.
  Tensor x = leaf({1, 2}, {2});
  REQUIRE_FALSE((x > 1).requires_grad());
}

TEST_CASE("where broadcasts and promotes", "[elementwise]") {
  Tensor cond = from_vector<bool>({true, false, true}, {3});
  Tensor a = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({-1, -2}, {2, 1});
  Tensor w = where(cond, a, b);
  REQUIRE(w.dtype() == f64);
  REQUIRE(w.shape() == Shape{2, 3});
  REQUIRE(vals(w) == std::vector<double>{1, -1, 3, 4, -2, 6});
  REQUIRE_THROWS_WITH(where(T({1, 0, 1}), a, b), Contains("[where] condition must be a bool tensor") && Contains("f64"));
  REQUIRE_THROWS_WITH(where(from_vector<bool>({true, false}), a, b), Contains("[where]") && Contains("[2]"));
}

TEST_CASE("to_dtype converts, and is differentiable only between floats", "[elementwise]") {
  Tensor x = T({1.7, -1.7, 300});
  REQUIRE(x.to(i32).to_vector<int32_t>() == std::vector<int32_t>{1, -1, 300});  // truncation toward 0
  REQUIRE(x.to(boolean).to_vector<bool>() == std::vector<bool>{true, true, true});
  REQUIRE(T({0, 2}).to(boolean).to_vector<bool>() == std::vector<bool>{false, true});
  REQUIRE(from_vector<bool>({true, false}).to(f32).to_vector<float>() == std::vector<float>{1, 0});
  REQUIRE(x.to(f64).is_same(x));  // no copy when the dtype is already right
  Tensor l = leaf({1.5, 2.5}, {2});
  Tensor h = l.to(f32);
  REQUIRE(h.requires_grad());
  (h * 2).sum().backward();
  REQUIRE(l.grad().dtype() == f64);
  REQUIRE(vals(l.grad()) == std::vector<double>{2, 2});
  REQUIRE_FALSE(l.to(i64).requires_grad());
}

// ---------------------------------------------------------------- gradients

TEST_CASE("gradcheck: binary arithmetic with broadcasting", "[elementwise][gradcheck]") {
  manual_seed(11);
  Tensor a = rnd({2, 3}), b = rnd({3}), c = rnd({2, 1}), s = rnd({});
  Tensor pos = rnd({3}, 0.5, 2);
  check_grad([](const TensorList& in) { return add(in[0], in[1], 2.5); }, {a, b});
  check_grad([](const TensorList& in) { return sub(in[0], in[1], -1.5); }, {c, b});
  check_grad([](const TensorList& in) { return in[0] * in[1]; }, {a, c});
  check_grad([](const TensorList& in) { return in[0] / in[1]; }, {a, pos});
  check_grad([](const TensorList& in) { return in[1] / in[0]; }, {pos, c});
  check_grad([](const TensorList& in) { return in[0] * in[1] + in[1]; }, {a, s});  // 0-dim operand
  check_grad([](const TensorList& in) { return maximum(in[0], in[1]); }, {a, b});
  check_grad([](const TensorList& in) { return minimum(in[0], in[1]); }, {c, a});
  check_grad([](const TensorList& in) { return pow(in[0], in[1]); }, {pos, c});
  // Non-contiguous operands inside the function.
  check_grad([](const TensorList& in) { return in[0].transpose(0, 1) * in[1]; }, {a, c.transpose(0, 1).contiguous()});
  // Mixed dtypes: the f32 operand gets an f32 gradient.
  Tensor f = from_vector<float>({1, 2, 3});
  f.requires_grad_();
  Tensor y = (f * T({2, 2, 2})).sum();
  REQUIRE(y.dtype() == f64);
  y.backward();
  REQUIRE(f.grad().dtype() == f32);
  REQUIRE(f.grad().to_vector<float>() == std::vector<float>{2, 2, 2});
}

TEST_CASE("gradcheck: Scalar operands", "[elementwise][gradcheck]") {
  manual_seed(12);
  Tensor a = rnd({2, 3}), pos = rnd({4}, 0.5, 2);
  check_grad([](const TensorList& in) { return in[0] + 3; }, {a});
  check_grad([](const TensorList& in) { return in[0] - 3; }, {a});
  check_grad([](const TensorList& in) { return 3 - in[0]; }, {a});
  check_grad([](const TensorList& in) { return in[0] * -2.5; }, {a});
  check_grad([](const TensorList& in) { return in[0] / 4; }, {a});
  check_grad([](const TensorList& in) { return 2 / in[0]; }, {pos});
  check_grad([](const TensorList& in) { return -in[0]; }, {a});
  check_grad([](const TensorList& in) { return pow(in[0], 2); }, {a});
  check_grad([](const TensorList& in) { return pow(in[0], 3); }, {a});
  check_grad([](const TensorList& in) { return pow(in[0], -1.5); }, {pos});
  check_grad([](const TensorList& in) { return pow(in[0], 0.5); }, {pos});
  check_grad([](const TensorList& in) { return pow(in[0], 0) * in[0]; }, {a});
}

TEST_CASE("gradcheck: unary math", "[elementwise][gradcheck]") {
  manual_seed(13);
  Tensor a = rnd({3, 4}, -2, 2), pos = rnd({3, 4}, 0.3, 3);
  check_grad([](const TensorList& in) { return abs(in[0]); }, {a});
  check_grad([](const TensorList& in) { return exp(in[0]); }, {a});
  check_grad([](const TensorList& in) { return log(in[0]); }, {pos});
  check_grad([](const TensorList& in) { return sqrt(in[0]); }, {pos});
  check_grad([](const TensorList& in) { return rsqrt(in[0]); }, {pos});
  check_grad([](const TensorList& in) { return tanh(in[0]); }, {a});
  check_grad([](const TensorList& in) { return sigmoid(in[0]); }, {a});
  check_grad([](const TensorList& in) { return relu(in[0]); }, {a});
  check_grad([](const TensorList& in) { return gelu(in[0]); }, {a});
  check_grad([](const TensorList& in) { return gelu(in[0], true); }, {a});
  check_grad([](const TensorList& in) { return silu(in[0]); }, {a});
  check_grad([](const TensorList& in) { return clamp(in[0], -0.5, 0.7); }, {a});
  check_grad([](const TensorList& in) { return clamp(in[0], std::nullopt, 0.1); }, {a});
}

TEST_CASE("gradcheck: where with broadcasting", "[elementwise][gradcheck]") {
  manual_seed(14);
  Tensor cond = from_vector<bool>({true, false, false, true}, {2, 2});
  Tensor a = rnd({2, 2}), b = rnd({2});
  check_grad([cond](const TensorList& in) { return where(cond, in[0], in[1]); }, {a, b});
  check_grad([cond](const TensorList& in) { return where(cond, in[1], in[0]) * in[0]; }, {a, b});
}

TEST_CASE("gradients at ties and kinks follow PyTorch", "[elementwise]") {
  // maximum/minimum split the gradient equally on ties.
  Tensor a = leaf({1, 2, 3}, {3});
  Tensor b = leaf({1, 5, 0}, {3});
  maximum(a, b).sum().backward();
  REQUIRE(vals(a.grad()) == std::vector<double>{0.5, 0, 1});
  REQUIRE(vals(b.grad()) == std::vector<double>{0.5, 1, 0});
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  minimum(a, b).sum().backward();
  REQUIRE(vals(a.grad()) == std::vector<double>{0.5, 1, 0});
  REQUIRE(vals(b.grad()) == std::vector<double>{0.5, 0, 1});
  // Broadcast tie: the row operand collects halves from each row.
  Tensor r = leaf({1}, {1});
  Tensor m = T({1, 1, 2}, {3});
  maximum(m, r).sum().backward();
  REQUIRE(vals(r.grad()) == std::vector<double>{1});
  // relu and abs have gradient 0 at 0.
  Tensor x = leaf({-1, 0, 2}, {3});
  relu(x).sum().backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 0, 1});
  x.set_grad(Tensor());
  abs(x).sum().backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{-1, 0, 1});
  // clamp passes the gradient where lo <= x <= hi (bounds included).
  Tensor c = leaf({-2, -1, 0, 1, 2}, {5});
  clamp(c, -1.0, 1.0).sum().backward();
  REQUIRE(vals(c.grad()) == std::vector<double>{0, 1, 1, 1, 0});
  // pow with exponent 0 has gradient 0, also at x = 0.
  Tensor z = leaf({0, 2}, {2});
  pow(z, 0).sum().backward();
  REQUIRE(vals(z.grad()) == std::vector<double>{0, 0});
  // pow(a, b) at a = 0, b >= 0: the exponent gradient is 0, not NaN.
  Tensor base = leaf({0, 2}, {2}), ex = leaf({2, 3}, {2});
  pow(base, ex).sum().backward();
  require_close(vals(ex.grad()), {0, 8 * std::log(2.0)});
  require_close(vals(base.grad()), {0, 12});
}

TEST_CASE("add records a lean node and backward gives the broadcast gradient", "[elementwise]") {
  Tensor a = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = leaf({1, 1, 1}, {3});
  Tensor y = add(a, b, 3);
  REQUIRE(y.grad_fn());
  REQUIRE(y.grad_fn()->name() == "AddBackward");
  y.sum().backward();
  REQUIRE(vals(a.grad()) == std::vector<double>(6, 1));
  REQUIRE(vals(b.grad()) == std::vector<double>{6, 6, 6});
  // An integer operand does not stop the float one's gradient.
  Tensor c = leaf({1, 2}, {2});
  (c + from_vector<int64_t>({5, 6})).sum().backward();
  REQUIRE(vals(c.grad()) == std::vector<double>{1, 1});
  // No history without grad.
  REQUIRE_FALSE((T({1}) + T({2})).requires_grad());
  {
    NoGradGuard ng;
    REQUIRE_FALSE((a + b).requires_grad());
  }
}

// ---------------------------------------------------------------- in place

TEST_CASE("in-place ops mutate, broadcast the operand, and bump the version", "[elementwise][inplace]") {
  Tensor a = T({1, 2, 3, 4}, {2, 2});
  uint64_t v0 = a.version();
  add_(a, T({10, 20}, {2}));
  REQUIRE(vals(a) == std::vector<double>{11, 22, 13, 24});
  REQUIRE(a.version() == v0 + 1);
  a.add_(T({1, 1}, {2}), -2);
  REQUIRE(vals(a) == std::vector<double>{9, 20, 11, 22});
  a += 1;
  sub_(a, T({1}, {1}));
  a *= T({2, 1}, {2, 1});
  REQUIRE(vals(a) == std::vector<double>{18, 40, 11, 22});
  a /= 2;
  mul_(a, 2);
  div_(a, T({2, 4}, {2}));
  REQUIRE(vals(a) == std::vector<double>{9, 10, 5.5, 5.5});
  a -= T({0.5, 0.5}, {2});
  REQUIRE(vals(a) == std::vector<double>{8.5, 9.5, 5, 5});
  REQUIRE(a.version() == v0 + 9);
  zero_(a);
  REQUIRE(vals(a) == std::vector<double>(4, 0));
  fill_(a, 2.5);
  REQUIRE(vals(a) == std::vector<double>(4, 2.5));
  clamp_(a, std::nullopt, 1.0);
  REQUIRE(vals(a) == std::vector<double>(4, 1));
  REQUIRE(a.version() == v0 + 12);
  // f32 self with an f64 operand: computed in f64, stored as f32.
  Tensor f = from_vector<float>({1, 2});
  f.add_(T({0.5, 0.25}));
  REQUIRE(f.dtype() == f32);
  REQUIRE(f.to_vector<float>() == std::vector<float>{1.5f, 2.25f});
  // An integer self with an integral Scalar stays integral.
  Tensor i = from_vector<int64_t>({1, 2});
  i.mul_(3);
  REQUIRE(i.to_vector<int64_t>() == std::vector<int64_t>{3, 6});
}

TEST_CASE("in-place ops through views write into the base", "[elementwise][inplace]") {
  Tensor base = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor col = base.select(1, 1);  // non-contiguous [2]
  uint64_t v0 = base.version();
  col.mul_(10);
  REQUIRE(vals(base) == std::vector<double>{1, 20, 3, 4, 50, 6});
  REQUIRE(base.version() == v0 + 1);  // views share the version counter
  base.transpose(0, 1).add_(T({100, 200}, {2}));
  REQUIRE(vals(base) == std::vector<double>{101, 120, 103, 204, 250, 206});
  // The operand aliasing self in a different layout is read before it is overwritten.
  Tensor sq = T({1, 2, 3, 4}, {2, 2});
  sq.add_(sq.transpose(0, 1));
  REQUIRE(vals(sq) == std::vector<double>{2, 5, 5, 8});
  Tensor s2 = T({1, 2, 3, 4}, {2, 2});
  s2.copy_(s2.transpose(0, 1));
  REQUIRE(vals(s2) == std::vector<double>{1, 3, 2, 4});
}

TEST_CASE("copy_ broadcasts and casts", "[elementwise][inplace]") {
  Tensor dst = zeros({2, 3}, i32);
  dst.copy_(T({1.9, -2.9, 3}, {3}));
  REQUIRE(dst.to_vector<int32_t>() == std::vector<int32_t>{1, -2, 3, 1, -2, 3});
  Tensor h = zeros({2}, f16);
  h.copy_(from_vector<float>({65520.0f, 1.0f}));
  REQUIRE(std::isinf(vals(h)[0]));
  REQUIRE_THROWS_WITH(dst.copy_(T({1, 2})), Contains("[copy_]") && Contains("[2]") && Contains("[2, 3]"));
}

TEST_CASE("optimizer in-place ops: addcmul_, addcdiv_, lerp_", "[elementwise][inplace]") {
  Tensor p = T({1, 2, 3});
  addcmul_(p, T({1, 2, 3}), T({2}, {1}), 0.5);  // p += 0.5 * a * b
  REQUIRE(vals(p) == std::vector<double>{2, 4, 6});
  addcdiv_(p, T({1, 2, 3}), T({2, 4, 8}), -2);  // p += -2 * a / b
  REQUIRE(vals(p) == std::vector<double>{1, 3, 5.25});
  Tensor q = T({0, 10});
  lerp_(q, T({10, 20}), 0.25);
  REQUIRE(vals(q) == std::vector<double>{2.5, 12.5});
  lerp_(q, T({7, 7}), 1.0);
  REQUIRE(vals(q) == std::vector<double>{7, 7});  // weight 1 lands exactly on end
  uint64_t v = q.version();
  lerp_(q, T({1, 1}), 0.75);
  REQUIRE(q.version() == v + 1);
  Tensor f = from_vector<float>({1, 1});
  addcmul_(f, from_vector<float>({2, 3}), from_vector<float>({4, 5}));
  REQUIRE(f.to_vector<float>() == std::vector<float>{9, 16});
  REQUIRE_THROWS_WITH(addcdiv_(from_vector<int64_t>({1}), T({1}), T({1})), Contains("[addcdiv_] self must be floating"));
  REQUIRE_THROWS_WITH(lerp_(q, T({1, 2, 3}), 0.5), Contains("[lerp_]") && Contains("[3]"));
}

TEST_CASE("in-place errors", "[elementwise][inplace]") {
  Tensor i = from_vector<int64_t>({1, 2});
  REQUIRE_THROWS_WITH(i.add_(0.5), Contains("[add_] result type f32 can't be cast to the desired output type i64"));
  REQUIRE_THROWS_WITH(i.add_(T({1, 1})), Contains("[add_] result type f64 can't be cast to the desired output type i64"));
  REQUIRE_THROWS_WITH(i.div_(2), Contains("[div_] result type f32 can't be cast to the desired output type i64"));
  REQUIRE_THROWS_WITH(from_vector<bool>({true}).add_(1), Contains("[add_]") && Contains("bool"));
  REQUIRE(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2});  // untouched by the failures
  // The operand must broadcast to self's shape, not the other way round.
  Tensor small = T({1, 2, 3});
  REQUIRE_THROWS_WITH(small.add_(T({1, 2, 3, 4, 5, 6}, {2, 3})),
                      Contains("[add_] other of shape [2, 3] cannot be broadcast to self's shape [3]"));
  REQUIRE_THROWS_WITH(small.mul_(T({1, 2})), Contains("[mul_]") && Contains("[2]") && Contains("[3]"));
  // A leaf that requires grad cannot be modified while grad mode is on; under no_grad it can.
  Tensor w = leaf({1, 2}, {2});
  uint64_t v = w.version();
  REQUIRE_THROWS_WITH(w.add_(1), Contains("[add_]") && Contains("leaf"));
  REQUIRE_THROWS_WITH(w.zero_(), Contains("[zero_]"));
  REQUIRE(w.version() == v);
  {
    NoGradGuard ng;
    w.sub_(T({1, 1}));
  }
  REQUIRE(vals(w) == std::vector<double>{0, 1});
  // An operand that requires grad would lose its gradient: an error in grad mode.
  Tensor buf = T({0, 0});
  REQUIRE_THROWS_WITH(buf.add_(w), Contains("[add_] an operand") && Contains("requires grad"));
  REQUIRE_THROWS_WITH(buf.copy_(w * 2), Contains("[copy_]"));
  // A saved tensor modified in place is caught at backward.
  Tensor x = leaf({1, 2}, {2});
  Tensor t = x * 1.0;
  Tensor y = t * t;
  {
    NoGradGuard ng;
    t.mul_(2);
  }
  REQUIRE_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
  // Writing into an expanded view would race on shared elements.
  Tensor e = T({1, 2}, {2, 1}).expand({2, 3});
  REQUIRE_THROWS_WITH(e.add_(1), Contains("[add_]") && Contains("expanded"));
  REQUIRE_THROWS_WITH(clamp_(T({1}), std::nullopt, std::nullopt), Contains("[clamp_] at least one"));
}

// ---------------------------------------------------------------- errors

TEST_CASE("error messages name the op, shapes and dtypes", "[elementwise][errors]") {
  Tensor a = T({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = T({1, 2}, {2});
  REQUIRE_THROWS_WITH(a + b, Contains("[add]") && Contains("[2, 3]") && Contains("[2]"));
  REQUIRE_THROWS_WITH(a * b, Contains("[mul]"));
  REQUIRE_THROWS_WITH(maximum(a, b), Contains("[maximum]"));
  REQUIRE_THROWS_WITH(eq(a, b), Contains("[eq]"));
  Tensor p = from_vector<bool>({true, false});
  REQUIRE_THROWS_WITH(p - p, Contains("[sub] subtraction with bool tensors is not supported"));
  REQUIRE_THROWS_WITH(-p, Contains("[neg] not supported for bool tensors"));
  REQUIRE_THROWS_WITH(add(from_vector<int64_t>({1}), from_vector<int64_t>({1}), 0.5),
                      Contains("[add] alpha must be an integral number") && Contains("i64"));
  REQUIRE_THROWS_WITH(clamp(a, std::optional<double>(), std::nullopt), Contains("[clamp] at least one of lo and hi"));
  REQUIRE_THROWS_WITH(a + Tensor(), Contains("undefined"));
}

// ---------------------------------------------------------------- libtorch spellings

TEST_CASE("Scalar comparisons in both orders give bool, promoting as PyTorch", "[elementwise][scalar]") {
  using V = std::vector<bool>;
  auto bools = [](const Tensor& t) {
    REQUIRE(t.dtype() == boolean);
    return t.to_vector<bool>();
  };
  // An integer tensor against a fractional Scalar compares in f32: truncating -0.5 to 0 would
  // make 0 <= -0.5 true.
  Tensor t = from_vector<int64_t>({-1, 0, 1, 2});
  REQUIRE(bools(t <= -0.5) == V{true, false, false, false});
  REQUIRE(bools(t == 0.5) == V{false, false, false, false});
  REQUIRE(bools(t != 0) == V{true, false, true, true});
  REQUIRE(bools(t < 1) == V{true, true, false, false});
  REQUIRE(bools(t > 1) == V{false, false, false, true});
  REQUIRE(bools(t >= 0.5) == V{false, false, true, true});
  // Scalar first mirrors the comparison.
  REQUIRE(bools(0.5 < t) == V{false, false, true, true});
  REQUIRE(bools(0.5 <= t) == V{false, false, true, true});
  REQUIRE(bools(0.5 > t) == V{true, true, false, false});
  REQUIRE(bools(-0.5 >= t) == V{true, false, false, false});
  REQUIRE(bools(1 == t) == V{false, false, true, false});
  REQUIRE(bools(1 != t) == V{true, true, false, true});
  // NaN compares unequal to everything.
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor f = T({nan, 1.5});
  REQUIRE(bools(f != 1.5) == V{true, false});
  REQUIRE(bools(f == 1.5) == V{false, true});
  REQUIRE(bools(f <= 2) == V{false, true});
  REQUIRE(bools(2 > f) == V{false, true});
  // Masks combine with & | ^ ~ (bool tensors only).
  Tensor x = T({-1, 0.25, 0.75, 2});
  REQUIRE(bools((x > 0) & (x < 1)) == V{false, true, true, false});
  REQUIRE(bools((x < 0) | (x > 1)) == V{true, false, false, true});
  REQUIRE(bools((x > 0) ^ (x > 0.5)) == V{false, true, false, false});
  REQUIRE(bools(~(x > 0)) == V{true, false, false, false});
  REQUIRE_THROWS_WITH(t & t, Contains("[bitwise_and] only bool tensors are supported (got i64 of shape [4]"));
  REQUIRE_THROWS_WITH(~t, Contains("[bitwise_not] only bool tensors"));
  // Comparisons carry no gradient.
  REQUIRE_FALSE((0.5 < leaf({1, 2}, {2})).requires_grad());
}

TEST_CASE("compound assignment with Scalars: += -= *= /=", "[elementwise][scalar][inplace]") {
  Tensor u = T({1, 2, 3});
  uint64_t v0 = u.version();
  u -= 1;
  REQUIRE(vals(u) == std::vector<double>{0, 1, 2});
  u += 1;
  REQUIRE(vals(u) == std::vector<double>{1, 2, 3});
  u *= 2;
  REQUIRE(vals(u) == std::vector<double>{2, 4, 6});
  u /= 4;
  REQUIRE(vals(u) == std::vector<double>{0.5, 1, 1.5});
  u -= 0.25;
  REQUIRE(vals(u) == std::vector<double>{0.25, 0.75, 1.25});
  REQUIRE(u.version() == v0 + 5);
  REQUIRE(u.sub_(0.25).is_same(u));
  REQUIRE(vals(u) == std::vector<double>{0, 0.5, 1});
  // Integers keep their dtype with integral Scalars; a result that needs f32 cannot be stored.
  Tensor i = from_vector<int64_t>({5, 6});
  i -= 1;
  i *= 3;
  REQUIRE(i.to_vector<int64_t>() == std::vector<int64_t>{12, 15});
  REQUIRE(i.dtype() == i64);
  REQUIRE_THROWS_WITH(i -= 1.5, Contains("[sub_] result type f32 can't be cast to the desired output type i64"));
  REQUIRE_THROWS_WITH(i /= 2, Contains("[div_] result type f32 can't be cast to the desired output type i64"));
  REQUIRE_THROWS_WITH(from_vector<bool>({true}) -= 1, Contains("[sub_]"));
  REQUIRE(i.to_vector<int64_t>() == std::vector<int64_t>{12, 15});
  // A leaf that requires grad is modified only under no_grad.
  Tensor w = leaf({1, 2}, {2});
  REQUIRE_THROWS_WITH(w -= 1, Contains("[sub_] a leaf tensor that requires grad"));
  {
    NoGradGuard ng;
    w -= 1;
  }
  REQUIRE(vals(w) == std::vector<double>{0, 1});
}

TEST_CASE("where with Scalar branches promotes as PyTorch 1.13", "[elementwise][scalar]") {
  Tensor c = from_vector<bool>({true, false});
  // torch.where(c, torch.tensor([1, 2]), 0.5): float32 [1, 0.5]
  Tensor w = where(c, from_vector<int64_t>({1, 2}), 0.5);
  REQUIRE(w.dtype() == f32);
  REQUIRE(vals(w) == std::vector<double>{1, 0.5});
  w = where(c, 2.0, from_vector<int64_t>({1, 2}));
  REQUIRE(w.dtype() == f32);
  REQUIRE(vals(w) == std::vector<double>{2, 2});
  REQUIRE(where(c, from_vector<int32_t>({1, 2}), 3).dtype() == i32);
  REQUIRE(where(c, from_vector<float>({1, 2}).to(f16), 3.5).dtype() == f16);
  REQUIRE(where(c, scalar_tensor(1.0, f64), 0.5).dtype() == f64);  // a 0-dim tensor outranks a Scalar
  // The Scalar is converted straight to the result dtype: 0.1 stays exact in f64.
  REQUIRE(vals(where(c, T({1, 2}), 0.1)) == std::vector<double>{1, 0.1});
  // Two Scalars: cond's shape; i64 when both are integral, else f32.
  Tensor c2 = from_vector<bool>({true, false, false, true}, {2, 2});
  Tensor ss = where(c2, 1.0, 0.0);
  REQUIRE(ss.dtype() == f32);
  REQUIRE(ss.shape() == Shape{2, 2});
  REQUIRE(vals(ss) == std::vector<double>{1, 0, 0, 1});
  REQUIRE(where(c2, 1, 0).dtype() == i64);
  REQUIRE(where(c2, 1, 2.5).dtype() == f32);
  REQUIRE(vals(where(c2, 1, 2.5)) == std::vector<double>{1, 2.5, 2.5, 1});
  // Broadcasting: cond [2, 1] against a [3] tensor.
  Tensor b = where(from_vector<bool>({true, false}, {2, 1}), T({1, 2, 3}), -1);
  REQUIRE(b.shape() == Shape{2, 3});
  REQUIRE(vals(b) == std::vector<double>{1, 2, 3, -1, -1, -1});
  // The method form: x.where(cond, y) is where(cond, x, y).
  REQUIRE(vals(T({1, 2}).where(c, T({7, 8}))) == std::vector<double>{1, 8});
  REQUIRE(vals(T({1, 2}).where(c, -3)) == std::vector<double>{1, -3});
  REQUIRE_THROWS_WITH(where(T({1, 0}), 1.0, 0.0), Contains("[where] condition must be a bool tensor"));
  // The gradient reaches the tensor branch where it was taken.
  Tensor x = leaf({1, 2}, {2});
  where(c, x, 0.0).sum().backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 0});
  Tensor y = leaf({1, 2}, {2});
  (where(c, -1.0, y) * 3).sum().backward();
  REQUIRE(vals(y.grad()) == std::vector<double>{0, 3});
}

TEST_CASE("clamp with tensor bounds: values, NaN, promotion, broadcasting", "[elementwise][clamp]") {
  // The probe of torch 1.13 also used for the gradients below.
  Tensor x = T({-2, 0, 1, 2, 3, 5, 1, 1, 0.5, 4});
  Tensor lo = T({0, 0, 1, 0, 3, 6, 2, 1, 1, 3});
  Tensor hi = T({1, 1, 1, 2, 4, 4, 2, 0, 1, 3});
  REQUIRE(vals(clamp(x, lo, hi)) == std::vector<double>{0, 0, 1, 2, 3, 4, 2, 0, 1, 3});
  REQUIRE(vals(x.clamp(lo, hi)) == std::vector<double>{0, 0, 1, 2, 3, 4, 2, 0, 1, 3});
  REQUIRE(vals(clamp(x, lo, std::nullopt)) == std::vector<double>{0, 0, 1, 2, 3, 6, 2, 1, 1, 4});
  REQUIRE(vals(clamp(x, std::nullopt, hi)) == std::vector<double>{-2, 0, 1, 2, 3, 4, 1, 0, 0.5, 3});
  REQUIRE(vals(clamp(x, Tensor(), hi)) == vals(clamp(x, std::nullopt, hi)));  // undefined: not applied
  REQUIRE(vals(clamp_min(x, lo)) == vals(clamp(x, lo, std::nullopt)));
  REQUIRE(vals(clamp_max(x, hi)) == vals(clamp(x, std::nullopt, hi)));
  REQUIRE(vals(clamp_min(x, 1.0)) == std::vector<double>{1, 1, 1, 2, 3, 5, 1, 1, 1, 4});
  REQUIRE(vals(x.clamp_max(1)) == std::vector<double>{-2, 0, 1, 1, 1, 1, 1, 1, 0.5, 1});
  REQUIRE(vals(x.clamp_min(2)) == std::vector<double>{2, 2, 2, 2, 3, 5, 2, 2, 2, 4});
  // NaN in the input or in a bound gives NaN (torch: clamp([1, nan], [nan, 0], [2, 2]) = [nan, nan]).
  double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> n = vals(clamp(T({1, nan}), T({nan, 0}), T({2, 2})));
  REQUIRE((std::isnan(n[0]) && std::isnan(n[1])));
  // One promotion over the three: int, int, f32 -> f32; f32 with f64 bounds (one 0-dim) -> f64.
  Tensor pi = clamp(from_vector<int64_t>({1, 5, 9}), from_vector<int64_t>({2}), from_vector<float>({7.5}));
  REQUIRE(pi.dtype() == f32);
  REQUIRE(vals(pi) == std::vector<double>{2, 5, 7.5});
  REQUIRE(clamp(from_vector<float>({1, 5, 9}), scalar_tensor(2.0, f64), T({7.5})).dtype() == f64);
  REQUIRE(clamp(from_vector<float>({1, 5, 9}), scalar_tensor(2.0, f64), std::nullopt).dtype() == f32);
  REQUIRE(clamp(from_vector<int64_t>({1, 5, 9}), from_vector<int64_t>({2}), std::nullopt).dtype() == i64);
  // The result broadcasts over all three.
  Tensor bc = clamp(T({0, 5, 10}), T({1, 6}, {2, 1}), T({8}));
  REQUIRE(bc.shape() == Shape{2, 3});
  REQUIRE(vals(bc) == std::vector<double>{1, 5, 8, 6, 6, 8});
  // Errors name clamp.
  REQUIRE_THROWS_WITH(clamp(x, Tensor(), std::nullopt), Contains("[clamp] at least one of min and max must be given"));
  REQUIRE_THROWS_WITH(clamp(x, T({1, 2}), hi), Contains("[clamp]") && Contains("[10]") && Contains("[2]"));
  Tensor p = from_vector<bool>({true, false});
  REQUIRE_THROWS_WITH(clamp(p, p, p), Contains("[clamp] not supported for bool tensors"));
}

TEST_CASE("clamp with tensor bounds: gradients follow PyTorch 1.13", "[elementwise][clamp][gradcheck]") {
  // torch 1.13: y = torch.clamp(x, lo, hi); y.backward(torch.arange(1., 11.)). The input takes
  // the gradient where lo <= x <= hi; lo where x < lo < hi; hi where x > hi or hi < lo (element
  // 5); where lo == hi and x < lo (elements 6 and 8) nobody does.
  Tensor x = leaf({-2, 0, 1, 2, 3, 5, 1, 1, 0.5, 4}, {10});
  Tensor lo = leaf({0, 0, 1, 0, 3, 6, 2, 1, 1, 3}, {10});
  Tensor hi = leaf({1, 1, 1, 2, 4, 4, 2, 0, 1, 3}, {10});
  clamp(x, lo, hi).backward(arange(1, 11).to(f64));
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 2, 3, 4, 5, 0, 0, 0, 0, 0});
  REQUIRE(vals(lo.grad()) == std::vector<double>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(vals(hi.grad()) == std::vector<double>{0, 0, 0, 0, 0, 6, 0, 8, 0, 10});
  // One bound: the input where it is not clamped (x == lo counts as inside), the bound elsewhere.
  for (Tensor* t : {&x, &lo, &hi}) t->set_grad(Tensor());
  clamp(x, lo, std::nullopt).sum().backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 1, 1, 1, 1, 0, 0, 1, 0, 1});
  REQUIRE(vals(lo.grad()) == std::vector<double>{1, 0, 0, 0, 0, 1, 1, 0, 1, 0});
  REQUIRE_FALSE(hi.grad().defined());
  for (Tensor* t : {&x, &lo, &hi}) t->set_grad(Tensor());
  clamp(x, std::nullopt, hi).sum().backward();
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 1, 1, 1, 1, 0, 1, 0, 1, 0});
  REQUIRE(vals(hi.grad()) == std::vector<double>{0, 0, 0, 0, 0, 1, 0, 1, 0, 1});
  // Broadcast bounds get their gradient summed back to their shape, in their dtype.
  Tensor xb = leaf({0, 5, 10, -1, 7, 3}, {2, 3});
  Tensor lob = test_util::leaf(from_vector<float>({1, 4}, {2, 1}));
  Tensor hib = leaf({8}, {1});
  Tensor yb = clamp(xb, lob, hib);
  REQUIRE(yb.dtype() == f64);
  yb.sum().backward();
  REQUIRE(lob.grad().dtype() == f32);
  REQUIRE(vals(lob.grad()) == std::vector<double>{1, 2});  // 0 < 1; -1 < 4 and 3 < 4
  REQUIRE(vals(hib.grad()) == std::vector<double>{1});       // 10 > 8
  REQUIRE(vals(xb.grad()) == std::vector<double>{0, 1, 0, 0, 1, 0});
}

TEST_CASE("gradcheck: clamp with tensor bounds, pow(Tensor) method", "[elementwise][clamp][gradcheck]") {
  // Values a finite difference of 1e-6 cannot push across a kink; element 4 has lo > hi.
  Tensor x = leaf({-0.9, -0.3, 0.1, 0.45, 0.0, 0.8}, {6});
  Tensor lo = leaf({-0.5, -0.4, -0.2, 0.5, 0.3, 0.1}, {6});
  Tensor hi = leaf({0.5, 0.6, 0.3, 0.7, -0.2, 0.6}, {6});
  check_grad([](const TensorList& in) { return clamp(in[0], in[1], in[2]); }, {x, lo, hi});
  check_grad([](const TensorList& in) { return in[0].clamp(in[1], std::nullopt); }, {x, lo});
  check_grad([](const TensorList& in) { return in[0].clamp(std::nullopt, in[1]); }, {x, hi});
  manual_seed(31);
  Tensor xb = rnd({3, 4}, -1, 1), lob = rnd({3, 1}, -0.6, -0.1), hib = rnd({4}, 0.1, 0.6);
  check_grad([](const TensorList& in) { return clamp(in[0], in[1], in[2]) * in[0]; }, {xb, lob, hib});
  Tensor base = rnd({2, 3}, 0.5, 2), e = rnd({3}, -1.5, 1.5);
  check_grad([](const TensorList& in) { return in[0].pow(in[1]); }, {base, e});
}

TEST_CASE("Tensor methods give what the free functions give", "[elementwise][methods]") {
  manual_seed(32);
  Tensor a = rand({3, 4}, f64) * 2 - 1, b = rand({3, 4}, f64) * 2 - 1, pos = rand({3, 4}, f64) + 0.5;
  auto same = [](const Tensor& got, const Tensor& want) {
    REQUIRE(got.dtype() == want.dtype());
    REQUIRE(got.shape() == want.shape());
    REQUIRE(got.equal(want));
  };
  same(a.add(b, 2), add(a, b, 2));
  same(a.add(3), a + 3);
  same(a.sub(b, 0.5), sub(a, b, 0.5));
  same(a.sub(3), a - 3);
  same(a.mul(3), a * 3);
  same(a.div(4), a / 4);
  same(a.maximum(b), maximum(a, b));
  same(a.minimum(b), minimum(a, b));
  same(pos.pow(b), pow(pos, b));
  same(a.gelu(), gelu(a));
  same(a.gelu(true), gelu(a, true));
  same(a.masked_fill(a > 0, 9), masked_fill(a, a > 0, 9));
  same(a.eq(b), eq(a, b));
  same(a.ne(0.5), ne(a, 0.5));
  same(a.lt(b), lt(a, b));
  same(a.le(0), le(a, 0));
  same(a.gt(b), gt(a, b));
  same(a.ge(0), ge(a, 0));
  same((a > 0).logical_and(b > 0), logical_and(a > 0, b > 0));
  same((a > 0).logical_or(b > 0), logical_or(a > 0, b > 0));
  same((a > 0).logical_xor(b > 0), logical_xor(a > 0, b > 0));
  same((a > 0).logical_not(), logical_not(a > 0));
  same(a.isnan(), isnan(a));
  same(a.isinf(), isinf(a));
  same(a.mm(b.t()), mm(a, b.t()));
  same(a.view({1, 3, 4}).bmm(b.view({1, 4, 3})), bmm(a.view({1, 3, 4}), b.view({1, 4, 3})));
  // reductions
  auto [values, indices] = a.max(1);
  auto [fv, fi] = max(a, 1);
  same(values, fv);
  same(indices, fi);
  REQUIRE(indices.dtype() == i64);
  auto [mv, mi] = a.min(0, true);
  REQUIRE(mv.shape() == Shape{1, 4});
  same(mi, min(a, 0, true).second);
  same(a.amax(), amax(a, {}));
  same(a.amax({1}, true), amax(a, {1}, true));
  same(a.amin({0}), amin(a, {0}));
  same(a.argmax(), argmax(a));
  same(a.argmin(), argmin(a));
  same(a.argmin(1, true), argmin(a, 1, true));
  same(a.var(), var(a));
  same(a.var({1}, 0, true), var(a, {1}, 0, true));
  same(a.std(), tandem::std(a));
  same(a.std({0}, 2), tandem::std(a, {0}, 2));
  same(a.logsumexp({1}), logsumexp(a, {1}));
  same(a.norm(), norm(a));
  // indexing and splitting
  Tensor idx = from_vector<int64_t>({2, 0});
  same(a.index_select(1, idx), index_select(a, 1, idx));
  Tensor gidx = from_vector<int64_t>({3, 0, 1}, {3, 1});
  same(a.gather(1, gidx), gather(a, 1, gidx));
  same(a.scatter_add(1, gidx, ones({3, 1}, f64)), scatter_add(a, 1, gidx, ones({3, 1}, f64)));
  REQUIRE(a.split(3, 1).size() == 2);
  same(a.split(3, 1)[1], split(a, 3, 1)[1]);
  same(a.split(std::vector<int64_t>{1, 2}, 0)[1], split(a, std::vector<int64_t>{1, 2}, 0)[1]);
  same(a.chunk(2, 1)[0], chunk(a, 2, 1)[0]);
  // in place
  Tensor s = a.clone();
  s.div_(b.abs() + 1);
  same(s, a / (b.abs() + 1));
  s = a.clone();
  s.clamp_(-0.25, 0.25);
  same(s, clamp(a, -0.25, 0.25));
  // (close, not equal: a kernel may fuse the multiply-add)
  s = a.clone();
  s.sub_(b, 2);
  require_close(vals(s), vals(a - b * 2));
  s = a.clone();
  s.addcmul_(a, b, 0.5);
  require_close(vals(s), vals(a + a * b * 0.5));
  s = a.clone();
  s.addcdiv_(a, pos, 2);
  require_close(vals(s), vals(a + a / pos * 2));
  s = a.clone();
  s.lerp_(b, 0.25);
  require_close(vals(s), vals(a + (b - a) * 0.25));
  // The methods record the same backward as the free functions.
  Tensor x = leaf({0.5, 1.5}, {2}), e = leaf({2, 3}, {2});
  x.pow(e).sum().backward();
  require_close(vals(x.grad()), {2 * 0.5, 3 * 1.5 * 1.5});
  require_close(vals(e.grad()), {0.25 * std::log(0.5), std::pow(1.5, 3) * std::log(1.5)});
}

TEST_CASE("f32 and bf16 GELU and its gradient on the SIMD clones give the scalar functors' bits", "[elementwise]") {
  // Contiguous f32 GELU runs on clones built for AVX-512/AVX2/the baseline without multiply-add
  // contraction (core/cpu/simd_loops.cpp): every element must equal the functor evaluated one
  // at a time here (this file is built for the baseline, which has no FMA). An odd length for the
  // tail, values across erf's and exp's ranges, infinities, NaN and signed zeros.
  std::vector<float> xs;
  for (int i = 0; i < 4099; ++i) xs.push_back(std::ldexp(static_cast<float>((i * 7919) % 2001 - 1000), -7 - i % 5));
  xs[1] = std::numeric_limits<float>::infinity();
  xs[2] = -std::numeric_limits<float>::infinity();
  xs[3] = std::numeric_limits<float>::quiet_NaN();
  xs[4] = -0.0f;
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor x = from_vector<float>(xs, {n}).requires_grad_();
  Tensor y = gelu(x);
  Tensor g = from_vector<float>(std::vector<float>(xs.rbegin(), xs.rend()), {n});
  (y * g).sum().backward();
  const float* yp = y.data_ptr<float>();
  const float* gx = x.grad().data_ptr<float>();
  const detail::Gelu f;
  const detail::GeluGradX df;
  auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
  for (int64_t i = 0; i < n; ++i) {
    INFO("x " << xs[i]);
    const float want = f(xs[i]), want_grad = df(g.data_ptr<float>()[i], xs[i]);
    REQUIRE((std::isnan(want) ? std::isnan(yp[i]) : bits(yp[i]) == bits(want)));
    REQUIRE((std::isnan(want_grad) ? std::isnan(gx[i]) : bits(gx[i]) == bits(want_grad)));
  }
  // bf16 (mixed precision's activations): converted in blocks, the same f32 clones, rounded once.
  Tensor xb = from_vector<float>(xs, {n}).to(bf16).requires_grad_();
  Tensor yb = gelu(xb);
  Tensor gb = g.to(bf16);
  (yb * gb).sum().backward();
  for (int64_t i = 0; i < n; ++i) {
    const float xv = static_cast<float>(xb.data_ptr<BFloat16>()[i]);
    const float gv = static_cast<float>(gb.data_ptr<BFloat16>()[i]);
    INFO("bf16 x " << xv);
    const BFloat16 want(f(xv)), want_grad(df(gv, xv));
    auto same = [](BFloat16 got, BFloat16 w) {
      return (w.bits & 0x7fffu) > 0x7f80u ? (got.bits & 0x7fffu) > 0x7f80u : got.bits == w.bits;
    };
    REQUIRE(same(yb.data_ptr<BFloat16>()[i], want));
    REQUIRE(same(xb.grad().data_ptr<BFloat16>()[i], want_grad));
  }
}
