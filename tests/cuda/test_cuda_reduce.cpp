// CUDA reductions (cuda/reduce.cu) against the CPU: every reduction forward and, through autograd,
// backward, on fresh random inputs, in f32/f64/f16/bf16 (and the integer/bool dtypes where the CPU
// has them), contiguous and strided, small and large enough to split over blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "core/detail/reduce.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using Catch::Contains;

namespace {

using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_match;

// Reductions sum many terms: looser than the defaults.
constexpr cuda_test::Tolerances tol_for{.f64 = 1e-10, .f16 = 2e-3, .bf16 = 1.6e-2};

// fn on x (CPU) vs fn on x moved to CUDA; for floating x also the gradient of sum(fn(x) * w).
void check_op(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, double tol, bool grad = true) {
  if (!grad || !is_floating(x.dtype())) {
    require_match(fn(x.to(kGPU)), fn(x), tol);
    return;
  }
  cuda_test::check_op([&](const TensorList& in) { return fn(in[0]); }, {x}, tol);
}

const Dtype kFloats[] = {f32, f64, f16, bf16};

}  // namespace

TEST_CASE("cuda sum and mean match the CPU over dims, keepdim and all elements", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt) * 4;
    Tensor x = random({6, 33, 17}, dt);
    check_op([](const Tensor& t) { return sum(t); }, x, tol);
    check_op([](const Tensor& t) { return sum(t, {2}); }, x, tol);
    check_op([](const Tensor& t) { return sum(t, {0}); }, x, tol);
    check_op([](const Tensor& t) { return sum(t, {1}, true); }, x, tol);
    check_op([](const Tensor& t) { return sum(t, {0, 2}); }, x, tol);
    check_op([](const Tensor& t) { return mean(t); }, x, tol);
    check_op([](const Tensor& t) { return mean(t, {-1}, true); }, x, tol);
    check_op([](const Tensor& t) { return mean(t, {0, 1}); }, x, tol);
    // Strided inputs: transposed and sliced views reduce in place.
    check_op([](const Tensor& t) { return sum(t.transpose(0, 2), {1}); }, x, tol);
    check_op([](const Tensor& t) { return mean(t.slice(1, 1, 30, 3), {1}); }, x, tol);
    check_op([](const Tensor& t) { return sum(t.permute({2, 0, 1}), {0, 2}); }, x, tol);
  }
}

TEST_CASE("cuda sum of integers and bool accumulates in i64", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor xi = randint(-1000, 1000, {7, 300}, i32);
  check_op([](const Tensor& t) { return sum(t); }, xi, 0);
  check_op([](const Tensor& t) { return sum(t, {0}); }, xi, 0);
  check_op([](const Tensor& t) { return sum(t, {1}); }, xi, 0);
  Tensor xl = randint(-(int64_t{1} << 40), int64_t{1} << 40, {1000}, i64);
  check_op([](const Tensor& t) { return sum(t); }, xl, 0);
  Tensor xb = gt(randn({5, 77}), Scalar(0.3));
  check_op([](const Tensor& t) { return sum(t, {1}); }, xb, 0);
  REQUIRE(sum(xb.to(kGPU)).dtype() == i64);
}

TEST_CASE("cuda large reductions split over blocks and are deterministic", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  // All elements of a big tensor, a long column sum, few long rows, and a middle dim.
  Tensor big = random({1 << 22}, f32);
  check_op([](const Tensor& t) { return sum(t); }, big, 1e-5, false);
  check_op([](const Tensor& t) { return mean(t); }, big, 1e-5, false);
  check_op([](const Tensor& t) { return norm(t); }, big, 1e-5, false);
  check_op([](const Tensor& t) { return var(t); }, big, 1e-5, false);
  Tensor cols = random({100000, 3}, f32);
  check_op([](const Tensor& t) { return sum(t, {0}); }, cols, 1e-5);
  check_op([](const Tensor& t) { return amax(t, {0}); }, cols, 0, false);
  Tensor rows = random({2, 300000}, f32);
  check_op([](const Tensor& t) { return logsumexp(t, {1}); }, rows, 1e-5);
  check_op([](const Tensor& t) { return tandem::std(t, {1}); }, rows, 1e-5);
  Tensor mid = random({8, 5000, 16}, bf16);
  check_op([](const Tensor& t) { return sum(t, {1}); }, mid, 2e-2);
  // Reproducible bit for bit, run to run.
  Tensor bd = big.to(kGPU);
  REQUIRE(sum(bd).to(kCPU).item<float>() == sum(bd).to(kCPU).item<float>());  // item() reads CPU tensors only
  Tensor cd = cols.to(kGPU);
  REQUIRE(equal(sum(cd, {0}), sum(cd, {0})));
}

TEST_CASE("cuda amax, amin, max and min follow the CPU's NaN and tie rules", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    Tensor x = random({5, 40, 9}, dt);
    check_op([](const Tensor& t) { return amax(t, {1}); }, x, 0);
    check_op([](const Tensor& t) { return amin(t, {0, 2}, true); }, x, 0);
    check_op([](const Tensor& t) { return max(t); }, x, 0);
    check_op([](const Tensor& t) { return min(t); }, x, 0);
    check_op([](const Tensor& t) { return max(t, 1).first; }, x, 0);
    check_op([](const Tensor& t) { return min(t, 2, true).first; }, x, 0);
    check_op([](const Tensor& t) { return max(t.transpose(1, 2), 2).first; }, x, 0);
    check_op([](const Tensor& t) { return argmax(t, 1); }, x, 0, false);
    check_op([](const Tensor& t) { return argmin(t, 0, true); }, x, 0, false);
    check_op([](const Tensor& t) { return argmax(t); }, x, 0, false);
  }
  // Ties: first occurrence; NaN wins; amax gradient split among ties.
  Tensor ties = from_vector<float>({1, 3, 3, 2, 3, 0, 5, 5}, {2, 4});
  check_op([](const Tensor& t) { return argmax(t, 1); }, ties, 0, false);
  check_op([](const Tensor& t) { return amax(t, {1}); }, ties, 0);
  check_op([](const Tensor& t) { return max(t, 1).first; }, ties, 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor withnan = from_vector<float>({1, nan, 7, nan, -2, 4, 4, 9}, {2, 4});
  check_op([](const Tensor& t) { return argmax(t, 1); }, withnan, 0, false);
  check_op([](const Tensor& t) { return argmin(t, 1); }, withnan, 0, false);
  check_op([](const Tensor& t) { return amax(t, {1}); }, withnan, 0, false);
  check_op([](const Tensor& t) { return max(t); }, withnan, 0, false);
  Tensor ints = randint(-5, 5, {6, 50}, i32);
  check_op([](const Tensor& t) { return amax(t, {1}); }, ints, 0);
  check_op([](const Tensor& t) { return argmin(t, 1); }, ints, 0);
  check_op([](const Tensor& t) { return argmax(t); }, ints, 0);
}

TEST_CASE("cuda var, std, logsumexp and norm match the CPU", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt) * 4;
    Tensor x = random({4, 130, 6}, dt);
    check_op([](const Tensor& t) { return var(t, {1}); }, x, tol);
    check_op([](const Tensor& t) { return var(t, {0, 2}, 0, true); }, x, tol);
    check_op([](const Tensor& t) { return tandem::std(t, {1}, 1); }, x, tol);
    check_op([](const Tensor& t) { return tandem::std(t); }, x, tol);
    check_op([](const Tensor& t) { return var(t); }, x, tol);
    check_op([](const Tensor& t) { return logsumexp(t, {1}); }, x, tol);
    check_op([](const Tensor& t) { return logsumexp(t, {0, 2}, true); }, x, tol);
    check_op([](const Tensor& t) { return norm(t); }, x, tol);
    check_op([](const Tensor& t) { return norm(t.transpose(0, 1)); }, x, tol);
  }
  // logsumexp of -inf rows is -inf, of a row with +inf is +inf.
  const float inf = std::numeric_limits<float>::infinity();
  Tensor special = from_vector<float>({-inf, -inf, -inf, 1, inf, 2, 0.5f, -inf, 3}, {3, 3});
  check_op([](const Tensor& t) { return logsumexp(t, {1}); }, special, 1e-6, false);
}

TEST_CASE("cuda reductions of empty tensors match the CPU", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor e = zeros({3, 0});
  check_op([](const Tensor& t) { return sum(t, {1}); }, e, 0, false);
  check_op([](const Tensor& t) { return sum(t, {0}); }, e, 0, false);
  check_op([](const Tensor& t) { return mean(t, {1}); }, e, 0, false);
  check_op([](const Tensor& t) { return logsumexp(t, {1}); }, e, 0, false);
  REQUIRE_THROWS_WITH(amax(e.to(kGPU), {1}), Contains("empty"));
}

TEST_CASE("cuda broadcast gradients sum to the operand's shape", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = random({16, 9, 5}, f32), b = random({9, 1}, f32);
  Tensor ac = leaf(a.clone()), bc = leaf(b.clone());
  Tensor ad = leaf(a.to(kGPU).detach()), bd = leaf(b.to(kGPU).detach());
  Tensor w = random({16, 9, 5}, f32);
  (ac * bc).backward(w);
  (ad * bd).backward(w.to(kGPU));
  require_match(bd.grad(), bc.grad(), 1e-5);
  require_match(ad.grad(), ac.grad(), 1e-5);
  require_match(detail::sum_to_shape(w.to(kGPU), {9, 5}, "test"), detail::sum_to_shape(w, {9, 5}, "test"), 1e-5);
}

TEST_CASE("cuda reduction kernels reject tensors on different devices", "[cuda][reduce]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = random({4, 5}, f32);
  detail::ReducePlan pl = detail::plan_reduction(a, {1}, false, "amax");
  Tensor r = amax(a, {1});
  REQUIRE_THROWS_WITH(detail::extreme_grad(r.to(kGPU), a, r, pl), Contains("different devices"));
  REQUIRE_THROWS_WITH(detail::logsumexp_grad(r, a.to(kGPU), r, pl), Contains("different devices"));
}
