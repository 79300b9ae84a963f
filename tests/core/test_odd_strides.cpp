// Size-1 dims with arbitrary strides, every op family against the same op on dense copies.
//
// A size-1 dim's stride never addresses memory, so a view may carry any value there (t(), narrow(),
// unsqueeze() and permute() make such views every day) and is_contiguous() ignores it. A kernel
// that derives a step from it reads the wrong elements. Each case here lays its inputs out in a
// buffer that is NaN (or, for integers, an index out of range everywhere) wherever the view does
// not reach, so such a read shows up as a NaN or an error rather than as a plausible neighbour,
// and compares the result, and the gradients under an odd-strided incoming gradient, with what
// dense copies give (f64: they must agree to ~1e-12).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::require_close;
using test_util::vals;

namespace {

using Fn = std::function<Tensor(const TensorList&)>;

// row_major: the dims of size > 1 dense in row-major order (is_contiguous() holds, whatever the
// size-1 dims say); column_major: the same dims dense in the reverse order (a strided tensor).
enum class Layout { row_major, column_major };
const char* name_of(Layout l) { return l == Layout::row_major ? "row-major" : "column-major"; }
const Layout kLayouts[] = {Layout::row_major, Layout::column_major};

// Strides for `shape` in `layout`, the size-1 dims taking odd values: larger than the tensor,
// zero, one, small primes, a different one per dim.
Strides odd_strides(const Shape& shape, Layout layout) {
  static const int64_t kOdd[] = {97, 0, 5, 1031, 1, 3};
  Strides st(shape.size(), 0);
  int64_t run = 1;
  auto dense = [&](size_t d) {
    if (shape[d] == 1) return;
    st[d] = run;
    run *= shape[d];
  };
  if (layout == Layout::row_major) {
    for (size_t d = shape.size(); d-- > 0;) dense(d);
  } else {
    for (size_t d = 0; d < shape.size(); ++d) dense(d);
  }
  size_t k = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] == 1) st[d] = kOdd[k++ % (sizeof(kOdd) / sizeof(kOdd[0]))];
  return st;
}

// `src`'s values viewed through `strides` (at an offset) in a fresh buffer filled with NaN, or
// with an out-of-range index for integers, wherever the view does not reach. The buffer is large
// enough that a read stepping by any stride times any index stays inside it.
Tensor relaid(const Tensor& src, const Strides& strides) {
  const Shape& shape = src.shape();
  const int64_t offset = 7;
  int64_t span = 1, widest = 1, longest = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] > 1) span += (shape[d] - 1) * strides[d];
    widest = std::max(widest, strides[d] + 1);
    longest = std::max(longest, shape[d]);
  }
  const int64_t n = offset + span + widest * (src.numel() + 1) * (longest + 1);
  Scalar fill = std::nan("");
  if (src.dtype() == boolean) fill = Scalar(true);
  else if (!src.is_floating_point()) fill = Scalar(int64_t{-1000003});
  Tensor buf = full({n}, fill, src.dtype());
  Tensor view = make_view(buf, shape, strides, offset);
  {
    NoGradGuard no_grad;
    view.copy_(src);
  }
  REQUIRE(vals(view) == vals(src));
  return view;
}

Tensor relaid(const Tensor& src, Layout layout) { return relaid(src, odd_strides(src.shape(), layout)); }

// A dense f64 tensor of distinct, non-round values (seed picks the sequence).
Tensor seeded(const Shape& shape, int seed) {
  Tensor t = empty(shape, f64);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::sin(0.7 * static_cast<double>(i) + 1.3 * seed) * 2.0 + 0.01 * i;
  return t;
}

// A dense i64 tensor of the given values.
Tensor ints(const Shape& shape, const std::vector<int64_t>& v) {
  Tensor t = empty(shape, i64);
  REQUIRE(static_cast<int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

Tensor dense_copy(const Tensor& t) {
  Tensor out = empty(t.shape(), t.dtype());
  NoGradGuard no_grad;
  out.copy_(t);
  return out;
}

// fn on `inputs` relaid with odd strides against fn on dense copies: the same shape, dtype and
// values; then, for a floating result that requires grad, the same gradient for every floating
// input, the odd run receiving its incoming gradient odd-strided as well.
void check_odd(const std::string& what, const Fn& fn, const TensorList& inputs, bool backward = true,
               double tol = 1e-12) {
  for (Layout layout : kLayouts) {
    INFO(what << " (" << name_of(layout) << ")");
    TensorList ref, odd;
    for (const Tensor& t : inputs) {
      ref.push_back(dense_copy(t));
      odd.push_back(relaid(t, layout));
      if (backward && t.is_floating_point()) {
        ref.back().requires_grad_();
        odd.back().requires_grad_();
      }
    }
    const Tensor r = fn(ref);
    const Tensor o = fn(odd);
    REQUIRE(o.shape() == r.shape());
    REQUIRE(o.dtype() == r.dtype());
    require_close(vals(o), vals(r), tol);
    if (!backward || !r.is_floating_point() || !r.requires_grad()) continue;
    const Tensor ct = seeded(r.shape(), 11).to(r.dtype());
    r.backward(ct);
    o.backward(relaid(ct, layout));
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].is_floating_point()) continue;
      INFO("gradient of input " << i << " (shape " << fmt::format("{}", inputs[i].shape()) << ")");
      REQUIRE(o.requires_grad());
      REQUIRE(odd[i].grad().defined() == ref[i].grad().defined());
      if (!ref[i].grad().defined()) continue;
      REQUIRE(odd[i].grad().shape() == ref[i].grad().shape());
      require_close(vals(odd[i].grad()), vals(ref[i].grad()), tol);
    }
  }
}

}  // namespace

// ---- the report of issue 15 ----

TEST_CASE("odd strides: linear reads t().narrow().unsqueeze() views element by element") {
  const Tensor base = arange(1, 10, TensorOptions(f64)).view({3, 3});
  const Tensor y = base.t().narrow(1, 0, 1).unsqueeze(1);
  REQUIRE(y.shape() == Shape{3, 1, 1});
  REQUIRE(y.is_contiguous());  // the trap: contiguous, yet its size-1 dims' strides are not 1
  REQUIRE(vals(y) == std::vector<double>{1, 2, 3});
  const Tensor w = full({1, 1}, 0.7, f64);
  require_close(vals(linear(y, w)), {0.7, 1.4, 2.1});
  require_close(vals(linear(y, w, full({1}, 0.5, f64))), {1.2, 1.9, 2.6});
  require_close(vals(matmul(y, w)), {0.7, 1.4, 2.1});
}

TEST_CASE("odd strides: linear's gradients through transpose and permute of its output") {
  // The incoming gradient is a permuted view whose size-1 dims carry the forward's strides.
  const Tensor coeff = seeded({1, 3, 1}, 3);
  const Tensor base = arange(1, 10, TensorOptions(f64)).view({3, 3}).requires_grad_();
  const Tensor w = full({1, 1}, 0.7, f64).requires_grad_();
  const Tensor b = full({1}, 0.25, f64).requires_grad_();
  const Tensor out = linear(base.t().narrow(1, 0, 1).unsqueeze(1), w, b).transpose(0, 1).permute({2, 1, 0});
  REQUIRE(out.shape() == Shape{1, 3, 1});
  require_close(vals(out), {0.95, 1.65, 2.35});
  (out * coeff).sum().backward();
  const std::vector<double> c = vals(coeff);
  require_close(vals(base.grad()), {0.7 * c[0], 0.7 * c[1], 0.7 * c[2], 0, 0, 0, 0, 0, 0});
  require_close(vals(w.grad()), {c[0] * 1 + c[1] * 2 + c[2] * 3});
  require_close(vals(b.grad()), {c[0] + c[1] + c[2]});

  // The same through a leaf that has the view's geometry, against a dense leaf.
  check_odd(
      "linear -> transpose -> permute",
      [](const TensorList& t) { return linear(t[0], t[1], t[2]).transpose(0, 1).permute({2, 1, 0}); },
      {seeded({3, 1, 1}, 1), seeded({1, 1}, 2), seeded({1}, 3)});
}

// ---- matrix products ----

TEST_CASE("odd strides: matmul, mm and bmm with size-1 rows, columns, contractions and batches") {
  const std::vector<std::pair<Shape, Shape>> pairs = {
      {{4, 1, 3}, {3, 2}},       {{1, 3}, {3, 1}},          {{2, 3, 1}, {1, 1, 4}},    {{3}, {2, 3, 1}},
      {{2, 1, 3}, {3}},          {{1, 1, 2}, {5, 2, 1}},    {{3, 1, 1, 2}, {1, 4, 2, 1}}, {{1}, {1}},
      {{2, 1, 1}, {2, 1, 1}},    {{1, 4, 1, 3}, {2, 1, 3, 1}}, {{3, 1, 2}, {1, 2, 2}}};
  for (const auto& [sa, sb] : pairs) {
    check_odd("matmul", [](const TensorList& t) { return matmul(t[0], t[1]); }, {seeded(sa, 1), seeded(sb, 2)});
  }
  const std::vector<std::pair<Shape, Shape>> mms = {{{1, 3}, {3, 4}}, {{3, 1}, {1, 4}}, {{1, 1}, {1, 1}}, {{4, 3}, {3, 1}}};
  for (const auto& [sa, sb] : mms)
    check_odd("mm", [](const TensorList& t) { return mm(t[0], t[1]); }, {seeded(sa, 3), seeded(sb, 4)});
  const std::vector<std::pair<Shape, Shape>> bmms = {
      {{1, 2, 3}, {1, 3, 1}}, {{3, 1, 2}, {3, 2, 1}}, {{2, 1, 1}, {2, 1, 3}}, {{1, 1, 1}, {1, 1, 1}}};
  for (const auto& [sa, sb] : bmms)
    check_odd("bmm", [](const TensorList& t) { return bmm(t[0], t[1]); }, {seeded(sa, 5), seeded(sb, 6)});
}

TEST_CASE("odd strides: linear with and without bias over size-1 leading dims and features") {
  struct L {
    Shape x, w;
    bool bias;
  };
  const std::vector<L> cases = {{{3, 1, 1}, {1, 1}, false},   {{3, 1, 1}, {1, 1}, true},     {{2, 1, 3}, {4, 3}, true},
                                {{1, 3}, {2, 3}, true},       {{4, 1, 1, 3}, {1, 3}, true},  {{3}, {2, 3}, false},
                                {{1, 1, 1}, {5, 1}, true},    {{2, 1, 3, 1}, {1, 1}, true},  {{1, 2, 3}, {4, 3}, false},
                                {{2, 3, 1, 2}, {3, 2}, true}, {{1, 1, 2}, {1, 2}, false}};
  for (const L& c : cases) {
    TensorList in = {seeded(c.x, 1), seeded(c.w, 2)};
    if (c.bias) in.push_back(seeded({c.w[0]}, 3));
    check_odd(
        c.bias ? "linear with bias" : "linear",
        [](const TensorList& t) { return t.size() == 3 ? linear(t[0], t[1], t[2]) : linear(t[0], t[1]); }, in);
    // The output permuted before the loss: an odd-strided gradient of another geometry.
    check_odd(
        "linear, output transposed",
        [](const TensorList& t) {
          Tensor y = t.size() == 3 ? linear(t[0], t[1], t[2]) : linear(t[0], t[1]);
          return y.dim() >= 2 ? y.transpose(0, -1) : y;
        },
        in);
  }
}

TEST_CASE("odd strides: addmm with broadcast biases and size-1 dims") {
  struct A {
    Shape bias, a, b;
  };
  const std::vector<A> cases = {{{4}, {1, 3}, {3, 4}},   {{1, 4}, {2, 3}, {3, 4}}, {{3, 1}, {3, 1}, {1, 1}},
                                {{1}, {1, 1}, {1, 1}},   {{1, 1}, {2, 1}, {1, 5}}, {{2, 1}, {2, 3}, {3, 1}},
                                {{1, 2}, {1, 4}, {4, 2}}};
  for (const A& c : cases)
    check_odd("addmm", [](const TensorList& t) { return addmm(t[0], t[1], t[2]); },
              {seeded(c.bias, 1), seeded(c.a, 2), seeded(c.b, 3)});
}

// ---- elementwise ----

TEST_CASE("odd strides: unary elementwise ops") {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(abs(x) + 1); }},
      {"sqrt", [](const Tensor& x) { return sqrt(abs(x) + 1); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(abs(x) + 1); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"gelu", [](const Tensor& x) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, true); }},
      {"silu", [](const Tensor& x) { return silu(x); }},
      {"pow", [](const Tensor& x) { return pow(x, 3); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
      {"scalar ops", [](const Tensor& x) { return 1.5 - x * 2.5 + 0.25; }},
      {"rdiv", [](const Tensor& x) { return 2.0 / (abs(x) + 1); }},
  };
  for (const Shape& s : {Shape{3, 1, 2, 1}, Shape{1, 1}, Shape{1, 5}, Shape{4, 1}}) {
    for (const auto& [name, f] : ops) {
      auto fn = f;
      check_odd("unary " + name, [fn](const TensorList& t) { return fn(t[0]); }, {seeded(s, 1)});
    }
  }
}

TEST_CASE("odd strides: binary elementwise ops with broadcasting") {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.5); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a / (b * b + 1); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a) + 1, b); }},
      {"where", [](const Tensor& a, const Tensor& b) { return where(gt(a, b), a * 2, b); }},
  };
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 1, 2}, {1, 4, 1}}, {{1, 1}, {3, 1, 1}}, {{2, 1, 3}, {3}}, {{2, 1, 3}, {2, 1, 3}}, {{1}, {1, 2, 1}}};
  for (const auto& [sa, sb] : shapes) {
    for (const auto& [name, f] : ops) {
      auto fn = f;
      check_odd("binary " + name, [fn](const TensorList& t) { return fn(t[0], t[1]); }, {seeded(sa, 1), seeded(sb, 2)});
    }
    check_odd("comparison", [](const TensorList& t) { return lt(t[0], t[1]); }, {seeded(sa, 1), seeded(sb, 2)}, false);
  }
}

TEST_CASE("odd strides: in-place elementwise ops write through odd-strided views") {
  for (Layout layout : kLayouts) {
    INFO(name_of(layout));
    const Tensor self_data = seeded({3, 1, 2, 1}, 1), other_data = seeded({1, 2, 1}, 2);
    Tensor ref = dense_copy(self_data), odd = relaid(self_data, layout);
    const Tensor other_ref = dense_copy(other_data), other_odd = relaid(other_data, layout);
    ref.add_(other_ref, 0.5).mul_(other_ref).add_(1.25).mul_(2.0);
    odd.add_(other_odd, 0.5).mul_(other_odd).add_(1.25).mul_(2.0);
    require_close(vals(odd), vals(ref));
    ref.fill_(0.5);
    odd.fill_(0.5);
    require_close(vals(odd), vals(ref));
    // The buffer around the view stays untouched: only the view's elements were written.
    Tensor buf = make_view(odd, Shape{static_cast<int64_t>(odd.storage()->nbytes() / 8)}, Strides{1}, 0);
    int64_t written = 0;
    for (double v : vals(buf)) written += std::isnan(v) ? 0 : 1;
    REQUIRE(written == odd.numel());
  }
}

// ---- reductions ----

TEST_CASE("odd strides: every reduction over several dims, with and without keepdim") {
  const Shape s{2, 1, 3, 1, 2};
  struct R {
    std::string name;
    Fn fn;
    bool backward = true;
  };
  std::vector<R> rs = {
      {"sum all", [](const TensorList& t) { return sum(t[0]); }},
      {"mean all", [](const TensorList& t) { return mean(t[0]); }},
      {"max all", [](const TensorList& t) { return max(t[0]); }},
      {"min all", [](const TensorList& t) { return min(t[0]); }},
      {"norm", [](const TensorList& t) { return norm(t[0]); }},
      {"var all", [](const TensorList& t) { return var(t[0]); }},
      {"std all", [](const TensorList& t) { return tandem::std(t[0]); }},
      {"argmax all", [](const TensorList& t) { return argmax(t[0]); }, false},
      {"argmin all", [](const TensorList& t) { return argmin(t[0]); }, false},
  };
  const std::vector<Shape> dim_sets = {{1}, {0}, {2}, {-1}, {0, 2}, {1, 3}, {0, 2, 4}, {0, 1, 2, 3, 4}, {2, 3, 4}};
  for (bool keep : {false, true}) {
    for (const Shape& dims : dim_sets) {
      const std::string tag = " dims " + std::to_string(dims.size()) + (keep ? " keepdim" : "");
      rs.push_back({"sum" + tag, [dims, keep](const TensorList& t) { return sum(t[0], dims, keep); }});
      rs.push_back({"mean" + tag, [dims, keep](const TensorList& t) { return mean(t[0], dims, keep); }});
      rs.push_back({"amax" + tag, [dims, keep](const TensorList& t) { return amax(t[0], dims, keep); }});
      rs.push_back({"amin" + tag, [dims, keep](const TensorList& t) { return amin(t[0], dims, keep); }});
      rs.push_back({"logsumexp" + tag, [dims, keep](const TensorList& t) { return logsumexp(t[0], dims, keep); }});
      rs.push_back({"var" + tag, [dims, keep](const TensorList& t) { return var(t[0], dims, 0, keep); }});
      rs.push_back({"std" + tag, [dims, keep](const TensorList& t) { return tandem::std(t[0], dims, 0, keep); }});
    }
    for (int64_t d = 0; d < 5; ++d) {
      const std::string tag = " dim " + std::to_string(d) + (keep ? " keepdim" : "");
      rs.push_back({"max" + tag, [d, keep](const TensorList& t) { return max(t[0], d, keep).first; }});
      rs.push_back({"min" + tag, [d, keep](const TensorList& t) { return min(t[0], d, keep).first; }});
      rs.push_back({"max indices" + tag, [d, keep](const TensorList& t) { return max(t[0], d, keep).second; }, false});
      rs.push_back({"argmax" + tag, [d, keep](const TensorList& t) { return argmax(t[0], d, keep); }, false});
      rs.push_back({"argmin" + tag, [d, keep](const TensorList& t) { return argmin(t[0], d, keep); }, false});
    }
  }
  for (const R& r : rs) check_odd(r.name, r.fn, {seeded(s, 1)}, r.backward);
  // Leading dims reduced, trailing kept (the row-sum fast path), and reductions of size-1 dims only.
  for (const Shape& shape : {Shape{1, 4, 3}, Shape{4, 1, 3}, Shape{4, 3, 1}, Shape{1, 1, 3}}) {
    check_odd("sum leading", [](const TensorList& t) { return sum(t[0], {0, 1}); }, {seeded(shape, 2)});
    check_odd("sum first", [](const TensorList& t) { return sum(t[0], {0}); }, {seeded(shape, 2)});
    check_odd("mean leading", [](const TensorList& t) { return mean(t[0], {0, 1}, true); }, {seeded(shape, 2)});
  }
}

// ---- indexing ----

TEST_CASE("odd strides: gather, index_select, scatter_add, embedding, masked_fill") {
  check_odd("gather", [](const TensorList& t) { return gather(t[0], 2, t[1]); },
            {seeded({3, 1, 4}, 1), ints({3, 1, 2}, {3, 0, 1, 1, 2, 3})});
  check_odd("gather dim 0", [](const TensorList& t) { return gather(t[0], 0, t[1]); },
            {seeded({1, 3, 1}, 1), ints({1, 3, 1}, {0, 0, 0})});
  check_odd("gather dim 1", [](const TensorList& t) { return gather(t[0], 1, t[1]); },
            {seeded({2, 3, 1}, 1), ints({2, 2, 1}, {2, 0, 1, 1})});
  check_odd("index_select", [](const TensorList& t) { return index_select(t[0], 2, t[1]); },
            {seeded({3, 1, 4}, 1), ints({2}, {3, 1})});
  check_odd("index_select of one index", [](const TensorList& t) { return index_select(t[0], 2, t[1]); },
            {seeded({3, 1, 4}, 1), ints({1}, {2})});
  check_odd("index_select size-1 dim", [](const TensorList& t) { return index_select(t[0], 1, t[1]); },
            {seeded({3, 1, 4}, 1), ints({3}, {0, 0, 0})});
  check_odd("scatter_add", [](const TensorList& t) { return scatter_add(t[0], 2, t[1], t[2]); },
            {seeded({3, 1, 4}, 1), ints({3, 1, 2}, {3, 3, 1, 0, 2, 2}), seeded({3, 1, 2}, 2)});
  check_odd("scatter_add size-1", [](const TensorList& t) { return scatter_add(t[0], 0, t[1], t[2]); },
            {seeded({2, 1}, 1), ints({2, 1}, {1, 1}), seeded({2, 1}, 2)});
  check_odd("embedding", [](const TensorList& t) { return embedding(t[0], t[1]); },
            {seeded({5, 1}, 1), ints({2, 1, 3}, {4, 0, 1, 1, 3, 4})});
  check_odd("embedding one row", [](const TensorList& t) { return embedding(t[0], t[1]); },
            {seeded({1, 3}, 1), ints({1, 1}, {0})});
  check_odd("embedding one index", [](const TensorList& t) { return embedding(t[0], t[1]); },
            {seeded({4, 3}, 1), ints({1}, {2})});
  {
    Tensor mask = empty({1, 1, 2}, boolean);
    mask.data_ptr<bool>()[0] = true;
    mask.data_ptr<bool>()[1] = false;
    check_odd("masked_fill", [](const TensorList& t) { return masked_fill(t[0], t[1], 0.5); },
              {seeded({3, 1, 2}, 1), mask});
  }
}

TEST_CASE("odd strides: cat, stack, split") {
  check_odd("cat", [](const TensorList& t) { return cat({t[0], t[1]}, 1); }, {seeded({2, 1, 3}, 1), seeded({2, 1, 3}, 2)});
  check_odd("cat dim 0", [](const TensorList& t) { return cat({t[0], t[1]}, 0); }, {seeded({1, 3}, 1), seeded({2, 3}, 2)});
  check_odd("stack", [](const TensorList& t) { return stack({t[0], t[1]}, 1); }, {seeded({1, 3}, 1), seeded({1, 3}, 2)});
  check_odd("split", [](const TensorList& t) { return split(t[0], 2, 0)[1] * 2; }, {seeded({4, 1, 2}, 1)});
  check_odd("chunk", [](const TensorList& t) { return chunk(t[0], 2, 2)[0] + 1; }, {seeded({1, 1, 4}, 1)});
}

// ---- nn ops ----

TEST_CASE("odd strides: tril and triu with size-1 rows, columns and batches") {
  check_odd("tril", [](const TensorList& t) { return tril(t[0]); }, {seeded({2, 1, 3, 4}, 1)});
  check_odd("triu below", [](const TensorList& t) { return triu(t[0], -1); }, {seeded({3, 1, 4, 3}, 1)});
  check_odd("tril one row", [](const TensorList& t) { return tril(t[0], 1); }, {seeded({3, 1, 4}, 1)});
  check_odd("triu one column", [](const TensorList& t) { return triu(t[0], -2); }, {seeded({2, 4, 1}, 1)});
  check_odd("tril 1x1", [](const TensorList& t) { return tril(t[0]); }, {seeded({3, 1, 1}, 1)});
  check_odd("triu integers", [](const TensorList& t) { return triu(t[0]); }, {ints({1, 2, 2}, {1, 2, 3, 4})});
}

TEST_CASE("odd strides: topk along every dim, values and indices; multinomial's rows") {
  for (const Shape& s : {Shape{2, 1, 5, 1}, Shape{1, 6}, Shape{4, 1}}) {
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      const int64_t k = (s[d] + 1) / 2;
      for (bool sorted : {true, false}) {
        check_odd("topk", [=](const TensorList& t) { return topk(t[0], k, d, true, sorted).first; }, {seeded(s, 1)});
        check_odd("topk indices", [=](const TensorList& t) { return topk(t[0], k, d, false, sorted).second; },
                  {seeded(s, 2)}, false);
      }
    }
  }
  for (const Shape& s : {Shape{3, 1}, Shape{1, 7}, Shape{7}}) {
    check_odd("multinomial", [](const TensorList& t) {
      manual_seed(5);
      return multinomial(t[0], 1, true);
    }, {seeded(s, 3).abs() + 0.1}, false);
  }
}

TEST_CASE("odd strides: softmax and log_softmax over every dim") {
  for (const Shape& s : {Shape{2, 1, 3, 1}, Shape{1, 4}, Shape{3, 1}}) {
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
      check_odd("softmax", [d](const TensorList& t) { return softmax(t[0], d); }, {seeded(s, 1)});
      check_odd("log_softmax", [d](const TensorList& t) { return log_softmax(t[0], d); }, {seeded(s, 1)});
    }
  }
}

TEST_CASE("odd strides: layer_norm, dropout, losses") {
  check_odd("layer_norm", [](const TensorList& t) { return layer_norm(t[0], {1, 4}, t[1], t[2]); },
            {seeded({3, 1, 4}, 1), seeded({1, 4}, 2), seeded({1, 4}, 3)});
  check_odd("layer_norm D=1", [](const TensorList& t) { return layer_norm(t[0], {1}); }, {seeded({2, 1}, 1)});
  check_odd("layer_norm one row", [](const TensorList& t) { return layer_norm(t[0], {3}, t[1], t[2]); },
            {seeded({1, 1, 3}, 1), seeded({3}, 2), seeded({3}, 3)});
  check_odd("layer_norm 2 dims", [](const TensorList& t) { return layer_norm(t[0], {3, 1}, t[1]); },
            {seeded({2, 3, 1}, 1), seeded({3, 1}, 2)});
  check_odd(
      "dropout",
      [](const TensorList& t) {
        set_rng_state(PhiloxState{1234, 0});
        return dropout(t[0], 0.4, true);
      },
      {seeded({3, 1, 2, 1}, 1)});
  check_odd("cross_entropy", [](const TensorList& t) { return nn::cross_entropy(t[0], t[1]); },
            {seeded({1, 4}, 1), ints({1}, {2})});
  check_odd("cross_entropy one class", [](const TensorList& t) { return nn::cross_entropy(t[0], t[1]); },
            {seeded({3, 1}, 1), ints({3}, {0, 0, 0})});
  check_odd("cross_entropy spatial",
            [](const TensorList& t) { return nn::cross_entropy(t[0], t[1], nn::Reduction::sum); },
            {seeded({2, 3, 1}, 1), ints({2, 1}, {2, 0})});
  check_odd(
      "cross_entropy weighted, smoothed",
      [](const TensorList& t) {
        nn::CrossEntropyOptions o;
        o.weight = t[2];
        o.label_smoothing = 0.1;
        return nn::cross_entropy(t[0], t[1], o);
      },
      {seeded({2, 1, 3}, 1).squeeze(1), ints({2}, {1, 2}), abs(seeded({3}, 2)) + 0.5}, true);
  check_odd("cross_entropy probabilities", [](const TensorList& t) { return nn::cross_entropy(t[0], softmax(t[1], 1)); },
            {seeded({1, 3}, 1), seeded({1, 3}, 2)});
  check_odd("nll_loss", [](const TensorList& t) { return nn::nll_loss(log_softmax(t[0], 1), t[1]); },
            {seeded({3, 2, 1}, 1), ints({3, 1}, {1, 0, 1})});
  check_odd("mse_loss", [](const TensorList& t) { return nn::mse_loss(t[0], t[1]); },
            {seeded({3, 1, 2}, 1), seeded({3, 1, 2}, 2)});
}

// ---- copies, casts, views ----

TEST_CASE("odd strides: contiguous, clone, to(dtype), copy_, and views of odd views") {
  const Shape s{2, 1, 3, 1};
  check_odd("contiguous", [](const TensorList& t) { return t[0].contiguous() * 1.5; }, {seeded(s, 1)});
  check_odd("clone", [](const TensorList& t) { return t[0].clone(); }, {seeded(s, 1)});
  check_odd("to f32 and back", [](const TensorList& t) { return t[0].to(f32).to(f64); }, {seeded(s, 1)});
  check_odd("to f16", [](const TensorList& t) { return t[0].to(f16); }, {seeded(s, 1)}, false);
  check_odd("to i64", [](const TensorList& t) { return (t[0] * 10).to(i64); }, {seeded(s, 1)}, false);
  check_odd("reshape", [](const TensorList& t) { return t[0].reshape({3, 2}); }, {seeded(s, 1)});
  check_odd("reshape split", [](const TensorList& t) { return t[0].reshape({1, 2, 1, 1, 3}); }, {seeded(s, 1)});
  check_odd("flatten", [](const TensorList& t) { return t[0].flatten(); }, {seeded(s, 1)});
  check_odd("squeeze", [](const TensorList& t) { return t[0].squeeze(); }, {seeded(s, 1)});
  check_odd("unsqueeze", [](const TensorList& t) { return t[0].unsqueeze(1).unsqueeze(-1); }, {seeded(s, 1)});
  check_odd("permute", [](const TensorList& t) { return t[0].permute({3, 2, 0, 1}); }, {seeded(s, 1)});
  check_odd("expand", [](const TensorList& t) { return t[0].expand({2, 4, 3, 2}); }, {seeded(s, 1)});
  check_odd("narrow, select, slice", [](const TensorList& t) { return t[0].narrow(2, 1, 2).select(0, 1).slice(1, 0, 2, 1); },
            {seeded(s, 1)});
  check_odd("t() of one row", [](const TensorList& t) { return t[0].t() * 3; }, {seeded({1, 3}, 1)});
  // view needs strides that allow it: the row-major layout always does.
  {
    const Tensor x = relaid(seeded(s, 1), Layout::row_major);
    REQUIRE(x.is_contiguous());
    require_close(vals(x.view({3, 2})), vals(seeded(s, 1)));
    require_close(vals(x.view({6})), vals(seeded(s, 1)));
    require_close(vals(x.view({1, 6, 1})), vals(seeded(s, 1)));
  }
  for (Layout ld : kLayouts) {
    for (Layout ls : kLayouts) {
      INFO(name_of(ld) << " destination, " << name_of(ls) << " source");
      const Tensor dst = relaid(zeros(s, f64), ld);
      const Tensor src = relaid(seeded(s, 2), ls);
      dst.copy_(src);
      require_close(vals(dst), vals(seeded(s, 2)));
      const Tensor dst32 = relaid(zeros(s, f32), ld);
      dst32.copy_(src);  // a converting copy
      require_close(vals(dst32), vals(seeded(s, 2).to(f32)));
      const Tensor bcast = relaid(zeros({2, 1, 3, 2}, f64), ld);
      bcast.copy_(relaid(seeded({1, 3, 1}, 3), ls));  // a broadcasting copy
      require_close(vals(bcast), vals(seeded({1, 3, 1}, 3).expand({2, 1, 3, 2})));
    }
  }
}

// ---- a small model end to end ----

TEST_CASE("odd strides: a layer stack's forward and backward on a permuted batch") {
  check_odd(
      "linear -> layer_norm -> gelu -> linear -> log_softmax",
      [](const TensorList& t) {
        Tensor h = linear(t[0], t[1], t[2]);
        h = gelu(layer_norm(h, {4}));
        return log_softmax(linear(h, t[3]).permute({2, 1, 0}), 2);
      },
      {seeded({2, 1, 3}, 1), seeded({4, 3}, 2), seeded({4}, 3), seeded({1, 4}, 4)});
}
