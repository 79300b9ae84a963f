#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <numeric>

#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using test_util::require_close;
using test_util::vals;
using Catch::Contains;

namespace {

// For every element of a row-major tensor of `shape`, the row-major index of its output when
// the dims flagged in `reduced` are reduced.
std::vector<int64_t> output_index(const Shape& shape, const std::vector<bool>& reduced) {
  int64_t n = numel_of(shape);
  std::vector<int64_t> out(n);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rem = flat, o = 0, mul = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      int64_t c = rem % shape[d];
      rem /= shape[d];
      if (!reduced[d]) {
        o += c * mul;
        mul *= shape[d];
      }
    }
    out[flat] = o;
  }
  return out;
}

int64_t out_count(const Shape& shape, const std::vector<bool>& reduced) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!reduced[d]) n *= shape[d];
  return n;
}

std::vector<double> naive_sum(const Tensor& a, const std::vector<bool>& red) {
  auto x = vals(a);
  auto idx = output_index(a.shape(), red);
  std::vector<double> out(out_count(a.shape(), red), 0.0);
  for (size_t i = 0; i < x.size(); ++i) out[idx[i]] += x[i];
  return out;
}

std::vector<double> naive_max(const Tensor& a, const std::vector<bool>& red) {
  auto x = vals(a);
  auto idx = output_index(a.shape(), red);
  std::vector<double> out(out_count(a.shape(), red), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < x.size(); ++i) out[idx[i]] = std::max(out[idx[i]], x[i]);
  return out;
}

}  // namespace

TEST_CASE("sum: full, over dims, keepdim, negative dims") {
  Tensor a = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(sum(a).dim() == 0);
  REQUIRE(sum(a).item<double>() == 21);
  Tensor s0 = sum(a, {0});
  REQUIRE(s0.shape() == Shape{3});
  require_close(vals(s0), {5, 7, 9});
  Tensor s1 = sum(a, {-1}, true);
  REQUIRE(s1.shape() == Shape{2, 1});
  require_close(vals(s1), {6, 15});
  REQUIRE(sum(a, {0, 1}).item<double>() == 21);
  REQUIRE(sum(a, {}).item<double>() == 21);  // an empty dim list reduces everything, like PyTorch
  REQUIRE(sum(a, {1, 0}, true).shape() == Shape{1, 1});
  REQUIRE(a.sum({1}).shape() == Shape{2});
}

TEST_CASE("sum: bad dims are errors naming the op") {
  Tensor a = zeros({2, 3});
  REQUIRE_THROWS_WITH(sum(a, {1, -1}), Contains("[sum]") && Contains("more than once"));
  REQUIRE_THROWS_WITH(sum(a, {2}), Contains("[sum]") && Contains("out of range"));
  REQUIRE_THROWS_WITH(mean(a, {-3}), Contains("[mean]"));
  REQUIRE_THROWS_WITH(amax(a, {0, 0}), Contains("[amax]") && Contains("more than once"));
}

TEST_CASE("sum: integer and bool inputs give i64, mean of integers is an error") {
  Tensor a = from_vector<int32_t>({1, 2, 3, 2147483647}, {4});
  Tensor s = sum(a);
  REQUIRE(s.dtype() == i64);
  REQUIRE(s.item<int64_t>() == 2147483653LL);  // no i32 overflow
  Tensor b = from_vector<bool>({true, false, true, true}, {2, 2});
  Tensor sb = sum(b, {1});
  REQUIRE(sb.dtype() == i64);
  REQUIRE(sb.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  REQUIRE_THROWS_WITH(mean(a), Contains("[mean]") && Contains("i32"));
  REQUIRE_THROWS_WITH(var(a), Contains("[var]"));
}

TEST_CASE("sum: f32 is accurate over many elements, f16 accumulates in f32") {
  // Naive f32 accumulation of 10^6 copies of 0.1 is off by ~1%; pairwise is within a few ulp.
  const int64_t n = 1000000;
  Tensor a = full({n}, 0.1, f32);
  double want = n * static_cast<double>(0.1f);
  REQUIRE(std::abs(sum(a).item<double>() - want) / want < 1e-6);
  REQUIRE(std::abs(mean(a).item<double>() - 0.1f) < 1e-7);
  // Same over rows of a contiguous 2-D tensor (the last-dim fast path) and over columns.
  Tensor b = full({4, n / 4}, 0.1, f32);
  for (double v : vals(sum(b, {1}))) REQUIRE(std::abs(v - want / 4) / (want / 4) < 1e-6);
  Tensor c = full({n / 4, 4}, 0.1, f32);
  for (double v : vals(sum(c, {0}))) REQUIRE(std::abs(v - want / 4) / (want / 4) < 1e-6);
  // f16 counting to 4096 stalls at 2048 when accumulated in f16.
  Tensor h = ones({4096}, f16);
  Tensor hs = sum(h);
  REQUIRE(hs.dtype() == f16);
  REQUIRE(hs.item<float>() == 4096.0f);
  Tensor bf = ones({2, 4096}, bf16);
  require_close(vals(sum(bf, {1})), {4096, 4096});
}

TEST_CASE("sum and mean match a naive reference on every reduction layout") {
  manual_seed(3);
  Tensor a = randn({3, 4, 5}, f64);
  std::vector<std::vector<bool>> masks = {{true, false, false}, {false, true, false}, {false, false, true},
                                          {true, true, false},  {true, false, true},  {false, true, true},
                                          {true, true, true}};
  for (const auto& m : masks) {
    Shape dims;
    for (int64_t d = 0; d < 3; ++d)
      if (m[d]) dims.push_back(d);
    INFO("dims " << shape_str(dims));
    require_close(vals(sum(a, dims)), naive_sum(a, m));
    auto ref = naive_sum(a, m);
    double cnt = static_cast<double>(a.numel()) / static_cast<double>(ref.size());
    for (auto& v : ref) v /= cnt;
    require_close(vals(mean(a, dims, true)), ref);
    // Non-contiguous input: the same values through a permuted view.
    Tensor p = a.permute({2, 0, 1});
    std::vector<bool> pm = {m[2], m[0], m[1]};
    Shape pdims;
    for (int64_t d = 0; d < 3; ++d)
      if (pm[d]) pdims.push_back(d);
    require_close(vals(sum(p, pdims)), naive_sum(p.contiguous(), pm));
    require_close(vals(amax(p, pdims)), naive_max(p.contiguous(), pm));
  }
}

TEST_CASE("reductions over empty tensors") {
  Tensor e = zeros({0, 3});
  Tensor s = sum(e, {0});
  REQUIRE(s.shape() == Shape{3});
  require_close(vals(s), {0, 0, 0});
  REQUIRE(sum(e, {1}).shape() == Shape{0});
  REQUIRE(std::isnan(mean(e).item<double>()));
  REQUIRE_THROWS_WITH(max(e), Contains("[max]") && Contains("empty"));
  REQUIRE_THROWS_WITH(amin(e, {0}), Contains("[amin]"));
  REQUIRE_THROWS_WITH(argmax(e), Contains("[argmax]"));
  REQUIRE(std::isinf(logsumexp(e, {0}).to_vector<double>()[0]));
}

TEST_CASE("max/min: full, per dim with indices, NaN and ties") {
  Tensor a = from_vector<double>({3, 7, 7, -1, 0, 5}, {2, 3});
  REQUIRE(max(a).item<double>() == 7);
  REQUIRE(min(a).item<double>() == -1);
  auto [v, i] = max(a, 1);
  require_close(vals(v), {7, 5});
  REQUIRE(i.dtype() == i64);
  REQUIRE(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2});  // first of the tied 7s
  auto [mv, mi] = min(a, 0, true);
  REQUIRE(mv.shape() == Shape{1, 3});
  require_close(vals(mv), {-1, 0, 5});
  REQUIRE(mi.to_vector<int64_t>() == std::vector<int64_t>{1, 1, 1});
  REQUIRE(argmax(a).item<int64_t>() == 1);
  REQUIRE(argmin(a).item<int64_t>() == 3);
  REQUIRE(argmax(a, 0).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  REQUIRE(argmin(a, -1, true).shape() == Shape{2, 1});
  require_close(vals(amax(a, {0})), {3, 7, 7});
  require_close(vals(amin(a, {1}, true)), {3, -1});
  // Flattened argmax of a transposed view counts in the view's logical order.
  REQUIRE(argmax(a.t()).item<int64_t>() == 2);
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor n = from_vector<double>({1, nan, 3}, {3});
  REQUIRE(std::isnan(max(n).item<double>()));
  REQUIRE(argmax(n).item<int64_t>() == 1);
  Tensor ints = from_vector<int64_t>({4, -9, 2}, {3});
  REQUIRE(max(ints).item<int64_t>() == 4);
  REQUIRE(min(ints).dtype() == i64);
  Tensor h = from_vector<float>({1.5f, -2.0f, 8.25f}, {3}).to(f16);
  REQUIRE(max(h).item<float>() == 8.25f);
}

TEST_CASE("var, std, logsumexp and norm values") {
  Tensor a = from_vector<double>({1, 2, 3, 4, 10, 20, 30, 40}, {2, 4});
  // Row 0: mean 2.5, squared deviations 5; row 1: mean 25, squared deviations 500.
  require_close(vals(var(a, Shape{1})), {5.0 / 3, 500.0 / 3});
  require_close(vals(var(a, {1})), {5.0 / 3, 500.0 / 3});  // a braced dim list means dims
  require_close(vals(var(a, {1}, 0)), {5.0 / 4, 500.0 / 4});
  require_close(vals(tandem::std(a, {1}, 1, true)), {std::sqrt(5.0 / 3), std::sqrt(500.0 / 3)});
  std::vector<double> x = vals(a);
  double m = std::accumulate(x.begin(), x.end(), 0.0) / 8, ss = 0;
  for (double v : x) ss += (v - m) * (v - m);
  require_close({var(a).item<double>()}, {ss / 7});
  require_close({tandem::std(a, {}, 0).item<double>()}, {std::sqrt(ss / 8)});
  REQUIRE(std::isnan(var(from_vector<double>({2.0}, {1})).item<double>()));  // 0 / 0, as in PyTorch
  // Stable logsumexp: exp(1000) overflows, the shifted form does not.
  Tensor big = from_vector<double>({1000, 1000, -5, -5}, {2, 2});
  require_close(vals(logsumexp(big, {1})), {1000 + std::log(2.0), -5 + std::log(2.0)});
  Tensor bigf = from_vector<float>({100, 100}, {2});
  REQUIRE(std::abs(logsumexp(bigf, {0}).item<double>() - (100 + std::log(2.0))) < 1e-4);
  double inf = std::numeric_limits<double>::infinity();
  Tensor ninf = from_vector<double>({-inf, -inf}, {2});
  REQUIRE(logsumexp(ninf, {0}).item<double>() == -inf);
  require_close({norm(from_vector<double>({3, 4, 12}, {3})).item<double>()}, {13});
}

TEST_CASE("reductions reject devices and dtypes they cannot handle") {
  Tensor b = from_vector<bool>({true, false}, {2});
  REQUIRE_THROWS_WITH(logsumexp(b, {0}), Contains("[logsumexp]"));
  REQUIRE_THROWS_WITH(norm(from_vector<int64_t>({1, 2}, {2})), Contains("[norm]"));
}

TEST_CASE("gradcheck: sum and mean") {
  manual_seed(11);
  Tensor a = leaf(randn({3, 4}, f64));
  for (auto fn : std::vector<std::function<Tensor(const TensorList&)>>{
           [](const TensorList& in) { return sum(in[0]); },
           [](const TensorList& in) { return sum(in[0], {1}); },
           [](const TensorList& in) { return sum(in[0], {0}, true); },
           [](const TensorList& in) { return mean(in[0]); },
           [](const TensorList& in) { return mean(in[0], {-1}, true); },
       }) {
    auto r = gradcheck(fn, {a});
    INFO(r.report);
    REQUIRE(r.ok);
  }
  // Non-contiguous input and a reduction over non-adjacent dims.
  // (gradcheck clones its inputs contiguous, so the view is taken inside the function.)
  Tensor p = leaf(randn({4, 3, 5}, f64));
  auto r = gradcheck([](const TensorList& in) { return sum(in[0].permute({1, 2, 0}), {0, 2}); }, {p});
  INFO(r.report);
  REQUIRE(r.ok);
  r = gradcheck([](const TensorList& in) { return mean(in[0].permute({1, 2, 0}), {1}); }, {p});
  INFO(r.report);
  REQUIRE(r.ok);
}

TEST_CASE("gradcheck: max/min/amax/amin") {
  manual_seed(12);
  Tensor a = leaf(randn({3, 5}, f64));
  std::vector<std::function<Tensor(const TensorList&)>> fns = {
      [](const TensorList& in) { return max(in[0]); },
      [](const TensorList& in) { return min(in[0]); },
      [](const TensorList& in) { return max(in[0], 1).first; },
      [](const TensorList& in) { return min(in[0], 0, true).first; },
      [](const TensorList& in) { return amax(in[0], {0}); },
      [](const TensorList& in) { return amin(in[0], {1}, true); },
  };
  for (auto& fn : fns) {
    auto r = gradcheck(fn, {a});
    INFO(r.report);
    REQUIRE(r.ok);
  }
  Tensor t = leaf(randn({5, 3}, f64));
  auto r = gradcheck([](const TensorList& in) { return max(in[0].t(), -1).first; }, {t});
  INFO(r.report);
  REQUIRE(r.ok);
}

TEST_CASE("max/min backward: ties share the gradient for full and amax, go to the index per dim") {
  Tensor a = leaf(from_vector<double>({1, 3, 3, 2}, {4}));
  max(a).backward();
  require_close(vals(a.grad()), {0, 0.5, 0.5, 0});
  Tensor b = leaf(from_vector<double>({1, 3, 3, 2, 2, 0}, {2, 3}));
  amax(b, {1}).sum().backward();
  require_close(vals(b.grad()), {0, 0.5, 0.5, 0.5, 0.5, 0});
  Tensor c = leaf(from_vector<double>({1, 3, 3, 2, 2, 0}, {2, 3}));
  max(c, 1).first.sum().backward();
  require_close(vals(c.grad()), {0, 1, 0, 1, 0, 0});
}

TEST_CASE("gradcheck: var, std, logsumexp, norm") {
  manual_seed(13);
  Tensor a = leaf(randn({3, 4}, f64));
  std::vector<std::function<Tensor(const TensorList&)>> fns = {
      [](const TensorList& in) { return var(in[0]); },
      [](const TensorList& in) { return var(in[0], Shape{1}); },
      [](const TensorList& in) { return var(in[0], {0}, 0, true); },
      [](const TensorList& in) { return tandem::std(in[0]); },
      [](const TensorList& in) { return tandem::std(in[0], {-1}, 1, true); },
      [](const TensorList& in) { return logsumexp(in[0], {1}); },
      [](const TensorList& in) { return logsumexp(in[0], {0, -1}, true); },
      [](const TensorList& in) { return norm(in[0]); },
  };
  Tensor t = leaf(randn({3, 2, 4}, f64));
  for (auto& fn : fns) {
    auto r = gradcheck(fn, {a});
    INFO(r.report);
    REQUIRE(r.ok);
    // The same reduction of a non-contiguous [4, 2, 3] view.
    r = gradcheck([&fn](const TensorList& in) { return fn({in[0].transpose(0, 2)}); }, {t});
    INFO(r.report);
    REQUIRE(r.ok);
  }
}

TEST_CASE("logsumexp backward is softmax; norm backward at zero is zero") {
  Tensor a = leaf(from_vector<double>({0, std::log(3.0)}, {2}));
  logsumexp(a, {0}).backward();
  require_close(vals(a.grad()), {0.25, 0.75});
  Tensor z = leaf(zeros({3}, f64));
  norm(z).backward();
  require_close(vals(z.grad()), {0, 0, 0});
}

TEST_CASE("var/std: a constant slice gives exactly 0 in every float dtype, layout, keepdim and correction") {
  // A mean taken as sum / n is off by a rounding (0.1 * 3 / 3 != 0.1 in f64), and then
  // [0.1, 0.1, 0.1] had std 1.7e-17 instead of 0; Welford's running mean stays exact here.
  for (Dtype dt : {f64, f32, f16, bf16}) {
    for (double c : {0.1, 1.0 / 3, 0.7, -2.3, 1000.1}) {
      for (int64_t n : {3, 7, 10, 129, 1000}) {
        INFO("dtype " << dt << ", value " << c << ", n " << n);
        Tensor row = full({n}, Scalar(c), dt);
        // [n, 3] with columns of one value each (c, 2c, -c) and its transpose: dim 0 is strided.
        Tensor cols = cat({full({n, 1}, Scalar(c), dt), full({n, 1}, Scalar(2 * c), dt), full({n, 1}, Scalar(-c), dt)}, 1);
        Tensor rows = cols.t().contiguous();
        // [2, n, 3] reduced over dims {0, 2}, which do not coalesce (the gathered path).
        Tensor cube = full({2, n, 3}, Scalar(c), dt);
        for (int64_t corr : {0, 1, 2}) {
          INFO("correction " << corr);
          for (bool keepdim : {false, true}) {
            for (const Tensor& r : {var(row, {}, corr, keepdim), tandem::std(row, {}, corr, keepdim),
                                    var(cols, {0}, corr, keepdim), tandem::std(cols, {0}, corr, keepdim),
                                    var(rows, {1}, corr, keepdim), tandem::std(rows, {-1}, corr, keepdim),
                                    var(cube, {0, 2}, corr, keepdim), tandem::std(cube, {0, 2}, corr, keepdim)}) {
              for (double v : vals(to_dtype(r, f64))) {
                INFO("got " << v);
                REQUIRE(v == 0.0);
              }
            }
          }
        }
        REQUIRE(var(row).item<double>() == 0.0);
        REQUIRE(tandem::std(row).item<double>() == 0.0);
      }
    }
  }
}

TEST_CASE("var/std backward: 0 where std is 0 (PyTorch masks it), exactly 0 on a constant slice") {
  for (Dtype dt : {f64, f32}) {
    INFO("dtype " << dt);
    // A zero row used to give g / (N - c) / 0 * 0 = NaN.
    Tensor z = leaf(from_vector<double>({0, 0, 0, 1, 2, 4}, {2, 3}).to(dt));
    tandem::std(z, {1}).sum().backward();
    std::vector<double> gz = vals(to_dtype(z.grad(), f64));
    const double s = std::sqrt(7.0 / 3);  // std of [1, 2, 4]; mean 7/3
    require_close(gz, {0, 0, 0, (-4.0 / 3) / (2 * s), (-1.0 / 3) / (2 * s), (5.0 / 3) / (2 * s)},
                  dt == f64 ? 1e-12 : 1e-6);
    // A constant row that is not all zeros: its std was ~1e-17, its gradient -0.41 per element.
    Tensor c = leaf(full({3}, Scalar(0.1), dt));
    tandem::std(c).backward();
    for (double v : vals(to_dtype(c.grad(), f64))) REQUIRE(v == 0.0);
    Tensor cv = leaf(full({3}, Scalar(0.1), dt));
    var(cv).backward();
    for (double v : vals(to_dtype(cv.grad(), f64))) REQUIRE(v == 0.0);
    // Per dim, keepdim, correction 0: columns 0 and 2 constant, column 1 not.
    Tensor m = leaf(from_vector<double>({0.3, 1.0, -0.7, 0.3, 2.0, -0.7, 0.3, 4.0, -0.7}, {3, 3}).to(dt));
    (tandem::std(m, {0}, 0, true) * from_vector<double>({1, 2, 3}, {1, 3}).to(dt)).sum().backward();
    std::vector<double> gm = vals(to_dtype(m.grad(), f64));
    const double s0 = std::sqrt(14.0 / 9);  // std of [1, 2, 4] with correction 0
    require_close(gm, {0, 2 * (-4.0 / 3) / (3 * s0), 0, 0, 2 * (-1.0 / 3) / (3 * s0), 0, 0, 2 * (5.0 / 3) / (3 * s0), 0},
                  dt == f64 ? 1e-12 : 1e-6);
    for (size_t i : {0, 2, 3, 5, 6, 8}) REQUIRE(gm[i] == 0.0);
  }
}

// Found by fuzz_ops: N - correction was computed in int64 and overflowed (UBSan) for a correction
// near INT64_MIN. Any correction is valid; a huge negative one divides by about 2^63.
TEST_CASE("var/std: corrections at the ends of int64 do not overflow the divisor", "[fuzz]") {
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor p = leaf(from_vector<double>({1.0, 3.0, 5.0}, {3}));
  Tensor v = var(p, {0}, lowest);
  REQUIRE(v.item<double>() == Approx(8.0 / 9.223372036854775811e18));
  v.backward();
  for (double g : vals(p.grad())) REQUIRE(std::abs(g) < 1e-17);
  REQUIRE(tandem::std(p, {0}, highest).item<double>() == std::numeric_limits<double>::infinity());
  REQUIRE(var(p, {0}, highest).item<double>() == std::numeric_limits<double>::infinity());
}

// Found by fuzz_ops: an empty tensor's sizes need not have products that fit in int64, and the
// plan multiplied the kept sizes (and the reduced ones) unchecked (UBSan: signed overflow).
TEST_CASE("reductions of an empty tensor whose other sizes multiply past int64", "[fuzz]") {
  const int64_t huge = int64_t{1} << 62;
  Tensor e = zeros({3, 0, huge});
  // Keeping 3 and 2^62 would make an output of 3 * 2^62 elements: an error naming the op.
  REQUIRE_THROWS_WITH(sum(e, {1}), Contains("[sum]") && Contains("overflow"));
  REQUIRE_THROWS_WITH(argmin(e, 1), Contains("[argmin]"));
  // Reducing 3 and 2^62 keeps the zero dim: an empty result, whatever the reduced count.
  REQUIRE(sum(e, {0, 2}).shape() == Shape{0});
  REQUIRE(mean(e, {0, 2}, true).shape() == Shape{1, 0, 1});
  REQUIRE(amax(e, {0, 2}).shape() == Shape{0});
  REQUIRE(var(e, {0, 2}).shape() == Shape{0});
  // Reducing the zero dim and the huge one keeps 3 outputs of empty slices; the loop stepped the
  // input pointer by the huge stride between them (UBSan: pointer overflow).
  Tensor f = zeros({3, 0, huge});
  REQUIRE(vals(sum(f, {1, 2})) == std::vector<double>{0, 0, 0});
  for (double m : vals(mean(f, {1, 2}))) REQUIRE(std::isnan(m));
  REQUIRE_THROWS_WITH(amax(f, {1, 2}), Contains("[amax]"));
}

// Found by fuzz_ops (corpus/ops/crash-norm-empty-huge-offset, crash-sum-empty-huge-offset-*): a
// view of an empty tensor can sit at an offset near INT64_MAX, and data_ptr() multiplied it by the
// item size (UBSan: signed overflow) although nothing is read through it. The address rule
// (core/shape.h): an empty tensor's data_ptr is its storage's start.
TEST_CASE("reductions of an empty view at an offset near INT64_MAX", "[reduce][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor e = zeros({1048576, 0, highest});  // strides [INT64_MAX, INT64_MAX, 1]
  // The second row along dim 0: its offset is the huge stride itself.
  Tensor v = e.slice(0, 1, 2).unsqueeze(0);
  REQUIRE(v.numel() == 0);
  REQUIRE(v.storage_offset() == highest);
  REQUIRE(v.data_ptr() == e.storage()->data());
  REQUIRE(norm(v).item<float>() == 0.0f);
  REQUIRE(sum(v).item<float>() == 0.0f);
  REQUIRE(std::isnan(mean(v).item<float>()));
  REQUIRE(vals(sum(v, {2, 3})) == std::vector<double>{0});
  Tensor s = e.select(0, 1);
  REQUIRE(s.storage_offset() == highest);
  REQUIRE(sum(s).item<float>() == 0.0f);
  REQUIRE(norm(s.to(f64)).item<double>() == 0.0);
}

// Found by fuzz_ops (corpus/ops/crash-max-backward-empty-huge-stride): max over dim 0 of an empty
// [4, 0, INT64_MAX] tensor; its backward scaled dim 0's stride (INT64_MAX) by the item size before
// finding that there was nothing to scatter (UBSan: signed overflow).
TEST_CASE("max backward of an empty tensor whose reduced dim's stride is INT64_MAX", "[reduce][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor e = zeros({4, 0, highest}).requires_grad_();
  REQUIRE(e.stride(0) == highest);
  auto [v, i] = e.max(0);
  REQUIRE(v.shape() == Shape{0, highest});
  sum(v).backward();
  REQUIRE(e.grad().shape() == Shape{4, 0, highest});
}

TEST_CASE("var/std: values and gradients match PyTorch 1.13, also at N - correction <= 0") {
  // Row 1 is constant; row 2 sits on a large offset (cancellation in E[x^2] - E[x]^2).
  const std::vector<double> data = {0.3,    -1.2,   2.5,    0.7,    -0.4,   0.1,    0.1,   0.1,
                                    0.1,    0.1,    1000.1, 1000.2, 1000.3, 1000.4, 1000.5};
  Tensor a = from_vector<double>(data, {3, 5});
  // torch.var(a, dim=1), torch.std(a, dim=1, correction=0, keepdim=True), torch.var(a, dim=0, correction=2).
  require_close(vals(var(a, {1})), {1.927, 0.0, 0.024999999999991473}, 1e-10);
  Tensor sk = tandem::std(a, {1}, 0, true);
  REQUIRE(sk.shape() == Shape{3, 1});
  require_close(vals(sk), {1.2416118556135005, 0.0, 0.14142135623728538}, 1e-10);
  require_close(vals(var(a, {0}, 2)), {666533.36, 667667.8866666667, 665336.88, 666666.8466666668, 667533.7399999999});
  require_close(vals(tandem::std(a, {0})),
                {577.2925428238269, 577.7836475129193, 576.7741672439917, 577.3503471319069, 577.7256009560248});
  // torch.std(x, dim=1).sum().backward(): the constant row's gradient is 0.
  Tensor x = leaf(a.clone());
  tandem::std(x, {1}).sum().backward();
  require_close(vals(x.grad()),
                {-0.014407516921751122, -0.28454845920458466, 0.3817991984264047, 0.057630067687004474,
                 -0.14047328998707342, 0.0, 0.0, 0.0, 0.0, 0.0, -0.316227766016784, -0.15811388300830212, 0.0,
                 0.1581138830084819, 0.3162277660169638},
                1e-10);
  // torch.var(x, dim=1, correction=0).sum().backward()
  Tensor y = leaf(a.clone());
  var(y, {1}, 0).sum().backward();
  require_close(vals(y.grad()),
                {-0.03200000000000001, -0.6320000000000001, 0.8480000000000001, 0.12799999999999997,
                 -0.31200000000000006, 0.0, 0.0, 0.0, 0.0, 0.0, -0.07999999999997272, -0.03999999999996362, 0.0,
                 0.0400000000000091, 0.0800000000000182},
                1e-10);
  // Full reductions of rows 0 and 2: torch.var(b), torch.std(b, correction=0), torch.std(b).backward().
  std::vector<double> bd(data.begin(), data.begin() + 5);
  bd.insert(bd.end(), data.begin() + 10, data.end());
  Tensor b = leaf(from_vector<double>(bd, {10}));
  require_close({var(b).item<double>()}, {277734.2026666666});
  require_close({tandem::std(b, {}, 0).item<double>()}, {499.9607808618592});
  tandem::std(b).backward();
  require_close(vals(b.grad()),
                {-0.10542595750975552, -0.105742210082079, -0.10496212040368108, -0.10534162349046927,
                 -0.10557354204350648, 0.10536692369625514, 0.1053880072010767, 0.10540909070589825,
                 0.10543017421071982, 0.10545125771554138});
  // f32 on rows 0 and 1 (torch f32 values).
  Tensor f = leaf(from_vector<float>({0.3f, -1.2f, 2.5f, 0.7f, -0.4f, 0.1f, 0.1f, 0.1f, 0.1f, 0.1f}, {2, 5}));
  require_close(vals(var(f, {1})), {1.9270000457763672, 0.0}, 1e-6);
  tandem::std(f, {1}).sum().backward();
  require_close(vals(f.grad()),
                {-0.014407508075237274, -0.28454846143722534, 0.38179922103881836, 0.05763006955385208,
                 -0.14047327637672424, 0, 0, 0, 0, 0},
                1e-6);

  // N - correction <= 0: the divisor is max(0, N - correction), as in PyTorch's forward, so
  // var is M2 / 0: NaN for a constant slice (one element with correction 1), inf otherwise.
  const double inf = std::numeric_limits<double>::infinity();
  REQUIRE(std::isnan(var(from_vector<double>({0.5}, {1})).item<double>()));
  for (double v : vals(tandem::std(from_vector<double>({0.5, 2.0}, {2, 1}), {1}))) REQUIRE(std::isnan(v));
  for (int64_t corr : {2, 3}) {
    INFO("correction " << corr);
    Tensor p = leaf(from_vector<double>({0.5, 1.5}, {1, 2}));
    Tensor v = var(p, {1}, corr);
    REQUIRE(v.item<double>() == inf);
    v.sum().backward();
    // torch gives [-inf, inf] at correction 2 (2 / 0 * (x - mean)); at 3 it divides by -1 and
    // gives [1, -1], a gradient of a forward it did not compute. The clamped divisor keeps the
    // gradient consistent with the inf forward.
    std::vector<double> gp = vals(p.grad());
    REQUIRE(gp[0] == -inf);
    REQUIRE(gp[1] == inf);
    Tensor q = leaf(from_vector<double>({0.5, 1.5}, {1, 2}));
    Tensor s = tandem::std(q, {1}, corr);
    REQUIRE(s.item<double>() == inf);
    s.sum().backward();  // torch: NaN (g / (2 inf) = 0, times 2 / 0)
    for (double g : vals(q.grad())) REQUIRE(std::isnan(g));
    Tensor k = leaf(from_vector<double>({0.5, 0.5}, {1, 2}));
    Tensor sk0 = tandem::std(k, {1}, corr);
    REQUIRE(std::isnan(sk0.item<double>()));  // 0 / 0: not a zero std, so not masked
    sk0.sum().backward();
    for (double g : vals(k.grad())) REQUIRE(std::isnan(g));
  }
}

TEST_CASE("gradcheck: var/std with corrections 0 and 2, keepdim, non-adjacent dims") {
  manual_seed(14);
  Tensor t = leaf(randn({3, 4, 5}, f64));
  std::vector<std::function<Tensor(const TensorList&)>> fns = {
      [](const TensorList& in) { return var(in[0], {0, 2}, 0, true); },
      [](const TensorList& in) { return tandem::std(in[0], {0, 2}, 2); },
      [](const TensorList& in) { return tandem::std(in[0].permute({2, 0, 1}), {1}, 0, true); },
      [](const TensorList& in) { return var(in[0].permute({2, 0, 1}), {0, 1}, 2); },
      [](const TensorList& in) { return tandem::std(in[0], {}, 0); },
  };
  for (auto& fn : fns) {
    auto r = gradcheck(fn, {t});
    INFO(r.report);
    REQUIRE(r.ok);
  }
}

TEST_CASE("an i64 sum over leading dims wraps, as PyTorch's does", "[reduce][fuzz]") {
  // fuzz_ops campaign finding: the column sums of a sum over leading dims add i64 elements, which
  // wrap like every integer tensor op here; the sanitizer builds failed here (signed overflow)
  // before the adds went through core/detail/wrapping.h's unsigned arithmetic. PyTorch 1.13:
  // torch.full((2, 3), -2**63).sum(0) == tensor([0, 0, 0]).
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  Tensor t = full({2, 3}, lowest, i64);
  REQUIRE(sum(t, {0}).to_vector<int64_t>() == std::vector<int64_t>{0, 0, 0});
  Tensor rows = full({70, 2}, lowest, i64);  // past the pairwise base case: the halves add too
  REQUIRE(sum(rows, {0}).to_vector<int64_t>() == std::vector<int64_t>{0, 0});
}

TEST_CASE("an i64 sum along a slice wraps, in the base case and across the pairwise halves", "[reduce][fuzz]") {
  // The slice sums (pairwise_sum) add i64 elements too; they were left to the hardware's wrap
  // (undefined in C++) until they went through wrapping_add. PyTorch 1.13:
  // torch.full((200,), 2**63 - 1).sum() == -200, torch.full((3,), 2**63 - 1).sum() == 2**63 - 3.
  const int64_t highest = std::numeric_limits<int64_t>::max();
  auto filled = [&](const Shape& shape) {  // full() takes a double, which cannot hold 2^63 - 1
    return from_vector<int64_t>(std::vector<int64_t>(numel_of(shape), highest), shape);
  };
  REQUIRE(sum(filled({200})).item<int64_t>() == -200);
  REQUIRE(sum(filled({3})).item<int64_t>() == highest - 2);
  REQUIRE(sum(filled({2, 9}), {1}).to_vector<int64_t>() == std::vector<int64_t>{highest - 8, highest - 8});
}
