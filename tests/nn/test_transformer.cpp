// nn: MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer. Reference values marked
// "torch 1.13" were computed with PyTorch 1.13 (f64) from the deterministic parameters and inputs
// of fill_params/ramp below and pasted here; tests/parity/test_module_parity.cpp compares against
// PyTorch itself on random draws.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> values(const Tensor& t) { return to_dtype(t.detach(), f64).contiguous().to_vector<double>(); }

void require_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-12) {
  auto g = values(got);
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    REQUIRE(std::abs(g[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

void require_close(const Tensor& got, const Tensor& want, double tol = 1e-12) {
  REQUIRE(got.shape() == want.shape());
  require_close(got, values(want), tol);
}

// The parameters the torch 1.13 references were computed with: the k-th state-dict entry's
// element i is ((37 i + 11 k) mod 23) / 23 - 0.5.
void fill_params(nn::Module& m) {
  NoGradGuard guard;
  int64_t k = 0;
  for (const auto& [name, t] : m.state_dict()) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>((static_cast<int64_t>(i) * 37 + k * 11) % 23) / 23.0 - 0.5;
    copy_(t, from_vector<double>(v, t.shape()));
    ++k;
  }
}

// The references' inputs: element i is ((53 i + 7 seed) mod 31) / 31 * 2 - 1.
Tensor ramp(const Shape& shape, int64_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((static_cast<int64_t>(i) * 53 + seed * 7) % 31) / 31.0 * 2 - 1;
  return from_vector<double>(v, shape);
}

Tensor bools(const std::vector<int>& v, const Shape& shape) {
  std::vector<double> d(v.begin(), v.end());
  return ne(from_vector<double>(d, shape), 0.0);
}

bool all_finite(const Tensor& t) {
  for (double v : values(t))
    if (!std::isfinite(v)) return false;
  return true;
}

Tensor leaf(const Tensor& t) {
  t.requires_grad_();
  return t;
}

// gradcheck over `inputs` and every parameter of `m`: the parameters are swapped for gradcheck's
// copies (set_parameter) before each run, so the finite differences perturb them too.
void require_module_gradcheck(nn::Module& m, const TensorList& inputs,
                              const std::function<Tensor(const TensorList&)>& run) {
  std::vector<std::string> names;
  TensorList all = inputs;
  for (const auto& [name, p] : m.named_parameters()) {
    names.push_back(name);
    all.push_back(leaf(clone(p.detach())));
  }
  const size_t n = inputs.size();
  auto fn = [&](const TensorList& in) {
    for (size_t i = 0; i < names.size(); ++i) m.set_parameter(names[i], in[n + i]);
    return run(TensorList(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n)));
  };
  auto r = gradcheck(fn, all);
  INFO(r.report);
  REQUIRE(r.ok);
}

std::shared_ptr<nn::MultiheadAttention> mha64(int64_t e, int64_t h, bool batch_first = false, bool bias = true) {
  auto m = std::make_shared<nn::MultiheadAttention>(e, h, 0.0, bias, batch_first);
  m->to(f64);
  return m;
}

}  // namespace

// ---- construction ----

TEST_CASE("MultiheadAttention: PyTorch's parameter names, shapes and init", "[nn][transformer]") {
  manual_seed(0);
  nn::MultiheadAttention mha(8, 2);
  REQUIRE(mha.state_dict().keys() ==
          std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  REQUIRE(mha.in_proj_weight.shape() == Shape{24, 8});
  REQUIRE(mha.in_proj_bias.shape() == Shape{24});
  REQUIRE(mha.out_proj->weight.shape() == Shape{8, 8});
  REQUIRE(mha.head_dim == 4);
  REQUIRE(mha.max_inputs() == 5);
  // xavier_uniform on [3E, E]: U(-b, b), b = sqrt(6 / (E + 3E)); zero biases; out_proj.weight
  // keeps Linear's U(-1/sqrt(E), 1/sqrt(E)).
  const double bound = std::sqrt(6.0 / 32.0);
  REQUIRE(max(abs(mha.in_proj_weight)).item<double>() <= bound);
  REQUIRE(max(abs(mha.in_proj_weight)).item<double>() > 0.8 * bound);
  REQUIRE(max(abs(mha.in_proj_bias)).item<double>() == 0.0);
  REQUIRE(max(abs(mha.out_proj->bias)).item<double>() == 0.0);
  REQUIRE(max(abs(mha.out_proj->weight)).item<double>() <= 1.0 / std::sqrt(8.0));
  REQUIRE(mha.str() ==
          "MultiheadAttention(embed_dim=8, num_heads=2, dropout=0, bias=true, batch_first=false\n"
          "  (out_proj): Linear(in_features=8, out_features=8, bias=true)\n)");

  nn::MultiheadAttention no_bias(8, 4, 0.0, /*bias=*/false);
  REQUIRE(no_bias.state_dict().keys() == std::vector<std::string>{"in_proj_weight", "out_proj.weight"});
  REQUIRE_FALSE(no_bias.in_proj_bias.defined());
}

TEST_CASE("Transformer layers: PyTorch's children, names and options", "[nn][transformer]") {
  nn::TransformerEncoderLayer enc(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .norm_first = true});
  REQUIRE(enc.named_children().keys() == std::vector<std::string>{"self_attn", "linear1", "dropout", "linear2", "norm1",
                                                                  "norm2", "dropout1", "dropout2"});
  REQUIRE(enc.state_dict().keys() ==
          std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                   "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                                   "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"});
  REQUIRE(enc.linear1->weight.shape() == Shape{16, 8});
  REQUIRE(enc.max_inputs() == 3);
  REQUIRE(enc.extra_repr() == "activation=relu, norm_first=true");

  nn::TransformerEncoderLayer positional(8, 2, 16, 0.2, nn::Activation::gelu, 1e-6, true, false);
  REQUIRE(positional.options.dim_feedforward == 16);
  REQUIRE(positional.options.dropout == 0.2);
  REQUIRE(positional.self_attn->dropout == 0.2);
  REQUIRE(positional.dropout1->p == 0.2);
  REQUIRE(positional.self_attn->batch_first);
  REQUIRE(positional.norm1->eps == 1e-6);
  REQUIRE(positional.extra_repr() == "activation=gelu, norm_first=false");
  nn::TransformerEncoderLayer defaults(8, 2);
  REQUIRE(defaults.linear1->out_features == 2048);
  REQUIRE(defaults.dropout->p == 0.1);

  nn::TransformerDecoderLayer dec(8, 2, {.dim_feedforward = 16});
  REQUIRE(dec.named_children().keys() == std::vector<std::string>{"self_attn", "multihead_attn", "linear1", "dropout",
                                                                  "linear2", "norm1", "norm2", "norm3", "dropout1",
                                                                  "dropout2", "dropout3"});
  REQUIRE(dec.state_dict().size() == 4 + 4 + 4 + 6);
  REQUIRE(dec.max_inputs() == 6);
}

// ---- values ----

TEST_CASE("MultiheadAttention: forward and weights against torch 1.13", "[nn][transformer]") {
  auto mha = mha64(4, 2);
  fill_params(*mha);
  const Tensor q = ramp({3, 2, 4}, 1), memory = ramp({2, 2, 4}, 2);
  const Tensor padding = bools({0, 0, 0, 1}, {2, 2});
  const Tensor mask = from_vector<double>({0, -1, 0.5, 0, 0.25, -0.5}, {3, 2});
  // torch 1.13: nn.MultiheadAttention(4, 2) on (q, memory, memory, key_padding_mask, attn_mask).
  const std::vector<double> want_out{
      -0.18802977406240384, -0.3519880139748962,  0.07229259539107571,  0.047657405254568685, 0.035916824196597336,
      -0.39999390206719926, 0.30014025245441794,  -0.06774803341667165, -0.24978738604385498, -0.32081644669079723,
      0.02653658804247125,  0.06326615203248875,  0.035916824196597336, -0.39999390206719926, 0.30014025245441794,
      -0.06774803341667165, -0.17399845983895526, -0.35538997847865483, 0.10037085312004695,  0.050375798991937226,
      0.035916824196597336, -0.39999390206719926, 0.30014025245441794,  -0.06774803341667165};
  const std::vector<double> want_weights{0.7568244144592144,
                                         0.2431755855407856,
                                         0.6402613099974621,
                                         0.35973869000253794,
                                         0.7751389312626674,
                                         0.22486106873733266,
                                         1.0,
                                         0.0,
                                         1.0,
                                         0.0,
                                         1.0,
                                         0.0};
  Tensor out = (*mha)(q, memory, memory, padding, mask);
  REQUIRE(out.shape() == Shape{3, 2, 4});
  require_close(out, want_out);
  auto [out2, weights] = mha->forward_with_weights(q, memory, memory, padding, mask);
  require_close(out2, want_out);
  REQUIRE(weights.shape() == Shape{2, 3, 2});
  require_close(weights, want_weights);
}

TEST_CASE("TransformerEncoderLayer: forward against torch 1.13", "[nn][transformer]") {
  nn::TransformerEncoderLayer enc(
      4, 2, {.dim_feedforward = 6, .dropout = 0.0, .activation = nn::Activation::gelu, .batch_first = true});
  enc.to(f64);
  fill_params(enc);
  const Tensor src = ramp({2, 3, 4}, 3);
  const Tensor causal = bools({0, 1, 1, 0, 0, 1, 0, 0, 0}, {3, 3});  // true: not allowed
  // torch 1.13: nn.TransformerEncoderLayer(4, 2, 6, dropout=0, activation="gelu", batch_first=True).
  const std::vector<double> want{-0.4018977717830824,  0.2140574794873559,  -0.2043038014106244,  -0.545636366192829,
                                 -0.34499388170945505, 0.1831882063064167,  0.2613137755220166,   -0.4971705385638868,
                                 -0.3402971833352536,  0.18326917299030987, 0.27404050937738367,  -0.49612931305870367,
                                 -0.5247993326382503,  0.2044121946237691,  -0.15445098137598598, -0.4971742503855267,
                                 -0.5194123684950156,  0.2032809506375931,  -0.14491389578467745, -0.4983041241811908,
                                 -0.2855867831912958,  0.24054305785562646, -0.2711891568066828,  -0.578426078088101};
  require_close(enc(src, causal), want);
}

TEST_CASE("MultiheadAttention: forward_with_weights' output equals forward's", "[nn][transformer]") {
  manual_seed(3);
  for (bool batch_first : {false, true}) {
    auto mha = mha64(8, 2, batch_first);
    const Tensor q = randn(batch_first ? Shape{3, 4, 8} : Shape{4, 3, 8}, f64);
    const Tensor kv = randn(batch_first ? Shape{3, 5, 8} : Shape{5, 3, 8}, f64);
    const Tensor padding = bools({0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {3, 5});
    const Tensor mask = randn({4, 5}, f64);
    for (const auto& [p, m] : std::vector<std::pair<Tensor, Tensor>>{
             {Tensor(), Tensor()}, {padding, Tensor()}, {Tensor(), mask}, {padding, mask}}) {
      INFO("batch_first " << batch_first << ", padding " << p.defined() << ", mask " << m.defined());
      Tensor out = mha->call({q, kv, kv, p, m});
      auto [with, averaged] = mha->forward_with_weights(q, kv, kv, p, m);
      require_close(with, out);
      REQUIRE(averaged.shape() == Shape{3, 4, 5});
      require_close(sum(averaged, {-1}), values(ones({3, 4}, f64)));
      auto [again, per_head] = mha->forward_with_weights(q, kv, kv, p, m, /*average_attn_weights=*/false);
      REQUIRE(per_head.shape() == Shape{3, 2, 4, 5});
      require_close(mean(per_head, {1}), averaged);
    }
  }
  // Unbatched: [L, E] in, [L, E] out, weights [L, S].
  auto mha = mha64(8, 4);
  const Tensor x = randn({4, 8}, f64);
  auto [out, weights] = mha->forward_with_weights(x, x, x);
  REQUIRE(out.shape() == Shape{4, 8});
  REQUIRE(weights.shape() == Shape{4, 4});
  require_close(out, (*mha)(x));
}

TEST_CASE("MultiheadAttention: batch_first, [L, N, E] and unbatched inputs agree", "[nn][transformer]") {
  manual_seed(4);
  auto mha = mha64(8, 2);
  const Tensor x = randn({2, 5, 8}, f64);  // [N, L, E]
  const Tensor padding = bools({0, 0, 0, 1, 1, 0, 0, 0, 0, 1}, {2, 5});
  mha->batch_first = true;
  const Tensor batch_major = mha->call({x, x, x, padding});
  REQUIRE(batch_major.shape() == Shape{2, 5, 8});
  mha->batch_first = false;
  const Tensor seq_major = mha->call({transpose(x, 0, 1), Tensor(), Tensor(), padding});
  REQUIRE(seq_major.shape() == Shape{5, 2, 8});
  require_close(transpose(seq_major, 0, 1), batch_major);
  // Each batch element alone, unbatched (batch_first does not matter then).
  for (int64_t n = 0; n < 2; ++n) {
    const Tensor xn = select(x, 0, n);
    require_close(mha->call({xn, xn, xn, select(padding, 0, n)}), select(batch_major, 0, n));
  }
  // The three projection paths (one product for q, k, v; one for q and one for k = v; three) agree.
  const Tensor xt = transpose(x, 0, 1);
  const Tensor self = (*mha)(xt);
  require_close(mha->call({xt, clone(xt)}), self);  // value absent: value = key
  require_close(mha->call({xt, clone(xt), clone(xt)}), self);
  require_close(mha->call({xt, Tensor(), Tensor()}), self);  // key absent: self-attention
}

TEST_CASE("MultiheadAttention: a bool mask and its -inf float twin agree", "[nn][transformer]") {
  manual_seed(5);
  auto mha = mha64(8, 2, /*batch_first=*/true);
  const Tensor q = randn({2, 4, 8}, f64), kv = randn({2, 3, 8}, f64);
  const Tensor blocked = bools({0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0}, {4, 3});
  const Tensor blocked_float = masked_fill(zeros({4, 3}, f64), blocked, -kInf);
  const Tensor padding = bools({0, 0, 1, 0, 0, 0}, {2, 3});
  const Tensor padding_float = masked_fill(zeros({2, 3}, f64), padding, -kInf);
  const Tensor want = mha->call({q, kv, kv, padding, blocked});
  require_close(mha->call({q, kv, kv, padding_float, blocked_float}), want);
  require_close(mha->call({q, kv, kv, padding, blocked_float}), want);
  require_close(mha->call({q, kv, kv, padding_float, blocked}), want);
  // Per batch element and head: [N * num_heads, L, S], head h of element n at n * num_heads + h.
  const Tensor per_head = expand(unsqueeze(blocked, 0), {4, 4, 3}).contiguous();
  require_close(mha->call({q, kv, kv, padding, per_head}), want);
  auto [out_b, w_b] = mha->forward_with_weights(q, kv, kv, padding, blocked);
  auto [out_f, w_f] = mha->forward_with_weights(q, kv, kv, padding_float, blocked_float);
  require_close(out_b, want);
  require_close(out_f, want);
  require_close(w_b, w_f);
  // The blocked keys get no weight.
  REQUIRE(max(masked_fill(w_b, logical_not(logical_or(unsqueeze(blocked, 0), unsqueeze(padding, 1))), 0.0))
              .item<double>() == 0.0);
}

TEST_CASE("MultiheadAttention: a query whose keys are all masked gets out_proj's bias (PyTorch: NaN)",
          "[nn][transformer]") {
  manual_seed(6);
  auto mha = mha64(8, 2, /*batch_first=*/true);
  nn::init::normal_(mha->out_proj->bias);
  nn::init::normal_(mha->in_proj_bias);
  // Query 2 may attend to no key; batch element 1 has every key padded, so none of its queries can.
  const Tensor blocked = bools({0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0}, {4, 3});
  const Tensor padding = bools({0, 0, 0, 1, 1, 1}, {2, 3});
  for (bool float_masks : {false, true}) {
    INFO("float masks " << float_masks);
    const Tensor m = float_masks ? masked_fill(zeros({4, 3}, f64), blocked, -kInf) : blocked;
    const Tensor p = float_masks ? masked_fill(zeros({2, 3}, f64), padding, -kInf) : padding;
    const Tensor q = leaf(randn({2, 4, 8}, f64)), kv = leaf(randn({2, 3, 8}, f64));
    const Tensor out = mha->call({q, kv, kv, p, m});
    const std::vector<double> bias = values(mha->out_proj->bias);
    require_close(select(select(out, 0, 0), 0, 2), bias);
    for (int64_t i = 0; i < 4; ++i) require_close(select(select(out, 0, 1), 0, i), bias);
    REQUIRE(all_finite(out));
    mha->zero_grad();
    sum(out * out).backward();
    const Tensor gq = q.grad(), gkv = kv.grad(), gw = mha->in_proj_weight.grad();
    REQUIRE(all_finite(gq));
    REQUIRE(all_finite(gkv));
    REQUIRE(all_finite(gw));
    // Nothing flows back through a dead query: batch element 1's inputs get no gradient.
    REQUIRE(max(abs(select(gq, 0, 1))).item<double>() == 0.0);
    REQUIRE(max(abs(select(gkv, 0, 1))).item<double>() == 0.0);

    // The explicit path: the same output, zero weights on the dead rows, the same gradients.
    const Tensor q2 = leaf(q.detach().clone()), kv2 = leaf(kv.detach().clone());
    auto [out2, weights] = mha->forward_with_weights(q2, kv2, kv2, p, m, /*average_attn_weights=*/false);
    require_close(out2, out);
    REQUIRE(max(abs(select(select(weights, 0, 0), 1, 2))).item<double>() == 0.0);
    REQUIRE(max(abs(select(weights, 0, 1))).item<double>() == 0.0);
    sum(out2 * out2).backward();
    require_close(q2.grad(), gq);
    require_close(kv2.grad(), gkv);
  }
}

// ---- gradients ----

TEST_CASE("MultiheadAttention: gradcheck in f64 (inputs, parameters, float masks)", "[nn][transformer][gradcheck]") {
  manual_seed(7);
  SECTION("self-attention, [L, N, E], no mask") {
    auto mha = mha64(4, 2);
    require_module_gradcheck(*mha, {leaf(randn({3, 2, 4}, f64))}, [&](const TensorList& in) { return (*mha)(in[0]); });
  }
  SECTION("batch_first, key = value, bool key_padding_mask") {
    auto mha = mha64(4, 2, /*batch_first=*/true);
    const Tensor padding = bools({0, 1, 0, 0, 0, 1}, {2, 3});
    require_module_gradcheck(*mha, {leaf(randn({2, 2, 4}, f64)), leaf(randn({2, 3, 4}, f64))},
                             [&](const TensorList& in) {
                               return mha->call({in[0], in[1], in[1], padding});
                             });
  }
  SECTION("[L, N, E], separate key and value, float attn_mask [L, S] (differentiable)") {
    auto mha = mha64(4, 2);
    require_module_gradcheck(*mha,
                             {leaf(randn({3, 2, 4}, f64)), leaf(randn({2, 2, 4}, f64)), leaf(randn({2, 2, 4}, f64)),
                              leaf(randn({3, 2}, f64))},
                             [&](const TensorList& in) {
                               return mha->call({in[0], in[1], in[2], Tensor(), in[3]});
                             });
  }
  SECTION("batch_first, bool attn_mask [N * heads, L, S] and float key_padding_mask") {
    auto mha = mha64(4, 2, /*batch_first=*/true);
    const Tensor blocked = bools({0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0}, {4, 2, 2});
    require_module_gradcheck(*mha, {leaf(randn({2, 2, 4}, f64)), leaf(randn({2, 2}, f64))}, [&](const TensorList& in) {
      return mha->call({in[0], in[0], in[0], in[1], blocked});
    });
  }
  SECTION("unbatched, float attn_mask [heads, L, S] and bool key_padding_mask [S]") {
    auto mha = mha64(4, 2);
    const Tensor padding = bools({0, 0, 1}, {3});
    require_module_gradcheck(*mha, {leaf(randn({2, 4}, f64)), leaf(randn({3, 4}, f64)), leaf(randn({2, 2, 3}, f64))},
                             [&](const TensorList& in) {
                               return mha->call({in[0], in[1], in[1], padding, in[2]});
                             });
  }
  SECTION("no bias") {
    auto mha = mha64(4, 2, /*batch_first=*/true, /*bias=*/false);
    require_module_gradcheck(*mha, {leaf(randn({2, 3, 4}, f64))}, [&](const TensorList& in) { return (*mha)(in[0]); });
  }
  SECTION("forward_with_weights: output and per-head weights, bool and float masks") {
    auto mha = mha64(4, 2);
    const Tensor padding = bools({0, 0, 1, 0}, {2, 2});
    require_module_gradcheck(*mha, {leaf(randn({3, 2, 4}, f64)), leaf(randn({2, 2, 4}, f64)), leaf(randn({3, 2}, f64))},
                             [&](const TensorList& in) {
                               auto [out, w] = mha->forward_with_weights(in[0], in[1], in[1], padding, in[2], false);
                               return cat({flatten(out), flatten(w)});
                             });
  }
}

TEST_CASE("TransformerEncoderLayer: gradcheck in f64, post- and pre-norm, relu and gelu",
          "[nn][transformer][gradcheck]") {
  manual_seed(8);
  const Tensor causal = bools({0, 1, 1, 0, 0, 1, 0, 0, 0}, {3, 3});
  const Tensor padding = bools({0, 0, 0, 0, 0, 1}, {2, 3});
  for (bool norm_first : {false, true})
    for (auto activation : {nn::Activation::relu, nn::Activation::gelu}) {
      const bool batch_first = norm_first != (activation == nn::Activation::gelu);
      INFO("norm_first " << norm_first << ", gelu " << (activation == nn::Activation::gelu) << ", batch_first "
                         << batch_first);
      nn::TransformerEncoderLayer enc(4, 2,
                                      {.dim_feedforward = 6,
                                       .dropout = 0.0,
                                       .activation = activation,
                                       .batch_first = batch_first,
                                       .norm_first = norm_first});
      enc.to(f64);
      const Tensor src = leaf(randn(batch_first ? Shape{2, 3, 4} : Shape{3, 2, 4}, f64));
      require_module_gradcheck(enc, {src}, [&](const TensorList& in) { return enc(in[0], causal, padding); });
    }
  SECTION("unbatched, float src_mask") {
    nn::TransformerEncoderLayer enc(4, 2, {.dim_feedforward = 6, .dropout = 0.0});
    enc.to(f64);
    require_module_gradcheck(enc, {leaf(randn({3, 4}, f64)), leaf(randn({3, 3}, f64))},
                             [&](const TensorList& in) { return enc(in[0], in[1]); });
  }
}

TEST_CASE("TransformerDecoderLayer: gradcheck in f64, post- and pre-norm, with masks", "[nn][transformer][gradcheck]") {
  manual_seed(9);
  const Tensor causal = bools({0, 1, 1, 0, 0, 1, 0, 0, 0}, {3, 3});
  const Tensor memory_padding = bools({0, 0, 1, 0}, {2, 2});
  for (bool norm_first : {false, true}) {
    INFO("norm_first " << norm_first);
    nn::TransformerDecoderLayer dec(4, 2,
                                    {.dim_feedforward = 6,
                                     .dropout = 0.0,
                                     .activation = norm_first ? nn::Activation::gelu : nn::Activation::relu,
                                     .batch_first = norm_first,
                                     .norm_first = norm_first});
    dec.to(f64);
    const Tensor tgt = leaf(randn(norm_first ? Shape{2, 3, 4} : Shape{3, 2, 4}, f64));
    const Tensor memory = leaf(randn(Shape{2, 2, 4}, f64));
    const Tensor memory_mask = leaf(randn({3, 2}, f64));
    require_module_gradcheck(dec, {tgt, memory, memory_mask}, [&](const TensorList& in) {
      return dec.call({in[0], in[1], causal, in[2], Tensor(), memory_padding});
    });
  }
  SECTION("unbatched, no masks") {
    nn::TransformerDecoderLayer dec(4, 2, {.dim_feedforward = 6, .dropout = 0.0});
    dec.to(f64);
    require_module_gradcheck(dec, {leaf(randn({3, 4}, f64)), leaf(randn({2, 4}, f64))},
                             [&](const TensorList& in) { return dec(in[0], in[1]); });
  }
}

// ---- composition, modes, conversion ----

TEST_CASE("Transformer layers: Sequential hands the masks to every layer", "[nn][transformer]") {
  manual_seed(10);
  auto l1 = std::make_shared<nn::TransformerEncoderLayer>(
      8, 2, nn::TransformerLayerOptions{.dim_feedforward = 16, .dropout = 0.0});
  auto l2 = std::make_shared<nn::TransformerEncoderLayer>(
      8, 2, nn::TransformerLayerOptions{.dim_feedforward = 16, .dropout = 0.0, .norm_first = true});
  auto mid = std::make_shared<nn::Linear>(8, 8);
  nn::Sequential seq(l1, mid, l2);
  seq.to(f64);
  REQUIRE(seq.max_inputs() == 3);
  const Tensor x = randn({4, 2, 8}, f64);
  const Tensor mask = bools({0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0}, {4, 4});
  const Tensor padding = bools({0, 0, 0, 0, 0, 0, 1, 1}, {2, 4});
  require_close(seq(x, mask), (*l2)((*mid)((*l1)(x, mask)), mask));
  require_close(seq(x, mask, padding), (*l2)((*mid)((*l1)(x, mask, padding)), mask, padding));
  require_close(seq(x), (*l2)((*mid)((*l1)(x))));

  // Layers taken by value work the same.
  nn::Sequential by_value(nn::TransformerEncoderLayer(8, 2, {.dim_feedforward = 16, .dropout = 0.0}),
                          nn::TransformerEncoderLayer(8, 2, {.dim_feedforward = 16, .dropout = 0.0}));
  by_value.to(f64);
  REQUIRE(by_value.max_inputs() == 3);
  auto b0 = by_value.at<nn::TransformerEncoderLayer>(0), b1 = by_value.at<nn::TransformerEncoderLayer>(1);
  REQUIRE(b0->self_attn.get() == by_value.submodule("0.self_attn").get());
  require_close(by_value(x, mask, padding), (*b1)((*b0)(x, mask, padding), mask, padding));

  // Decoder layers get (memory, masks...) after the running tgt.
  auto d1 = std::make_shared<nn::TransformerDecoderLayer>(
      8, 2, nn::TransformerLayerOptions{.dim_feedforward = 16, .dropout = 0.0});
  auto d2 = std::make_shared<nn::TransformerDecoderLayer>(
      8, 2, nn::TransformerLayerOptions{.dim_feedforward = 16, .dropout = 0.0});
  nn::Sequential decoder(d1, d2);
  decoder.to(f64);
  const Tensor memory = randn({3, 2, 8}, f64);
  require_close(decoder(x, memory, mask), (*d2)((*d1)(x, memory, mask), memory, mask));
}

TEST_CASE("Transformer layers: dropout only in training; eval is deterministic", "[nn][transformer]") {
  manual_seed(11);
  nn::TransformerEncoderLayer with(8, 2, {.dim_feedforward = 16, .dropout = 0.3});
  nn::TransformerEncoderLayer without(8, 2, {.dim_feedforward = 16, .dropout = 0.0});
  with.to(f64);
  without.to(f64);
  without.load_state_dict(with.state_dict());
  const Tensor x = randn({5, 2, 8}, f64);
  with.eval();
  require_close(with(x), without(x));
  with.train();
  REQUIRE_FALSE(allclose(with(x), without(x)));

  // The attention's own dropout (of the weights) is the fused attention's, in training only.
  nn::MultiheadAttention mha(8, 2, 0.5);
  nn::MultiheadAttention plain(8, 2);
  mha.to(f64);
  plain.to(f64);
  plain.load_state_dict(mha.state_dict());
  REQUIRE_FALSE(allclose(mha(x), plain(x)));
  mha.eval();
  require_close(mha(x), plain(x));
  auto [out, weights] = mha.forward_with_weights(x, x, x);
  require_close(out, plain(x));
}

TEST_CASE("Transformer layers: to() converts in place; f32 agrees with f64", "[nn][transformer]") {
  manual_seed(12);
  nn::TransformerDecoderLayer dec(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .batch_first = true});
  const Tensor tgt = randn({2, 3, 8}), memory = randn({2, 5, 8});
  const Tensor out32 = dec(tgt, memory);
  REQUIRE(out32.dtype() == f32);
  dec.to(f64);
  REQUIRE(dec.self_attn->in_proj_weight.dtype() == f64);
  REQUIRE(dec.multihead_attn->in_proj_bias.dtype() == f64);
  const Tensor out64 = dec(to_dtype(tgt, f64), to_dtype(memory, f64));
  require_close(out32, out64, 1e-5);
  // A tied or replaced projection is what forward uses.
  const Tensor fresh = zeros({24, 8}, f64);
  dec.set_parameter("self_attn.in_proj_weight", fresh);
  REQUIRE(dec.self_attn->in_proj_weight.is_same(fresh));
}

// ---- errors ----

TEST_CASE("MultiheadAttention: errors name the shapes and dtypes", "[nn][transformer][errors]") {
  REQUIRE_THROWS_WITH(nn::MultiheadAttention(6, 4),
                      Contains("[MultiheadAttention] embed_dim 6 is not divisible by num_heads 4"));
  REQUIRE_THROWS_WITH(nn::MultiheadAttention(0, 1),
                      Contains("[MultiheadAttention] embed_dim and num_heads must be positive"));
  REQUIRE_THROWS_WITH(nn::MultiheadAttention(4, 2, 1.0),
                      Contains("[MultiheadAttention] dropout must be in [0, 1), got 1"));

  auto mha = mha64(8, 2);
  const Tensor q = zeros({3, 2, 8}, f64), kv = zeros({4, 2, 8}, f64);
  REQUIRE_THROWS_WITH(
      (*mha)(zeros({8}, f64)),
      Contains("[MultiheadAttention] expected query of shape [L, N, 8] or unbatched [L, 8]") && Contains("got [8]"));
  REQUIRE_THROWS_WITH((*mha)(zeros({3, 2, 6}, f64)), Contains("embed_dim 8") && Contains("got [3, 2, 6]"));
  mha->batch_first = true;
  REQUIRE_THROWS_WITH((*mha)(zeros({1, 3, 2, 8}, f64)), Contains("[N, L, 8]") && Contains("[1, 3, 2, 8]"));
  mha->batch_first = false;
  REQUIRE_THROWS_WITH(mha->call({q, kv, zeros({5, 2, 8}, f64)}),
                      Contains("[MultiheadAttention] key and value must have one shape") && Contains("key [4, 2, 8]") &&
                          Contains("value [5, 2, 8]"));
  REQUIRE_THROWS_WITH(mha->call({q, zeros({4, 8}, f64)}), Contains("query [3, 2, 8], key [4, 8]"));
  REQUIRE_THROWS_WITH(mha->call({q, zeros({4, 3, 8}, f64)}),
                      Contains("[MultiheadAttention] query and key have different batch sizes") &&
                          Contains("[3, 2, 8]") && Contains("[4, 3, 8]"));
  REQUIRE_THROWS_WITH((*mha)(zeros({3, 2, 8}, i64)),
                      Contains("[MultiheadAttention] query, key and value must have one floating dtype, got i64"));
  REQUIRE_THROWS_WITH(mha->call({q, to_dtype(kv, f32)}), Contains("got f64, f32, f32"));
  REQUIRE_THROWS_WITH((*mha)(zeros({3, 2, 8})),
                      Contains("[MultiheadAttention] the inputs are f32 but the parameters are f64"));
  REQUIRE_NOTHROW(mha->call({q}));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, zeros({2, 4}, i64)}),
                      Contains("[MultiheadAttention] key_padding_mask must be bool (true: not allowed) or the query's "
                               "dtype f64 (added), got i64"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, zeros({2, 4}, f32)}), Contains("key_padding_mask") && Contains("got f32"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, zeros({4, 2}, boolean)}),
                      Contains("[MultiheadAttention] expected key_padding_mask of shape [2, 4] ([N, S]), got [4, 2]"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, Tensor(), zeros({3, 3}, boolean)}),
                      Contains("[MultiheadAttention] expected attn_mask of shape [3, 4] ([L, S]) or [4, 3, 4] "
                               "([N * num_heads, L, S]), got [3, 3]"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, Tensor(), zeros({2, 3, 4}, boolean)}), Contains("got [2, 3, 4]"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, Tensor(), zeros({3, 4}, i32)}),
                      Contains("[MultiheadAttention] attn_mask must be bool") && Contains("got i32"));
  REQUIRE_THROWS_WITH(mha->call({q, kv, kv, Tensor(), Tensor(), Tensor()}),
                      Contains("[MultiheadAttention] takes 5 inputs at most, got 6"));
  // Unbatched: the masks' unbatched shapes.
  const Tensor x = zeros({3, 8}, f64);
  REQUIRE_THROWS_WITH(mha->call({x, x, x, zeros({1, 3}, boolean)}),
                      Contains("expected key_padding_mask of shape [3] ([S] for unbatched input), got [1, 3]"));
  REQUIRE_THROWS_WITH(mha->call({x, x, x, Tensor(), zeros({4, 3, 3}, boolean)}),
                      Contains("or [2, 3, 3] ([num_heads, L, S]), got [4, 3, 3]"));
  REQUIRE_THROWS_WITH(mha->forward_with_weights(x, x, x, zeros({3}, i64)), Contains("key_padding_mask must be bool"));
  REQUIRE_THROWS_WITH(mha->forward_with_weights(Tensor(), x, x),
                      Contains("[MultiheadAttention] query must be a defined tensor"));
}

TEST_CASE("Transformer layers: errors", "[nn][transformer][errors]") {
  REQUIRE_THROWS_WITH(nn::TransformerEncoderLayer(6, 4),
                      Contains("[TransformerEncoderLayer] d_model 6 is not divisible by nhead 4"));
  REQUIRE_THROWS_WITH(nn::TransformerEncoderLayer(8, 0),
                      Contains("[TransformerEncoderLayer] d_model and nhead must be positive"));
  REQUIRE_THROWS_WITH(nn::TransformerEncoderLayer(8, 2, {.dim_feedforward = 0}),
                      Contains("[TransformerEncoderLayer] dim_feedforward must be positive, got 0"));
  REQUIRE_THROWS_WITH(nn::TransformerDecoderLayer(8, 2, {.dropout = 1.5}),
                      Contains("[TransformerDecoderLayer] dropout must be in [0, 1), got 1.5"));
  REQUIRE_THROWS_WITH(nn::TransformerDecoderLayer(8, 2, {.layer_norm_eps = 0}),
                      Contains("[TransformerDecoderLayer] layer_norm_eps must be positive"));

  nn::TransformerEncoderLayer enc(8, 2, {.dim_feedforward = 16, .batch_first = true});
  REQUIRE_THROWS_WITH(enc(zeros({2, 3, 6})),
                      Contains("[TransformerEncoderLayer] expected src of shape [N, L, 8] or unbatched [L, 8] "
                               "(d_model 8), got [2, 3, 6]"));
  REQUIRE_THROWS_WITH(enc.call({zeros({2, 3, 8}), Tensor(), Tensor(), Tensor()}),
                      Contains("[TransformerEncoderLayer] takes 3 inputs at most, got 4"));
  REQUIRE_THROWS_WITH(enc(zeros({2, 3, 8}), zeros({2, 2}, boolean)),
                      Contains("[MultiheadAttention] expected attn_mask of shape [3, 3]"));

  nn::TransformerDecoderLayer dec(8, 2, {.dim_feedforward = 16});
  REQUIRE_THROWS_WITH(dec(zeros({3, 2, 8})),
                      Contains("[TransformerDecoderLayer] takes {tgt, memory, tgt_mask, memory_mask, "
                               "tgt_key_padding_mask, memory_key_padding_mask}, tgt and memory required; got 1 input"));
  REQUIRE_THROWS_WITH(dec(zeros({3, 2, 8}), Tensor()), Contains("got 2 inputs with memory undefined"));
  REQUIRE_THROWS_WITH(dec(zeros({3, 2, 8}), zeros({4, 8})),
                      Contains("[TransformerDecoderLayer] tgt and memory must both be batched or both unbatched"));
  REQUIRE_THROWS_WITH(
      dec(zeros({3, 2, 8}), zeros({4, 2, 7})),
      Contains("[TransformerDecoderLayer] expected memory of shape [L, N, 8]") && Contains("[4, 2, 7]"));
  const Tensor t = zeros({3, 2, 8});
  REQUIRE_THROWS_WITH(dec.call({t, t, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()}), Contains("[TransformerDecoderLayer] takes 6 inputs at most, got 7"));
}
