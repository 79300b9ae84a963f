// Optimizers: update values against torch.optim, skipping, validation, param groups, state dict.
//
// Reference values: PyTorch 1.13, p = tensor([1., -2., 3.]) with the gradients of kGrads set by
// hand before each of three opt.step() calls (torch.optim.SGD/Adam/AdamW with the options named
// in each case), p printed with repr(float(x)) after every step. f64 unless marked f32.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;
using Catch::Contains;
using Rows = std::vector<std::vector<double>>;

namespace {

const Rows kGrads = {{0.1, 0.2, -0.3}, {-0.5, 0.4, 0.25}, {0.3, -0.1, 0.2}};

// A leaf holding [1, -2, 3]; `strided` makes it a non-contiguous view (the general path).
Tensor make_param(Dtype dtype, bool strided) {
  Tensor base = zeros({3, 2}, dtype);
  Tensor p = strided ? base.select(1, 1) : base.select(1, 1).contiguous();
  {
    NoGradGuard g;
    p.copy_(from_vector<double>({1.0, -2.0, 3.0}));
  }
  p.requires_grad_();
  REQUIRE(p.is_contiguous() == !strided);
  return p;
}

void set_grad(const Tensor& p, const std::vector<double>& g) { p.set_grad(to_dtype(from_vector<double>(g), p.dtype())); }

template <class Opt, class Options>
void check_steps(const Options& options, const Rows& expected, Dtype dtype, bool strided, double tol) {
  Tensor p = make_param(dtype, strided);
  Opt opt({p}, options);
  for (size_t s = 0; s < kGrads.size(); ++s) {
    set_grad(p, kGrads[s]);
    opt.step();
    auto got = to_dtype(p.detach(), f64).contiguous().to_vector<double>();
    for (size_t i = 0; i < 3; ++i) {
      INFO("step " << s + 1 << " element " << i << ": got " << got[i] << ", want " << expected[s][i]);
      REQUIRE(std::abs(got[i] - expected[s][i]) <= tol * (1 + std::abs(expected[s][i])));
    }
  }
}

const Rows kSgdPlain = {{0.99, -2.02, 3.03}, {1.04, -2.06, 3.005}, {1.01, -2.0500000000000003, 2.985}};
const Rows kSgdMomentumDecay = {{0.989, -2.018, 3.027},
                                {1.028111, -2.0721819999999997, 3.023273},
                                {1.032282789, -2.1088736179999996, 2.996895427}};
const Rows kSgdNesterov = {{0.962, -2.0, 3.0},
                           {1.022522, -2.038, 2.8955},
                           {0.9642218819999999, -1.9964779999999998, 2.7579355000000003}};
const Rows kSgdDampening = {{0.995, -2.01, 3.015},
                            {1.01, -2.029, 3.01375},
                            {1.0070000000000001, -2.0349999999999997, 3.006125}};
const Rows kSgdMaximize = {{1.005, -1.99, 2.985},
                           {0.9824999999999999, -1.965, 2.9899999999999998},
                           {0.98625, -1.9575, 3.0025}};

}  // namespace

TEST_CASE("SGD: torch.optim.SGD values (fused and general paths, f64 and f32)", "[optim][sgd]") {
  using optim::SGD;
  using optim::SGDOptions;
  struct Case {
    const char* name;
    SGDOptions options;
    const Rows* expected;
  };
  const std::vector<Case> cases = {
      {"lr=0.1", {.lr = 0.1}, &kSgdPlain},
      {"lr=0.1 momentum=0.9 weight_decay=0.01", {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, &kSgdMomentumDecay},
      {"lr=0.1 momentum=0.9 nesterov weight_decay=0.1",
       {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true},
       &kSgdNesterov},
      {"lr=0.05 momentum=0.5 dampening=0.3", {.lr = 0.05, .momentum = 0.5, .dampening = 0.3}, &kSgdDampening},
      {"lr=0.05 momentum=0.5 maximize", {.lr = 0.05, .momentum = 0.5, .maximize = true}, &kSgdMaximize},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      check_steps<SGD>(c.options, *c.expected, f64, /*strided=*/false, 1e-14);
      check_steps<SGD>(c.options, *c.expected, f64, /*strided=*/true, 1e-14);
      // f32: same rules in single precision (torch's f32 results agree with these to ~1e-7).
      check_steps<SGD>(c.options, *c.expected, f32, false, 3e-7);
      check_steps<SGD>(c.options, *c.expected, f32, true, 3e-7);
    }
  }
}

TEST_CASE("SGD: f32 step matches torch's f32 numbers", "[optim][sgd]") {
  // torch 1.13, float32, lr=0.1 momentum=0.9 weight_decay=0.01
  const Rows expected = {{0.9890000224113464, -2.0179998874664307, 3.0269999504089355},
                         {1.0281109809875488, -2.0721819400787354, 3.02327299118042},
                         {1.0322827100753784, -2.1088736057281494, 2.9968953132629395}};
  check_steps<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, expected, f32, false,
                          1e-7);
}

TEST_CASE("Adam / AdamW: torch.optim values", "[optim][adam]") {
  SECTION("Adam lr=0.01") {
    check_steps<optim::Adam>(optim::AdamOptions{.lr = 0.01},
                             {{0.9900000009999999, -2.0099999995, 3.009999999666667},
                              {0.9959835426552334, -2.0196518194530464, 3.0103812199892404},
                              {0.9967288866915633, -2.025537886557849, 3.0077296458366556}},
                             f64, false, 1e-13);
  }
  SECTION("Adam lr=0.01 weight_decay=0.1 amsgrad") {
    // The third element's gradient plus decay is exactly 0 at the first step: a sharp test of the
    // order of operations (L2 term added to the gradient before the moments).
    check_steps<optim::Adam>(optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true},
                             {{0.9900000005, -2.0, 2.9999999999722444},
                              {0.9936703327599068, -2.007441367709617, 2.9925586319278663},
                              {0.9915361425502198, -2.0053054246474007, 2.9840056473144885}},
                             f64, false, 1e-10);
  }
  SECTION("AdamW lr=0.01 weight_decay=0.1") {
    check_steps<optim::AdamW>(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1},
                              {{0.9890000009999999, -2.0079999995, 3.0069999996666668},
                               {0.9939945426542334, -2.015643819453546, 3.0043742199895735},
                               {0.9937458921479091, -2.0195142427388952, 2.9987182716169993}},
                              f64, false, 1e-13);
  }
  SECTION("AdamW lr=0.01 betas=(0.8, 0.99) weight_decay=0.1 amsgrad (strided)") {
    check_steps<optim::AdamW>(optim::AdamWOptions{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 0.1,
                                                  .amsgrad = true},
                              {{0.9890000009999999, -2.0079999995, 3.0069999996666668},
                               {0.9944675458424359, -2.0158153983566955, 3.0037917179090936},
                               {0.9939045429079074, -2.0191941560101565, 2.9974182649222296}},
                              f64, true, 1e-13);
  }
  SECTION("AdamW f32 (torch float32 numbers)") {
    check_steps<optim::AdamW>(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1},
                              {{0.9890000224113464, -2.008000135421753, 3.006999969482422},
                               {0.9939945936203003, -2.015644073486328, 3.0043742656707764},
                               {0.9937459826469421, -2.019514560699463, 2.99871826171875}},
                              f32, false, 2e-7);
  }
  REQUIRE(optim::AdamWOptions{}.weight_decay == 1e-2);
  REQUIRE(optim::AdamOptions{}.weight_decay == 0);
}

TEST_CASE("optimizers skip parameters without a gradient", "[optim]") {
  Tensor a = make_param(f32, false), b = make_param(f32, false);
  optim::SGD sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
  optim::AdamW adamw({a, b});
  set_grad(a, {1, 1, 1});
  sgd.step();
  adamw.step();
  REQUIRE(b.detach().equal(from_vector<float>({1, -2, 3})));
  REQUIRE(sgd.state(b) == nullptr);
  REQUIRE(adamw.state(b) == nullptr);
  REQUIRE(sgd.state(a) != nullptr);
  REQUIRE(adamw.state(a)->step == 1);
  REQUIRE_FALSE(a.detach().equal(from_vector<float>({1, -2, 3})));
}

TEST_CASE("optimizers: validation errors", "[optim]") {
  Tensor p = make_param(f32, false);
  REQUIRE_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .nesterov = true}),
                      Contains("[SGD] Nesterov momentum requires a momentum and zero dampening"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                      Contains("Nesterov"));
  REQUIRE_THROWS_WITH(optim::SGD({p}, {.lr = -1}), Contains("[SGD] invalid learning rate: -1"));
  REQUIRE_THROWS_WITH(optim::Adam({p}, {.beta1 = 1.0}), Contains("[Adam] invalid beta parameter at index 0"));
  REQUIRE_THROWS_WITH(optim::SGD({p, p}), Contains("more than once"));
  Tensor nonleaf = p * 2.0;
  REQUIRE_THROWS_WITH(optim::SGD({nonleaf}), Contains("non-leaf"));
  REQUIRE_THROWS_WITH(optim::SGD({zeros({2}, i64)}), Contains("floating"));
}

TEST_CASE("optimizers: zero_grad and param groups", "[optim]") {
  Tensor a = make_param(f64, false), b = make_param(f64, false);
  std::vector<optim::ParamGroup<optim::SGDOptions>> groups = {{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.01}}};
  optim::SGD sgd(groups);
  REQUIRE(sgd.num_param_groups() == 2);
  set_grad(a, {1, 1, 1});
  set_grad(b, {1, 1, 1});
  sgd.step();
  REQUIRE(a.detach().allclose(from_vector<double>({0.9, -2.1, 2.9})));
  REQUIRE(b.detach().allclose(from_vector<double>({0.99, -2.01, 2.99})));
  sgd.set_lr(0.5);
  REQUIRE(sgd.lr(1) == 0.5);
  sgd.zero_grad(/*set_to_none=*/false);
  REQUIRE(a.grad().equal(zeros({3}, f64)));
  sgd.zero_grad();
  REQUIRE_FALSE(a.grad().defined());
  REQUIRE_FALSE(b.grad().defined());
  REQUIRE_THROWS_WITH(sgd.add_param_group({{a}, {.lr = 0.1}}), Contains("more than once"));
}

TEST_CASE("optimizers: state_dict names and a resumed run matches an uninterrupted one", "[optim][state]") {
  auto run = [](auto make_opt, int steps_before, bool resume) {
    Tensor p = make_param(f64, false);
    auto opt = make_opt(p);
    for (int s = 0; s < steps_before; ++s) {
      set_grad(p, kGrads[s]);
      opt->step();
    }
    if (resume) {
      auto sd = opt->state_dict();
      Tensor q = make_param(f64, false);
      {
        NoGradGuard g;
        q.copy_(p.detach());
      }
      auto fresh = make_opt(q);
      fresh->load_state_dict(sd);
      p = q;
      opt = std::move(fresh);
    }
    set_grad(p, kGrads[steps_before]);
    opt->step();
    return p.detach().to_vector<double>();
  };
  auto make_sgd = [](const Tensor& p) {
    return std::make_unique<optim::SGD>(TensorList{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  };
  auto make_adamw = [](const Tensor& p) {
    return std::make_unique<optim::AdamW>(TensorList{p}, optim::AdamWOptions{.lr = 0.01, .amsgrad = true});
  };
  REQUIRE(run(make_sgd, 2, true) == run(make_sgd, 2, false));
  REQUIRE(run(make_adamw, 2, true) == run(make_adamw, 2, false));

  Tensor p = make_param(f64, false);
  optim::AdamW adamw({p}, {.lr = 0.01, .amsgrad = true});
  set_grad(p, kGrads[0]);
  adamw.step();
  adamw.step();
  auto sd = adamw.state_dict();
  for (const char* key : {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq",
                          "param_groups.0.params", "param_groups.0.lr", "param_groups.0.beta1",
                          "param_groups.0.weight_decay", "param_groups.0.amsgrad"}) {
    INFO(key);
    REQUIRE(sd.contains(key));
  }
  REQUIRE(sd["state.0.step"].item<double>() == 2);
  REQUIRE(sd["state.0.step"].dim() == 0);
  REQUIRE(sd["param_groups.0.lr"].item<double>() == 0.01);

  // Hyperparameters come back from the dict.
  Tensor q = make_param(f64, false);
  optim::AdamW other({q}, {.lr = 0.5});
  other.load_state_dict(sd);
  REQUIRE(other.lr() == 0.01);
  REQUIRE(other.param_groups()[0].options.amsgrad);
  REQUIRE(other.state(q)->step == 2);

  optim::SGD sgd({make_param(f64, false)}, {.lr = 0.1, .momentum = 0.9});
  REQUIRE(sgd.state_dict().keys() ==
          std::vector<std::string>{"param_groups.0.params", "param_groups.0.lr", "param_groups.0.momentum",
                                   "param_groups.0.dampening", "param_groups.0.weight_decay",
                                   "param_groups.0.nesterov", "param_groups.0.maximize"});
}

TEST_CASE("optimizers: load_state_dict rejects what does not fit, changing nothing", "[optim][state]") {
  Tensor p = make_param(f64, false);
  optim::AdamW adamw({p}, {.lr = 0.01});
  set_grad(p, kGrads[0]);
  adamw.step();
  auto good = adamw.state_dict();

  auto with = [&](const std::string& key, const Tensor& value) {
    nn::TensorDict d = good;
    d.insert_or_assign(key, value);
    return d;
  };
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("state.0.exp_avg", zeros({4}, f64))),
                      Contains("[AdamW]") && Contains("'state.0.exp_avg' has shape [4]") && Contains("[3]"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("state.5.exp_avg", zeros({3}, f64))),
                      Contains("refers to parameter 5, but the optimizer has 1"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("state.0.momentum_buffer", zeros({3}, f64))),
                      Contains("unexpected key 'state.0.momentum_buffer'"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("param_groups.0.momentum", scalar_tensor(0.9, f64))),
                      Contains("unexpected key 'param_groups.0.momentum'"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("param_groups.1.lr", scalar_tensor(0.9, f64))),
                      Contains("group 1"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("param_groups.0.params", arange(0, 2, TensorOptions(i64)))),
                      Contains("group 0 has 1 parameters here, but the state dict lists 2"));
  REQUIRE_THROWS_WITH(adamw.load_state_dict(with("weird", zeros({1}))), Contains("unexpected key 'weird'"));
  nn::TensorDict bad_lr = with("param_groups.0.lr", scalar_tensor(0.7, f64));
  bad_lr.insert("state.0.bogus", zeros({3}, f64));
  REQUIRE_THROWS(adamw.load_state_dict(bad_lr));
  REQUIRE(adamw.lr() == 0.01);  // validation precedes any change
  REQUIRE(adamw.state(p)->step == 1);
}

TEST_CASE("optimizers: save/load through safetensors", "[optim][state][safetensors]") {
  auto dir = std::filesystem::temp_directory_path() / ("tandem_optim_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "opt.safetensors").string();
  Tensor p = make_param(f32, false);
  optim::SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, kGrads[0]);
  sgd.step();
  nn::save_optimizer(sgd, path);
  Tensor q = make_param(f32, false);
  optim::SGD restored({q}, {.lr = 0.3});
  nn::load_optimizer(restored, path);
  REQUIRE(restored.lr() == Approx(0.1));
  REQUIRE(restored.state(q)->buffers.at("momentum_buffer").equal(sgd.state(p)->buffers.at("momentum_buffer")));
  optim::AdamW wrong({q});
  REQUIRE_THROWS_WITH(nn::load_optimizer(wrong, path), Contains("holds SGD optimizer state"));
  std::filesystem::remove_all(dir);
}
