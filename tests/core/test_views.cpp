// View ops: geometry (shape, strides, offset), storage sharing, copies only where documented,
// error messages, and gradcheck of every op (f64, including non-contiguous inputs).
#include <catch2/catch.hpp>

#include <limits>

#include "tandem.h"

using namespace tandem;

namespace {
Tensor iota(const Shape& shape, Dtype dt = f32) { return arange(numel_of(shape), dt).view(shape); }
Tensor leaf64(const Shape& shape) {
  manual_seed(numel_of(shape));
  Tensor t = randn(shape, f64);
  t.requires_grad_();
  return t;
}
#define REQUIRE_GRADCHECK(fn, inputs)        \
  do {                                       \
    auto r_ = gradcheck(fn, inputs);         \
    INFO(r_.report);                         \
    REQUIRE(r_.ok);                          \
  } while (0)
}  // namespace

TEST_CASE("view: shapes, strides, -1, and shared storage", "[views]") {
  Tensor a = iota({2, 6});
  Tensor v = a.view({3, -1});
  REQUIRE(v.shape() == Shape{3, 4});
  REQUIRE(v.strides() == Strides{4, 1});
  REQUIRE(v.storage() == a.storage());
  REQUIRE(v.to_vector<float>() == a.to_vector<float>());
  // A write through the view is visible in the base (and bumps the shared version).
  float* p = v.data_ptr<float>();
  p[5] = 100;
  REQUIRE(a.to_vector<float>()[5] == 100);
  REQUIRE(a.view({12}).shape() == Shape{12});
  REQUIRE(a.view({2, 1, 6, 1}).strides() == Strides{6, 6, 1, 1});
  REQUIRE(scalar_tensor(1.0).view({1, 1}).shape() == Shape{1, 1});
  REQUIRE(ones({1, 1}).view({}).dim() == 0);
  // A transposed tensor can still be viewed where dims stay within contiguous chunks.
  Tensor t = iota({4, 6}).t();  // [6, 4], strides [1, 6]
  REQUIRE(t.view({6, 2, 2}).strides() == Strides{1, 12, 6});
  REQUIRE_THROWS_WITH(t.view({24}), Catch::Contains("[view]") && Catch::Contains("use reshape") &&
                                        Catch::Contains("[6, 4]"));
  REQUIRE_THROWS_WITH(a.view({5, -1}), Catch::Contains("[view] shape [5, -1] is invalid for input of size 12"));
  REQUIRE_THROWS_WITH(a.view({-1, -1}), Catch::Contains("[view] only one dimension can be inferred"));
  REQUIRE_THROWS_WITH(a.view({7}), Catch::Contains("[view] shape [7] is invalid for input of size 12"));
  REQUIRE(zeros({0, 3}).view({3, 0}).shape() == Shape{3, 0});
}

TEST_CASE("reshape views when it can and copies when it must", "[views]") {
  Tensor a = iota({3, 4});
  Tensor r = a.reshape({4, 3});
  REQUIRE(r.storage() == a.storage());
  Tensor t = a.t();
  Tensor c = t.reshape({-1});
  REQUIRE(c.storage() != a.storage());
  REQUIRE(c.is_contiguous());
  REQUIRE(c.to_vector<float>() == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  REQUIRE(t.flatten().to_vector<float>() == c.to_vector<float>());
  REQUIRE_THROWS_WITH(a.reshape({5, 2}), Catch::Contains("[reshape]") && Catch::Contains("size 12"));
}

TEST_CASE("permute and transpose", "[views]") {
  Tensor a = iota({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  REQUIRE(p.shape() == Shape{4, 2, 3});
  REQUIRE(p.strides() == Strides{1, 12, 4});
  REQUIRE(p.storage() == a.storage());
  REQUIRE_FALSE(p.is_contiguous());
  REQUIRE(a.permute({-1, 0, 1}).strides() == p.strides());
  Tensor t = a.transpose(0, -1);
  REQUIRE(t.shape() == Shape{4, 3, 2});
  REQUIRE(t.strides() == Strides{1, 4, 12});
  // element [i][j][k] of the transpose is a[k][j][i]
  REQUIRE(t.select(0, 3).select(0, 1).select(0, 1).item<float>() == 1 * 12 + 1 * 4 + 3);
  REQUIRE_THROWS_WITH(a.permute({0, 1}), Catch::Contains("[permute]") && Catch::Contains("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(a.permute({0, 1, 1}), Catch::Contains("[permute]") && Catch::Contains("repeat"));
  REQUIRE_THROWS_WITH(a.transpose(0, 3), Catch::Contains("[transpose] dim 3 out of range"));
  REQUIRE(iota({2, 3}).t().shape() == Shape{3, 2});
}

TEST_CASE("slice and narrow follow Python's rules", "[views]") {
  Tensor a = iota({10});
  REQUIRE(a.slice(0, 2, 8, 3).to_vector<float>() == std::vector<float>{2, 5});
  REQUIRE(a.slice(0, -3, 100).to_vector<float>() == std::vector<float>{7, 8, 9});
  REQUIRE(a.slice(0, 8, 2).numel() == 0);
  REQUIRE(a.slice(0, -100, 2).to_vector<float>() == std::vector<float>{0, 1});
  Tensor m = iota({4, 5});
  Tensor s = m.slice(1, 1, 5, 2);
  REQUIRE(s.shape() == Shape{4, 2});
  REQUIRE(s.strides() == Strides{5, 2});
  REQUIRE(s.storage_offset() == 1);
  REQUIRE(s.to_vector<float>() == std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18});
  REQUIRE(s.storage() == m.storage());
  Tensor n = m.narrow(0, 1, 2);
  REQUIRE(n.shape() == Shape{2, 5});
  REQUIRE(n.storage_offset() == 5);
  REQUIRE(m.narrow(1, -2, 2).to_vector<float>() == std::vector<float>{3, 4, 8, 9, 13, 14, 18, 19});
  REQUIRE_THROWS_WITH(a.slice(0, 0, 5, 0), Catch::Contains("[slice] step must be positive"));
  REQUIRE_THROWS_WITH(m.narrow(0, 3, 2), Catch::Contains("[narrow] start 3 + length 2 exceeds dim 0 of size 4"));
  REQUIRE_THROWS_WITH(m.slice(2, 0, 1), Catch::Contains("[slice] dim 2 out of range"));
}

// Found by tools/fuzz/fuzz_ops (corpus/ops/crash-slice-huge-step): a step past the dim's size
// leaves one element, but the stride was still multiplied by it (3 * INT64_MAX overflowed).
// Found by fuzz_ops: an empty tensor's sizes can reach INT64_MAX, and so can its strides; unsqueeze
// multiplied size by stride, slice and select index by stride, unchecked (UBSan: signed overflow).
TEST_CASE("views of an empty tensor whose sizes and strides are near INT64_MAX", "[views][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor e = zeros({1048576, 0, highest});
  REQUIRE(e.unsqueeze(0).shape() == Shape{1, 1048576, 0, highest});
  REQUIRE(e.unsqueeze(1).shape() == Shape{1048576, 1, 0, highest});
  REQUIRE(e.select(0, 1048575).shape() == Shape{0, highest});
  REQUIRE(e.narrow(0, 1048575, 1).shape() == Shape{1, 0, highest});
  REQUIRE(e.slice(0, 3, 1048576, 1 << 10).shape() == Shape{1024, 0, highest});
  REQUIRE(e.slice(2, 1, highest, highest / 2).shape() == Shape{1048576, 0, 2});
  REQUIRE(e.unsqueeze(0).numel() == 0);
  // The contiguity check multiplied the sizes (transpose, permute: UBSan).
  REQUIRE(e.transpose(0, 2).shape() == Shape{highest, 0, 1048576});
  REQUIRE_FALSE(e.permute({2, 1, 0}).is_contiguous());
  REQUIRE(e.is_contiguous());
}

TEST_CASE("slice with a step past the end of the dim", "[views][fuzz]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Tensor m = iota({2, 3});
  Tensor s = m.slice(0, 0, 100, kMax);
  REQUIRE(s.shape() == Shape{1, 3});
  REQUIRE(s.to_vector<float>() == std::vector<float>{0, 1, 2});
  Tensor t = m.slice(1, 1, kMax, kMax);
  REQUIRE(t.shape() == Shape{2, 1});
  REQUIRE(t.to_vector<float>() == std::vector<float>{1, 4});
  REQUIRE(m.slice(1, 3, kMax, kMax).numel() == 0);
  Tensor g = leaf64({2, 3});
  sum(g.slice(0, 1, 2, kMax)).backward();
  REQUIRE(g.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 1, 1});
}

TEST_CASE("select and operator[]", "[views]") {
  Tensor m = iota({3, 4});
  REQUIRE(m[1].to_vector<float>() == std::vector<float>{4, 5, 6, 7});
  REQUIRE(m.select(1, -1).to_vector<float>() == std::vector<float>{3, 7, 11});
  REQUIRE(m[2][3].dim() == 0);
  REQUIRE(m[2][3].item<float>() == 11);
  REQUIRE_THROWS_WITH(m.select(0, 3), Catch::Contains("[select] index 3 out of range for dim 0 of size 3"));
  REQUIRE_THROWS_WITH(m.select(1, -5), Catch::Contains("[select] index -5"));
  REQUIRE_THROWS_WITH(scalar_tensor(1.0).select(0, 0), Catch::Contains("[select] cannot select on a 0-dim tensor"));
}

TEST_CASE("expand broadcasts with zero strides", "[views]") {
  Tensor a = iota({3, 1});
  Tensor e = a.expand({2, 3, 4});
  REQUIRE(e.shape() == Shape{2, 3, 4});
  REQUIRE(e.strides() == Strides{0, 1, 0});
  REQUIRE(e.storage() == a.storage());
  REQUIRE(e[1][2].to_vector<float>() == std::vector<float>(4, 2.0f));
  REQUIRE(a.expand({-1, 5}).shape() == Shape{3, 5});
  REQUIRE(a.expand_as(zeros({3, 2})).shape() == Shape{3, 2});
  REQUIRE_THROWS_WITH(a.expand({4, 4}), Catch::Contains("[expand] the expanded size 4 must match the existing size 3"));
  REQUIRE_THROWS_WITH(a.expand({4}), Catch::Contains("[expand]") && Catch::Contains("fewer dims"));
  REQUIRE_THROWS_WITH(a.expand({-1, 3, 1}), Catch::Contains("[expand]") && Catch::Contains("leading"));
}

TEST_CASE("squeeze, unsqueeze, flatten", "[views]") {
  Tensor a = zeros({1, 3, 1, 2});
  REQUIRE(a.squeeze().shape() == Shape{3, 2});
  REQUIRE(a.squeeze(2).shape() == Shape{1, 3, 2});
  REQUIRE(a.squeeze(1).shape() == a.shape());  // not size 1: unchanged
  REQUIRE(a.squeeze(-4).shape() == Shape{3, 1, 2});
  REQUIRE(a.squeeze().storage() == a.storage());
  Tensor b = iota({2, 3});
  REQUIRE(b.unsqueeze(0).shape() == Shape{1, 2, 3});
  REQUIRE(b.unsqueeze(-1).shape() == Shape{2, 3, 1});
  REQUIRE(b.unsqueeze(1).strides() == Strides{3, 3, 1});
  REQUIRE(b.unsqueeze(1).is_contiguous());
  REQUIRE(scalar_tensor(2.0).unsqueeze(0).shape() == Shape{1});
  REQUIRE_THROWS_WITH(b.unsqueeze(3), Catch::Contains("[unsqueeze] dim 3 out of range"));
  Tensor c = zeros({2, 3, 4, 5});
  REQUIRE(c.flatten().shape() == Shape{120});
  REQUIRE(c.flatten(1).shape() == Shape{2, 60});
  REQUIRE(c.flatten(1, 2).shape() == Shape{2, 12, 5});
  REQUIRE(c.flatten(2, 2).shape() == c.shape());
  REQUIRE(scalar_tensor(1.0).flatten().shape() == Shape{1});
  REQUIRE_THROWS_WITH(c.flatten(2, 1), Catch::Contains("[flatten]"));
}

TEST_CASE("contiguous and clone copy every dtype", "[views]") {
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO(dtype_name(dt));
    Tensor base = dt == boolean ? randint(0, 2, {4, 5}, boolean) : randint(-50, 50, {4, 5}, dt);
    Tensor t = base.t().slice(0, 0, 5, 2);  // [3, 4], strides [2, 5]
    Tensor c = t.contiguous();
    REQUIRE(c.is_contiguous());
    REQUIRE(c.storage() != base.storage());
    REQUIRE(c.shape() == Shape{3, 4});
    REQUIRE(c.dtype() == dt);
    REQUIRE(c.to_vector<double>() == t.to_vector<double>());
    REQUIRE(c.contiguous().is_same(c));
    Tensor k = base.clone();
    REQUIRE(k.storage() != base.storage());
    REQUIRE(equal(k, base));
  }
  Tensor e = iota({3, 1}).expand({3, 4}).contiguous();
  REQUIRE(e.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});
}

TEST_CASE("views of leaves record history; contiguous tensors are returned as is", "[views]") {
  Tensor x = leaf64({2, 3});
  Tensor v = x.view({3, 2});
  REQUIRE(v.requires_grad());
  REQUIRE(v.grad_fn());
  REQUIRE(v.grad_fn()->name() == "ViewBackward");
  REQUIRE(x.t().grad_fn()->name() == "TransposeBackward");
  REQUIRE(x.contiguous().is_same(x));
  {
    NoGradGuard ng;
    REQUIRE_FALSE(x.view({6}).requires_grad());
  }
}

TEST_CASE("gradcheck: view, reshape, flatten, squeeze, unsqueeze", "[views][gradcheck]") {
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].view({3, -1}); }, {leaf64({2, 6})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].t().reshape({-1}); }, {leaf64({3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].reshape({4, 3}); }, {leaf64({3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].transpose(0, 2).flatten(1); }, {leaf64({2, 3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].squeeze(); }, {leaf64({1, 3, 1})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].squeeze(0); }, {leaf64({1, 3})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].unsqueeze(1); }, {leaf64({3, 2})});
}

TEST_CASE("gradcheck: permute, transpose", "[views][gradcheck]") {
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].permute({2, 0, 1}); }, {leaf64({2, 3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].permute({1, 0, 2}).permute({2, 1, 0}); },
                    {leaf64({2, 3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].transpose(-1, 0); }, {leaf64({3, 5})});
}

TEST_CASE("gradcheck: slice, narrow, select", "[views][gradcheck]") {
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].slice(1, 1, 6, 2); }, {leaf64({3, 6})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].t().slice(0, -3, 100); }, {leaf64({3, 6})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].narrow(0, 1, 2); }, {leaf64({4, 3})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].select(1, -1); }, {leaf64({4, 3})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].permute({1, 0, 2})[1]; }, {leaf64({2, 3, 2})});
}

TEST_CASE("gradcheck: expand, contiguous, clone", "[views][gradcheck]") {
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].expand({2, 3, 4}); }, {leaf64({3, 1})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].expand({-1, 4}); }, {leaf64({3, 1})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].t().contiguous(); }, {leaf64({3, 4})});
  REQUIRE_GRADCHECK([](const TensorList& in) { return in[0].slice(0, 0, 3, 2).clone(); }, {leaf64({3, 4})});
}

TEST_CASE("slice gradients land in the right places", "[views]") {
  Tensor x = leaf64({2, 4});
  Tensor y = x.slice(1, 1, 4, 2);  // columns 1 and 3
  y.backward(from_vector<double>({1, 2, 3, 4}, {2, 2}));
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{0, 1, 0, 2, 0, 3, 0, 4});
  Tensor z = leaf64({3});
  z.expand({2, 3}).backward(from_vector<double>({1, 2, 3, 10, 20, 30}, {2, 3}));
  REQUIRE(z.grad().to_vector<double>() == std::vector<double>{11, 22, 33});
}

// TensorImpl::rebind, the one way a tensor takes other data (Module::to and dtype casts bump the
// version, mixed precision's master/shadow switch does not).
TEST_CASE("TensorImpl::rebind: geometry follows the data, the version rule as asked", "[views]") {
  Tensor base = arange(0, 12, 1, f32).reshape({3, 4});
  Tensor slot = base.transpose(0, 1);  // a view with strides of its own
  REQUIRE(slot.impl()->is_view);
  Tensor data = arange(0, 6, 1, f64).reshape({2, 3});
  data.impl()->storage->bump_version();
  data.impl()->storage->bump_version();
  const uint64_t old_version = slot.impl()->storage->version();
  const uint64_t data_version = data.impl()->storage->version();
  Tensor alias = slot;  // another handle to the same impl follows
  slot.impl()->rebind(*data.impl(), /*bump_version=*/false);
  REQUIRE(alias.shape() == Shape{2, 3});
  REQUIRE(alias.dtype() == f64);
  REQUIRE(alias.is_contiguous());
  REQUIRE(!alias.impl()->is_view);
  REQUIRE(alias.impl()->storage == data.impl()->storage);
  REQUIRE(data.impl()->storage->version() == data_version);  // a switch between copies: unchanged
  REQUIRE(alias.select(0, 1).select(0, 2).item<double>() == 5);

  Tensor fresh = arange(0, 4, 1, f32);
  slot.impl()->rebind(*fresh.impl(), /*bump_version=*/true);
  REQUIRE(slot.shape() == Shape{4});
  // New values: the version moves past both the old storage's count and the new one's.
  REQUIRE(fresh.impl()->storage->version() > std::max(old_version, data_version));
}
