// Optimizer in backward: per-parameter optimizers stepped in the post-accumulate-grad hooks must
// leave the parameters exactly where a plain optimizer's step() after backward leaves them, and
// the seam a synchroniser (DDP) uses must hand the steps over and back.
//
// The reference runs are the same small MLP (same seed, f64) trained with the plain optimizer:
// zero_grad, backward, step. Both runs go through the same fused per-parameter arithmetic, so the
// parameters agree bitwise.
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using optim::AdamOptions;
using optim::AdamWOptions;
using optim::InBackwardOptimizers;
using optim::OptimizerSpec;
using optim::SGDOptions;

namespace {

constexpr int kSteps = 8;

std::shared_ptr<nn::Sequential> make_mlp() {
  manual_seed(7);  // both runs start from the same parameters
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(4, 6));
  net->push_back(std::make_shared<nn::Tanh>());
  net->push_back(std::make_shared<nn::Linear>(6, 3));
  net->to(f64);
  return net;
}

struct Batch {
  Tensor x, y;
};

std::vector<Batch> make_batches(int n) {
  manual_seed(11);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({randn({5, 4}, f64), randn({5, 3}, f64)});
  return out;
}

Tensor loss_of(nn::Module& net, const Batch& b) { return nn::mse_loss(net(b.x), b.y); }

std::unique_ptr<optim::Optimizer> plain_optimizer(const OptimizerSpec& spec, const TensorList& params) {
  return std::visit(
      [&](const auto& o) -> std::unique_ptr<optim::Optimizer> {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, SGDOptions>) {
          return std::make_unique<optim::SGD>(params, o);
        } else if constexpr (std::is_same_v<O, AdamOptions>) {
          return std::make_unique<optim::Adam>(params, o);
        } else {
          return std::make_unique<optim::AdamW>(params, o);
        }
      },
      spec);
}

std::vector<Tensor> snapshot(const TensorList& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) out.push_back(p.detach().clone());
  return out;
}

void require_same(const TensorList& got, const TensorList& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("parameter " << i << " (shape " << fmt::format("{}", got[i].shape()) << ")");
    REQUIRE(equal(got[i].detach(), want[i].detach()));
  }
}

bool any_grad(const TensorList& params) {
  for (const Tensor& p : params) {
    if (p.grad().defined()) return true;
  }
  return false;
}

// Trains `steps` batches with the plain optimizer; `before_step(s, opt)` runs before step s.
TensorList plain_run(const OptimizerSpec& spec, int steps,
                     const std::function<void(int, optim::Optimizer&)>& before_step = {}) {
  auto net = make_mlp();
  auto opt = plain_optimizer(spec, net->parameters());
  auto batches = make_batches(steps);
  for (int s = 0; s < steps; ++s) {
    if (before_step) before_step(s, *opt);
    opt->zero_grad();
    loss_of(*net, batches[s]).backward();
    opt->step();
  }
  return snapshot(net->parameters());
}

}  // namespace

TEST_CASE("optimizer in backward: SGD, Adam and AdamW equal a plain step() after backward", "[optim][in_backward]") {
  struct Case {
    const char* name;
    OptimizerSpec spec;
  };
  const std::vector<Case> cases = {
      {"SGD lr=0.1", SGDOptions{.lr = 0.1}},
      {"SGD momentum weight_decay", SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}},
      {"SGD momentum dampening", SGDOptions{.lr = 0.05, .momentum = 0.8, .dampening = 0.3}},
      {"SGD Nesterov weight_decay", SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true}},
      {"Adam", AdamOptions{.lr = 0.01}},
      {"Adam weight_decay amsgrad", AdamOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}},
      {"AdamW", AdamWOptions{.lr = 0.01}},
      {"AdamW amsgrad", AdamWOptions{.lr = 0.01, .weight_decay = 0.05, .amsgrad = true}},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      auto net = make_mlp();
      TensorList params = net->parameters();
      auto initial = snapshot(params);
      auto in_backward = optim::apply_optimizer_in_backward(c.spec, params);
      REQUIRE(in_backward->size() == params.size());
      auto batches = make_batches(kSteps);
      for (int s = 0; s < kSteps; ++s) {
        loss_of(*net, batches[s]).backward();
        INFO("after backward " << s + 1);
        REQUIRE_FALSE(any_grad(params));  // each .grad dropped right after its step
      }
      require_same(params, plain_run(c.spec, kSteps));
      // Not vacuous: the parameters moved.
      for (size_t i = 0; i < params.size(); ++i) REQUIRE_FALSE(equal(params[i].detach(), initial[i]));
      // Each optimizer holds its one parameter, of the requested kind.
      const char* kind = std::visit(
          [](const auto& o) {
            using O = std::decay_t<decltype(o)>;
            return std::is_same_v<O, SGDOptions> ? "SGD" : std::is_same_v<O, AdamOptions> ? "Adam" : "AdamW";
          },
          c.spec);
      for (size_t i = 0; i < params.size(); ++i) {
        REQUIRE(in_backward->optimizer(i).name() == kind);
        REQUIRE(in_backward->optimizer(i).parameters().size() == 1);
        REQUIRE(&in_backward->optimizer_for(params[i]) == &in_backward->optimizer(i));
      }
    }
  }
}

TEST_CASE("optimizer in backward: keep_grads leaves .grad as the plain run has it", "[optim][in_backward]") {
  const OptimizerSpec spec = SGDOptions{.lr = 0.05, .momentum = 0.9};
  auto net = make_mlp();
  TensorList params = net->parameters();
  auto in_backward = optim::apply_optimizer_in_backward(spec, params, {.keep_grads = true});

  auto ref = make_mlp();
  TensorList ref_params = ref->parameters();
  auto opt = plain_optimizer(spec, ref_params);

  auto batches = make_batches(kSteps);
  for (int s = 0; s < kSteps; ++s) {
    net->zero_grad();  // kept gradients accumulate otherwise, as with any optimizer
    loss_of(*net, batches[s]).backward();
    opt->zero_grad();
    loss_of(*ref, batches[s]).backward();
    opt->step();
    for (size_t i = 0; i < params.size(); ++i) {
      REQUIRE(params[i].grad().defined());
      REQUIRE(equal(params[i].grad(), ref_params[i].grad()));
    }
  }
  require_same(params, ref_params);
}

TEST_CASE("optimizer in backward: a parameter used twice is stepped once per backward", "[optim][in_backward]") {
  manual_seed(3);
  Tensor w0 = randn({4, 4}, f64) * 0.5;
  auto batches = make_batches(3);
  auto loss_with = [&](const Tensor& w, const Batch& b) {
    Tensor h = tanh(matmul(b.x, w));  // w's first use
    return (matmul(h, w) * matmul(h, w)).sum();  // and two more
  };
  const AdamOptions options{.lr = 0.01};

  Tensor w = w0.clone().requires_grad_();
  int fired = 0;
  auto in_backward = optim::apply_optimizer_in_backward(options, {w});
  HookHandle counter = register_post_accumulate_grad_hook(w, [&](const Tensor&) { ++fired; });

  Tensor v = w0.clone().requires_grad_();
  optim::Adam plain({v}, options);
  for (int s = 0; s < 3; ++s) {
    loss_with(w, batches[s]).backward();
    plain.zero_grad();
    loss_with(v, batches[s]).backward();
    plain.step();
  }
  REQUIRE(fired == 3);
  REQUIRE(in_backward->optimizer(0).state(w)->step == 3);  // Adam counts every step it takes
  REQUIRE(equal(w.detach(), v.detach()));
}

TEST_CASE("optimizer in backward: a parameter the loss does not reach is not stepped", "[optim][in_backward]") {
  auto net = make_mlp();
  Tensor unused = randn({2, 2}, f64).requires_grad_();
  Tensor unused_before = unused.detach().clone();
  TensorList params = net->parameters();
  params.push_back(unused);
  auto in_backward = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.1, .momentum = 0.9}, params);
  auto batches = make_batches(2);
  for (const auto& b : batches) loss_of(*net, b).backward();

  const size_t u = params.size() - 1;
  REQUIRE(in_backward->optimizer_for(unused).state(unused) == nullptr);
  REQUIRE(equal(unused.detach(), unused_before));
  REQUIRE_FALSE(unused.grad().defined());
  auto sd = in_backward->state_dict();
  REQUIRE_FALSE(sd.contains(fmt::format("{}.state.0.momentum_buffer", u)));
  REQUIRE(sd.contains(fmt::format("{}.param_groups.0.params", u)));
  REQUIRE(sd.contains("0.state.0.momentum_buffer"));  // the reached ones were stepped
}

TEST_CASE("optimizer in backward: set_lr between steps matches the plain optimizer's schedule",
          "[optim][in_backward]") {
  for (const OptimizerSpec& spec : {OptimizerSpec(SGDOptions{.lr = 0.1, .momentum = 0.9}),
                                    OptimizerSpec(AdamWOptions{.lr = 0.02, .amsgrad = true})}) {
    auto schedule = [&](int s) { return std::visit([](const auto& o) { return o.lr; }, spec) * std::pow(0.7, s); };
    auto net = make_mlp();
    TensorList params = net->parameters();
    auto in_backward = optim::apply_optimizer_in_backward(spec, params);
    auto batches = make_batches(kSteps);
    for (int s = 0; s < kSteps; ++s) {
      in_backward->set_lr(schedule(s));
      REQUIRE(in_backward->lr() == schedule(s));
      for (size_t i = 0; i < params.size(); ++i) REQUIRE(in_backward->optimizer(i).lr() == schedule(s));
      loss_of(*net, batches[s]).backward();
    }
    require_same(params, plain_run(spec, kSteps, [&](int s, optim::Optimizer& opt) { opt.set_lr(schedule(s)); }));
    // And the schedule mattered: a constant learning rate ends elsewhere.
    auto constant = plain_run(spec, kSteps);
    REQUIRE_FALSE(equal(params[0].detach(), constant[0]));
  }
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, make_mlp()->parameters())->set_lr(-1),
                      Contains("[apply_optimizer_in_backward] set_lr: invalid learning rate: -1"));
}

TEST_CASE("optimizer in backward: state_dict, loaded into a fresh one, continues identically",
          "[optim][in_backward][state]") {
  const OptimizerSpec spec = AdamWOptions{.lr = 0.01, .amsgrad = true};
  auto batches = make_batches(kSteps);

  auto net = make_mlp();
  TensorList params = net->parameters();
  auto in_backward = optim::apply_optimizer_in_backward(spec, params);
  for (int s = 0; s < 4; ++s) loss_of(*net, batches[s]).backward();
  auto sd = in_backward->state_dict();
  for (const char* key : {"0.state.0.step", "0.state.0.exp_avg", "0.state.0.exp_avg_sq", "0.state.0.max_exp_avg_sq",
                          "0.param_groups.0.params", "0.param_groups.0.lr", "3.state.0.exp_avg",
                          "3.param_groups.0.amsgrad"}) {
    INFO(key);
    REQUIRE(sd.contains(key));
  }
  REQUIRE(sd["3.state.0.step"].item<double>() == 4);

  // A second model with the first's parameters and a fresh optimizer set (other hyperparameters,
  // which the dict overrides).
  auto resumed = make_mlp();
  TensorList resumed_params = resumed->parameters();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) resumed_params[i].copy_(params[i].detach());
  }
  auto fresh = optim::apply_optimizer_in_backward(AdamWOptions{.lr = 0.5}, resumed_params);
  fresh->load_state_dict(sd);
  REQUIRE(fresh->lr() == 0.01);
  REQUIRE(fresh->optimizer(2).state(resumed_params[2])->step == 4);

  for (int s = 4; s < kSteps; ++s) {
    loss_of(*net, batches[s]).backward();
    loss_of(*resumed, batches[s]).backward();
  }
  require_same(resumed_params, params);
  require_same(params, plain_run(spec, kSteps));
}

TEST_CASE("optimizer in backward: load_state_dict rejects what does not fit, changing nothing",
          "[optim][in_backward][state]") {
  auto net = make_mlp();
  TensorList params = net->parameters();
  auto in_backward = optim::apply_optimizer_in_backward(AdamOptions{.lr = 0.01}, params);
  loss_of(*net, make_batches(1)[0]).backward();
  const auto good = in_backward->state_dict();
  const auto exp_avg_before = in_backward->optimizer(0).state(params[0])->buffers.at("exp_avg").clone();

  auto with = [&](const std::string& key, const Tensor& value) {
    nn::TensorDict d = good;
    d.insert_or_assign(key, value);
    return d;
  };
  // The last parameter's part is bad: the earlier parts, though fine, must not be loaded.
  const size_t last = params.size() - 1;
  nn::TensorDict bad_last = with(fmt::format("{}.state.0.exp_avg", last), zeros({7}, f64));
  bad_last.insert_or_assign("0.param_groups.0.lr", scalar_tensor(0.3, f64));
  bad_last.insert_or_assign("0.state.0.exp_avg", zeros(params[0].shape(), f64));
  REQUIRE_THROWS_WITH(in_backward->load_state_dict(bad_last),
                      Contains("[apply_optimizer_in_backward] load_state_dict: parameter 3 (shape [3])") &&
                          Contains("has shape [7]"));
  REQUIRE(in_backward->lr() == 0.01);
  REQUIRE(in_backward->optimizer(0).lr() == 0.01);
  REQUIRE(equal(in_backward->optimizer(0).state(params[0])->buffers.at("exp_avg"), exp_avg_before));

  REQUIRE_THROWS_WITH(in_backward->load_state_dict(with("9.param_groups.0.lr", scalar_tensor(0.1, f64))),
                      Contains("'9.param_groups.0.lr' refers to parameter 9, but there are 4"));
  REQUIRE_THROWS_WITH(in_backward->load_state_dict(with("state.0.exp_avg", zeros({3}, f64))),
                      Contains("unexpected key 'state.0.exp_avg'"));
  REQUIRE_THROWS_WITH(in_backward->load_state_dict(with("1.state.0.momentum_buffer", zeros({6}, f64))),
                      Contains("parameter 1 (shape [6])") && Contains("unexpected key 'state.0.momentum_buffer'"));

  // Saved from fewer parameters: the missing ones are named rather than silently reset.
  nn::TensorDict fewer;
  for (const auto& [key, t] : good) {
    if (key.rfind("3.", 0) != 0) fewer.insert(key, t);
  }
  REQUIRE_THROWS_WITH(in_backward->load_state_dict(fewer),
                      Contains("no entries for parameter 3 (shape [3])"));

  // Another optimizer kind's dict.
  auto other_net = make_mlp();
  auto sgd = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.1, .momentum = 0.9}, other_net->parameters());
  loss_of(*other_net, make_batches(1)[0]).backward();
  REQUIRE_THROWS_WITH(in_backward->load_state_dict(sgd->state_dict()), Contains("[Adam] load_state_dict"));
  REQUIRE(equal(in_backward->optimizer(0).state(params[0])->buffers.at("exp_avg"), exp_avg_before));
  REQUIRE(in_backward->optimizer(0).state(params[0])->step == 1);
}

TEST_CASE("optimizer in backward: applying twice, or to a parameter listed twice, is an error naming it",
          "[optim][in_backward]") {
  auto net = make_mlp();
  TensorList params = net->parameters();
  auto first = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.1}, params);
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(AdamOptions{}, {params[2]}),
                      Contains("[apply_optimizer_in_backward] parameter 0 (shape [3, 6]) already has an optimizer in "
                               "backward"));
  // A failed apply leaves nothing behind: the second parameter of this list was free.
  Tensor free_param = randn({2}, f64).requires_grad_();
  REQUIRE_THROWS(optim::apply_optimizer_in_backward(AdamOptions{}, {free_param, params[1]}));
  REQUIRE_NOTHROW(optim::apply_optimizer_in_backward(AdamOptions{}, {free_param}));

  Tensor p = randn({5}, f64).requires_grad_();
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, {p, p}),
                      Contains("parameter 1 (shape [5]) appears more than once"));

  // Once removed, the parameters are free again.
  first->remove();
  REQUIRE_NOTHROW(optim::apply_optimizer_in_backward(AdamOptions{}, {params[2]}));
}

TEST_CASE("optimizer in backward: argument checks", "[optim][in_backward]") {
  Tensor x = randn({3}, f64);
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, {x}),
                      Contains("[apply_optimizer_in_backward] parameter 0 (shape [3]) must be a leaf that requires grad"));
  Tensor leaf = randn({3}, f64).requires_grad_();
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, {leaf * 2}),
                      Contains("must be a leaf that requires grad"));
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, {Tensor()}), Contains("parameter 0 is undefined"));
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, {arange(0, 3, TensorOptions(i64))}),
                      Contains("only floating tensors"));
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{.lr = -1}, {}), Contains("invalid learning rate"));
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(AdamWOptions{.beta1 = 1.5}, {leaf}), Contains("beta"));

  auto in_backward = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.25}, {leaf});
  REQUIRE_THROWS_WITH(in_backward->optimizer_for(x),
                      Contains("[apply_optimizer_in_backward] optimizer_for: the tensor of shape [3] is not one of the 1 "
                               "parameters"));
  REQUIRE_THROWS_WITH(in_backward->optimizer(1), Contains("optimizer index 1 is out of range: there are 1"));
  auto empty = optim::apply_optimizer_in_backward(AdamOptions{.lr = 0.125}, {});
  REQUIRE(empty->size() == 0);
  REQUIRE(empty->lr() == 0.125);
  REQUIRE(empty->state_dict().size() == 0);
}

TEST_CASE("optimizer in backward: a parameter claimed by a synchroniser cannot get one", "[optim][in_backward]") {
  auto net = make_mlp();
  TensorList params = net->parameters();
  optim::claim_gradient(params[1], "DistributedDataParallel");
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, params),
                      Contains("[apply_optimizer_in_backward] parameter [6] is managed by DistributedDataParallel: "
                               "apply the optimizer in backward before wrapping the module in DistributedDataParallel"));
  // The same owner may claim again (nested); another may not.
  optim::claim_gradient(params[1], "DistributedDataParallel");
  REQUIRE_THROWS_WITH(optim::claim_gradient(params[1], "FSDP"),
                      Contains("[claim_gradient] parameter [6] is already managed by DistributedDataParallel"));
  optim::unclaim_gradient(params[1]);
  REQUIRE_THROWS_WITH(optim::apply_optimizer_in_backward(SGDOptions{}, params), Contains("is managed by"));
  optim::unclaim_gradient(params[1]);
  REQUIRE_NOTHROW(optim::apply_optimizer_in_backward(SGDOptions{}, params));
}

TEST_CASE("optimizer in backward: take_over stops the local step, InBackwardStep::step() steps, give_back restores",
          "[optim][in_backward][seam]") {
  const OptimizerSpec spec = SGDOptions{.lr = 0.05, .momentum = 0.9};
  auto net = make_mlp();
  TensorList params = net->parameters();
  REQUIRE(optim::take_over_in_backward_step(params[0], "DDP") == nullptr);  // none applied yet
  auto in_backward = optim::apply_optimizer_in_backward(spec, params);
  auto batches = make_batches(3);

  std::vector<std::shared_ptr<optim::InBackwardStep>> taken;
  for (const Tensor& p : params) {
    taken.push_back(optim::take_over_in_backward_step(p, "DDP"));
    REQUIRE(taken.back() != nullptr);
    REQUIRE(taken.back()->taken_over());
    REQUIRE_FALSE(taken.back()->keep_grads());
  }
  REQUIRE(&taken[2]->optimizer() == &in_backward->optimizer(2));
  REQUIRE_THROWS_WITH(optim::take_over_in_backward_step(params[0], "FSDP"),
                      Contains("[take_over_in_backward_step] FSDP cannot take over") && Contains("DDP already holds it"));

  // Taken over: backward leaves the parameters alone and their gradients in place.
  auto before = snapshot(params);
  loss_of(*net, batches[0]).backward();
  require_same(params, before);
  for (const Tensor& p : params) REQUIRE(p.grad().defined());
  for (auto& s : taken) s->step();  // what DDP does after each bucket's reduction
  REQUIRE_FALSE(any_grad(params));
  taken[0]->step();  // no gradient: nothing to do
  for (const Tensor& p : params) optim::give_back_in_backward_step(p);
  REQUIRE_FALSE(taken[0]->taken_over());

  // Given back: the local hooks step again.
  for (int s = 1; s < 3; ++s) loss_of(*net, batches[s]).backward();
  REQUIRE_FALSE(any_grad(params));
  require_same(params, plain_run(spec, 3));
}

TEST_CASE("optimizer in backward: remove() and destruction stop stepping, also for a taker",
          "[optim][in_backward][seam]") {
  auto net = make_mlp();
  TensorList params = net->parameters();
  auto batches = make_batches(2);
  auto in_backward = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.1}, params);
  in_backward->remove();
  auto before = snapshot(params);
  loss_of(*net, batches[0]).backward();
  require_same(params, before);
  for (const Tensor& p : params) REQUIRE(p.grad().defined());  // left for the user
  in_backward->remove();  // idempotent
  net->zero_grad();

  // A taker's step outlives the set that made it, and does nothing once the set is gone.
  auto again = optim::apply_optimizer_in_backward(SGDOptions{.lr = 0.1}, params);
  auto step = optim::take_over_in_backward_step(params[0], "DDP");
  REQUIRE(step->active());
  again.reset();
  REQUIRE_FALSE(step->active());
  loss_of(*net, batches[1]).backward();
  step->step();
  require_same(params, before);
  REQUIRE(params[0].grad().defined());
  optim::give_back_in_backward_step(params[0]);  // nothing left to give back: harmless
  REQUIRE(optim::take_over_in_backward_step(params[0], "DDP") == nullptr);
}

TEST_CASE("optimizer in backward: taken-over steps run on other threads", "[optim][in_backward][seam][threads]") {
  // As DDP's communication thread does: the main thread's backward only computes gradients, then
  // two threads step disjoint halves of the parameters concurrently. Written for TSan too.
  const OptimizerSpec spec = AdamOptions{.lr = 0.01, .amsgrad = true};
  auto net = make_mlp();
  TensorList params = net->parameters();
  auto in_backward = optim::apply_optimizer_in_backward(spec, params);
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps;
  for (const Tensor& p : params) steps.push_back(optim::take_over_in_backward_step(p, "test"));

  auto batches = make_batches(4);
  std::atomic<int> stepped{0};
  for (const auto& b : batches) {
    loss_of(*net, b).backward();
    auto worker = [&](size_t first) {
      for (size_t i = first; i < steps.size(); i += 2) {
        steps[i]->step();
        ++stepped;
      }
    };
    std::thread t0(worker, 0), t1(worker, 1);
    t0.join();
    t1.join();
    REQUIRE_FALSE(any_grad(params));
  }
  REQUIRE(stepped == static_cast<int>(batches.size() * params.size()));
  require_same(params, plain_run(spec, 4));
  for (const Tensor& p : params) optim::give_back_in_backward_step(p);
}
