// topk: values and indices against a brute-force ranking (every dtype, dims, strides, ties, NaN,
// -0), sorted and index order, empty and 0-dim inputs, the errors, and the gradient (gradcheck
// in f64 and the exact scatter).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using test_util::leaf;
using test_util::require_gradcheck;
using test_util::vals;

namespace {

using I = std::vector<int64_t>;
using V = std::vector<double>;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Whether x ranks before y (positions i < j break ties): NaN above every number, -0 == +0.
bool ranks_before(double x, int64_t i, double y, int64_t j, bool largest) {
  const bool xn = std::isnan(x), yn = std::isnan(y);
  if (xn != yn) return largest ? xn : yn;
  if (!xn && x != y) return largest ? x > y : x < y;
  return i < j;
}

struct Expected {
  std::vector<double> values;
  std::vector<int64_t> indices;
};

// topk by brute force over a tensor of any shape (its values read as f64, in logical order): the
// output in row-major order of a's shape with k along dim.
Expected reference(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  const std::vector<double> x = a.contiguous().to(f64).to_vector<double>();
  const Shape& s = a.shape();
  if (s.empty()) return {x, I{0}};
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[d];
  for (size_t d = dim + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t n = s[dim];
  Expected e;
  e.values.resize(outer * k * inner);
  e.indices.resize(outer * k * inner);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<int64_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      auto at = [&](int64_t j) { return x[(o * n + j) * inner + i]; };
      std::sort(order.begin(), order.end(),
                [&](int64_t p, int64_t q) { return ranks_before(at(p), p, at(q), q, largest); });
      order.resize(k);
      if (!sorted) std::sort(order.begin(), order.end());
      for (int64_t t = 0; t < k; ++t) {
        e.values[(o * k + t) * inner + i] = at(order[t]);
        e.indices[(o * k + t) * inner + i] = order[t];
      }
    }
  }
  return e;
}

void require_topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  INFO("shape " << shape_str(a.shape()) << " " << a.dtype() << " k " << k << " dim " << dim << " largest "
                << largest << " sorted " << sorted);
  auto [v, i] = topk(a, k, dim, largest, sorted);
  Shape want_shape = a.shape();
  const int64_t d = a.dim() == 0 ? 0 : wrap_dim(dim, a.dim(), "test");
  if (a.dim() > 0) want_shape[d] = k;
  REQUIRE(v.shape() == want_shape);
  REQUIRE(i.shape() == want_shape);
  REQUIRE(v.dtype() == a.dtype());
  REQUIRE(i.dtype() == i64);
  const Expected e = reference(a, a.dim() == 0 ? 1 : k, d, largest, sorted);
  test_util::require_close(v.to(f64).to_vector<double>(), e.values, 0);  // exact, NaN matching NaN
  REQUIRE(i.to_vector<int64_t>() == e.indices);
}

Tensor random_values(const Shape& shape, Dtype dt) {
  if (is_integral(dt)) return randint(-20, 20, shape, dt);  // many ties
  return randn(shape, f64).to(dt);
}

}  // namespace

TEST_CASE("topk: the k largest or smallest, sorted or in index order", "[topk]") {
  Tensor a = from_vector<double>({3, -1, 7, 0.5, 7, -4, 2});
  auto [v, i] = topk(a, 3);
  REQUIRE(vals(v) == V{7, 7, 3});
  REQUIRE(i.to_vector<int64_t>() == I{2, 4, 0});  // equal values: the lower index first
  std::tie(v, i) = topk(a, 3, 0, /*largest=*/false);
  REQUIRE(vals(v) == V{-4, -1, 0.5});
  REQUIRE(i.to_vector<int64_t>() == I{5, 1, 3});
  std::tie(v, i) = topk(a, 3, -1, true, /*sorted=*/false);
  REQUIRE(i.to_vector<int64_t>() == I{0, 2, 4});  // the same elements, in the order of their indices
  REQUIRE(vals(v) == V{3, 7, 7});
  std::tie(v, i) = a.topk(7, 0, false, false);  // every element, in place
  REQUIRE(vals(v) == vals(a));
  REQUIRE(i.to_vector<int64_t>() == I{0, 1, 2, 3, 4, 5, 6});
  std::tie(v, i) = a.topk(0);
  REQUIRE(v.shape() == Shape{0});
  REQUIRE(i.shape() == Shape{0});
}

TEST_CASE("topk: ties go to the lower index, NaN ranks above everything, -0 equals +0", "[topk]") {
  Tensor a = from_vector<double>({1, kNaN, 3, kNaN, 2, -kInf, kInf});
  auto [v, i] = topk(a, 4);
  REQUIRE(i.to_vector<int64_t>() == I{1, 3, 6, 2});  // as PyTorch: NaN first when largest
  REQUIRE(std::isnan(vals(v)[0]));
  REQUIRE(vals(v)[2] == kInf);
  std::tie(v, i) = topk(a, 7, 0, /*largest=*/false);
  REQUIRE(i.to_vector<int64_t>() == I{5, 0, 4, 2, 6, 1, 3});  // and last when smallest
  std::tie(v, i) = topk(a, 2, 0, false);
  REQUIRE(vals(v) == V{-kInf, 1});

  for (Dtype dt : {f64, f32, f16, bf16}) {
    INFO(dt);
    Tensor z = from_vector<double>({0.0, -0.0, 0.0, -1.0}).to(dt);
    REQUIRE(topk(z, 2).second.to_vector<int64_t>() == I{0, 1});
    REQUIRE(topk(z, 3, 0, false).second.to_vector<int64_t>() == I{3, 0, 1});
    REQUIRE(std::signbit(vals(topk(z, 2).first)[1]));  // the element itself is copied out
    Tensor n = from_vector<double>({kNaN, 1, -kNaN, kInf}).to(dt);
    REQUIRE(topk(n, 4).second.to_vector<int64_t>() == I{0, 2, 3, 1});  // NaN of either sign first
  }

  Tensor same = full({5}, 2.5, f32);
  REQUIRE(topk(same, 3).second.to_vector<int64_t>() == I{0, 1, 2});
  REQUIRE(topk(same, 3, 0, false).second.to_vector<int64_t>() == I{0, 1, 2});
}

TEST_CASE("topk: every numeric dtype, dim and k against a brute-force ranking", "[topk]") {
  manual_seed(11);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    for (const Shape& shape : {Shape{9}, Shape{4, 7}, Shape{3, 5, 4}, Shape{2, 3, 1, 6}}) {
      Tensor a = random_values(shape, dt);
      const int64_t nd = static_cast<int64_t>(shape.size());
      for (int64_t dim = -nd; dim < nd; ++dim) {
        const int64_t n = shape[dim < 0 ? dim + nd : dim];
        for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n})
          for (bool largest : {true, false})
            for (bool sorted : {true, false}) require_topk(a, k, dim, largest, sorted);
      }
    }
  }
  // The 2-byte floats round many normals to the same value: ties among them, by index.
  Tensor h = (randn({200}) * 4).to(bf16);
  require_topk(h, 60, 0, true, true);
  require_topk(h, 60, 0, false, false);
}

TEST_CASE("topk: long rows take each selection path (few, many, all)", "[topk]") {
  manual_seed(12);
  Tensor a = randint(0, 50, {3, 1000}).to(f32);  // ties everywhere
  for (int64_t k : {int64_t{1}, int64_t{50}, int64_t{125}, int64_t{126}, int64_t{600}, int64_t{999}, int64_t{1000}})
    for (bool largest : {true, false})
      for (bool sorted : {true, false}) require_topk(a, k, 1, largest, sorted);
  Tensor logits = randn({2, 50257});
  require_topk(logits, 50, -1, true, true);
}

TEST_CASE("topk: strided inputs give what their contiguous copies give", "[topk]") {
  manual_seed(13);
  Tensor base = randn({6, 8, 5}, f64);
  const TensorList views = {base.transpose(0, 2), base.slice(1, 1, 8, 3), base.permute({1, 2, 0}),
                            base.select(2, 3).t(), base.narrow(2, 1, 3).unsqueeze(1)};
  for (const Tensor& x : views) {
    REQUIRE_FALSE(x.is_contiguous());
    for (int64_t dim = 0; dim < x.dim(); ++dim) {
      const int64_t k = std::min<int64_t>(3, x.size(dim));
      for (bool sorted : {true, false}) {
        auto [v, i] = topk(x, k, dim, true, sorted);
        auto [vc, ic] = topk(x.contiguous(), k, dim, true, sorted);
        REQUIRE(v.equal(vc));
        REQUIRE(i.equal(ic));
        require_topk(x, k, dim, false, sorted);
      }
    }
  }
  // An expanded input (stride 0 along dim): every element ties.
  Tensor e = from_vector<double>({1.5, -2}, {2, 1}).expand({2, 4});
  auto [v, i] = topk(e, 2, 1);
  REQUIRE(vals(v) == V{1.5, 1.5, -2, -2});
  REQUIRE(i.to_vector<int64_t>() == I{0, 1, 0, 1});
}

TEST_CASE("topk: empty and 0-dim inputs", "[topk]") {
  auto [v, i] = topk(zeros({0, 5}), 2);
  REQUIRE(v.shape() == Shape{0, 2});
  REQUIRE(i.shape() == Shape{0, 2});
  std::tie(v, i) = topk(zeros({3, 0}), 0);
  REQUIRE(v.shape() == Shape{3, 0});
  std::tie(v, i) = topk(zeros({3, 0, 2}), 1, 0);
  REQUIRE(v.shape() == Shape{1, 0, 2});
  REQUIRE_THROWS_WITH(topk(zeros({3, 0}), 1), Contains("[topk] k (1) is out of range for dim -1 of size 0") &&
                                                   Contains("[3, 0]"));

  Tensor s = scalar_tensor(4.25, f64);
  for (int64_t k : {0, 1})
    for (int64_t dim : {0, -1}) {
      std::tie(v, i) = topk(s, k, dim);
      REQUIRE(v.dim() == 0);
      REQUIRE(i.dim() == 0);
      REQUIRE(v.item<double>() == 4.25);  // as PyTorch: even k = 0 gives the one element
      REQUIRE(i.item<int64_t>() == 0);
    }
  REQUIRE_THROWS_WITH(topk(s, 2), Contains("[topk] k (2) is out of range for dim -1 of size 1"));
  REQUIRE_THROWS_WITH(topk(s, 1, 1), Contains("[topk] dim 1 out of range for a tensor with 0 dims"));
}

TEST_CASE("topk: errors name the op, k, the dim and the shape", "[topk]") {
  Tensor a = zeros({3, 4});
  REQUIRE_THROWS_WITH(topk(a, 5), Contains("[topk] k (5) is out of range for dim -1 of size 4 (input shape [3, 4])") &&
                                      Contains("[0, 4]"));
  REQUIRE_THROWS_WITH(topk(a, 4, 0), Contains("[topk] k (4) is out of range for dim 0 of size 3"));
  REQUIRE_THROWS_WITH(topk(a, -1), Contains("[topk] k (-1) is out of range"));
  REQUIRE_THROWS_WITH(topk(a, 1, 2), Contains("[topk] dim 2 out of range for a tensor with 2 dims"));
  REQUIRE_THROWS_WITH(topk(zeros({2}, boolean), 1), Contains("[topk] expected a numeric dtype, got bool"));
  REQUIRE_THROWS_WITH(topk(Tensor(), 1), Contains("[topk] got an undefined tensor"));
}

TEST_CASE("topk: the gradient goes to the selected elements (gradcheck in f64)", "[topk][autograd]") {
  manual_seed(14);
  Tensor x = leaf(from_vector<double>({0.5, 3, -1, 2, 8}));
  auto [v, i] = topk(x, 2);
  REQUIRE(v.requires_grad());
  REQUIRE_FALSE(i.requires_grad());
  (v * from_vector<double>({10, 100})).sum().backward();
  REQUIRE(vals(x.grad()) == V{0, 100, 0, 0, 10});

  Tensor y = leaf(from_vector<double>({0.5, 3, -1, 2, 8}));
  topk(y, 3, 0, false, false).first.sum().backward();  // smallest three, in index order
  REQUIRE(vals(y.grad()) == V{1, 0, 1, 1, 0});

  for (bool largest : {true, false})
    for (bool sorted : {true, false})
      for (int64_t dim : {0, 1, -1}) {
        INFO("largest " << largest << " sorted " << sorted << " dim " << dim);
        Tensor a = leaf(randn({4, 6, 5}, f64));
        require_gradcheck([=](const TensorList& in) { return topk(in[0], 3, dim, largest, sorted).first; }, {a});
        // Through a strided view, and the values used twice.
        Tensor b = leaf(randn({6, 4}, f64));
        require_gradcheck(
            [=](const TensorList& in) {
              Tensor t = topk(in[0].t(), 2, dim == 1 ? 1 : 0, largest, sorted).first;
              return t * t;
            },
            {b});
      }
  Tensor s = leaf(scalar_tensor(1.5, f64));
  require_gradcheck([](const TensorList& in) { return topk(in[0], 1).first * 3; }, {s});

  // f32 and the 2-byte floats: the gradient in the input's dtype.
  for (Dtype dt : {f32, bf16}) {
    Tensor h = leaf(from_vector<float>({1, 4, 2, 3}).to(dt));
    topk(h, 2).first.sum().backward();
    REQUIRE(h.grad().dtype() == dt);
    REQUIRE(vals(h.grad()) == V{0, 1, 0, 1});
  }
  {
    NoGradGuard no_grad;
    REQUIRE_FALSE(topk(leaf(randn({3}, f64)), 1).first.requires_grad());
  }
}
