// Indexing and joining: embedding, index_select, gather, scatter_add, masked_fill, cat, stack,
// split, chunk. Values on hand-built inputs, shapes, non-contiguous inputs, negative dims,
// gradchecks in f64, and error messages.
#include <catch2/catch.hpp>

#include <limits>

#include "tandem.h"

using namespace tandem;
using Catch::Contains;

namespace {

Tensor f64v(const std::vector<double>& v, const Shape& s) { return from_vector(v, s); }
Tensor i64v(const std::vector<int64_t>& v, const Shape& s) { return from_vector(v, s); }
Tensor i32v(const std::vector<int32_t>& v, const Shape& s) { return from_vector(v, s); }
Tensor boolv(const std::vector<bool>& v, const Shape& s) { return from_vector(v, s); }
std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

// 0, 1, ..., n-1 as f64 in `shape`.
Tensor iota(const Shape& shape) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return f64v(v, shape);
}

Tensor leaf(const Shape& shape) {
  Tensor t = randn(shape, f64);
  t.requires_grad_();
  return t;
}

void check_grad(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs) {
  auto r = gradcheck(fn, inputs);
  INFO(r.report);
  REQUIRE(r.ok);
}

}  // namespace

// ---------------------------------------------------------------- embedding

TEST_CASE("embedding looks up rows for indices of any shape", "[index][embedding]") {
  Tensor w = iota({4, 3});
  Tensor idx = i64v({0, 2, 3, 0}, {2, 2});
  Tensor out = embedding(w, idx);
  REQUIRE(out.shape() == Shape{2, 2, 3});
  REQUIRE(vals(out) == std::vector<double>{0, 1, 2, 6, 7, 8, 9, 10, 11, 0, 1, 2});

  // i32 indices, a 0-dim index, and a non-contiguous weight (transposed [3, 4]).
  REQUIRE(vals(embedding(w, i32v({3, 1}, {2}))) == std::vector<double>{9, 10, 11, 3, 4, 5});
  Tensor scalar_idx = i64v({1}, {1}).squeeze();
  REQUIRE(embedding(w, scalar_idx).shape() == Shape{3});
  Tensor wt = transpose(iota({3, 4}), 0, 1);  // [4, 3], column-major
  REQUIRE_FALSE(wt.is_contiguous());
  REQUIRE(vals(embedding(wt, i64v({1, 3}, {2}))) == std::vector<double>{1, 5, 9, 3, 7, 11});
  // Empty indices give an empty [..., D] result.
  REQUIRE(embedding(w, i64v({}, {0})).shape() == Shape{0, 3});
}

TEST_CASE("embedding works for every floating dtype and f32 rows", "[index][embedding]") {
  for (Dtype dt : {f32, f16, bf16, i32}) {
    Tensor w = iota({3, 2}).to(dt);
    Tensor out = embedding(w, i64v({2, 0}, {2}));
    REQUIRE(out.dtype() == dt);
    REQUIRE(vals(out) == std::vector<double>{4, 5, 0, 1});
  }
}

TEST_CASE("embedding backward scatter-adds repeated rows", "[index][embedding][grad]") {
  Tensor w = zeros({4, 2}, f64);
  w.requires_grad_();
  Tensor idx = i64v({1, 3, 1, 1}, {2, 2});
  Tensor out = embedding(w, idx);
  out.backward(f64v({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2}));
  // row 1 gets positions 0, 2, 3; row 3 gets position 1; rows 0 and 2 nothing.
  REQUIRE(vals(w.grad()) == std::vector<double>{0, 0, 1 + 5 + 7, 2 + 6 + 8, 0, 0, 3, 4});

  check_grad([&](const TensorList& in) { return embedding(in[0], idx); }, {leaf({4, 2})});
  check_grad([&](const TensorList& in) { return embedding(transpose(in[0], 0, 1), i32v({0, 2, 2}, {3})); },
             {leaf({3, 5})});
}

TEST_CASE("embedding errors", "[index][embedding][errors]") {
  Tensor w = iota({4, 3});
  REQUIRE_THROWS_WITH(embedding(w, i64v({1, 4}, {2})),
                      Contains("[embedding]") && Contains("index 4") && Contains("4 rows") && Contains("[4, 3]"));
  REQUIRE_THROWS_WITH(embedding(w, i64v({-1}, {1})), Contains("[embedding]") && Contains("index -1"));
  REQUIRE_THROWS_WITH(embedding(iota({4}), i64v({0}, {1})), Contains("[embedding]") && Contains("2-D"));
  REQUIRE_THROWS_WITH(embedding(w, f64v({0}, {1})), Contains("[embedding]") && Contains("i64 or i32") &&
                                                        Contains("f64"));
}

// ---------------------------------------------------------------- index_select

TEST_CASE("index_select picks slices along a dim", "[index][index_select]") {
  Tensor a = iota({3, 4});
  REQUIRE(vals(index_select(a, 0, i64v({2, 0, 2}, {3}))) ==
          std::vector<double>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  Tensor cols = index_select(a, -1, i32v({3, 1}, {2}));
  REQUIRE(cols.shape() == Shape{3, 2});
  REQUIRE(vals(cols) == std::vector<double>{3, 1, 7, 5, 11, 9});
  // 0-dim index keeps the dim with size 1; non-contiguous input.
  REQUIRE(index_select(a, 1, i64v({2}, {1}).squeeze()).shape() == Shape{3, 1});
  Tensor at = transpose(a, 0, 1);  // [4, 3]
  REQUIRE(vals(index_select(at, 1, i64v({1}, {1}))) == std::vector<double>{4, 5, 6, 7});
  REQUIRE(index_select(a, 0, i64v({}, {0})).shape() == Shape{0, 4});
  // bool and f16 data
  Tensor b = boolv({true, false, false, true}, {4});
  REQUIRE(index_select(b, 0, i64v({3, 1}, {2})).to_vector<bool>() == std::vector<bool>{true, false});
  REQUIRE(vals(index_select(a.to(f16), 0, i64v({1}, {1}))) == std::vector<double>{4, 5, 6, 7});
}

TEST_CASE("index_select gradients", "[index][index_select][grad]") {
  Tensor idx = i64v({1, 0, 1, 3}, {4});
  check_grad([&](const TensorList& in) { return index_select(in[0], 0, idx); }, {leaf({4, 3})});
  check_grad([&](const TensorList& in) { return index_select(in[0], -1, idx); }, {leaf({2, 4})});
  check_grad([&](const TensorList& in) { return index_select(transpose(in[0], 0, 2), 1, i32v({2, 2}, {2})); },
             {leaf({2, 3, 5})});
}

TEST_CASE("index_select errors", "[index][index_select][errors]") {
  Tensor a = iota({3, 4});
  REQUIRE_THROWS_WITH(index_select(a, 1, i64v({4}, {1})),
                      Contains("[index_select]") && Contains("index 4") && Contains("dim 1 of size 4"));
  REQUIRE_THROWS_WITH(index_select(a, 0, i64v({0, 1}, {1, 2})), Contains("[index_select]") && Contains("1-D"));
  REQUIRE_THROWS_WITH(index_select(a, 0, f64v({0}, {1})), Contains("[index_select]") && Contains("i64 or i32"));
  REQUIRE_THROWS_WITH(index_select(a, 2, i64v({0}, {1})), Contains("[index_select]") && Contains("dim 2"));
}

// ---------------------------------------------------------------- gather / scatter_add

TEST_CASE("gather follows PyTorch's rule out[i][j] = a[index[i][j]][j] (dim 0)", "[index][gather]") {
  Tensor t = f64v({1, 2, 3, 4}, {2, 2});
  REQUIRE(vals(gather(t, 1, i64v({0, 0, 1, 0}, {2, 2}))) == std::vector<double>{1, 1, 4, 3});
  Tensor a = iota({3, 4});
  // index smaller than the input outside dim, larger along dim
  Tensor idx = i64v({2, 0, 1, 1, 0, 2}, {3, 2});
  Tensor g = gather(a, 0, idx);
  REQUIRE(g.shape() == Shape{3, 2});
  REQUIRE(vals(g) == std::vector<double>{8, 1, 4, 5, 0, 9});
  REQUIRE(vals(gather(a, -1, i32v({3, 3, 0}, {3, 1}))) == std::vector<double>{3, 7, 8});
  // non-contiguous input and index
  Tensor at = transpose(a, 0, 1);                          // [4, 3]: at[i][j] = a[j][i]
  Tensor it = transpose(i64v({0, 3, 1, 2}, {2, 2}), 0, 1);  // [[0, 1], [3, 2]]
  REQUIRE(vals(gather(at, 0, it)) == std::vector<double>{0, 5, 3, 6});
  REQUIRE(gather(a, 0, i64v({}, {0, 4})).shape() == Shape{0, 4});
}

TEST_CASE("scatter_add accumulates src at index", "[index][scatter_add]") {
  // PyTorch's documentation example: src larger than index in dim 0.
  Tensor src = ones({2, 5}, f64);
  Tensor idx = i64v({0, 1, 2, 0, 0}, {1, 5});
  REQUIRE(vals(scatter_add(zeros({3, 5}, f64), 0, idx, src)) ==
          std::vector<double>{1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0});
  Tensor idx2 = i64v({0, 1, 2, 0, 0, 0, 1, 2, 2, 2}, {2, 5});
  REQUIRE(vals(scatter_add(zeros({3, 5}, f64), 0, idx2, src)) ==
          std::vector<double>{2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1});
  // dim -1 with repeated indices; input values kept, input not modified
  Tensor a = iota({2, 3});
  Tensor out = scatter_add(a, -1, i32v({2, 2, 0, 1}, {2, 2}), f64v({10, 20, 30, 40}, {2, 2}));
  REQUIRE(vals(out) == std::vector<double>{0, 1, 2 + 30, 3 + 30, 4 + 40, 5});
  REQUIRE(vals(a) == std::vector<double>{0, 1, 2, 3, 4, 5});
  // i64 data, non-contiguous input
  Tensor ai = transpose(zeros({3, 2}, i64), 0, 1);  // [2, 3]
  Tensor oi = scatter_add(ai, 1, i64v({1, 1}, {2, 1}), i64v({5, 7}, {2, 1}));
  REQUIRE(oi.dtype() == i64);
  REQUIRE(oi.to_vector<int64_t>() == std::vector<int64_t>{0, 5, 0, 0, 7, 0});
}

TEST_CASE("gather and scatter_add gradients", "[index][gather][scatter_add][grad]") {
  Tensor idx = i64v({2, 0, 1, 1, 0, 2, 2, 2}, {4, 2});
  check_grad([&](const TensorList& in) { return gather(in[0], 0, idx); }, {leaf({3, 3})});
  check_grad([&](const TensorList& in) { return gather(transpose(in[0], 0, 1), 1, idx); }, {leaf({3, 4})});
  // scatter_add w.r.t. both the input and src (src larger than index)
  Tensor sidx = i64v({0, 2, 2, 1, 0, 0}, {2, 3});
  check_grad([&](const TensorList& in) { return scatter_add(in[0], 0, sidx, in[1]); }, {leaf({3, 4}), leaf({3, 5})});
  check_grad([&](const TensorList& in) { return scatter_add(in[0], -1, i64v({3, 3, 0}, {3, 1}), in[1]); },
             {leaf({3, 4}), leaf({3, 2})});
}

TEST_CASE("gather and scatter_add in 3-D, low precision and with permuted inputs", "[index][gather][scatter_add]") {
  Tensor a = iota({2, 3, 4});
  Tensor idx = i64v({1, 0, 2, 2, 0, 1}, {1, 3, 2});
  // dim 1 of a [2, 3, 4] with index [1, 3, 2]: out[0][j][k] = a[0][idx[0][j][k]][k]
  REQUIRE(vals(gather(a, 1, idx)) == std::vector<double>{4, 1, 8, 9, 0, 5});
  for (Dtype dt : {f16, bf16, f32, i32}) {
    REQUIRE(vals(gather(a.to(dt), 1, idx)) == std::vector<double>{4, 1, 8, 9, 0, 5});
    Tensor s = scatter_add(zeros({2, 3}, dt), 1, i64v({0, 0, 2, 1}, {2, 2}), iota({2, 2}).to(dt));
    REQUIRE(s.dtype() == dt);
    REQUIRE(vals(s) == std::vector<double>{0 + 1, 0, 0, 0, 3, 2});
  }
  check_grad([&](const TensorList& in) { return gather(permute(in[0], {2, 0, 1}), -1, i64v({2, 0, 1, 1}, {1, 2, 2})); },
             {leaf({2, 3, 4})});
  check_grad(
      [&](const TensorList& in) {
        return scatter_add(permute(in[0], {1, 2, 0}), 2, i64v({1, 1, 0, 1, 0, 0}, {3, 1, 2}), in[1]);
      },
      {leaf({2, 3, 4}), leaf({3, 2, 2})});
}

TEST_CASE("gather and scatter_add errors", "[index][gather][scatter_add][errors]") {
  Tensor a = iota({3, 4});
  REQUIRE_THROWS_WITH(gather(a, 0, i64v({0, 1}, {2})),
                      Contains("[gather]") && Contains("as many dims") && Contains("[2]") && Contains("[3, 4]"));
  REQUIRE_THROWS_WITH(gather(a, 0, i64v({3}, {1, 1})),
                      Contains("[gather]") && Contains("index 3") && Contains("dim 0 of size 3"));
  REQUIRE_THROWS_WITH(gather(a, 0, i64v({0, 0, 0, 0, 0}, {1, 5})),
                      Contains("[gather]") && Contains("[1, 5]") && Contains("larger than the input"));
  REQUIRE_THROWS_WITH(gather(a, 0, i64v({0}, {1, 1}).to(f32)), Contains("[gather]") && Contains("i64 or i32"));

  Tensor src = iota({2, 4});
  REQUIRE_THROWS_WITH(scatter_add(a, 0, i64v({0, 5}, {1, 2}), src),
                      Contains("[scatter_add]") && Contains("index 5") && Contains("size 3"));
  REQUIRE_THROWS_WITH(scatter_add(a, 0, i64v({0, 0, 0}, {3, 1}), src),
                      Contains("[scatter_add]") && Contains("larger than src") && Contains("[2, 4]"));
  REQUIRE_THROWS_WITH(scatter_add(a, 0, i64v({0}, {1}), src), Contains("[scatter_add]") && Contains("same number"));
  REQUIRE_THROWS_WITH(scatter_add(a, 0, i64v({0}, {1, 1}), src.to(f32)),
                      Contains("[scatter_add]") && Contains("f64") && Contains("f32"));
}

// ---------------------------------------------------------------- masked_fill

TEST_CASE("masked_fill broadcasts a bool mask over the input", "[index][masked_fill]") {
  Tensor a = iota({2, 3});
  Tensor mask = boolv({true, false, true}, {3});
  REQUIRE(vals(masked_fill(a, mask, -1.5)) == std::vector<double>{-1.5, 1, -1.5, -1.5, 4, -1.5});
  Tensor col = boolv({false, true}, {2, 1});
  REQUIRE(vals(masked_fill(a, col, 9)) == std::vector<double>{0, 1, 2, 9, 9, 9});
  // non-contiguous input and mask, integer and bool data
  Tensor at = transpose(a, 0, 1);  // [3, 2]
  Tensor mt = transpose(boolv({true, false, false, false, false, true}, {2, 3}), 0, 1);
  REQUIRE(vals(masked_fill(at, mt, 7)) == std::vector<double>{7, 3, 1, 4, 2, 7});
  Tensor ai = masked_fill(a.to(i32), mask, 5);
  REQUIRE(ai.dtype() == i32);
  REQUIRE(ai.to_vector<int32_t>() == std::vector<int32_t>{5, 1, 5, 5, 4, 5});
  REQUIRE(masked_fill(boolv({false, false}, {2}), boolv({true, false}, {2}), true).to_vector<bool>() ==
          std::vector<bool>{true, false});
  REQUIRE(vals(masked_fill(a.to(bf16), mask, 0.5)) == std::vector<double>{0.5, 1, 0.5, 0.5, 4, 0.5});
}

// Found by tools/fuzz/fuzz_ops (corpus/ops/crash-masked-fill-inf-i32): the value was converted
// to the integer type unchecked (undefined behaviour); PyTorch refuses it.
TEST_CASE("masked_fill refuses a value the integer dtype cannot hold", "[index][masked_fill][fuzz]") {
  Tensor a = iota({2, 3}).to(i32);
  Tensor mask = boolv({true, false, true}, {3});
  REQUIRE_THROWS_WITH(masked_fill(a, mask, INFINITY), Contains("[masked_fill] value inf cannot be converted to i32"));
  REQUIRE_THROWS_WITH(masked_fill(a.to(i64), mask, 1e19), Contains("[masked_fill]") && Contains("i64"));
  REQUIRE(masked_fill(a.to(f16), mask, INFINITY).dtype() == f16);  // floating dtypes take any value
}

TEST_CASE("masked_fill gradient is zero where masked", "[index][masked_fill][grad]") {
  Tensor mask = boolv({true, false, false, true, true, false}, {2, 3});
  check_grad([&](const TensorList& in) { return masked_fill(in[0], mask, 3.0); }, {leaf({2, 3})});
  check_grad([&](const TensorList& in) { return masked_fill(transpose(in[0], 0, 1), boolv({true, false}, {2}), 0); },
             {leaf({2, 3})});
  Tensor x = leaf({2, 3});
  masked_fill(x, mask, 1.0).backward(ones({2, 3}, f64));
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 1, 1, 0, 0, 1});
}

TEST_CASE("masked_fill errors", "[index][masked_fill][errors]") {
  Tensor a = iota({2, 3});
  REQUIRE_THROWS_WITH(masked_fill(a, i64v({1, 0, 1}, {3}), 0),
                      Contains("[masked_fill]") && Contains("bool") && Contains("i64"));
  REQUIRE_THROWS_WITH(masked_fill(a, boolv({true, false}, {2}), 0),
                      Contains("[masked_fill]") && Contains("[2]") && Contains("[2, 3]"));
  // the mask broadcasts to the input, not the other way round
  REQUIRE_THROWS_WITH(masked_fill(iota({3}), boolv({true, false, true, true, false, true}, {2, 3}), 0),
                      Contains("[masked_fill]") && Contains("[2, 3]"));
}

// ---------------------------------------------------------------- cat / stack

TEST_CASE("cat joins along a dim", "[index][cat]") {
  Tensor a = iota({2, 2});
  Tensor b = f64v({10, 11, 12, 13, 14, 15}, {2, 3});
  Tensor c = cat({a, b}, 1);
  REQUIRE(c.shape() == Shape{2, 5});
  REQUIRE(vals(c) == std::vector<double>{0, 1, 10, 11, 12, 2, 3, 13, 14, 15});
  REQUIRE(vals(cat({a, b.t().slice(0, 0, 2)}, -2)) == std::vector<double>{0, 1, 2, 3, 10, 13, 11, 14});
  REQUIRE(cat({a}, 0).shape() == Shape{2, 2});
  // non-contiguous inputs along dim 0
  Tensor at = transpose(a, 0, 1);
  REQUIRE(vals(cat({at, at}, 0)) == std::vector<double>{0, 2, 1, 3, 0, 2, 1, 3});
  // zero-size pieces in the cat dim contribute nothing
  REQUIRE(vals(cat({zeros({2, 0}, f64), a}, 1)) == vals(a));
}

TEST_CASE("cat promotes dtypes and skips empty 1-D tensors", "[index][cat]") {
  Tensor f = f64v({0.5, 1.5}, {1, 2}).to(f32);
  Tensor i = i64v({3, 4}, {1, 2});
  Tensor c = cat({i, f}, 0);
  REQUIRE(c.dtype() == f32);
  REQUIRE(vals(c) == std::vector<double>{3, 4, 0.5, 1.5});
  REQUIRE(cat({boolv({true}, {1}), i32v({7}, {1})}, 0).dtype() == i32);
  REQUIRE(cat({f.to(f16), f.to(bf16)}, 0).dtype() == f32);
  // PyTorch's legacy rule: an empty 1-D tensor is skipped whatever the others' shape.
  Tensor empty = zeros({0}, f64);
  Tensor k = cat({empty, iota({2, 3}), empty}, 1);
  REQUIRE(k.shape() == Shape{2, 3});
  REQUIRE(cat({empty, empty}, 0).shape() == Shape{0});
  // all dtypes copy correctly
  Tensor bools = cat({boolv({true, false}, {2}), boolv({false, true}, {2})}, 0);
  REQUIRE(bools.to_vector<bool>() == std::vector<bool>{true, false, false, true});
  REQUIRE(vals(cat({f.to(bf16), f.to(bf16)}, 1)) == std::vector<double>{0.5, 1.5, 0.5, 1.5});
}

TEST_CASE("cat gradients", "[index][cat][grad]") {
  check_grad([](const TensorList& in) { return cat({in[0], in[1], in[2]}, 1); },
             {leaf({2, 3}), leaf({2, 1}), leaf({2, 2})});
  check_grad([](const TensorList& in) { return cat({transpose(in[0], 0, 1), in[1]}, -2); },
             {leaf({3, 2}), leaf({4, 3})});
  // an empty 1-D input that is skipped still gets a (0-element) gradient
  check_grad([](const TensorList& in) { return cat({in[0], in[1]}, 0); }, {leaf({0}), leaf({2, 2})});
  // an f32 input concatenated with f64 gets its gradient back in f32
  Tensor x = zeros({2}, f32);
  x.requires_grad_();
  Tensor y = zeros({3}, f64);
  y.requires_grad_();
  Tensor c = cat({x, y}, 0);
  REQUIRE(c.dtype() == f64);
  c.backward(f64v({1, 2, 3, 4, 5}, {5}));
  REQUIRE(x.grad().dtype() == f32);
  REQUIRE(vals(x.grad()) == std::vector<double>{1, 2});
  REQUIRE(vals(y.grad()) == std::vector<double>{3, 4, 5});
}

TEST_CASE("cat errors", "[index][cat][errors]") {
  Tensor a = iota({2, 3});
  REQUIRE_THROWS_WITH(cat({a, iota({2, 3}), iota({2, 4})}, 0),
                      Contains("[cat]") && Contains("except in dim 0") && Contains("tensor 0 is [2, 3]") &&
                          Contains("tensor 2 is [2, 4]"));
  REQUIRE_THROWS_WITH(cat({a, iota({6})}, 0),
                      Contains("[cat]") && Contains("same number of dims") && Contains("tensor 1 is [6]"));
  REQUIRE_THROWS_WITH(cat({}, 0), Contains("[cat]") && Contains("non-empty"));
  REQUIRE_THROWS_WITH(cat({a, f64v({1}, {1}).squeeze()}, 0),
                      Contains("[cat]") && Contains("zero-dimensional") && Contains("index 1"));
  REQUIRE_THROWS_WITH(cat({a, a}, 2), Contains("[cat]") && Contains("dim 2"));
}

TEST_CASE("stack inserts a new dim", "[index][stack]") {
  Tensor a = iota({2, 3});
  Tensor b = f64v({10, 11, 12, 13, 14, 15}, {2, 3});
  Tensor s0 = stack({a, b}, 0);
  REQUIRE(s0.shape() == Shape{2, 2, 3});
  REQUIRE(vals(s0) == std::vector<double>{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  Tensor s2 = stack({a, b}, -1);
  REQUIRE(s2.shape() == Shape{2, 3, 2});
  REQUIRE(vals(s2) == std::vector<double>{0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15});
  Tensor s1 = stack({transpose(a, 0, 1), transpose(b, 0, 1)}, 1);
  REQUIRE(s1.shape() == Shape{3, 2, 2});
  REQUIRE(vals(s1) == std::vector<double>{0, 3, 10, 13, 1, 4, 11, 14, 2, 5, 12, 15});
  // 0-dim tensors stack into a vector
  Tensor v = stack({f64v({1}, {1}).squeeze(), f64v({2}, {1}).squeeze()}, 0);
  REQUIRE(v.shape() == Shape{2});
  REQUIRE(vals(v) == std::vector<double>{1, 2});
}

TEST_CASE("stack gradients and errors", "[index][stack][grad][errors]") {
  check_grad([](const TensorList& in) { return stack({in[0], in[1], in[0]}, 1); }, {leaf({2, 3}), leaf({2, 3})});
  check_grad([](const TensorList& in) { return stack({transpose(in[0], 0, 1), in[1]}, -1); },
             {leaf({3, 2}), leaf({2, 3})});
  REQUIRE_THROWS_WITH(stack({iota({2, 3}), iota({3, 2})}, 0),
                      Contains("[stack]") && Contains("same shape") && Contains("tensor 1 is [3, 2]"));
  REQUIRE_THROWS_WITH(stack({iota({2, 3})}, 3), Contains("[stack]") && Contains("dim 3"));
  REQUIRE_THROWS_WITH(stack({}, 0), Contains("[stack]"));
}

// ---------------------------------------------------------------- split / chunk

TEST_CASE("split returns views of consecutive slices", "[index][split]") {
  Tensor a = iota({5, 2});
  TensorList parts = split(a, 2, 0);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[0].shape() == Shape{2, 2});
  REQUIRE(parts[2].shape() == Shape{1, 2});
  REQUIRE(vals(parts[1]) == std::vector<double>{4, 5, 6, 7});
  REQUIRE(vals(parts[2]) == std::vector<double>{8, 9});
  for (const Tensor& p : parts) REQUIRE(p.storage() == a.storage());

  TensorList cols = split(iota({2, 5}), std::vector<int64_t>{1, 0, 4}, -1);
  REQUIRE(cols.size() == 3);
  REQUIRE(cols[1].shape() == Shape{2, 0});
  REQUIRE(vals(cols[0]) == std::vector<double>{0, 5});
  REQUIRE(vals(cols[2]) == std::vector<double>{1, 2, 3, 4, 6, 7, 8, 9});
  REQUIRE_FALSE(cols[2].is_contiguous());
  // split of a non-contiguous tensor, and a split_size past the end gives one piece
  TensorList tp = split(transpose(iota({2, 3}), 0, 1), 2, 0);
  REQUIRE(vals(tp[0]) == std::vector<double>{0, 3, 1, 4});
  REQUIRE(vals(tp[1]) == std::vector<double>{2, 5});
  REQUIRE(split(a, 10, 0).size() == 1);
  REQUIRE(split(zeros({0, 3}, f64), 2, 0).size() == 1);
}

TEST_CASE("chunk uses chunk size ceil(n / chunks)", "[index][chunk]") {
  auto sizes = [](const TensorList& ts, int64_t dim) {
    std::vector<int64_t> s;
    for (const Tensor& t : ts) s.push_back(t.size(dim));
    return s;
  };
  REQUIRE(sizes(chunk(iota({5}), 3), 0) == std::vector<int64_t>{2, 2, 1});
  REQUIRE(sizes(chunk(iota({5}), 4), 0) == std::vector<int64_t>{2, 2, 1});  // fewer than asked, as in PyTorch
  REQUIRE(sizes(chunk(iota({6}), 4), 0) == std::vector<int64_t>{2, 2, 2});
  REQUIRE(sizes(chunk(iota({2, 7}), 2, -1), 1) == std::vector<int64_t>{4, 3});
  REQUIRE(sizes(chunk(iota({3}), 5), 0) == std::vector<int64_t>{1, 1, 1});
  REQUIRE(sizes(chunk(zeros({0}, f64), 3), 0) == std::vector<int64_t>{0, 0, 0});
  TensorList c = chunk(iota({2, 4}), 2, 1);
  REQUIRE(vals(c[1]) == std::vector<double>{2, 3, 6, 7});
}

// Found by fuzz_ops: the piece count ceil(n / size) was (n + size - 1) / size, which overflows
// int64 for a split size or chunk count near INT64_MAX (UBSan; a release build got a negative
// count). torch.split(t, 2**63 - 1) is one piece; torch.chunk(t, 2**63 - 1) pieces of one.
TEST_CASE("split and chunk take sizes and counts up to INT64_MAX", "[index][split][chunk][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  TensorList s = split(iota({3}), highest);
  REQUIRE(s.size() == 1);
  REQUIRE(s[0].size(0) == 3);
  TensorList c = chunk(iota({3}), highest);
  REQUIRE(c.size() == 3);
  for (const Tensor& t : c) REQUIRE(t.size(0) == 1);
  // Explicit sizes whose sum overflows int64 (fuzz_ops, UBSan): an error, not a wrapped sum.
  REQUIRE_THROWS_WITH(split(iota({3}), std::vector<int64_t>{highest, 3}),
                      Contains("[split]") && Contains("sum to more than dim 0") && Contains("size 3"));
  REQUIRE_THROWS_WITH(split(iota({3}), std::vector<int64_t>{1, highest}), Contains("sum to more than"));
}

// Found by fuzz_ops: chunk of an empty dim made `chunks` pieces and split of an empty tensor's huge
// dim ceil(n / size) pieces, whatever their number: a std::vector of 2^62 sizes threw
// std::length_error (or exhausted memory) instead of a tandem::Error.
TEST_CASE("split and chunk refuse more pieces than one call returns", "[index][split][chunk][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  REQUIRE_THROWS_WITH(chunk(zeros({0}), highest), Contains("[chunk]") && Contains("empty dim"));
  REQUIRE_THROWS_WITH(split(zeros({0, int64_t{1} << 62}), 1, 1),
                      Contains("[split]") && Contains("4611686018427387904 views"));
  REQUIRE_THROWS_WITH(chunk(zeros({0}), (int64_t{1} << 24) + 1), Contains("[chunk]") && Contains("16777216"));
  // A huge empty dim in few pieces is fine.
  REQUIRE(split(zeros({0, int64_t{1} << 62}), int64_t{1} << 61, 1).size() == 2);
}

// Found by fuzz_ops: cat summed the sizes along dim unchecked, and split's pieces of an empty tensor
// with strides near INT64_MAX got offsets start * stride that overflow (UBSan). The pieces are
// now views made by narrow, whose offset arithmetic is checked.
TEST_CASE("cat and split of empty tensors with sizes near INT64_MAX", "[index][cat][split][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  REQUIRE_THROWS_WITH(cat({zeros({0, highest}), zeros({0, highest})}, 1),
                      Contains("[cat]") && Contains("sum past int64") && Contains("tensor 1"));
  REQUIRE(cat({zeros({0, highest}), zeros({0, highest})}, 0).shape() == Shape{0, highest});
  TensorList parts = split(zeros({4, 0, highest}), 2, 0);
  REQUIRE(parts.size() == 2);
  for (const Tensor& p : parts) REQUIRE(p.shape() == Shape{2, 0, highest});
  // index_select scaled the slices' strides by the element size before seeing there was nothing to copy.
  Tensor e = zeros({1048576, 0, highest}).requires_grad_();
  Tensor picked = index_select(e, 0, from_vector<int64_t>({0, 3}, {2}));
  REQUIRE(picked.shape() == Shape{2, 0, highest});
  sum(picked).backward();
  REQUIRE(e.grad().shape() == e.shape());
}

TEST_CASE("split and chunk gradients", "[index][split][chunk][grad]") {
  // each piece alone: the pieces nobody used get zero gradients
  for (int k = 0; k < 3; ++k)
    check_grad([k](const TensorList& in) { return split(in[0], 2, 1)[static_cast<size_t>(k)]; }, {leaf({3, 5})});
  // all pieces through one node, reordered
  check_grad(
      [](const TensorList& in) {
        TensorList p = split(in[0], std::vector<int64_t>{1, 3, 1}, 0);
        return cat({p[2], p[0], p[1]}, 0);
      },
      {leaf({5, 2})});
  check_grad([](const TensorList& in) { return chunk(transpose(in[0], 0, 1), 2, -1)[1]; }, {leaf({3, 4})});
  check_grad(
      [](const TensorList& in) {
        TensorList p = chunk(in[0], 3, 0);
        return stack({p[0], p[2]}, 0);
      },
      {leaf({6, 2})});
  // one node for the whole split
  Tensor x = leaf({4, 2});
  TensorList p = split(x, 2, 0);
  REQUIRE(p[0].grad_fn() != nullptr);
  REQUIRE(p[0].grad_fn() == p[1].grad_fn());
  p[1].backward(ones({2, 2}, f64));
  REQUIRE(vals(x.grad()) == std::vector<double>{0, 0, 0, 0, 1, 1, 1, 1});
}

TEST_CASE("split and chunk errors", "[index][split][chunk][errors]") {
  Tensor a = iota({5, 2});
  REQUIRE_THROWS_WITH(split(a, std::vector<int64_t>{2, 2}, 0),
                      Contains("[split]") && Contains("[2, 2]") && Contains("sum to 4") && Contains("size 5"));
  REQUIRE_THROWS_WITH(split(a, 0, 0), Contains("[split]") && Contains("split_size"));
  REQUIRE_THROWS_WITH(split(a, -1, 0), Contains("[split]") && Contains("non-negative"));
  REQUIRE_THROWS_WITH(split(a, 2, 2), Contains("[split]") && Contains("dim 2"));
  REQUIRE_THROWS_WITH(split(f64v({1}, {1}).squeeze(), 1, 0), Contains("[split]") && Contains("0-dim"));
  REQUIRE_THROWS_WITH(chunk(a, 0, 0), Contains("[chunk]") && Contains("positive"));
  REQUIRE_THROWS_WITH(chunk(a, 2, -3), Contains("[chunk]") && Contains("dim -3"));
}

// Found by fuzz_ops (corpus/ops/crash-scatter-add-huge-stride): scatter_add and gather scaled the
// indexed dim's stride by the item size before looking at the index, and an empty tensor's stride
// there can be near INT64_MAX (UBSan: signed overflow); index_select and index_add did the same.
// The step along a dim of at most one element is never taken: dim_step_bytes makes it 0.
TEST_CASE("indexing along a dim whose stride is near INT64_MAX", "[index][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor e = zeros({0, highest}, f16);
  REQUIRE(e.stride(0) == highest);
  Tensor none = zeros({0, 0}, i64);
  REQUIRE(scatter_add(e, 0, none, zeros({0, 0}, f16)).shape() == Shape{0, highest});
  REQUIRE(gather(e, 0, none).shape() == Shape{0, 0});
  REQUIRE(index_select(e, 0, none.flatten()).shape() == Shape{0, highest});
}

// Found by the fuzz_ops campaign (corpus/ops/crash-gather-empty-huge-offset): gather from an empty
// view at an offset near INT64_MAX, along its size-0 dim, with a non-empty index. The walk made a
// view of the input shaped like the index, which claimed elements at that offset, and data_ptr()
// overflowed (UBSan) before the index value was found out of range. Now the error comes first.
TEST_CASE("gather and scatter_add into an empty view at a huge offset with a non-empty index", "[index][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor e = zeros({1048576, 0, highest});
  Tensor v = e.slice(0, 1, 2);  // [1, 0, highest] at offset highest
  REQUIRE(v.storage_offset() == highest);
  Tensor index = i64v({0}, {1, 1, 1});
  REQUIRE_THROWS_WITH(gather(v, 1, index), Contains("[gather]") && Contains("index 0") && Contains("dim 1 of size 0"));
  REQUIRE_THROWS_WITH(scatter_add(v, 1, index, ones({1, 1, 1})),
                      Contains("[scatter_add]") && Contains("index 0") && Contains("size 0"));
}

TEST_CASE("an i64 scatter_add wraps, as PyTorch's does", "[index][fuzz]") {
  // fuzz_ops campaign finding: scatter_add's i64 element adds overflowed (undefined in C++; UBSan
  // failed the sanitizer builds here). They now wrap in unsigned arithmetic, as every integer
  // tensor op wraps. PyTorch 1.13:
  // torch.full((2,), -2**63).scatter_add(0, torch.tensor([0, 1]), torch.full((2,), -2**63)) == tensor([0, 0]),
  // and with index [0, 0] element 0 wraps twice: tensor([-2**63, -2**63]).
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  Tensor base = full({2}, lowest, i64), src = full({2}, lowest, i64);
  REQUIRE(scatter_add(base, 0, from_vector<int64_t>({0, 1}), src).to_vector<int64_t>() == std::vector<int64_t>{0, 0});
  REQUIRE(scatter_add(base, 0, from_vector<int64_t>({0, 0}), src).to_vector<int64_t>() ==
          std::vector<int64_t>{lowest, lowest});
}
