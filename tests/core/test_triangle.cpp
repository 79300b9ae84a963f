// Triangles: tril and triu. Values against a reference built element by element from the
// definition (column - row against the diagonal), every dtype, batched and non-square inputs,
// diagonals past either corner, non-contiguous and empty inputs, the gradient (hand-checked and
// gradcheck in f64) and the errors.
#include <catch2/catch.hpp>

#include <limits>

#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::require_gradcheck;
using test_util::vals;

namespace {

// 1, 2, ..., n as f64 in `shape` (no zeros, so a kept element never reads as a zeroed one).
Tensor count_from_one(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i + 1);
  return from_vector(v, shape);
}

// The definition, element by element over a's logical order: (row, col) of each element in its
// matrix, kept when col - row <= diagonal (lower) or >= diagonal (upper).
std::vector<double> reference(const Tensor& a, int64_t diagonal, bool lower) {
  std::vector<double> v = to_dtype(a, f64).contiguous().to_vector<double>();
  const int64_t rows = a.size(-2), cols = a.size(-1);
  for (size_t e = 0; e < v.size(); ++e) {
    const int64_t col = static_cast<int64_t>(e) % cols, row = (static_cast<int64_t>(e) / cols) % rows;
    const bool keep = lower ? col - row <= diagonal : col - row >= diagonal;
    if (!keep) v[e] = 0;
  }
  return v;
}

void require_both_match_reference(const Tensor& a, int64_t diagonal) {
  INFO("shape " << fmt::format("{}", a.shape()) << ", diagonal " << diagonal);
  Tensor lo = tril(a, diagonal), up = triu(a, diagonal);
  REQUIRE(lo.shape() == a.shape());
  REQUIRE(up.shape() == a.shape());
  REQUIRE(lo.dtype() == a.dtype());
  REQUIRE(up.dtype() == a.dtype());
  REQUIRE(lo.is_contiguous());
  REQUIRE(vals(to_dtype(lo, f64)) == reference(a, diagonal, true));
  REQUIRE(vals(to_dtype(up, f64)) == reference(a, diagonal, false));
}

}  // namespace

TEST_CASE("tril and triu keep one side of a diagonal of a square matrix", "[triangle]") {
  Tensor a = count_from_one({3, 3});
  REQUIRE(vals(tril(a)) == std::vector<double>{1, 0, 0, 4, 5, 0, 7, 8, 9});
  REQUIRE(vals(triu(a)) == std::vector<double>{1, 2, 3, 0, 5, 6, 0, 0, 9});
  REQUIRE(vals(tril(a, 1)) == std::vector<double>{1, 2, 0, 4, 5, 6, 7, 8, 9});
  REQUIRE(vals(tril(a, -1)) == std::vector<double>{0, 0, 0, 4, 0, 0, 7, 8, 0});
  REQUIRE(vals(triu(a, 1)) == std::vector<double>{0, 2, 3, 0, 0, 6, 0, 0, 0});
  REQUIRE(vals(triu(a, -1)) == std::vector<double>{1, 2, 3, 4, 5, 6, 0, 8, 9});
  // The method forms are the same ops.
  REQUIRE(a.tril().equal(tril(a)));
  REQUIRE(a.triu(-1).equal(triu(a, -1)));
  // The two sides split the matrix: tril(a, k) + triu(a, k + 1) == a for every k.
  for (int64_t k = -4; k <= 4; ++k) REQUIRE((tril(a, k) + triu(a, k + 1)).equal(a));
}

TEST_CASE("tril and triu on non-square and batched matrices, every diagonal", "[triangle]") {
  // Wide, tall, batched, batched with a size-1 batch dim, single rows and columns.
  for (const Shape& shape : {Shape{3, 5}, Shape{5, 3}, Shape{2, 3, 4}, Shape{2, 1, 4, 3}, Shape{1, 6}, Shape{6, 1},
                             Shape{1, 1}, Shape{3, 2, 2, 2}}) {
    Tensor a = count_from_one(shape);
    for (int64_t k = -7; k <= 7; ++k) require_both_match_reference(a, k);
  }
  // Wide [3, 5]: hand-written for diagonal 2 and -1.
  Tensor w = count_from_one({3, 5});
  REQUIRE(vals(tril(w, 2)) == std::vector<double>{1, 2, 3, 0, 0, 6, 7, 8, 9, 0, 11, 12, 13, 14, 15});
  REQUIRE(vals(triu(w, -1)) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 12, 13, 14, 15});
  // Batched: every matrix gets the same mask.
  Tensor b = count_from_one({2, 2, 2});
  REQUIRE(vals(tril(b)) == std::vector<double>{1, 0, 3, 4, 5, 0, 7, 8});
  REQUIRE(vals(triu(b)) == std::vector<double>{1, 2, 0, 4, 5, 6, 0, 8});
}

TEST_CASE("tril and triu with diagonals past the corners keep everything or nothing", "[triangle]") {
  Tensor a = count_from_one({3, 4});
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  REQUIRE(tril(a, 3).equal(a));  // col - row is at most 3 in a [3, 4] matrix
  REQUIRE(triu(a, -2).equal(a));  // and at least -2
  for (int64_t k : {int64_t{4}, int64_t{5}, int64_t{100}, big}) {
    INFO("diagonal " << k);
    REQUIRE(tril(a, k).equal(a));
    REQUIRE(vals(triu(a, k)) == std::vector<double>(12, 0.0));
  }
  for (int64_t k : {int64_t{-3}, int64_t{-4}, int64_t{-100}, small}) {
    INFO("diagonal " << k);
    REQUIRE(vals(tril(a, k)) == std::vector<double>(12, 0.0));
    REQUIRE(triu(a, k).equal(a));
  }
  // One inside either corner: only the corner element survives.
  REQUIRE(vals(triu(a, 3)) == std::vector<double>{0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(vals(tril(a, -2)) == std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0});
}

TEST_CASE("tril and triu take every dtype and return a new tensor", "[triangle]") {
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    INFO(dt);
    Tensor a = count_from_one({2, 3, 3}).to(dt);
    require_both_match_reference(a, 0);
    require_both_match_reference(a, -1);
    require_both_match_reference(a, 2);
  }
  // bool: the causal mask of attention, and a bool input's own triangle.
  Tensor causal = tril(ones({4, 4}, boolean));
  REQUIRE(causal.dtype() == boolean);
  REQUIRE(causal.to_vector<bool>() == std::vector<bool>{true, false, false, false, true, true, false, false,
                                                        true, true, true, false, true, true, true, true});
  Tensor pattern = from_vector<bool>({true, false, true, true, true, false}, {2, 3});
  REQUIRE(triu(pattern).to_vector<bool>() == std::vector<bool>{true, false, true, false, true, false});
  REQUIRE(tril(pattern, -1).to_vector<bool>() == std::vector<bool>{false, false, false, true, false, false});
  // A new tensor: writing into the result leaves the input alone, and the other way round.
  Tensor a = count_from_one({3, 3});
  Tensor t = tril(a);
  REQUIRE(t.storage() != a.storage());
  t.fill_(-1.0);
  REQUIRE(a.equal(count_from_one({3, 3})));
  Tensor u = triu(a);
  a.zero_();
  REQUIRE(vals(u) == std::vector<double>{1, 2, 3, 0, 5, 6, 0, 0, 9});
}

TEST_CASE("tril and triu read non-contiguous inputs", "[triangle]") {
  Tensor base = count_from_one({4, 6});
  // Transposed (column-major rows), a stepped slice, a narrow with an offset, an expanded batch
  // (zero strides), and a permuted batched tensor.
  Tensor transposed = base.t();
  Tensor stepped = base.slice(1, 0, 6, 2);  // [4, 3], column stride 2
  Tensor narrowed = base.narrow(0, 1, 3).narrow(1, 2, 3);
  Tensor expanded = count_from_one({1, 3, 4}).expand({3, 3, 4});
  Tensor permuted = count_from_one({3, 4, 2}).permute({2, 0, 1});
  for (const Tensor& a : {transposed, stepped, narrowed, expanded, permuted}) {
    REQUIRE_FALSE(a.is_contiguous());
    for (int64_t k : {-2, -1, 0, 1, 3}) {
      require_both_match_reference(a, k);
      REQUIRE(tril(a, k).equal(tril(a.contiguous(), k)));
      REQUIRE(triu(a, k).equal(triu(a.contiguous(), k)));
    }
  }
}

TEST_CASE("tril and triu of empty tensors are empty, with their shape", "[triangle]") {
  for (const Shape& shape : {Shape{0, 3}, Shape{3, 0}, Shape{0, 0}, Shape{2, 0, 4}, Shape{0, 2, 2}}) {
    INFO(fmt::format("{}", shape));
    Tensor a = zeros(shape, f64);
    REQUIRE(tril(a).shape() == shape);
    REQUIRE(triu(a, -3).shape() == shape);
    REQUIRE(tril(a, 2).numel() == 0);
    Tensor x = zeros(shape, f64).requires_grad_();
    tril(x, 1).sum().backward();
    REQUIRE(x.grad().shape() == shape);
  }
}

TEST_CASE("tril and triu backward apply the same mask to the gradient", "[triangle][grad]") {
  Tensor x = count_from_one({2, 3}).requires_grad_();
  tril(x).backward(from_vector<double>({10, 20, 30, 40, 50, 60}, {2, 3}));
  REQUIRE(vals(x.grad()) == std::vector<double>{10, 0, 0, 40, 50, 0});
  x.set_grad(Tensor());
  triu(x, 1).sum().backward();  // an expanded (zero-stride) upstream gradient
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 1, 1, 0, 0, 1});
  // A view's gradient reaches its base through the same positions.
  Tensor base = count_from_one({3, 2}).requires_grad_();
  tril(base.t(), -1).sum().backward();  // keeps (1, 0) of the [2, 3] view: base element (0, 1)
  REQUIRE(vals(base.grad()) == std::vector<double>{0, 1, 0, 0, 0, 0});
  // Nothing records without a grad-requiring input, or under no_grad.
  REQUIRE(tril(count_from_one({2, 2})).grad_fn() == nullptr);
  {
    NoGradGuard no_grad;
    REQUIRE(tril(x).grad_fn() == nullptr);
  }
  REQUIRE(tril(x).grad_fn() != nullptr);
}

TEST_CASE("tril and triu pass gradcheck in f64", "[triangle][grad]") {
  manual_seed(3);
  for (const Shape& shape : {Shape{4, 4}, Shape{3, 5}, Shape{5, 2}, Shape{2, 3, 4}}) {
    for (int64_t k : {-2, 0, 1, 4}) {
      INFO(fmt::format("shape {}, diagonal {}", shape, k));
      Tensor x = randn(shape, f64).requires_grad_();
      require_gradcheck([k](const TensorList& in) { return tril(in[0], k); }, {x});
      require_gradcheck([k](const TensorList& in) { return triu(in[0], k); }, {x});
    }
  }
  // Through a non-contiguous view of the leaf, and composed with another op.
  Tensor y = randn({4, 3}, f64).requires_grad_();
  require_gradcheck([](const TensorList& in) { return triu(in[0].t(), -1); }, {y});
  require_gradcheck([](const TensorList& in) { return tril(in[0] * in[0], 1).sum({1}); }, {y});
}

TEST_CASE("tril and triu refuse fewer than 2 dims, naming the shape", "[triangle]") {
  REQUIRE_THROWS_WITH(tril(zeros({5})),
                      "[tril] input must have at least 2 dims (a matrix or a batch of matrices), got shape [5]");
  REQUIRE_THROWS_WITH(triu(zeros({}), 1),
                      "[triu] input must have at least 2 dims (a matrix or a batch of matrices), got shape []");
  REQUIRE_THROWS_WITH(tril(zeros({0})),
                      "[tril] input must have at least 2 dims (a matrix or a batch of matrices), got shape [0]");
  REQUIRE_THROWS_WITH(triu(Tensor()), "[triu] input is an undefined tensor");
  REQUIRE_THROWS_AS(zeros({3}).tril(), Error);
}
