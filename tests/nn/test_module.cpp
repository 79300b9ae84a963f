// nn: Module (registration, naming, modes, zero_grad, to(), state_dict, hooks), the layers,
// the losses and init. Reference values marked "torch 1.13" were computed with PyTorch 1.13
// (torch.nn / torch.nn.functional, f64) and pasted here; the suite itself needs no Python.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <type_traits>

#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;
using Catch::Contains;

namespace {

Tensor t64(const std::vector<double>& v, const Shape& shape) { return from_vector<double>(v, shape); }

void require_close(const Tensor& got, const std::vector<double>& want, double tol = 1e-12) {
  auto g = to_dtype(got.detach(), f64).contiguous().to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << g[i] << ", want " << want[i]);
    REQUIRE(std::abs(g[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

struct Net : nn::Module {
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 3));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(3));
    seq = register_module("seq", std::make_shared<nn::Sequential>(
                                     std::initializer_list<std::shared_ptr<nn::Module>>{
                                         std::make_shared<nn::Linear>(3, 2), std::make_shared<nn::ReLU>()}));
  }
  Tensor forward(const Tensor& x) override { return (*seq)((*bn)((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Sequential> seq;
};

}  // namespace

TEST_CASE("module: names in registration order, dotted, shared tensors once", "[nn][module]") {
  manual_seed(0);
  auto net = std::make_shared<Net>();
  auto params = net->named_parameters();
  REQUIRE(params.keys() ==
          std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "seq.0.weight", "seq.0.bias"});
  REQUIRE(net->named_parameters(false).empty());
  REQUIRE(net->named_buffers().keys() ==
          std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  REQUIRE(net->named_modules().keys() == std::vector<std::string>{"", "fc1", "bn", "seq", "seq.0", "seq.1"});
  REQUIRE(net->named_children().keys() == std::vector<std::string>{"fc1", "bn", "seq"});
  REQUIRE(net->parameters().size() == 6);
  REQUIRE(net->parameter("fc1.weight").is_same(net->fc1->weight));
  REQUIRE(net->parameter("seq.0.bias").shape() == Shape{2});
  REQUIRE(net->submodule("seq.1")->type_name() == "ReLU");
  REQUIRE(net->has_buffer("bn.running_var"));
  REQUIRE_FALSE(net->has_parameter("bn.running_var"));
  REQUIRE_THROWS_WITH(net->parameter("fc2.weight"), Contains("no submodule 'fc2'"));
  REQUIRE_THROWS_WITH(net->parameter("fc1.scale"), Contains("no parameter named 'fc1.scale'"));
  for (const auto& p : net->parameters()) REQUIRE(p.requires_grad());

  // A parameter registered in two places (weight tying) and a module reachable twice are
  // listed once, under the first name.
  nn::Module root("Root");
  auto a = root.register_module("a", std::make_shared<nn::Linear>(2, 2));
  auto b = root.register_module("b", std::make_shared<nn::Module>("Holder"));
  b->register_parameter("tied", a->weight);
  root.register_module("again", a);
  REQUIRE(root.named_parameters().keys() == std::vector<std::string>{"a.weight", "a.bias"});
  REQUIRE(root.named_modules().keys() == std::vector<std::string>{"", "a", "b"});
  // state_dict lists every name, as PyTorch does.
  REQUIRE(root.state_dict().keys() ==
          std::vector<std::string>{"a.weight", "a.bias", "b.tied", "again.weight", "again.bias"});
}

TEST_CASE("module: registration errors", "[nn][module]") {
  nn::Module m("Custom");
  m.register_parameter("w", zeros({2}));
  REQUIRE_THROWS_WITH(m.register_parameter("w", zeros({2})), Contains("[Custom]") && Contains("'w'") &&
                                                                   Contains("already taken"));
  REQUIRE_THROWS_WITH(m.register_buffer("w", zeros({2})), Contains("already taken"));
  REQUIRE_THROWS_WITH(m.register_parameter("a.b", zeros({2})), Contains("must not contain '.'"));
  REQUIRE_THROWS_WITH(m.register_parameter("", zeros({2})), Contains("must not be empty"));
  REQUIRE_THROWS_WITH(m.register_parameter("u", Tensor()), Contains("undefined"));
  REQUIRE_THROWS_WITH(m.register_parameter("i", zeros({2}, i64)), Contains("i64") && Contains("cannot require grad"));
  m.register_parameter("frozen", zeros({2}, i64), /*requires_grad=*/false);
  Tensor leaf = ones({2}).requires_grad_();
  Tensor nonleaf = leaf * 2.0;
  REQUIRE_THROWS_WITH(m.register_parameter("n", nonleaf), Contains("leaf"));
  REQUIRE_THROWS_WITH(m.register_module("c", std::shared_ptr<nn::Module>()), Contains("null"));
  REQUIRE_THROWS_WITH(m.forward(zeros({1})), Contains("[Custom]") && Contains("forward"));
}

TEST_CASE("module: train/eval is recursive", "[nn][module]") {
  auto net = std::make_shared<Net>();
  REQUIRE(net->is_training());
  net->eval();
  for (const auto& m : net->modules()) REQUIRE_FALSE(m->is_training());
  net->train();
  for (const auto& m : net->modules()) REQUIRE(m->is_training());
}

TEST_CASE("module: zero_grad drops or zeroes gradients", "[nn][module]") {
  manual_seed(1);
  nn::Linear fc(3, 2);
  Tensor x = randn({4, 3});
  sum(fc(x)).backward();
  REQUIRE(fc.weight.grad().defined());
  fc.zero_grad(/*set_to_none=*/false);
  REQUIRE(fc.weight.grad().defined());
  REQUIRE(fc.weight.grad().equal(zeros({2, 3})));
  REQUIRE(fc.bias.grad().equal(zeros({2})));
  fc.zero_grad();
  REQUIRE_FALSE(fc.weight.grad().defined());
  REQUIRE_FALSE(fc.bias.grad().defined());
}

TEST_CASE("module: to(dtype) converts in place of each tensor, keeping identity", "[nn][module]") {
  manual_seed(2);
  auto net = std::make_shared<Net>();
  Tensor w_handle = net->fc1->weight;  // e.g. held by an optimizer
  auto before = w_handle.to_vector<float>();
  sum((*net)(randn({5, 4}))).backward();
  net->to(f64);
  REQUIRE(w_handle.dtype() == f64);
  REQUIRE(net->fc1->weight.is_same(w_handle));
  REQUIRE(net->parameter("fc1.weight").is_same(w_handle));
  REQUIRE(w_handle.requires_grad());
  REQUIRE(w_handle.is_leaf());
  REQUIRE(w_handle.grad().dtype() == f64);
  auto after = w_handle.to_vector<double>();
  for (size_t i = 0; i < before.size(); ++i) REQUIRE(after[i] == static_cast<double>(before[i]));
  REQUIRE(net->bn->running_mean().dtype() == f64);
  REQUIRE(net->bn->num_batches_tracked().dtype() == i64);  // integer buffers are left alone
  // The converted model runs and trains in f64.
  net->zero_grad();
  Tensor y = (*net)(randn({5, 4}, f64));
  REQUIRE(y.dtype() == f64);
  sum(y).backward();
  REQUIRE(w_handle.grad().dtype() == f64);
  REQUIRE_THROWS_WITH(net->to(i32), Contains("floating"));
}

TEST_CASE("module: state_dict round trip and load errors", "[nn][module]") {
  manual_seed(3);
  auto a = std::make_shared<Net>();
  auto b = std::make_shared<Net>();
  (*a)(randn({6, 4}));  // training forward: moves a's running stats
  auto sd = a->state_dict();
  REQUIRE(sd.keys() == std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                                "bn.running_var", "bn.num_batches_tracked", "seq.0.weight",
                                                "seq.0.bias"});
  REQUIRE_FALSE(sd["fc1.weight"].requires_grad());
  REQUIRE_FALSE(b->fc1->weight.equal(a->fc1->weight));
  Tensor b_weight = b->fc1->weight;
  auto r = b->load_state_dict(sd);
  REQUIRE(r.missing_keys.empty());
  REQUIRE(r.unexpected_keys.empty());
  REQUIRE(b->fc1->weight.is_same(b_weight));  // copied into the existing tensor
  for (const auto& [name, t] : sd) REQUIRE(b->state_dict()[name].equal(t));
  REQUIRE(b->bn->num_batches_tracked().item<int64_t>() == 1);

  nn::TensorDict missing;
  for (const auto& [name, t] : sd) {
    if (name != "bn.bias" && name != "seq.0.weight") missing.insert(name, t);
  }
  missing.insert("extra.weight", zeros({1}));
  REQUIRE_THROWS_WITH(b->load_state_dict(missing),
                      Contains("[load_state_dict]") && Contains("missing keys: 'bn.bias', 'seq.0.weight'") &&
                          Contains("unexpected keys: 'extra.weight'"));
  auto loose = b->load_state_dict(missing, /*strict=*/false);
  REQUIRE(loose.missing_keys == std::vector<std::string>{"bn.bias", "seq.0.weight"});
  REQUIRE(loose.unexpected_keys == std::vector<std::string>{"extra.weight"});

  nn::TensorDict wrong = sd;
  wrong.at("fc1.weight") = zeros({4, 3});
  Tensor bias_before = b->fc1->bias.clone();
  {
    NoGradGuard g;
    b->fc1->bias.fill_(7.0);
  }
  REQUIRE_THROWS_WITH(b->load_state_dict(wrong), Contains("size mismatch for 'fc1.weight'") && Contains("[4, 3]") &&
                                                     Contains("[3, 4]"));
  // Nothing is copied when the dict is rejected.
  REQUIRE(b->fc1->bias.equal(full({3}, 7.0)));
}

TEST_CASE("module: set_buffer replaces a buffer by dotted name", "[nn][module]") {
  auto net = std::make_shared<Net>();
  Tensor fresh = full({3}, 0.5);
  net->set_buffer("bn.running_mean", fresh);
  REQUIRE(net->buffer("bn.running_mean").is_same(fresh));
  REQUIRE(net->bn->running_mean().is_same(fresh));
  REQUIRE(net->named_buffers()["bn.running_mean"].is_same(fresh));
  // The layer uses it at once: eval normalises with the new mean.
  net->bn->eval();
  Tensor y = (*net->bn)(full({2, 3}, 0.5));
  require_close(y, std::vector<double>(6, 0.0), 1e-6);
  REQUIRE_THROWS_WITH(net->set_buffer("bn.nope", fresh), Contains("no buffer named 'bn.nope'"));
  REQUIRE_THROWS_WITH(net->set_buffer("bn.running_var", Tensor()), Contains("undefined"));
}

TEST_CASE("module: pre-forward hooks run before forward, may replace the input", "[nn][module][hooks]") {
  manual_seed(4);
  auto seq = std::make_shared<nn::Sequential>();
  auto fc = seq->push_back(std::make_shared<nn::Linear>(2, 2));
  int calls = 0;
  nn::Module* seen = nullptr;
  {
    HookHandle h = seq->register_forward_pre_hook([&](nn::Module& m) {
      ++calls;
      seen = &m;
    });
    (*seq)(zeros({1, 2}));
    REQUIRE(calls == 1);
    REQUIRE(seen == seq.get());
    seq->forward(zeros({1, 2}));  // forward itself does not run hooks
    REQUIRE(calls == 1);
  }
  (*seq)(zeros({1, 2}));
  REQUIRE(calls == 1);  // handle dropped: hook removed

  // A child's hook runs when the parent calls it; a replacing hook changes what forward sees.
  HookHandle replace = fc->register_forward_pre_hook(
      nn::ForwardPreHook([](nn::Module&, const Tensor& x) -> std::optional<Tensor> { return x * 0.0; }));
  Tensor y = (*seq)(ones({1, 2}));
  REQUIRE(y.allclose(fc->bias.detach().unsqueeze(0)));
  replace.remove();
  REQUIRE_FALSE(replace.active());
  Tensor y2 = (*seq)(ones({1, 2}));
  REQUIRE_FALSE(y2.allclose(fc->bias.detach().unsqueeze(0)));
}

namespace {
// forward_inputs(x, gate[, bias]) = fc(x) * gate (+ bias): a module of several inputs.
struct Gated : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Gated() : Module("Gated") { fc = register_module("fc", std::make_shared<nn::Linear>(3, 3)); }
  size_t max_inputs() const override { return 3; }
  Tensor forward_inputs(const TensorList& in) override {
    Tensor y = (*fc)(in[0]);
    if (in.size() > 1 && in[1].defined()) y = y * in[1];
    return in.size() > 2 && in[2].defined() ? y + in[2] : y;
  }
};
}  // namespace

TEST_CASE("module: several inputs (forward_inputs), through hooks and Sequential", "[nn][module][hooks]") {
  manual_seed(1);
  nn::Linear lin(3, 3);
  const Tensor x = randn({2, 3}), gate = full({2, 3}, 2.0), bias = ones({2, 3});
  // A one-input module refuses more, naming itself.
  REQUIRE_THROWS_WITH(lin(x, gate), Contains("[Linear] takes 1 input, got 2"));
  auto gated = std::make_shared<Gated>();
  REQUIRE_THROWS_WITH(gated->call({x, gate, bias, bias}), Contains("[Gated] takes 3 inputs at most, got 4"));
  const Tensor want = (*gated->fc)(x) * gate + bias;
  CHECK(((*gated)(x, gate, bias) - want).abs().max().item<double>() == 0);
  CHECK(((*gated)(x) - (*gated->fc)(x)).abs().max().item<double>() == 0);  // one input: forward -> forward_inputs
  {
    // A one-tensor hook sees and replaces the first input; a list hook sees all of them.
    auto first = gated->register_forward_pre_hook(
        [](nn::Module&, const Tensor& in) -> std::optional<Tensor> { return in * 0.0; });
    const Tensor from_zeros = (*gated->fc)(zeros({2, 3})) * gate + bias;
    CHECK(((*gated)(x, gate, bias) - from_zeros).abs().max().item<double>() == 0);
  }
  {
    int seen = 0;
    auto all = gated->register_forward_pre_hook(
        nn::ForwardPreHookInputs([&](nn::Module&, const TensorList& in) -> std::optional<TensorList> {
          seen = static_cast<int>(in.size());
          return std::nullopt;
        }));
    (*gated)(x, gate);
    CHECK(seen == 2);
    auto wrong = gated->register_forward_pre_hook(nn::ForwardPreHookInputs(
        [](nn::Module&, const TensorList& in) -> std::optional<TensorList> { return TensorList{in[0]}; }));
    REQUIRE_THROWS_WITH((*gated)(x, gate), Contains("[Gated] a pre-forward hook replaced 2 inputs with 1"));
  }
  // Sequential: the first input runs through the chain; the others go to the children that take several.
  auto a = std::make_shared<Gated>();
  auto b = std::make_shared<Gated>();
  nn::Sequential seq(a, std::make_shared<nn::ReLU>(), b);
  CHECK(seq.max_inputs() == 3);
  const Tensor chained = (*b)(relu((*a)(x, gate, bias)), gate, bias);
  CHECK((seq(x, gate, bias) - chained).abs().max().item<double>() == 0);
  CHECK((seq(x) - (*b)(relu((*a)(x)))).abs().max().item<double>() == 0);
  nn::Sequential plain(std::make_shared<nn::Linear>(3, 3), std::make_shared<nn::ReLU>());
  REQUIRE_THROWS_WITH(plain(x, gate), Contains("[Sequential] takes 1 input, got 2"));
}

namespace {
// Declares two inputs, and hands a single one back to forward: a loop the default forward breaks.
struct Looping : nn::Module {
  Looping() : Module("Looping") {}
  size_t max_inputs() const override { return 2; }
  Tensor forward_inputs(const TensorList& in) override { return in.size() == 1 ? forward(in[0]) : in[0] + in[1]; }
};
}  // namespace

TEST_CASE("module: a module of several inputs that hands one back to forward is an error, not a loop",
          "[nn][module]") {
  Looping m;
  const Tensor x = ones({2});
  CHECK((m(x, x) - 2.0).abs().max().item<double>() == 0);
  REQUIRE_THROWS_WITH(m(x), Contains("[Looping] takes several inputs but implements neither forward(const Tensor&) "
                                     "nor forward_inputs for one input"));
}

TEST_CASE("module: str prints the tree", "[nn][module]") {
  auto net = std::make_shared<Net>();
  std::string s = net->str();
  REQUIRE_THAT(s, Contains("Net(") && Contains("(fc1): Linear(in_features=4, out_features=3, bias=true)") &&
                      Contains("(seq): Sequential(") && Contains("(1): ReLU()"));
}

// ---- layers ----

TEST_CASE("Linear: forward, init bounds, errors, gradcheck", "[nn][layers]") {
  manual_seed(5);
  nn::Linear fc(200, 50);
  REQUIRE(fc.weight.shape() == Shape{50, 200});
  double bound = 1.0 / std::sqrt(200.0);
  REQUIRE(max(abs(fc.weight)).item<float>() <= bound);
  REQUIRE(max(abs(fc.bias)).item<float>() <= bound);
  // U(-b, b) has std b / sqrt(3): check the spread is that of the PyTorch init, not another.
  double sd = std::sqrt(var(fc.weight.detach()).item<float>());
  REQUIRE(sd == Approx(bound / std::sqrt(3.0)).epsilon(0.05));

  nn::Linear small(2, 2);
  small.to(f64);
  {
    NoGradGuard g;
    small.weight.copy_(t64({1, 2, 3, 4}, {2, 2}));
    small.bias.copy_(t64({0.5, -1}, {2}));
  }
  require_close(small(t64({1, 1, 2, -1}, {2, 2})), {3.5, 6, 0.5, 1});
  nn::Linear nobias(3, 2, false);
  REQUIRE_FALSE(nobias.bias.defined());
  REQUIRE(nobias.named_parameters().keys() == std::vector<std::string>{"weight"});
  REQUIRE_THROWS_WITH(small(zeros({2, 3}, f64)), Contains("[Linear]") && Contains("[2, 3]"));

  nn::Linear g(3, 2);
  g.to(f64);
  Tensor x = randn({4, 3}, f64).requires_grad_();
  auto r = gradcheck([&](const TensorList& in) { return linear(in[0], in[1], in[2]); }, {x, g.weight, g.bias});
  INFO(r.report);
  REQUIRE(r.ok);
  auto r2 = gradcheck([&](const TensorList& in) { return g(in[0]); }, {x});
  INFO(r2.report);
  REQUIRE(r2.ok);
}

TEST_CASE("Embedding: lookup and N(0,1) init", "[nn][layers]") {
  manual_seed(6);
  nn::Embedding emb(1000, 16);
  double m = mean(emb.weight.detach()).item<float>();
  double sd = std::sqrt(var(emb.weight.detach()).item<float>());
  REQUIRE(std::abs(m) < 0.03);
  REQUIRE(sd == Approx(1.0).epsilon(0.03));
  Tensor idx = from_vector<int64_t>({3, 0, 3, 999}, {2, 2});
  Tensor out = emb(idx);
  REQUIRE(out.shape() == Shape{2, 2, 16});
  REQUIRE(out.select(0, 0).select(0, 0).equal(emb.weight.detach().select(0, 3)));
  REQUIRE(out.select(0, 1).select(0, 1).equal(emb.weight.detach().select(0, 999)));
  sum(out).backward();
  // Row 3 was used twice: its gradient is 2 everywhere.
  REQUIRE(emb.weight.grad().select(0, 3).equal(full({16}, 2.0)));
}

TEST_CASE("LayerNorm: forward against torch, gradcheck", "[nn][layers]") {
  nn::LayerNorm ln({3});
  ln.to(f64);
  Tensor x = t64({1.0, 2.0, -1.0, 3.0, 0.0, 0.5}, {2, 3});
  // torch 1.13: nn.LayerNorm(3).double()(x)[0]
  require_close(ln(x).select(0, 0), {0.2672603828625745, 1.0690415314502977, -1.3363019143128718}, 1e-10);
  REQUIRE(ln.named_parameters().keys() == std::vector<std::string>{"weight", "bias"});
  nn::LayerNorm plain({3}, 1e-5, false);
  REQUIRE(plain.parameters().empty());

  manual_seed(7);
  {
    NoGradGuard g;
    ln.weight.normal_();
    ln.bias.normal_();
  }
  Tensor xr = randn({4, 3}, f64).requires_grad_();
  auto r = gradcheck([&](const TensorList& in) { return ln(in[0]); }, {xr, ln.weight, ln.bias});
  INFO(r.report);
  REQUIRE(r.ok);
}

TEST_CASE("BatchNorm1d: training batch stats, running stats, eval", "[nn][layers]") {
  nn::BatchNorm1d bn(3);
  bn.to(f64);
  {
    NoGradGuard g;
    bn.weight.copy_(t64({1.0, 0.5, 2.0}, {3}));
    bn.bias.copy_(t64({0.0, 1.0, -1.0}, {3}));
  }
  Tensor x = t64({1.0, 2.0, -1.0, 3.0, 0.0, 0.5, -2.0, 1.0, 2.5, 0.0, 4.0, 1.0}, {4, 3});
  // torch 1.13: BatchNorm1d(3) with the weight and bias above, training mode.
  require_close(bn(x), {0.2773496714211406, 1.0845152322953986, -3.7999910400430075, 1.3867483571057029,
                        0.40839337393220976, -1.3999987200061441, -1.3867483571057029, 0.7464543031138042,
                        1.7999910400430075, -0.2773496714211406, 1.7606370906585873, -0.6000012799938561},
                1e-10);
  require_close(bn.running_mean(), {0.05, 0.17500000000000002, 0.07500000000000001});
  require_close(bn.running_var(), {1.3333333333333335, 1.1916666666666667, 1.1083333333333334});
  REQUIRE(bn.num_batches_tracked().item<int64_t>() == 1);
  bn.eval();
  require_close(bn(x).select(0, 0), {0.8227210483970699, 1.8358987103962203, -3.0422142546518476}, 1e-10);
  REQUIRE(bn.num_batches_tracked().item<int64_t>() == 1);  // eval does not update

  REQUIRE_THROWS_WITH(bn(zeros({4, 2}, f64)), Contains("[BatchNorm1d]") && Contains("[4, 2]"));
  bn.train();
  REQUIRE_THROWS_WITH(bn(zeros({1, 3}, f64)), Contains("more than 1 value per channel"));
}

TEST_CASE("BatchNorm1d: [N, C, L] input, cumulative average (momentum = None)", "[nn][layers]") {
  nn::BatchNorm1d bn(3, 1e-5, std::nullopt, /*affine=*/false);
  bn.to(f64);
  REQUIRE(bn.parameters().empty());
  // sin(0), sin(1), ..., sin(23) (as printed by torch)
  Tensor x3 = t64({0.0, 0.8414709848078965, 0.9092974268256817, 0.1411200080598672, -0.7568024953079282,
                   -0.9589242746631385, -0.27941549819892586, 0.6569865987187891, 0.9893582466233818,
                   0.4121184852417566, -0.5440211108893698, -0.9999902065507035, -0.5365729180004349,
                   0.4201670368266409, 0.9906073556948704, 0.6502878401571168, -0.2879033166650653,
                   -0.9613974918795568, -0.750987246771676, 0.14987720966295234, 0.9129452507276277,
                   0.8366556385360561, -0.008851309290403876, -0.8462204041751706},
                  {2, 3, 4});
  bn(x3);
  Tensor y = bn(x3 * 2.0);
  // torch 1.13: BatchNorm1d(3, momentum=None, affine=False), called on x3 then 2 * x3.
  require_close(y.select(0, 1).select(0, 2), {1.0772372711426663, 0.9768863066291992, -0.1352891951175096,
                                              -1.2367602068516463},
                1e-9);
  require_close(bn.running_mean(), {0.6405708251946822, -0.597856221582103, 0.1409989856668452}, 1e-12);
  require_close(bn.running_var(), {0.701601259204136, 0.8302639715163306, 1.6512688542155394}, 1e-12);
  REQUIRE(bn.num_batches_tracked().item<int64_t>() == 2);
}

TEST_CASE("BatchNorm1d: gradcheck in training mode", "[nn][layers]") {
  manual_seed(8);
  nn::BatchNorm1d bn(3);
  bn.to(f64);
  {
    NoGradGuard g;
    bn.weight.normal_();
    bn.bias.normal_();
  }
  Tensor x = randn({5, 3}, f64).requires_grad_();
  auto r = gradcheck([&](const TensorList& in) { return bn(in[0]); }, {x, bn.weight, bn.bias});
  INFO(r.report);
  REQUIRE(r.ok);
  Tensor x3 = randn({2, 3, 4}, f64).requires_grad_();
  auto r3 = gradcheck([&](const TensorList& in) { return bn(in[0]); }, {x3, bn.weight, bn.bias});
  INFO(r3.report);
  REQUIRE(r3.ok);
  // Without tracked stats eval still normalises with the batch.
  nn::BatchNorm1d untracked(3, 1e-5, 0.1, true, /*track_running_stats=*/false);
  untracked.to(f64);
  untracked.eval();
  REQUIRE(untracked.buffers().empty());
  Tensor y = untracked(x.detach());
  require_close(mean(y, {0}), {0, 0, 0}, 1e-12);
}

TEST_CASE("Dropout and activations", "[nn][layers]") {
  manual_seed(9);
  nn::Dropout drop(0.25);
  Tensor x = ones({20000});
  Tensor y = drop(x);
  double zero_frac = mean(to_dtype(eq(y, Scalar(0.0)), f32)).item<float>();
  REQUIRE(zero_frac == Approx(0.25).margin(0.02));
  REQUIRE(max(y).item<float>() == Approx(1.0 / 0.75));
  drop.eval();
  REQUIRE(drop(x).equal(x));
  REQUIRE_THROWS_WITH(nn::Dropout(1.5), Contains("[Dropout]"));

  Tensor v = t64({-1.0, 0.5, 2.0}, {3});
  require_close(nn::ReLU()(v), {0, 0.5, 2});
  require_close(nn::Tanh()(v), {std::tanh(-1.0), std::tanh(0.5), std::tanh(2.0)});
  require_close(nn::Sigmoid()(v), {1 / (1 + std::exp(1.0)), 1 / (1 + std::exp(-0.5)), 1 / (1 + std::exp(-2.0))});
  // torch 1.13: F.gelu and F.gelu(approximate='tanh')
  require_close(nn::GELU()(v), {-0.15865525393145702, 0.34573123063700656, 1.9544997361036416}, 1e-10);
  require_close(nn::GELU(true)(v), {-0.15880800939172324, 0.34571400982514394, 1.954597694087775}, 1e-10);
}

TEST_CASE("Sequential: order, names, indexing", "[nn][layers]") {
  manual_seed(10);
  nn::Sequential seq{std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::Tanh>(),
                     std::make_shared<nn::Linear>(4, 2)};
  REQUIRE(seq.size() == 3);
  REQUIRE(seq.named_children().keys() == std::vector<std::string>{"0", "1", "2"});
  REQUIRE(seq.named_parameters().keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  REQUIRE(seq[-1].get() == seq[2].get());
  auto first = seq.at<nn::Linear>(0);
  REQUIRE(first->out_features == 4);
  REQUIRE_THROWS_WITH(seq.at<nn::Linear>(1), Contains("Tanh"));
  REQUIRE_THROWS_WITH(seq[3], Contains("[Sequential] index 3 out of range for 3 layers"));
  Tensor x = randn({5, 3});
  Tensor manual = (*seq[2])(tanh((*seq[0])(x)));
  REQUIRE(seq(x).allclose(manual));
  seq.push_back(std::make_shared<nn::ReLU>());
  REQUIRE(seq.named_children().keys().back() == "3");
}

// What Sequential takes: module values by move, shared_ptrs by sharing; never a module lvalue,
// which it could neither own nor copy (the compile-time half of the tests below).
static_assert(std::is_constructible_v<nn::Sequential, nn::Linear, nn::ReLU>);
static_assert(std::is_constructible_v<nn::Sequential, nn::Linear&&, std::shared_ptr<nn::Tanh>&>);
static_assert(std::is_constructible_v<nn::Sequential, std::shared_ptr<nn::Linear>>);
static_assert(!std::is_constructible_v<nn::Sequential, nn::Linear&>);
static_assert(!std::is_constructible_v<nn::Sequential, const nn::Linear&&>);
static_assert(!std::is_constructible_v<nn::Sequential, nn::Linear, int>);
static_assert(!std::is_copy_constructible_v<nn::Linear>);
static_assert(std::is_move_constructible_v<nn::Linear> && std::is_move_constructible_v<nn::BatchNorm1d>);
static_assert(!std::is_constructible_v<nn::Module, nn::Module&&>);  // no slicing into a bare Module
static_assert(!std::is_convertible_v<nn::Linear, nn::Sequential>);  // the variadic constructor is explicit

TEST_CASE("Sequential: module values are moved in, shared_ptrs are shared", "[nn][layers]") {
  manual_seed(11);
  nn::Linear first(3, 4);
  const TensorImpl* w = first.weight.impl();
  const TensorImpl* b = first.bias.impl();
  auto act = std::make_shared<nn::Tanh>();
  nn::Sequential seq(std::move(first), act, nn::Linear(4, 2), nn::ReLU());
  REQUIRE(seq.size() == 4);
  REQUIRE(seq.named_children().keys() == std::vector<std::string>{"0", "1", "2", "3"});
  REQUIRE(seq.named_parameters().keys() == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  // The moved module keeps its tensors: member, registry and the tensors made before all agree.
  auto lin = seq.at<nn::Linear>(0);
  REQUIRE(lin->weight.impl() == w);
  REQUIRE(lin->bias.impl() == b);
  REQUIRE(seq.parameter("0.weight").is_same(lin->weight));
  REQUIRE(seq.parameters()[0].impl() == w);
  REQUIRE(lin->weight.requires_grad());
  // The moved-from module is empty, not a second owner of the same tensors.
  REQUIRE(first.named_parameters().empty());
  REQUIRE_FALSE(first.weight.defined());
  // A shared_ptr is shared, not copied; the new object is owned by Sequential's shared_ptr.
  REQUIRE(seq[1].get() == act.get());
  REQUIRE(lin->weak_from_this().lock() == seq[0]);
  REQUIRE(seq.named_modules()["2"].get() == seq[2].get());
  Tensor x = randn({5, 3});
  Tensor manual = relu((*seq[2])(tanh(linear(x, lin->weight, lin->bias))));
  REQUIRE(seq(x).allclose(manual));
  // Training through the Sequential updates the tensors the moved module's members name.
  optim::SGD opt(seq.parameters(), {.lr = 0.5});
  Tensor before = lin->weight.detach().clone();
  seq(x).sum().backward();
  REQUIRE(lin->weight.grad().defined());
  opt.step();
  REQUIRE_FALSE(lin->weight.equal(before));
  // push_back takes both forms and returns the typed pointer.
  std::shared_ptr<nn::Linear> added = seq.push_back(nn::Linear(2, 3));
  REQUIRE(added->out_features == 3);
  REQUIRE(seq[-1].get() == added.get());
  auto shared = std::make_shared<nn::GELU>();
  REQUIRE(seq.push_back(shared).get() == shared.get());
  REQUIRE(seq.named_children().keys().back() == "5");
  // The existing forms still work.
  nn::Sequential listed{std::make_shared<nn::Linear>(2, 2), std::make_shared<nn::ReLU>()};
  nn::Sequential from_vec(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::Tanh>()});
  REQUIRE((listed.size() == 2 && from_vec.size() == 1));
}

TEST_CASE("Sequential: nested and custom modules moved in keep their names and state", "[nn][layers]") {
  manual_seed(12);
  Net net;
  const TensorImpl* fc1_weight = net.fc1->weight.impl();
  const nn::Linear* fc1 = net.fc1.get();
  net.bn->eval();
  nn::Sequential seq(std::move(net), nn::Sequential(nn::Linear(2, 2), nn::Sigmoid()));
  REQUIRE(seq.named_parameters().keys() ==
          std::vector<std::string>{"0.fc1.weight", "0.fc1.bias", "0.bn.weight", "0.bn.bias", "0.seq.0.weight",
                                   "0.seq.0.bias", "1.0.weight", "1.0.bias"});
  REQUIRE(seq.named_buffers().keys() ==
          std::vector<std::string>{"0.bn.running_mean", "0.bn.running_var", "0.bn.num_batches_tracked"});
  // Children are the same objects (shared_ptrs moved), so the derived class's members still
  // point at what is registered.
  auto moved = seq.at<Net>(0);
  REQUIRE(moved->fc1.get() == fc1);
  REQUIRE(moved->submodule("fc1").get() == fc1);
  REQUIRE(seq.parameter("0.fc1.weight").impl() == fc1_weight);
  REQUIRE_FALSE(seq.submodule("0.bn")->is_training());  // the mode travels with the module
  REQUIRE(net.named_children().empty());
  REQUIRE(net.fc1 == nullptr);
  // Buffers read by name at forward time are the ones the Sequential lists.
  moved->bn->train();
  seq(randn({6, 4}));
  REQUIRE(seq.buffer("0.bn.num_batches_tracked").item<int64_t>() == 1);
  REQUIRE(seq.buffer("0.bn.running_mean").is_same(moved->bn->running_mean()));
}

TEST_CASE("module: moving hands over the pre-forward hooks", "[nn][module][hooks]") {
  nn::Linear lin(2, 2);
  int calls = 0;
  HookHandle h = lin.register_forward_pre_hook([&](nn::Module&) { ++calls; });
  nn::Sequential seq(std::move(lin));
  seq(zeros({1, 2}));
  REQUIRE(calls == 1);
  lin.run_pre_forward_hooks(zeros({1, 2}));  // the moved-from module has none left
  REQUIRE(calls == 1);
  h.remove();  // the handle now removes the hook from the moved module
  seq(zeros({1, 2}));
  REQUIRE(calls == 1);
}

// ---- losses ----

namespace {
// logits [3, 4] shared by the loss tests (and by the torch script that made the references)
Tensor loss_logits() {
  return t64({0.5, -1.0, 2.0, 0.1, 1.5, 0.3, -0.7, 0.0, -0.2, 0.8, 0.4, -1.1}, {3, 4});
}
}  // namespace

TEST_CASE("cross_entropy: reductions, ignore_index, weights, label smoothing (torch 1.13)", "[nn][loss]") {
  Tensor x = loss_logits();
  Tensor t = from_vector<int64_t>({2, 0, 3});
  Tensor ti = from_vector<int64_t>({2, -100, 3});
  Tensor w = t64({1.0, 2.0, 0.5, 1.5}, {4});
  require_close(nn::cross_entropy(x, t), {1.1756695447827294});
  require_close(nn::cross_entropy(x, t, nn::Reduction::sum), {3.527008634348188});
  require_close(nn::cross_entropy(x, t, nn::Reduction::none),
                {0.35240593810343074, 0.4917208015660495, 2.682881894678708});
  // The mean divides by the 2 targets left, not by 3.
  require_close(nn::cross_entropy(x, ti), {1.5176439163910693});
  require_close(nn::cross_entropy(x, t, {.weight = w}), {1.5640822042119424});
  require_close(nn::cross_entropy(x, t, nn::Reduction::mean, -100, 0.1), {1.2340028781160628});
  require_close(nn::cross_entropy(x, ti, nn::Reduction::mean, -100, 0.2), {1.5701439163910693});
  require_close(nn::cross_entropy(x, ti, {.weight = w, .label_smoothing = 0.2}), {2.1821213035256783});
  require_close(nn::cross_entropy(x, ti, nn::Reduction::none, -100, 0.2),
                {0.6724059381034309, 0.0, 2.467881894678708});
  // [N, C, d]: the same logits with the classes in dim 1 of [1, 4, 3].
  Tensor x3 = x.reshape({1, 3, 4}).permute({0, 2, 1}).contiguous();
  require_close(nn::cross_entropy(x3, t.reshape({1, 3})), {1.1756695447827294});
  require_close(nn::cross_entropy(x3, t.reshape({1, 3}), nn::Reduction::none).reshape({3}),
                {0.35240593810343074, 0.4917208015660495, 2.682881894678708});
  // Class probabilities as target.
  Tensor probs = softmax(t64({1, 0, 0, 2, 0, 1, 1, 0, 3, 0, 1, 0}, {3, 4}), 1);
  require_close(nn::cross_entropy(x, probs), {1.9152820543480802});
  require_close(nn::cross_entropy(x, probs, nn::Reduction::mean, -100, 0.1), {1.8996541367248787});
  // Unbatched: [C] logits with a 0-dim target.
  require_close(nn::cross_entropy(x.select(0, 2), scalar_tensor(int64_t{3}, i64)), {2.682881894678708});
}

TEST_CASE("losses: errors name the problem", "[nn][loss]") {
  Tensor x = loss_logits();
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, from_vector<int64_t>({2, 4, 0})),
                      Contains("[nll_loss] target 4 is out of bounds for 4 classes"));
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, from_vector<int64_t>({2, -1, 0})), Contains("target -1"));
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, from_vector<int64_t>({2, 0})),
                      Contains("[nll_loss]") && Contains("[3]") && Contains("[2]"));
  REQUIRE_THROWS_WITH(nn::nll_loss(x, from_vector<float>({2, 0, 1})), Contains("[nll_loss]") && Contains("i64"));
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, from_vector<int64_t>({2, 0, 1}), {.weight = ones({3}, f64)}),
                      Contains("weight must have shape [4]"));
  REQUIRE_THROWS_WITH(nn::mse_loss(zeros({2, 3}), zeros({3, 2})), Contains("[mse_loss]") && Contains("[2, 3]"));
  REQUIRE_THROWS_WITH(nn::cross_entropy(x, from_vector<int64_t>({0, 0, 0}), nn::Reduction::mean, -100, 1.5),
                      Contains("label_smoothing"));
}

TEST_CASE("nll_loss and mse_loss: values", "[nn][loss]") {
  Tensor logp = log_softmax(loss_logits(), 1);
  Tensor t = from_vector<int64_t>({2, 0, 3});
  require_close(nn::nll_loss(logp, t), {1.1756695447827294});
  // i32 targets are accepted too.
  require_close(nn::nll_loss(logp, to_dtype(t, i32), nn::Reduction::sum), {3.527008634348188});
  // ignore_index other than -100
  require_close(nn::nll_loss(logp, from_vector<int64_t>({2, 1, 1}), nn::Reduction::mean, 1), {0.35240593810343074});
  Tensor a = t64({1, 2, 3, 4}, {2, 2});
  Tensor b = t64({0, 2, 5, 3}, {2, 2});
  require_close(nn::mse_loss(a, b), {1.5});
  require_close(nn::mse_loss(a, b, nn::Reduction::sum), {6});
  require_close(nn::mse_loss(a, b, nn::Reduction::none), {1, 0, 4, 1});
}

TEST_CASE("losses: gradcheck", "[nn][loss]") {
  manual_seed(11);
  Tensor x = randn({4, 5}, f64).requires_grad_();
  Tensor t = from_vector<int64_t>({1, 4, -100, 0});
  Tensor w = rand({5}, f64) + 0.5;
  auto check = [](const std::function<Tensor(const TensorList&)>& f, const TensorList& in) {
    auto r = gradcheck(f, in);
    INFO(r.report);
    REQUIRE(r.ok);
  };
  check([&](const TensorList& in) { return nn::cross_entropy(in[0], t); }, {x});
  check([&](const TensorList& in) { return nn::cross_entropy(in[0], t, nn::Reduction::none); }, {x});
  check([&](const TensorList& in) { return nn::cross_entropy(in[0], t, {.weight = w, .label_smoothing = 0.3}); },
        {x});
  check([&](const TensorList& in) { return nn::nll_loss(in[0], t, nn::Reduction::sum); }, {x});
  Tensor x3 = randn({2, 3, 4}, f64).requires_grad_();
  Tensor t3 = from_vector<int64_t>({0, 1, 2, 1, 2, 2, 0, 0}, {2, 4});
  check([&](const TensorList& in) { return nn::cross_entropy(in[0], t3, nn::Reduction::mean, -100, 0.1); }, {x3});
  Tensor y = randn({4, 5}, f64).requires_grad_();
  check([&](const TensorList& in) { return nn::mse_loss(in[0], in[1]); }, {x, y});
  Tensor probs = softmax(randn({4, 5}, f64), 1);
  check([&](const TensorList& in) { return nn::cross_entropy(in[0], probs); }, {x});
}

TEST_CASE("cross_entropy and nll_loss: a mean over no weight is NaN with a zero gradient (torch 1.13)", "[nn][loss]") {
  auto all_zero = [](const Tensor& g) {
    REQUIRE(g.defined());
    for (double v : to_dtype(g, f64).contiguous().to_vector<double>()) REQUIRE(v == 0.0);  // a NaN fails too
  };
  // loss(x) for fresh leaf logits x; returns x's gradient after loss.backward().
  auto grad_of = [](const Tensor& logits, const std::function<Tensor(const Tensor&)>& loss, bool want_nan) {
    Tensor x = logits.clone().requires_grad_();
    Tensor l = loss(x);
    INFO("loss " << l.item<double>());
    REQUIRE(std::isnan(l.item<double>()) == want_nan);
    l.backward();
    return x.grad();
  };
  Tensor x = loss_logits();
  Tensor none = from_vector<int64_t>({-100, -100, -100});
  Tensor w = t64({1.0, 2.0, 0.5, 1.5}, {4});
  // Every target ignored: the mean is 0 / 0 (NaN, as in torch), but no row reaches the loss, so
  // the gradient is 0 (torch skips ignored rows; the division by the total weight gave inf * 0).
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, none); }, true));
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, none, nn::Reduction::mean, -100, 0.2); },
                   true));
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, none, {.weight = w, .label_smoothing = 0.2}); },
                   true));
  all_zero(grad_of(
      x, [&](const Tensor& in) { return nn::cross_entropy(in, from_vector<int64_t>({1, 1, 1}), nn::Reduction::mean, 1); },
      true));
  all_zero(grad_of(to_dtype(x, f32), [&](const Tensor& in) { return nn::cross_entropy(in, none); }, true));
  Tensor x3 = x.reshape({1, 3, 4}).permute({0, 2, 1}).contiguous();  // [N, C, d]
  all_zero(grad_of(x3, [&](const Tensor& in) { return nn::cross_entropy(in, none.reshape({1, 3})); }, true));
  Tensor logp = log_softmax(x, 1);
  all_zero(grad_of(logp, [&](const Tensor& in) { return nn::nll_loss(in, none); }, true));
  all_zero(grad_of(logp, [&](const Tensor& in) { return nn::nll_loss(in, none, {.weight = w}); }, true));
  // The sum of nothing is 0, with a zero gradient.
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, none, nn::Reduction::sum); }, false));
  // Targets left, all of class weight 0: torch gives NaN gradients here (w_t * (1 / 0) = 0 * inf);
  // Tandem applies the same rule as above, a zero total weight contributes no gradient.
  Tensor wz = t64({0.0, 2.0, 0.0, 1.5}, {4});
  Tensor tz = from_vector<int64_t>({0, 2, -100});
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, tz, {.weight = wz}); }, true));
  all_zero(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, tz, {.weight = wz, .label_smoothing = 0.2}); },
                   true));
  all_zero(grad_of(logp, [&](const Tensor& in) { return nn::nll_loss(in, tz, {.weight = wz}); }, true));

  // A partly ignored batch is unchanged: torch's values and gradients.
  Tensor ti = from_vector<int64_t>({2, -100, 3});
  require_close(grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, ti); }, false),
                {0.07842965907291799, 0.017500022389326946, -0.1485026541425628, 0.052572972680317895, 0, 0, 0, 0,
                 0.08407642475687144, 0.22854341761840785, 0.15319723421911347, -0.4658170765943927});
  require_close(
      grad_of(x, [&](const Tensor& in) { return nn::cross_entropy(in, ti, {.weight = w, .label_smoothing = 0.2}); },
              false),
      {0.025979278397396704, -0.03862498544693749, 0.0159732748073342, -0.0033275677577933667, 0, 0, 0, 0,
       0.0969108158974636, 0.28138795554669144, 0.20963598961771454, -0.5879347610618695});
  require_close(nn::nll_loss(x, ti), {-0.44999999999999996});
  require_close(grad_of(x, [&](const Tensor& in) { return nn::nll_loss(in, ti); }, false),
                {0, 0, -0.5, 0, 0, 0, 0, 0, 0, 0, 0, -0.5});
}

// ---- init ----

TEST_CASE("init: gains, fans, bounds", "[nn][init]") {
  using namespace nn::init;
  REQUIRE(calculate_gain(Nonlinearity::linear) == 1.0);
  REQUIRE(calculate_gain(Nonlinearity::sigmoid) == 1.0);
  REQUIRE(calculate_gain(Nonlinearity::tanh) == Approx(5.0 / 3.0));
  REQUIRE(calculate_gain(Nonlinearity::relu) == Approx(std::sqrt(2.0)));
  REQUIRE(calculate_gain(Nonlinearity::leaky_relu) == Approx(std::sqrt(2.0 / (1 + 0.01 * 0.01))));
  REQUIRE(calculate_gain(Nonlinearity::leaky_relu, 0.2) == Approx(std::sqrt(2.0 / 1.04)));
  REQUIRE(calculate_gain(Nonlinearity::selu) == 0.75);
  Tensor conv = empty({8, 4, 3, 3});
  REQUIRE(calculate_fan_in_and_fan_out(conv) == std::pair<int64_t, int64_t>{36, 72});
  REQUIRE_THROWS_WITH(calculate_fan_in_and_fan_out(empty({5})), Contains("[init]") && Contains("[5]"));

  manual_seed(12);
  Tensor w = empty({300, 200}).requires_grad_();  // works on parameters: runs under no_grad
  xavier_uniform_(w);
  double a = std::sqrt(6.0 / 500.0);
  REQUIRE(max(abs(w)).item<float>() <= a);
  REQUIRE(max(abs(w)).item<float>() > 0.95 * a);
  xavier_normal_(w, 2.0);
  REQUIRE(std::sqrt(var(w.detach()).item<float>()) == Approx(2.0 * std::sqrt(2.0 / 500.0)).epsilon(0.03));
  kaiming_normal_(w, 0, FanMode::fan_out, Nonlinearity::relu);
  REQUIRE(std::sqrt(var(w.detach()).item<float>()) == Approx(std::sqrt(2.0) / std::sqrt(300.0)).epsilon(0.03));
  kaiming_uniform_(w, 0, FanMode::fan_in, Nonlinearity::relu);
  double bound = std::sqrt(3.0) * std::sqrt(2.0) / std::sqrt(200.0);
  REQUIRE(max(abs(w)).item<float>() <= bound);
  REQUIRE(max(abs(w)).item<float>() > 0.95 * bound);
  constant_(w, 0.25);
  REQUIRE(w.detach().equal(full({300, 200}, 0.25)));
  zeros_(w);
  REQUIRE(sum(w).item<float>() == 0);
  ones_(w);
  REQUIRE(sum(w).item<float>() == 60000);
  Tensor e = empty({2, 3});
  eye_(e);
  REQUIRE(e.equal(from_vector<float>({1, 0, 0, 0, 1, 0}, {2, 3})));
  nn::init::uniform_(w, -0.5, 0.5);
  REQUIRE(max(abs(w)).item<float>() <= 0.5);
  REQUIRE_FALSE(w.grad().defined());
  REQUIRE(w.is_leaf());
  REQUIRE_THROWS_WITH(nn::init::uniform_(empty({2}, i64)), Contains("floating"));
}
