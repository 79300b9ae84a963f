// scaled_dot_product_attention: the fused op against softmax(q kᵀ · scale + bias) v composed from
// matmul, softmax, masked_fill and tril in f64 (outputs to 1e-12, gradients to 1e-11): every rank
// (2-D to 5-D), L != S, Ev != E, explicit and default scales, causal with L = S, L > S and L < S
// (PyTorch's top-left tril), boolean and additive masks broadcast from several shapes, strided
// q/k/v (a GPT's qkv split, heads expanded from one), sizes that are no multiple of a tile, large
// scores. Fully masked queries (0, no gradient, no NaN anywhere) apart from NaN scores (NaN, as
// in the composition), gradcheck in f64 (q, k, v and an additive mask, broadcast or not), dropout
// against the keep bits rebuilt from the generator state (core/detail/attention.h), f32/bf16/f16
// against f64, empty problems and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "core/detail/attention.h"  // attention_keep, attention_dropout_blocks: the dropout bits
#include "core/random.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using Catch::StartsWith;
using test_util::leaf;
using test_util::require_close;
using test_util::require_gradcheck;
using test_util::vals;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Options {
  Tensor mask;
  double dropout_p = 0;
  bool causal = false;
  std::optional<double> scale;
};

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Options& o = {}) {
  return scaled_dot_product_attention(q, k, v, o.mask, o.dropout_p, o.causal, o.scale);
}

Shape batch_of(const Tensor& q) {
  Shape b;
  for (int64_t d = 0; d + 2 < q.dim(); ++d) b.push_back(q.size(d));
  return b;
}

Shape cat_shape(Shape s, std::initializer_list<int64_t> tail) {
  for (int64_t t : tail) s.push_back(t);
  return s;
}

// keep_ij / (1 - p) for every element of [batch..., L, S], element e in row-major order: the bits
// one forward reserves at `state` (e = ((b·H + h)·L + i)·S + j once the batch dims are merged).
Tensor dropout_weights(const Shape& batch, int64_t L, int64_t S, PhiloxState state, double p) {
  const int64_t n = numel_of(batch) * L * S;
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e)
    w[e] = detail::attention_keep(state.seed, state.offset, static_cast<uint64_t>(e), static_cast<float>(p))
               ? 1.0 / (1.0 - p)
               : 0.0;
  return from_vector(w, cat_shape(batch, {L, S}));
}

// softmax(q kᵀ · scale + bias) (· keep) v in the library's own differentiable ops. A row whose keys
// are all masked gives 0 and no gradient: its scores are replaced by zeros before the softmax and
// its weights by zeros after it (plain softmax would give NaN there, as PyTorch's math path does).
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Options& o, const Tensor& keep = Tensor()) {
  const int64_t L = q.size(-2), S = k.size(-2);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  Tensor s = matmul(q, k.transpose(-2, -1)) * scale;
  if (o.causal) s = masked_fill(s, logical_not(tril(ones({L, S}, boolean))), -kInf);
  if (o.mask.defined()) s = o.mask.dtype() == boolean ? masked_fill(s, logical_not(o.mask), -kInf) : s + o.mask;
  Tensor live = gt(amax(s, {-1}, true), -kInf);
  Tensor w = where(live, softmax(where(live, s, 0.0), -1), 0.0);
  if (keep.defined()) w = w * keep;
  return matmul(w, v);
}

bool all_zero(const Tensor& t) {
  for (double x : vals(t.to(f64)))
    if (x != 0) return false;
  return true;
}

bool all_finite(const Tensor& t) {
  for (double x : vals(t.to(f64)))
    if (!std::isfinite(x)) return false;
  return true;
}

// A problem built from leaves: the builder turns them into q, k, v and the options (views of the
// leaves, a mask among them), so strided inputs and their gradients go through the same code.
struct Problem {
  Tensor q, k, v;
  Options o;
};
using Builder = std::function<Problem(const TensorList&)>;

TensorList fresh_leaves(const TensorList& bases) {
  TensorList out;
  for (const Tensor& b : bases) {
    Tensor t = b.detach().clone();
    if (b.requires_grad()) t.requires_grad_();
    out.push_back(t);
  }
  return out;
}

// The fused op and the reference, each on its own copy of `bases` (those that require grad are
// leaves), one upstream gradient (transposed: any strides) into both: the outputs and every leaf's
// gradient agree. With dropout, the reference's keep bits are those reserved by the fused call,
// which advances the generator by attention_dropout_blocks and its backward by nothing.
void require_matches_reference(const TensorList& bases, const Builder& build, double tol = 1e-12,
                               double grad_tol = 1e-11) {
  TensorList a = fresh_leaves(bases), b = fresh_leaves(bases);
  const Problem pa = build(a), pb = build(b);
  const Shape batch = batch_of(pa.q);
  const int64_t L = pa.q.size(-2), S = pa.k.size(-2);
  INFO("q " << shape_str(pa.q.shape()) << " k " << shape_str(pa.k.shape()) << " v " << shape_str(pa.v.shape())
            << " mask " << (pa.o.mask.defined() ? shape_str(pa.o.mask.shape()) : std::string("none")) << " causal "
            << pa.o.causal << " scale " << (pa.o.scale ? *pa.o.scale : -1.0) << " dropout " << pa.o.dropout_p);

  const PhiloxState before = get_rng_state();
  Tensor got = sdpa(pa.q, pa.k, pa.v, pa.o);
  const PhiloxState after = get_rng_state();
  REQUIRE(after.seed == before.seed);
  const uint64_t reserved = pa.o.dropout_p > 0 ? detail::attention_dropout_blocks(numel_of(batch), 1, L, S) : 0;
  REQUIRE(after.offset == before.offset + reserved);
  Tensor keep = pa.o.dropout_p > 0 ? dropout_weights(batch, L, S, before, pa.o.dropout_p).to(pb.q.dtype()) : Tensor();
  Tensor want = reference(pb.q, pb.k, pb.v, pb.o, keep);

  REQUIRE(got.shape() == cat_shape(batch, {L, pa.v.size(-1)}));
  REQUIRE(got.dtype() == pa.q.dtype());
  REQUIRE(got.is_contiguous());
  REQUIRE(all_finite(got));
  require_close(vals(got), vals(want), tol);

  bool any = false;
  for (const Tensor& t : a) any |= t.requires_grad();
  if (!any) return;
  REQUIRE(got.requires_grad());
  Shape gshape = got.shape();
  std::swap(gshape[gshape.size() - 1], gshape[gshape.size() - 2]);
  Tensor g = randn(gshape, got.dtype()).transpose(-2, -1);
  const PhiloxState before_backward = get_rng_state();
  got.backward(g);
  REQUIRE(get_rng_state().offset == before_backward.offset);  // the bits are redrawn, not drawn
  want.backward(g);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].requires_grad()) continue;
    INFO("gradient of leaf " << i << " " << shape_str(a[i].shape()));
    Tensor ga = a[i].grad(), gb = b[i].grad();
    REQUIRE(ga.defined());
    REQUIRE(gb.defined());
    REQUIRE(ga.shape() == a[i].shape());
    REQUIRE(ga.dtype() == a[i].dtype());
    REQUIRE(all_finite(ga));
    require_close(vals(ga), vals(gb), grad_tol);
  }
}

// q [batch..., L, E], k [batch..., S, E], v [batch..., S, Ev] as f64 leaves, plus options.
void require_plain_matches(const Shape& batch, int64_t L, int64_t S, int64_t E, int64_t Ev, const Options& o) {
  const TensorList bases = {leaf(randn(cat_shape(batch, {L, E}), f64)), leaf(randn(cat_shape(batch, {S, E}), f64)),
                            leaf(randn(cat_shape(batch, {S, Ev}), f64))};
  require_matches_reference(bases, [o](const TensorList& x) { return Problem{x[0], x[1], x[2], o}; });
}

// A boolean [L, S] mask from a predicate of (query, key).
Tensor bool_mask(int64_t L, int64_t S, const std::function<bool(int64_t, int64_t)>& takes_part) {
  std::vector<bool> m;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) m.push_back(takes_part(i, j));
  return from_vector<bool>(m, {L, S});
}

}  // namespace

TEST_CASE("scaled_dot_product_attention equals the composed softmax(q kᵀ scale) v for every rank and size",
          "[attention]") {
  manual_seed(21);
  struct Case {
    Shape batch;
    int64_t L, S, E, Ev;
  };
  const Case cases[] = {
      {{2, 3}, 5, 7, 8, 8},      // 4-D [B, H, L, E]
      {{2}, 4, 6, 3, 5},         // 3-D, Ev != E
      {{}, 6, 4, 5, 2},          // 2-D, L > S
      {{2, 2, 3}, 3, 5, 4, 4},   // 5-D: the leading dims are merged
      {{1, 1}, 1, 1, 1, 1},      // one query, one key
      {{1, 2}, 37, 37, 16, 16},  // no multiple of a tile
      {{2, 1}, 130, 130, 8, 12},
      {{1, 1}, 130, 37, 8, 8},
      {{1, 1}, 37, 130, 8, 8},
      {{2}, 1, 130, 5, 3},
      {{2}, 130, 1, 5, 3},
      {{1, 1}, 65, 64, 64, 64},
      {{1, 1}, 64, 65, 130, 3},  // a head dim past a tile too
  };
  for (const Case& c : cases) {
    Options o;
    require_plain_matches(c.batch, c.L, c.S, c.E, c.Ev, o);
    o.scale = 0.37;
    require_plain_matches(c.batch, c.L, c.S, c.E, c.Ev, o);
    o.scale.reset();
    o.causal = true;
    require_plain_matches(c.batch, c.L, c.S, c.E, c.Ev, o);
  }
}

TEST_CASE("scaled_dot_product_attention: the default scale is 1/sqrt(E) of q and k, not of v", "[attention]") {
  manual_seed(22);
  Tensor q = randn({2, 5, 8}, f64), k = randn({2, 6, 8}, f64), v = randn({2, 6, 3}, f64);
  require_close(vals(sdpa(q, k, v)), vals(sdpa(q, k, v, {Tensor(), 0, false, 1 / std::sqrt(8.0)})), 1e-15);
  require_close(vals(sdpa(q, k, v)), vals(reference(q, k, v, {Tensor(), 0, false, 1 / std::sqrt(8.0)})), 1e-12);
  // Scale 0: every key weighs the same, so each query gets the mean of v.
  Tensor mean_v = v.mean({1}, true).expand({2, 5, 3});
  require_close(vals(sdpa(q, k, v, {Tensor(), 0, false, 0.0})), vals(mean_v.contiguous()), 1e-14);
  // A negative scale is a scale: the reference's.
  require_close(vals(sdpa(q, k, v, {Tensor(), 0, false, -2.5})), vals(reference(q, k, v, {Tensor(), 0, false, -2.5})),
                1e-12);
}

TEST_CASE("scaled_dot_product_attention: causal is PyTorch's top-left tril(ones(L, S)), for L = S, L > S and L < S",
          "[attention]") {
  manual_seed(23);
  for (auto [L, S] : {std::pair<int64_t, int64_t>{4, 4}, {6, 3}, {3, 6}, {70, 5}, {5, 70}, {1, 9}, {9, 1}}) {
    INFO("L " << L << " S " << S);
    Tensor q = randn({2, L, 4}, f64), k = randn({2, S, 4}, f64), v = randn({2, S, 3}, f64);
    Tensor got = sdpa(q, k, v, {Tensor(), 0, true});
    // The same as the boolean mask tril(ones(L, S)), and as the composition.
    require_close(vals(got), vals(sdpa(q, k, v, {tril(ones({L, S}, boolean))})), 1e-14);
    require_close(vals(got), vals(reference(q, k, v, {Tensor(), 0, true})), 1e-12);
    // Query 0 sees key 0 alone: its output is v's first row.
    require_close(vals(got.select(1, 0)), vals(v.select(1, 0).contiguous()), 1e-14);
    // Queries i >= S - 1 see every key: the non-causal result.
    if (L >= S) {
      Tensor full_rows = sdpa(q, k, v).narrow(1, S - 1, L - S + 1).contiguous();
      require_close(vals(got.narrow(1, S - 1, L - S + 1).contiguous()), vals(full_rows), 1e-14);
    }
  }
}

TEST_CASE("scaled_dot_product_attention: boolean and additive masks broadcast to [..., L, S]", "[attention]") {
  manual_seed(24);
  const int64_t B = 2, H = 3, L = 5, S = 7;
  // Bool masks that leave every query at least its first key (fully masked rows have their own test).
  auto random_bool = [&](const Shape& shape) {
    Tensor m = lt(rand(shape, f64), 0.6);
    return logical_or(m, eq(arange(S).view(cat_shape(Shape(shape.size() - 1, 1), {S})), 0));
  };
  for (const Shape& ms : {Shape{L, S}, Shape{B, 1, L, S}, Shape{1, H, 1, S}, Shape{S}, Shape{H, L, S},
                          Shape{B, H, L, S}, Shape{1, 1, 1, 1}}) {
    Options o;
    o.mask = random_bool(ms);
    require_plain_matches({B, H}, L, S, 4, 6, o);
    o.mask = randn(ms, f64) * 2;  // additive, of q's dtype, not differentiated here
    require_plain_matches({B, H}, L, S, 4, 6, o);
  }
  // 3-D and 5-D inputs, 2-D with a 1-D mask.
  require_plain_matches({4}, L, S, 3, 3, {random_bool({4, L, S})});
  require_plain_matches({4}, L, S, 3, 3, {randn({1, S}, f64)});
  require_plain_matches({2, 3, 2}, L, S, 3, 2, {random_bool({3, 1, L, S})});
  require_plain_matches({2, 3, 2}, L, S, 3, 2, {randn({2, 1, 2, L, S}, f64)});
  require_plain_matches({}, L, S, 3, 2, {random_bool({S})});
  // Strided masks: transposed, a stepped slice, expanded (stride 0).
  Tensor t = lt(rand({S, L}, f64), 0.6).t();
  Tensor stepped = randn({L, 2 * S}, f64).slice(1, 0, 2 * S, 2);
  Tensor expanded = randn({1, 1, 1, S}, f64).expand({B, H, L, S});
  for (const Tensor& m : {t, stepped, expanded}) {
    REQUIRE_FALSE(m.is_contiguous());
    require_plain_matches({B, H}, L, S, 4, 6, {m});
  }
  // A mask whose first tile of keys is masked for some queries and its last for others: the
  // running maximum starts at -inf there.
  const int64_t Sl = 130;
  Tensor late =
      bool_mask(3, Sl, [](int64_t i, int64_t j) { return i == 0 ? j >= 100 : i == 1 ? j < 30 : j == Sl - 1; });
  require_plain_matches({2, 2}, 3, Sl, 8, 8, {late});
  Tensor late_add = zeros({3, Sl}, f64).masked_fill(logical_not(late), -kInf);
  require_plain_matches({2, 2}, 3, Sl, 8, 8, {late_add});
  // Large finite negatives and large scores: the online softmax's rescaling keeps them finite.
  require_plain_matches({2, 2}, 9, 70, 4, 4, {randn({9, 70}, f64) * 1e4});
  const TensorList big = {leaf(randn({1, 2, 9, 8}, f64) * 40), leaf(randn({1, 2, 70, 8}, f64)),
                          leaf(randn({1, 2, 70, 5}, f64))};
  require_matches_reference(big, [](const TensorList& x) { return Problem{x[0], x[1], x[2], {}}; });
}

TEST_CASE("scaled_dot_product_attention reads strided q, k, v (a GPT's qkv split, shared heads)", "[attention]") {
  manual_seed(25);
  const int64_t B = 2, T = 37, H = 3, D = 8, C = H * D;
  // x [B, T, 3C] split into q, k, v, each .view(B, T, H, D).transpose(1, 2): [B, H, T, D] with
  // strides (T·3C, D, 3C, 1). Gradients flow back into x through the views.
  auto gpt = [=](bool causal) {
    return [=](const TensorList& x) {
      TensorList qkv = chunk(x[0], 3, -1);
      auto heads = [&](const Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
      Problem p{heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}};
      p.o.causal = causal;
      return p;
    };
  };
  for (bool causal : {false, true}) {
    const TensorList x = {leaf(randn({B, T, 3 * C}, f64))};
    {
      TensorList xs = fresh_leaves(x);
      const Problem p = gpt(causal)(xs);
      REQUIRE_FALSE(p.q.is_contiguous());
      // The strided result is the contiguous one.
      Tensor dense = sdpa(p.q.contiguous(), p.k.contiguous(), p.v.contiguous(), p.o);
      require_close(vals(sdpa(p.q, p.k, p.v, p.o)), vals(dense), 1e-13);
    }
    require_matches_reference(x, gpt(causal));
  }
  // One key/value head shared by every query head (expanded: stride 0), a permuted q and a
  // stepped slice of v.
  const TensorList bases = {leaf(randn({B, 5, H, 4}, f64)), leaf(randn({B, 1, 6, 4}, f64)),
                            leaf(randn({B, 1, 6, 10}, f64))};
  require_matches_reference(bases, [=](const TensorList& x) {
    return Problem{x[0].permute({0, 2, 1, 3}), x[1].expand({B, H, 6, 4}), x[2].expand({B, H, 6, 10}).slice(3, 1, 10, 3),
                   {}};
  });
  require_matches_reference(bases, [=](const TensorList& x) {
    Problem p{x[0].permute({0, 2, 1, 3}), x[1].expand({B, H, 6, 4}), x[2].expand({B, H, 6, 10}), {}};
    p.o.causal = true;
    return p;
  });
}

TEST_CASE("scaled_dot_product_attention: a query whose keys are all masked gets 0 and passes no gradient",
          "[attention]") {
  manual_seed(26);
  const int64_t B = 2, H = 2, L = 5, S = 7;
  // Query 1 has no key, query 3 only the last one.
  Tensor mask =
      bool_mask(L, S, [](int64_t i, int64_t j) { return i == 1 ? false : i == 3 ? j == S - 1 : (i + j) % 3 != 0; });
  Tensor q = leaf(randn({B, H, L, 4}, f64)), k = leaf(randn({B, H, S, 4}, f64)), v = leaf(randn({B, H, S, 3}, f64));
  Tensor out = sdpa(q, k, v, {mask});
  REQUIRE(all_finite(out));
  REQUIRE(all_zero(out.select(2, 1)));
  require_close(vals(out.select(2, 3).contiguous()), vals(v.select(2, S - 1).detach().contiguous()), 1e-14);
  (out * randn(out.shape(), f64)).sum().backward();
  REQUIRE(all_finite(q.grad()));
  REQUIRE(all_finite(k.grad()));
  REQUIRE(all_finite(v.grad()));
  REQUIRE(all_zero(q.grad().select(2, 1)));
  // The reference on the same values, gradients included.
  require_matches_reference({q.detach(), k.detach(), v.detach()}, [&](const TensorList& x) {
    return Problem{x[0], x[1], x[2], {mask}};
  });
  require_matches_reference({leaf(q.detach()), leaf(k.detach()), leaf(v.detach())}, [&](const TensorList& x) {
    return Problem{x[0], x[1], x[2], {mask}};
  });

  // An additive mask with -inf: a whole row of batch 1, and some single keys. Its gradient is 0
  // on that row and wherever it is -inf, and finite everywhere.
  std::vector<double> m(static_cast<size_t>(B * L * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < S; ++j)
        m[(b * L + i) * S + j] = (b == 1 && i == 2) || (j == 2 && i != 0) ? -kInf : 0.3 * static_cast<double>(i - j);
  Tensor add = leaf(from_vector(m, {B, 1, L, S}));
  Tensor q2 = leaf(q.detach().clone());
  Tensor out2 = sdpa(q2, k.detach(), v.detach(), {add});
  REQUIRE(all_finite(out2));
  REQUIRE(all_zero(out2.select(0, 1).select(1, 2)));
  out2.sum().backward();
  REQUIRE(add.grad().shape() == add.shape());
  REQUIRE(all_finite(add.grad()));
  REQUIRE(all_zero(add.grad().select(0, 1).select(1, 2)));
  REQUIRE(all_zero(add.grad().select(3, 2).narrow(2, 1, L - 1)));
  REQUIRE(all_zero(q2.grad().select(0, 1).select(1, 2)));
  require_matches_reference({q.detach(), k.detach(), v.detach(), add.detach().requires_grad_()},
                            [](const TensorList& x) { return Problem{x[0], x[1], x[2], {x[3]}}; });

  // Every key masked for every query: zeros, and zero gradients.
  for (const Tensor& none : {zeros({L, S}, boolean), full({L, S}, -kInf, f64)}) {
    Tensor q3 = leaf(q.detach().clone()), k3 = leaf(k.detach().clone()), v3 = leaf(v.detach().clone());
    Tensor out3 = sdpa(q3, k3, v3, {none});
    REQUIRE(out3.shape() == Shape{B, H, L, 3});
    REQUIRE(all_zero(out3));
    (out3 * randn(out3.shape(), f64)).sum().backward();
    for (const Tensor& t : {q3, k3, v3}) REQUIRE((!t.grad().defined() || all_zero(t.grad())));
  }
}

TEST_CASE("scaled_dot_product_attention: NaN propagates as in the composition; only masking gives 0",
          "[attention]") {
  // A NaN score is not a masked key: a query with a NaN in q, or a NaN score from the mask, gets
  // NaN (PyTorch's math path too), never the 0 of a fully masked query. Key j's NaN reaches every
  // query that attends to it.
  manual_seed(32);
  for (Dtype dt : {f64, f32}) {
    INFO(dt);
    Tensor q = randn({2, 5, 3}, f64).to(dt), k = randn({2, 6, 3}, f64).to(dt), v = randn({2, 6, 4}, f64).to(dt);
    auto row_is_nan = [](const Tensor& t) {
      for (double x : vals(t.to(f64)))
        if (!std::isnan(x)) return false;
      return true;
    };
    Tensor clean = sdpa(q, k, v);
    // One NaN element in query 1 of batch 0 (and a whole NaN query 3 of batch 1).
    Tensor qn = q.clone();
    qn.select(0, 0).select(0, 1).select(0, 0).fill_(kNaN);
    qn.select(0, 1).select(0, 3).fill_(kNaN);
    Tensor out = sdpa(qn, k, v);
    REQUIRE(row_is_nan(out.select(0, 0).select(0, 1)));
    REQUIRE(row_is_nan(out.select(0, 1).select(0, 3)));
    REQUIRE(all_finite(out.select(0, 0).narrow(0, 2, 3)));
    require_close(vals(out.select(0, 0).narrow(0, 2, 3).contiguous()),
                  vals(clean.select(0, 0).narrow(0, 2, 3).contiguous()), dt == f64 ? 1e-14 : 1e-6);
    // A NaN in key 2: every query attends to it, without a mask; under causal only queries >= 2.
    Tensor kn = k.clone();
    kn.select(1, 2).select(1, 1).fill_(kNaN);
    REQUIRE(row_is_nan(sdpa(q, kn, v)));
    Tensor causal = sdpa(q, kn, v, {Tensor(), 0, true});
    REQUIRE(all_finite(causal.narrow(1, 0, 2)));
    REQUIRE(row_is_nan(causal.narrow(1, 2, 3)));
    // A NaN in the additive mask: that query is NaN; a whole NaN row of the mask too.
    Tensor m = zeros({5, 6}, dt);
    m.select(0, 0).select(0, 4).fill_(kNaN);
    m.select(0, 2).fill_(kNaN);
    Tensor masked = sdpa(q, k, v, {m});
    REQUIRE(row_is_nan(masked.select(1, 0)));
    REQUIRE(row_is_nan(masked.select(1, 2)));
    REQUIRE(all_finite(masked.select(1, 1)));
    // A NaN in value 2 reaches every query that gives it a non-zero weight (all of them here).
    Tensor vn = v.clone();
    vn.select(1, 2).select(1, 3).fill_(kNaN);
    Tensor through_v = sdpa(q, k, vn);
    REQUIRE(row_is_nan(through_v.select(2, 3)));
    REQUIRE(all_finite(through_v.narrow(2, 0, 3)));
  }
}

TEST_CASE("scaled_dot_product_attention: gradients equal the composition's for every option", "[attention][autograd]") {
  manual_seed(27);
  auto qkv = [](const Shape& batch, int64_t L, int64_t S, int64_t E, int64_t Ev) {
    return TensorList{leaf(randn(cat_shape(batch, {L, E}), f64)), leaf(randn(cat_shape(batch, {S, E}), f64)),
                      leaf(randn(cat_shape(batch, {S, Ev}), f64))};
  };
  auto plain = [](Options o) { return [o](const TensorList& x) { return Problem{x[0], x[1], x[2], o}; }; };
  // Additive masks that require grad: their gradient is summed to their own shape.
  auto with_mask = [](bool causal) {
    return [causal](const TensorList& x) {
      Problem p{x[0], x[1], x[2], {x[3]}};
      p.o.causal = causal;
      return p;
    };
  };
  for (const Shape& ms : {Shape{6, 9}, Shape{2, 1, 6, 9}, Shape{1, 3, 1, 9}, Shape{9}, Shape{2, 3, 6, 9}}) {
    TensorList x = qkv({2, 3}, 6, 9, 5, 4);
    x.push_back(leaf(randn(ms, f64)));
    require_matches_reference(x, with_mask(false));
  }
  for (auto [L, S] : {std::pair<int64_t, int64_t>{37, 37}, {130, 37}, {37, 130}, {1, 1}}) {
    Options o;
    o.causal = true;
    require_matches_reference(qkv({2, 2}, L, S, 8, 8), plain(o));
    o.causal = false;
    o.scale = 0.2;
    require_matches_reference(qkv({3}, L, S, 8, 5), plain(o));
  }
  require_matches_reference(qkv({}, 70, 65, 16, 16), plain({}));
  require_matches_reference(qkv({2, 1, 2}, 7, 3, 4, 4), plain({Tensor(), 0, true}));
  // Only the mask requires grad; then only v.
  {
    TensorList x = qkv({2, 2}, 4, 5, 3, 3);
    for (auto& t : x) t = t.detach();
    x.push_back(leaf(randn({4, 5}, f64)));
    require_matches_reference(x, with_mask(false));
    x[2] = leaf(x[2].clone());
    x[3] = x[3].detach();
    require_matches_reference(x, with_mask(false));
  }
}

TEST_CASE("scaled_dot_product_attention: gradcheck in f64 w.r.t. q, k, v and an additive mask",
          "[attention][autograd]") {
  manual_seed(28);
  Tensor q = leaf(randn({2, 2, 4, 3}, f64)), k = leaf(randn({2, 2, 5, 3}, f64)), v = leaf(randn({2, 2, 5, 2}, f64));
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2]); }, {q, k, v});
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {Tensor(), 0, true}); }, {q, k, v});
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {Tensor(), 0, false, 0.8}); },
                    {q, k, v});
  // Causal with L > S and L < S.
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {Tensor(), 0, true}); },
                    {leaf(randn({2, 6, 3}, f64)), leaf(randn({2, 3, 3}, f64)), leaf(randn({2, 3, 4}, f64))});
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {Tensor(), 0, true}); },
                    {leaf(randn({3, 3}, f64)), leaf(randn({6, 3}, f64)), leaf(randn({6, 2}, f64))});
  // A boolean mask with a fully masked query.
  Tensor bm = bool_mask(4, 5, [](int64_t i, int64_t j) { return i != 2 && (i + j) % 2 == 0; });
  require_gradcheck([bm](const TensorList& in) { return sdpa(in[0], in[1], in[2], {bm}); }, {q, k, v});
  // Additive masks that require grad: [L, S] and [B, 1, L, S] (broadcast), [B, H, L, S], with and
  // without -inf (a masked key, a fully masked query), alone or with q, k, v.
  std::vector<double> m(20);
  for (size_t e = 0; e < m.size(); ++e) m[e] = e == 3 || (e >= 10 && e < 15) ? -kInf : 0.1 * static_cast<double>(e);
  const TensorList masks = {leaf(randn({4, 5}, f64)), leaf(randn({2, 1, 4, 5}, f64)), leaf(randn({2, 2, 4, 5}, f64)),
                            leaf(from_vector(m, {4, 5})), leaf(randn({5}, f64))};
  for (const Tensor& mask : masks) {
    INFO("mask " << shape_str(mask.shape()));
    require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {in[3]}); }, {q, k, v, mask});
    require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {in[3], 0, false, 1.3}); },
                      {q.detach(), k.detach(), v.detach(), mask});
  }
  // 3-D, 5-D, and strided inputs built inside the function.
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2]); },
                    {leaf(randn({3, 4, 2}, f64)), leaf(randn({3, 3, 2}, f64)), leaf(randn({3, 3, 5}, f64))});
  require_gradcheck([](const TensorList& in) { return sdpa(in[0], in[1], in[2], {Tensor(), 0, true}); },
                    {leaf(randn({2, 1, 2, 3, 2}, f64)), leaf(randn({2, 1, 2, 4, 2}, f64)),
                     leaf(randn({2, 1, 2, 4, 3}, f64))});
  require_gradcheck(
      [](const TensorList& in) {
        TensorList qkv = chunk(in[0], 3, -1);
        auto heads = [](const Tensor& t) { return t.view({2, 5, 2, 3}).transpose(1, 2); };
        return sdpa(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {Tensor(), 0, true});
      },
      {leaf(randn({2, 5, 18}, f64))});
  require_gradcheck(
      [](const TensorList& in) { return sdpa(in[0], in[1].expand({2, 3, 5, 3}), in[2].expand({2, 3, 5, 2})); },
      {leaf(randn({2, 3, 4, 3}, f64)), leaf(randn({2, 1, 5, 3}, f64)), leaf(randn({2, 1, 5, 2}, f64))});
}

TEST_CASE("scaled_dot_product_attention: the result requires grad when an input does; a boolean mask never",
          "[attention][autograd]") {
  manual_seed(29);
  Tensor q = randn({2, 4, 3}, f64), k = randn({2, 5, 3}, f64), v = randn({2, 5, 2}, f64);
  REQUIRE_FALSE(sdpa(q, k, v).requires_grad());
  REQUIRE_FALSE(sdpa(q, k, v, {lt(rand({4, 5}), 0.5)}).requires_grad());
  Tensor ql = leaf(q.clone());
  {
    NoGradGuard ng;
    REQUIRE_FALSE(sdpa(ql, k, v).requires_grad());
  }
  // Only v: only v gets a gradient.
  Tensor vl = leaf(v.clone());
  Tensor out = sdpa(q, k, vl);
  REQUIRE(out.requires_grad());
  out.sum().backward();
  REQUIRE(vl.grad().shape() == v.shape());
  // Only the additive mask: its gradient has its own (broadcast) shape.
  Tensor mask = leaf(randn({1, 5}, f64));
  Tensor out2 = sdpa(q, k, v, {mask});
  REQUIRE(out2.requires_grad());
  out2.sum().backward();
  REQUIRE(mask.grad().shape() == Shape{1, 5});
  // Sum over keys of dL/dmask is 0 for each query (softmax's shift invariance), summed here over
  // queries too.
  REQUIRE(std::abs(mask.grad().sum().item<double>()) < 1e-12);
}

TEST_CASE("scaled_dot_product_attention: dropout keeps what attention_keep says at the reserved offset",
          "[attention][random]") {
  // Every configuration against the reference with the keep bits rebuilt from the generator state
  // taken before the call, gradients included; the forward advances the generator by
  // attention_dropout_blocks(B, H, L, S), the backward by nothing (require_matches_reference).
  uint64_t seed = 100;
  for (double p : {0.3, 0.75}) {
    INFO("dropout_p " << p);
    auto qkv = [](const Shape& batch, int64_t L, int64_t S, int64_t E, int64_t Ev) {
      return TensorList{leaf(randn(cat_shape(batch, {L, E}), f64)), leaf(randn(cat_shape(batch, {S, E}), f64)),
                        leaf(randn(cat_shape(batch, {S, Ev}), f64))};
    };
    auto with = [p](bool causal, Tensor mask) {
      return [=](const TensorList& x) {
        Problem pr{x[0], x[1], x[2], {x.size() > 3 ? x[3] : mask, p, causal}};
        return pr;
      };
    };
    manual_seed(seed++);
    require_matches_reference(qkv({2, 3}, 37, 29, 8, 8), with(false, Tensor()));
    manual_seed(seed++);
    require_matches_reference(qkv({3}, 20, 33, 4, 6), with(true, Tensor()));
    manual_seed(seed++);
    require_matches_reference(qkv({}, 17, 65, 4, 4), with(false, lt(rand({17, 65}), 0.7)));
    manual_seed(seed++);
    require_matches_reference(qkv({2, 1, 2}, 5, 3, 2, 2), with(true, Tensor()));
    manual_seed(seed++);
    TensorList x = qkv({2, 2}, 6, 7, 3, 3);
    x.push_back(leaf(randn({2, 1, 6, 7}, f64)));
    require_matches_reference(x, with(false, Tensor()));
    // Not from the start of a stream: the offset the reference reads is whatever the state says.
    manual_seed(seed++);
    (void)rand({13});
    require_matches_reference(qkv({1, 2}, 130, 70, 8, 8), with(false, Tensor()));
  }

  // The fraction kept is about 1 - p, and a kept weight is scaled by 1 / (1 - p): with scale 0
  // every weight is 1/S, so with v = 1 output i is (keys kept for i) / ((1 - p) S).
  manual_seed(7);
  const int64_t L = 64, S = 128;
  Tensor q = randn({2, L, 4}, f64), k = randn({2, S, 4}, f64);
  const PhiloxState st = get_rng_state();
  Tensor out = sdpa(q, k, ones({2, S, 1}, f64), {Tensor(), 0.25, false, 0.0});
  const std::vector<double> o = vals(out);
  int64_t kept_total = 0;
  for (int64_t r = 0; r < 2 * L; ++r) {
    int64_t kept = 0;
    for (int64_t j = 0; j < S; ++j) kept += detail::attention_keep(st.seed, st.offset, r * S + j, 0.25f);
    kept_total += kept;
    REQUIRE(std::abs(o[r] - static_cast<double>(kept) / (0.75 * S)) < 1e-12);
  }
  // Binomial(16384, 0.75): mean 12288, sd ~55.
  REQUIRE(std::abs(kept_total - 12288) < 400);
}

TEST_CASE("scaled_dot_product_attention: dropout is one draw per call; dropout_p 0 draws nothing",
          "[attention][random]") {
  Tensor q = randn({2, 3, 9, 4}, f64), k = randn({2, 3, 11, 4}, f64), v = randn({2, 3, 11, 5}, f64);
  manual_seed(5);
  Tensor a = sdpa(q, k, v, {Tensor(), 0.5});
  Tensor b = sdpa(q, k, v, {Tensor(), 0.5});
  REQUIRE(get_rng_state().offset == 2 * detail::attention_dropout_blocks(2, 3, 9, 11));
  REQUIRE_FALSE(a.equal(b));  // the second call reads the next blocks
  manual_seed(5);
  REQUIRE(sdpa(q, k, v, {Tensor(), 0.5}).equal(a));  // the same seed, the same bits
  {
    NoGradGuard ng;  // no training flag: dropout_p applies, and draws, with or without grad
    REQUIRE(sdpa(q, k, v, {Tensor(), 0.5}).equal(b));
  }
  // dropout_p 0: the generator is left alone and the result is the plain one.
  manual_seed(6);
  (void)rand({3});
  const PhiloxState before = get_rng_state();
  Tensor plain = sdpa(q, k, v, {Tensor(), 0.0, true});
  REQUIRE(get_rng_state().seed == before.seed);
  REQUIRE(get_rng_state().offset == before.offset);
  require_close(vals(plain), vals(reference(q, k, v, {Tensor(), 0, true})), 1e-12);
  Tensor ql = leaf(q.clone());
  sdpa(ql, k, v).sum().backward();
  REQUIRE(get_rng_state().offset == before.offset);
}

TEST_CASE("scaled_dot_product_attention: dropout's gradient (gradcheck in f64, the generator reset in the function)",
          "[attention][autograd][random]") {
  manual_seed(30);
  const PhiloxState s0{77, 5};
  Tensor q = leaf(randn({2, 2, 4, 3}, f64)), k = leaf(randn({2, 2, 5, 3}, f64)), v = leaf(randn({2, 2, 5, 2}, f64));
  require_gradcheck(
      [s0](const TensorList& in) {
        set_rng_state(s0);
        return sdpa(in[0], in[1], in[2], {Tensor(), 0.4});
      },
      {q, k, v});
  require_gradcheck(
      [s0](const TensorList& in) {
        set_rng_state(s0);
        return sdpa(in[0], in[1], in[2], {Tensor(), 0.4, true});
      },
      {q, k, v});
  require_gradcheck(
      [s0](const TensorList& in) {
        set_rng_state(s0);
        return sdpa(in[0], in[1], in[2], {in[3], 0.6});
      },
      {q, k, v, leaf(randn({2, 1, 4, 5}, f64))});
}

TEST_CASE("scaled_dot_product_attention: f32, bf16 and f16 against the f64 result of the same values", "[attention]") {
  manual_seed(31);
  struct Tol {
    Dtype dt;
    double out, grad;
  };
  // bf16/f16: accumulated in f32, the result rounded once (2^-9, 2^-12 relative); the tolerances
  // leave room for a kernel that rounds the weights to the input dtype before multiplying by v.
  for (Tol t : {Tol{f32, 1e-5, 5e-5}, Tol{bf16, 1e-2, 2e-2}, Tol{f16, 2e-3, 5e-3}}) {
    for (int variant = 0; variant < 4; ++variant) {
      INFO(t.dt << ", variant " << variant);
      // Values representable in the dtype, so that both computations read the same inputs.
      Tensor q = randn({2, 3, 37, 16}, f64).to(t.dt), k = randn({2, 3, 45, 16}, f64).to(t.dt),
             v = randn({2, 3, 45, 24}, f64).to(t.dt);
      Options o;
      if (variant == 1) o.causal = true;
      if (variant == 2) o.mask = (randn({37, 45}, f64) * 2).to(t.dt);  // additive: q's dtype
      if (variant == 3) o.mask = lt(rand({2, 1, 37, 45}), 0.8);
      Tensor ql = leaf(q.clone()), kl = leaf(k.clone()), vl = leaf(v.clone());
      Tensor out = sdpa(ql, kl, vl, o);
      REQUIRE(out.dtype() == t.dt);
      REQUIRE(out.shape() == Shape{2, 3, 37, 24});
      Options o64 = o;
      if (o.mask.defined() && o.mask.dtype() != boolean) o64.mask = o.mask.to(f64);
      Tensor q64 = leaf(q.to(f64)), k64 = leaf(k.to(f64)), v64 = leaf(v.to(f64));
      Tensor want = reference(q64, k64, v64, o64);
      REQUIRE(all_finite(out));
      require_close(vals(out.to(f64)), vals(want), t.out);
      Tensor g = randn(out.shape(), f64).to(t.dt);
      out.backward(g);
      want.backward(g.to(f64));
      for (const auto& [got, ref] : {std::pair{ql, q64}, std::pair{kl, k64}, std::pair{vl, v64}}) {
        REQUIRE(got.grad().dtype() == t.dt);
        REQUIRE(all_finite(got.grad()));
        require_close(vals(got.grad().to(f64)), vals(ref.grad()), t.grad);
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention of empty problems", "[attention]") {
  // No keys: every query is fully masked, so the output is zeros (PyTorch's [L, 0] @ [0, Ev] too).
  Tensor q = leaf(randn({2, 3, 4, 8}, f64));
  Tensor out = sdpa(q, randn({2, 3, 0, 8}, f64), randn({2, 3, 0, 6}, f64));
  REQUIRE(out.shape() == Shape{2, 3, 4, 6});
  REQUIRE(all_zero(out));
  out.sum().backward();
  REQUIRE((!q.grad().defined() || (q.grad().shape() == q.shape() && all_zero(q.grad()))));
  // No queries, no batch.
  REQUIRE(sdpa(randn({2, 3, 0, 8}), randn({2, 3, 5, 8}), randn({2, 3, 5, 6})).shape() == Shape{2, 3, 0, 6});
  REQUIRE(sdpa(randn({0, 3, 4, 8}), randn({0, 3, 5, 8}), randn({0, 3, 5, 6})).shape() == Shape{0, 3, 4, 6});
  REQUIRE(sdpa(randn({0, 8}), randn({5, 8}), randn({5, 6}), {Tensor(), 0, true}).shape() == Shape{0, 6});
  // Dropout over nothing reserves nothing.
  Tensor q0 = randn({2, 0, 8}), k0 = randn({2, 5, 8}), v0 = randn({2, 5, 6});
  const PhiloxState before = get_rng_state();
  REQUIRE(sdpa(q0, k0, v0, {Tensor(), 0.5}).shape() == Shape{2, 0, 6});
  REQUIRE(get_rng_state().offset == before.offset);
}

TEST_CASE("scaled_dot_product_attention: errors name the op and the shapes", "[attention]") {
  const char* op = "[scaled_dot_product_attention]";
  Tensor q = randn({2, 3, 4, 8}), k = randn({2, 3, 5, 8}), v = randn({2, 3, 5, 6});
  REQUIRE(sdpa(q, k, v).shape() == Shape{2, 3, 4, 6});
  // Batch dims: q against k, k against v, and ranks that differ.
  REQUIRE_THROWS_WITH(sdpa(q, randn({2, 4, 5, 8}), randn({2, 4, 5, 6})),
                      StartsWith(op) && Contains("[2, 3, 4, 8]") && Contains("[2, 4, 5, 8]"));
  REQUIRE_THROWS_WITH(sdpa(q, k, randn({1, 3, 5, 6})), StartsWith(op) && Contains("[1, 3, 5, 6]"));
  REQUIRE_THROWS_WITH(sdpa(q, randn({3, 5, 8}), randn({3, 5, 6})), StartsWith(op) && Contains("[3, 5, 8]"));
  REQUIRE_THROWS_WITH(sdpa(randn({3, 4, 8}), k, v), StartsWith(op) && Contains("[3, 4, 8]"));
  // E of q and k, S of k and v.
  REQUIRE_THROWS_WITH(sdpa(q, randn({2, 3, 5, 7}), v), StartsWith(op) && Contains("[2, 3, 4, 8]") &&
                                                            Contains("[2, 3, 5, 7]"));
  REQUIRE_THROWS_WITH(sdpa(q, k, randn({2, 3, 6, 6})), StartsWith(op) && Contains("[2, 3, 5, 8]") &&
                                                           Contains("[2, 3, 6, 6]"));
  // Fewer than 2 dims.
  REQUIRE_THROWS_WITH(sdpa(randn({8}), randn({8}), randn({8})), StartsWith(op));
  REQUIRE_THROWS_WITH(sdpa(randn({4, 8}), randn({8}), randn({5, 6})), StartsWith(op));
  REQUIRE_THROWS_WITH(sdpa(scalar_tensor(1.0), scalar_tensor(1.0), scalar_tensor(1.0)), StartsWith(op));
  // Dtypes: integers, and q, k, v that differ.
  REQUIRE_THROWS_WITH(sdpa(randint(0, 3, {2, 4, 8}), randint(0, 3, {2, 5, 8}), randint(0, 3, {2, 5, 6})),
                      StartsWith(op) && Contains("i64"));
  REQUIRE_THROWS_WITH(sdpa(q, k.to(f64), v), StartsWith(op) && Contains("f64") && Contains("f32"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v.to(bf16)), StartsWith(op) && Contains("bf16"));
  REQUIRE_THROWS_WITH(sdpa(q.to(f16), k.to(f16), v), StartsWith(op));
  // Masks: not broadcastable to [2, 3, 4, 5], neither bool nor q's dtype, with is_causal.
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {ones({4, 6}, boolean)}), StartsWith(op) && Contains("[4, 6]"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {zeros({2, 4, 5})}), StartsWith(op) && Contains("[2, 4, 5]"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {zeros({5, 4})}), StartsWith(op) && Contains("[5, 4]"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {zeros({4, 5}, f64)}), StartsWith(op) && Contains("f64"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {zeros({4, 5}, i64)}), StartsWith(op) && Contains("i64"));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {ones({4, 5}, boolean), 0, true}), StartsWith(op));
  REQUIRE_THROWS_WITH(sdpa(q, k, v, {zeros({4, 5}), 0, true}), StartsWith(op));
  // dropout_p in [0, 1).
  for (double p : {-0.1, 1.0, 1.5, kNaN}) {
    INFO("dropout_p " << p);
    REQUIRE_THROWS_WITH(sdpa(q, k, v, {Tensor(), p}), StartsWith(op));
  }
  // Undefined tensors.
  REQUIRE_THROWS_WITH(sdpa(Tensor(), k, v), StartsWith(op));
  REQUIRE_THROWS_WITH(sdpa(q, Tensor(), v), StartsWith(op));
  REQUIRE_THROWS_WITH(sdpa(q, k, Tensor()), StartsWith(op));
  // A refused call draws nothing.
  Tensor bad_k = randn({2, 3, 5, 7});
  const PhiloxState before = get_rng_state();
  REQUIRE_THROWS(sdpa(q, bad_k, v, {Tensor(), 0.5}));
  REQUIRE(get_rng_state().offset == before.offset);
}

// A fully masked row whose query and upstream gradient are inf: its output is 0 whatever they are, so it
// sends no gradient back (0 · (dP - delta) with dP = inf must not become NaN). A partially masked
// row is not special: 0 · inf in P·V gives NaN there, as in PyTorch's composition.
TEST_CASE("scaled_dot_product_attention: a fully masked row passes no NaN back", "[attention]") {
  Tensor q0 = randn({1, 1, 2, 3}, f64);
  q0.select(2, 0).fill_(INFINITY);  // the masked query itself
  Tensor q = q0.detach().requires_grad_();
  Tensor k = randn({1, 1, 2, 3}, f64).requires_grad_();
  Tensor v = randn({1, 1, 2, 3}, f64).requires_grad_();
  Tensor mask = from_vector<bool>({false, false, true, true}, {2, 2});  // row 0: every key masked
  Tensor out = scaled_dot_product_attention(q, k, v, mask);
  REQUIRE(out.select(2, 0).abs().max().item<double>() == 0);
  Tensor w = randn({1, 1, 2, 3}, f64);
  w.select(2, 0).fill_(INFINITY);
  sum(out * w).backward();
  for (const Tensor* t : {&q, &k, &v})
    REQUIRE(sum(logical_or(isnan(t->grad()), isinf(t->grad()))).item<int64_t>() == 0);
  // Row 1 alone: the same gradients as without row 0.
  Tensor q1 = q.detach().narrow(2, 1, 1).requires_grad_();
  Tensor k1 = k.detach().requires_grad_(), v1 = v.detach().requires_grad_();
  sum(scaled_dot_product_attention(q1, k1, v1) * w.narrow(2, 1, 1)).backward();
  REQUIRE(max(abs(k.grad() - k1.grad())).item<double>() < 1e-14);
  REQUIRE(max(abs(v.grad() - v1.grad())).item<double>() < 1e-14);
}

// fuzz_seq_ops' finding: with a tiny scale and huge q and k, dQ = scale · dS · K overflowed in
// dS · K although dQ itself is finite (the scale was applied last). The gradients of q and k are
// linear in v, and v's do not depend on it: v · 1e-200 gives the reference at a safe magnitude.
TEST_CASE("scaled_dot_product_attention: a tiny scale with huge q and k keeps finite gradients", "[attention][fuzz]") {
  const double s = 1e-300;
  // Scores s · q·k of order 1 (an unsaturated softmax); dS ~ |v| = 1e200 and |k| = 1e150, so
  // dS · K ~ 1e350 overflows while dQ = s · dS · K ~ 1e50 does not.
  Tensor q = (randn({2, 2, 8, 2}, f64) * 1e150).requires_grad_();
  Tensor k = (randn({2, 2, 8, 2}, f64) * 1e150).requires_grad_();
  Tensor v = (randn({2, 2, 8, 2}, f64) * 1e200).requires_grad_();
  Tensor w = randn({2, 2, 8, 2}, f64);
  sum(scaled_dot_product_attention(q, k, v, {}, 0.0, true, s) * w).backward();
  Tensor q2 = q.detach().requires_grad_(), k2 = k.detach().requires_grad_();
  Tensor v2 = (v.detach() * 1e-200).requires_grad_();
  sum(scaled_dot_product_attention(q2, k2, v2, {}, 0.0, true, s) * w).backward();
  for (const Tensor* t : {&q, &k, &v})
    REQUIRE(sum(logical_or(isnan(t->grad()), isinf(t->grad()))).item<int64_t>() == 0);
  REQUIRE(max(abs(q.grad() - q2.grad() * 1e200)).item<double>() <= 1e-12 * max(abs(q.grad())).item<double>());
  REQUIRE(max(abs(k.grad() - k2.grad() * 1e200)).item<double>() <= 1e-12 * max(abs(k.grad())).item<double>());
  REQUIRE(max(abs(v.grad() - v2.grad())).item<double>() <= 1e-12 * max(abs(v.grad())).item<double>());
}

// fuzz_seq_ops' finding (tools/fuzz/corpus/seq_ops/crash-attention-negzero-scale): scale = -0 with
// q = k = 1.5e300 and one key. The scale goes into q first, so every score is ±0 and the output is
// v exactly; the target's reference computed q·k first, which overflowed, and -0 · inf is NaN. The
// reference was wrong, not the op: the scores are (scale · q)·k, as the op's contract says.
TEST_CASE("scaled_dot_product_attention: a zero scale with huge q and k attends evenly", "[attention][fuzz]") {
  for (const double scale : {-0.0, 0.0}) {
    Tensor q = full({2, 8, 1}, 0x1.7e43c8800759cp+996, f64).requires_grad_();
    Tensor k = full({2, 3, 1}, 0x1.7e43c8800759cp+996, f64).requires_grad_();
    Tensor v = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3, 1}).requires_grad_();
    Tensor out = scaled_dot_product_attention(q, k, v, {}, 0.0, false, scale);
    // Every weight 1/3: each row is the mean of its batch's values.
    REQUIRE(max(abs(out - from_vector<double>({2, 5}, {2, 1, 1}))).item<double>() == 0);
    sum(out).backward();
    for (const Tensor* t : {&q, &k, &v})
      REQUIRE(sum(logical_or(isnan(t->grad()), isinf(t->grad()))).item<int64_t>() == 0);
    REQUIRE(max(abs(v.grad() - full({2, 3, 1}, 8.0 / 3, f64))).item<double>() < 1e-15);
  }
}

// Stride-0 views can have sizes whose B·H·L·S overflows int64: dropout cannot number its weights,
// which is a clear error before anything is drawn or allocated.
TEST_CASE("scaled_dot_product_attention: dropout over more weights than int64 counts is an error", "[attention]") {
  const int64_t n = int64_t{1} << 32;
  Tensor q = zeros({1, 1}).expand({n, 1});
  const PhiloxState before = get_rng_state();
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, q, q, {}, 0.5),
                      Catch::StartsWith("[scaled_dot_product_attention] dropout over B·H·L·S") &&
                          Catch::Contains("overflows int64"));
  REQUIRE(get_rng_state().offset == before.offset);
}
