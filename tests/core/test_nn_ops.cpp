#include <catch2/catch.hpp>

#include <cmath>

#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using test_util::require_gradcheck;
using test_util::require_close;
using test_util::vals;
using Catch::Contains;

namespace {

// Reference softmax over `dim` of a contiguous row-major tensor, from the definition.
std::vector<double> naive_softmax(const Tensor& a, int64_t dim, bool log) {
  auto x = vals(a);
  const Shape& s = a.shape();
  int64_t outer = 1, n = s[dim], inner = 1;
  for (int64_t i = 0; i < dim; ++i) outer *= s[i];
  for (size_t i = dim + 1; i < s.size(); ++i) inner *= s[i];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double z = 0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(x[(o * n + j) * inner + i]);
      for (int64_t j = 0; j < n; ++j) {
        double v = x[(o * n + j) * inner + i];
        y[(o * n + j) * inner + i] = log ? v - std::log(z) : std::exp(v) / z;
      }
    }
  return y;
}

}  // namespace

TEST_CASE("softmax and log_softmax match the definition over every dim") {
  manual_seed(1);
  Tensor a = randn({3, 4, 5}, f64);
  for (int64_t d = 0; d < 3; ++d) {
    INFO("dim " << d);
    require_close(vals(softmax(a, d)), naive_softmax(a, d, false), 1e-12);
    require_close(vals(log_softmax(a, d)), naive_softmax(a, d, true), 1e-12);
    require_close(vals(softmax(a, d - 3)), naive_softmax(a, d, false), 1e-12);
  }
  // Rows sum to one.
  Tensor s = softmax(randn({6, 7}, f32), 1);
  for (double v : vals(sum(s, {1}))) REQUIRE(std::abs(v - 1.0) < 1e-6);
  // Non-contiguous input.
  Tensor t = a.transpose(0, 2);
  require_close(vals(softmax(t, 1)), naive_softmax(t.contiguous(), 1, false), 1e-12);
  REQUIRE(a.softmax(-1).shape() == a.shape());
}

TEST_CASE("softmax is stable for large inputs and exact on a known example") {
  Tensor big = from_vector<float>({1000, 1001, 1002}, {3});
  auto s = vals(softmax(big, 0));
  double z = 1 + std::exp(1.0) + std::exp(2.0);
  require_close(s, {1 / z, std::exp(1.0) / z, std::exp(2.0) / z}, 1e-5);
  auto ls = vals(log_softmax(big, 0));
  require_close(ls, {-std::log(z), 1 - std::log(z), 2 - std::log(z)}, 1e-5);
  Tensor neg = from_vector<double>({-1000, 0}, {2});
  require_close(vals(log_softmax(neg, 0)), {-1000, 0}, 1e-12);
  // f16 softmax accumulates in f32.
  Tensor h = from_vector<float>({0.5f, 1.0f, -2.0f, 3.0f}, {4}).to(f16);
  auto hv = vals(softmax(h, 0));
  auto fv = vals(softmax(from_vector<float>({0.5f, 1.0f, -2.0f, 3.0f}, {4}), 0));
  require_close(hv, fv, 2e-3);
  REQUIRE_THROWS_WITH(softmax(zeros({2, 3}), 2), Contains("[softmax]") && Contains("out of range"));
  REQUIRE_THROWS_WITH(log_softmax(zeros({2}, i64), 0), Contains("[log_softmax]") && Contains("i64"));
}

// Found by tools/fuzz/fuzz_ops (corpus/ops/crash-softmax-empty-huge-dim): an empty tensor may
// have a huge dim ([0, 2^62], a view), and the kernel sized its scratch by it first
// (std::length_error escaped instead of a result).
TEST_CASE("softmax and log_softmax of an empty tensor with a huge dim") {
  Tensor x = zeros({0, 1}).requires_grad_();
  Tensor e = expand(x, {0, int64_t{1} << 62});
  for (bool log : {false, true}) {
    Tensor y = log ? log_softmax(e, -1) : softmax(e, 1);
    REQUIRE(y.shape() == Shape{0, int64_t{1} << 62});
    sum(y).backward();
    REQUIRE(x.grad().shape() == Shape{0, 1});
  }
  REQUIRE_THROWS_WITH(softmax(zeros({0, 3}, i64), 0), Contains("[softmax]") && Contains("floating"));
}

TEST_CASE("gradcheck: softmax and log_softmax") {
  manual_seed(2);
  Tensor a = leaf(randn({3, 4, 2}, f64));
  Tensor t = leaf(randn({4, 3}, f64));  // used transposed inside the function (gradcheck clones inputs)
  for (int64_t d : {0, 1, 2, -1}) {
    INFO("dim " << d);
    require_gradcheck([d](const TensorList& in) { return softmax(in[0], d); }, {a});
    require_gradcheck([d](const TensorList& in) { return log_softmax(in[0], d); }, {a});
  }
  require_gradcheck([](const TensorList& in) { return softmax(in[0].t(), 1); }, {t});
  require_gradcheck([](const TensorList& in) { return log_softmax(in[0].t(), 0); }, {t});
}

TEST_CASE("layer_norm normalises the trailing dims and applies weight and bias") {
  manual_seed(3);
  Tensor x = randn({4, 6}, f64) * 3.0 + 2.0;
  Tensor y = layer_norm(x, {6}, Tensor(), Tensor(), 0.0);
  auto yv = vals(y);
  for (int r = 0; r < 4; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 6; ++j) m += yv[r * 6 + j];
    m /= 6;
    for (int j = 0; j < 6; ++j) v += (yv[r * 6 + j] - m) * (yv[r * 6 + j] - m);
    REQUIRE(std::abs(m) < 1e-12);
    REQUIRE(std::abs(v / 6 - 1) < 1e-12);  // biased variance, as layer_norm uses
  }
  Tensor w = randn({3, 2}, f64), b = randn({3, 2}, f64);
  Tensor x3 = randn({2, 3, 2}, f64);
  auto got = vals(layer_norm(x3, {3, 2}, w, b, 1e-5));
  auto xv = vals(x3), wv = vals(w), bv = vals(b);
  std::vector<double> want(12);
  for (int r = 0; r < 2; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 6; ++j) m += xv[r * 6 + j];
    m /= 6;
    for (int j = 0; j < 6; ++j) v += (xv[r * 6 + j] - m) * (xv[r * 6 + j] - m);
    v /= 6;
    for (int j = 0; j < 6; ++j) want[r * 6 + j] = (xv[r * 6 + j] - m) / std::sqrt(v + 1e-5) * wv[j] + bv[j];
  }
  require_close(got, want, 1e-12);
  // Non-contiguous input gives the same as its contiguous copy.
  Tensor xt = randn({6, 4}, f64).t();
  require_close(vals(layer_norm(xt, {6})), vals(layer_norm(xt.contiguous(), {6})));
}

TEST_CASE("layer_norm errors") {
  REQUIRE_THROWS_WITH(layer_norm(zeros({2, 3}), {4}),
                      Contains("[layer_norm] normalized_shape [4] does not match the trailing dims of input [2, 3]"));
  REQUIRE_THROWS_WITH(layer_norm(zeros({2, 3}), {3}, zeros({2})), Contains("[layer_norm] weight must have shape"));
  REQUIRE_THROWS_WITH(layer_norm(zeros({2, 3}), {3}, zeros({3}), zeros({3}, f64)),
                      Contains("[layer_norm] bias has dtype f64"));
  REQUIRE_THROWS_WITH(layer_norm(zeros({2, 3}), {}), Contains("[layer_norm]"));
  REQUIRE_THROWS_WITH(layer_norm(zeros({2, 3}, i64), {3}), Contains("[layer_norm]") && Contains("i64"));
}

TEST_CASE("gradcheck: layer_norm") {
  manual_seed(4);
  auto full = [](const TensorList& in) { return layer_norm(in[0], {4}, in[1], in[2]); };
  require_gradcheck(full, {leaf(randn({3, 4}, f64)), leaf(randn({4}, f64)), leaf(randn({4}, f64))});
  require_gradcheck([](const TensorList& in) { return layer_norm(in[0].t(), {4}, in[1], in[2]); },
                    {leaf(randn({4, 3}, f64)), leaf(randn({4}, f64)), leaf(randn({4}, f64))});
  require_gradcheck([](const TensorList& in) { return layer_norm(in[0], {2, 3}, in[1], in[2], 1e-3); },
                    {leaf(randn({2, 2, 3}, f64)), leaf(randn({2, 3}, f64)), leaf(randn({2, 3}, f64))});
  require_gradcheck([](const TensorList& in) { return layer_norm(in[0], {5}); }, {leaf(randn({2, 3, 5}, f64))});
  // Only the parameters need grad.
  require_gradcheck(full, {randn({3, 4}, f64), leaf(randn({4}, f64)), leaf(randn({4}, f64))});
}

TEST_CASE("dropout: identity cases, zeros at p = 1, scaled mask otherwise") {
  Tensor x = ones({1000}, f64);
  REQUIRE(dropout(x, 0.0, true).is_same(x));
  REQUIRE(dropout(x, 0.7, false).is_same(x));
  require_close(vals(dropout(x, 1.0, true)), std::vector<double>(1000, 0.0));
  REQUIRE_THROWS_WITH(dropout(x, 1.5, true), Contains("[dropout] p must be in [0, 1], got 1.5"));
  REQUIRE_THROWS_WITH(dropout(x, -0.1, false), Contains("[dropout]"));
  manual_seed(5);
  Tensor big = ones({20000}, f32);
  auto v = vals(dropout(big, 0.25, true));
  int64_t kept = 0;
  for (double e : v) {
    REQUIRE((e == 0.0 || std::abs(e - 1 / 0.75) < 1e-6));
    kept += e != 0.0;
  }
  // Binomial(20000, 0.75): mean 15000, sd ~61.
  REQUIRE(std::abs(kept - 15000) < 400);
}

TEST_CASE("dropout backward multiplies by the saved mask") {
  manual_seed(6);
  Tensor x = leaf(randn({50}, f64));
  Tensor y = dropout(x, 0.5, true);
  sum(y).backward();
  auto g = vals(x.grad()), yv = vals(y), xv = vals(x);
  for (size_t i = 0; i < g.size(); ++i) {
    REQUIRE((g[i] == 0.0 || g[i] == 2.0));
    REQUIRE(std::abs(yv[i] - g[i] * xv[i]) < 1e-12);
  }
  // Re-seeding inside the function fixes the mask, so finite differences see one function.
  require_gradcheck(
      [](const TensorList& in) {
        manual_seed(7);
        return dropout(in[0].t(), 0.3, true);
      },
      {leaf(randn({4, 5}, f64))});
}

TEST_CASE("layer_norm backward of an empty input whose normalized dim is huge", "[layer_norm][fuzz]") {
  // fuzz_ops (campaign, seed tools/fuzz/corpus/ops/crash-layer-norm-empty-huge-dim): the backward
  // sized its row scratch by the normalized numel, 2^61 here, and threw std::length_error out of
  // the library although there is no row to normalise.
  const int64_t huge = int64_t{1} << 61;
  Tensor x = zeros({0, huge}).requires_grad_();
  sum(layer_norm(x, {huge})).backward();
  REQUIRE(x.grad().shape() == Shape{0, huge});
  // With weight and bias (a small D, no rows): their gradients are zeros.
  Tensor x2 = zeros({0, 4}).requires_grad_();
  Tensor w = ones({4}).requires_grad_(), b = ones({4}).requires_grad_();
  sum(layer_norm(x2, {4}, w, b)).backward();
  REQUIRE(w.grad().to_vector<float>() == std::vector<float>(4, 0.0f));
  REQUIRE(b.grad().to_vector<float>() == std::vector<float>(4, 0.0f));
}
