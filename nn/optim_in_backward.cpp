#include "nn/optim_in_backward.h"

#include <type_traits>
#include <unordered_set>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::optim {

namespace {

constexpr const char* kApply = "[apply_optimizer_in_backward]";

// Who holds which parameter's step, and which parameters a synchroniser manages. Keyed by the
// parameter's TensorImpl: an entry's owner keeps the parameter alive (the step holds it, a
// synchroniser holds its module), so an address cannot be reused while its entry exists.
struct Registry {
  struct Claim {
    std::string owner;
    int count = 0;
  };
  std::mutex mu;
  std::unordered_map<const TensorImpl*, std::shared_ptr<InBackwardStep>> steps;
  std::unordered_map<const TensorImpl*, Claim> claims;
};

// Never destroyed: optimizer sets and synchronisers with static storage duration may be
// destroyed after a function-local static registry would have been.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSpec& spec, const Tensor& param) {
  return std::visit(
      [&](const auto& o) -> std::unique_ptr<Optimizer> {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, SGDOptions>) {
          return std::make_unique<SGD>(TensorList{param}, o);
        } else if constexpr (std::is_same_v<O, AdamOptions>) {
          return std::make_unique<Adam>(TensorList{param}, o);
        } else {
          return std::make_unique<AdamW>(TensorList{param}, o);
        }
      },
      spec);
}

void validate_spec(const OptimizerSpec& spec) {
  std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, AdamWOptions>) {
          AdamOptions(o).validate();
        } else {
          o.validate();
        }
      },
      spec);
}

// "12.state.0.exp_avg" -> (12, "state.0.exp_avg"); false when the key does not have that form.
bool split_index(const std::string& key, size_t& index, std::string& rest) {
  size_t dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 9 || dot + 1 == key.size()) return false;
  std::string digits = key.substr(0, dot);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoul(digits);
  rest = key.substr(dot + 1);
  return true;
}

}  // namespace

// ---- InBackwardStep ----

InBackwardStep::InBackwardStep(Tensor param, std::unique_ptr<Optimizer> optimizer, bool keep_grads)
    : param_(std::move(param)), optimizer_(std::move(optimizer)), keep_grads_(keep_grads) {
  TANDEM_CHECK(param_.defined() && optimizer_ != nullptr, "{} an InBackwardStep needs a parameter and an optimizer",
               kApply);
}

InBackwardStep::InBackwardStep(Tensor param, std::function<void()> step, bool keep_grads)
    : param_(std::move(param)), step_fn_(std::move(step)), keep_grads_(keep_grads) {
  TANDEM_CHECK(param_.defined() && step_fn_ != nullptr, "{} an InBackwardStep needs a parameter and a step", kApply);
}

Optimizer& InBackwardStep::optimizer() {
  TANDEM_CHECK(optimizer_ != nullptr, "{} this parameter's step belongs to another optimizer: it has none of its own",
               kApply);
  return *optimizer_;
}

const Optimizer& InBackwardStep::optimizer() const { return const_cast<InBackwardStep*>(this)->optimizer(); }

void InBackwardStep::step() {
  std::lock_guard lock(mu_);
  if (removed_.load(std::memory_order_acquire)) return;
  if (!param_.grad().defined()) return;
  // The taker may call this from its communication thread, whose grad mode is its own.
  NoGradGuard no_grad;
  if (optimizer_) {
    optimizer_->step();
  } else {
    step_fn_();
  }
  if (!keep_grads_) param_.set_grad(Tensor());  // the gradient's memory goes while backward still runs
}

void InBackwardStep::step_from_hook() {
  if (taken_.load(std::memory_order_acquire)) return;  // the synchroniser steps it after its reduction
  step();
}

// ---- InBackwardOptimizers ----

InBackwardOptimizers::InBackwardOptimizers(const OptimizerSpec& spec, const TensorList& params,
                                           InBackwardOptions options)
    : spec_(spec), options_(options) {
  validate_spec(spec);  // also for an empty list, so a bad spec never passes silently
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    TANDEM_CHECK(p.defined(), "{} parameter {} is undefined", kApply, i);
    TANDEM_CHECK(p.is_floating_point(), "{} parameter {} (shape {}) is {}: only floating tensors can be optimized",
                 kApply, i, p.shape(), p.dtype());
    TANDEM_CHECK(p.is_leaf() && p.requires_grad(),
                 "{} parameter {} (shape {}) must be a leaf that requires grad: only those have post-accumulate-grad "
                 "hooks",
                 kApply, i, p.shape());
    TANDEM_CHECK(index_.emplace(p.impl(), i).second,
                 "{} parameter {} (shape {}) appears more than once in the list (it would be stepped twice)", kApply,
                 i, p.shape());
  }
  params_ = params;
  steps_.reserve(params.size());
  for (const Tensor& p : params) {
    steps_.push_back(std::make_shared<InBackwardStep>(p, make_optimizer(spec, p), options.keep_grads));
  }
}

namespace {

// Every check before the first insertion: a failed registration leaves the registry as it was.
void register_steps(const std::vector<std::shared_ptr<InBackwardStep>>& steps, const char* who) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Tensor& p = steps[i]->parameter();
    TANDEM_CHECK(!r.steps.count(p.impl()),
                 "{} parameter {} (shape {}) already has an optimizer in backward: apply it once per parameter "
                 "(or remove() the earlier one first)",
                 who, i, p.shape());
    auto claim = r.claims.find(p.impl());
    TANDEM_CHECK(claim == r.claims.end(),
                 "{} parameter {} is managed by {}: apply the optimizer in backward before wrapping the module in {}",
                 who, p.shape(), claim->second.owner, claim->second.owner);
  }
  for (const auto& step : steps) r.steps.emplace(step->parameter().impl(), step);
}

void unregister_steps(const std::vector<std::shared_ptr<InBackwardStep>>& steps) noexcept {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  for (const auto& s : steps) {
    auto it = r.steps.find(s->parameter().impl());
    if (it != r.steps.end() && it->second == s) r.steps.erase(it);
  }
}

}  // namespace

void InBackwardOptimizers::attach() {
  register_steps(steps_, kApply);
  registered_ = true;
  hooks_.reserve(steps_.size());
  for (const auto& step : steps_) {
    // Weak: the parameter owns its hook list, and a strong reference from there would keep the
    // step, and through its optimizer the parameter itself, alive in a cycle.
    std::weak_ptr<InBackwardStep> weak = step;
    hooks_.push_back(register_post_accumulate_grad_hook(step->parameter(), [weak](const Tensor&) {
      if (auto s = weak.lock()) s->step_from_hook();
    }));
  }
}

InBackwardOptimizers::~InBackwardOptimizers() { remove(); }

void InBackwardOptimizers::remove() noexcept {
  for (auto& h : hooks_) h.remove();
  hooks_.clear();
  for (const auto& s : steps_) {
    s->removed_.store(true, std::memory_order_release);
    // Wait out a step in flight on another thread: once remove() returns nothing steps.
    std::lock_guard lock(s->mu_);
  }
  if (registered_) {
    unregister_steps(steps_);
    registered_ = false;
  }
}

// ---- InBackwardRegistration ----

InBackwardRegistration::~InBackwardRegistration() { remove(); }

void InBackwardRegistration::remove() noexcept {
  for (const auto& s : steps_) {
    s->removed_.store(true, std::memory_order_release);
    std::lock_guard lock(s->mu_);  // a step in flight on another thread ends first
  }
  if (registered_) {
    unregister_steps(steps_);
    registered_ = false;
  }
}

std::unique_ptr<InBackwardRegistration> register_in_backward_steps(std::vector<std::shared_ptr<InBackwardStep>> steps,
                                                                   const std::string& who) {
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < steps.size(); ++i) {
    TANDEM_CHECK(steps[i] != nullptr, "[{}] in-backward step {} is null", who, i);
    TANDEM_CHECK(seen.insert(steps[i]->parameter().impl()).second, "[{}] parameter {} has two in-backward steps", who,
                 i);
  }
  std::unique_ptr<InBackwardRegistration> reg(new InBackwardRegistration(std::move(steps)));
  register_steps(reg->steps_, fmt::format("[{}]", who).c_str());
  reg->registered_ = true;
  return reg;
}

Optimizer& InBackwardOptimizers::optimizer(size_t i) {
  TANDEM_CHECK(i < steps_.size(), "{} optimizer index {} is out of range: there are {} parameters", kApply, i,
               steps_.size());
  return steps_[i]->optimizer();
}

Optimizer& InBackwardOptimizers::optimizer_for(const Tensor& param) {
  TANDEM_CHECK(param.defined(), "{} optimizer_for: undefined tensor", kApply);
  auto it = index_.find(param.impl());
  TANDEM_CHECK(it != index_.end(), "{} optimizer_for: the tensor of shape {} is not one of the {} parameters given",
               kApply, param.shape(), params_.size());
  return steps_[it->second]->optimizer();
}

double InBackwardOptimizers::lr() const {
  if (steps_.empty()) return std::visit([](const auto& o) { return o.lr; }, spec_);
  std::lock_guard lock(steps_[0]->mu_);
  return steps_[0]->optimizer().lr();
}

void InBackwardOptimizers::set_lr(double lr) {
  TANDEM_CHECK(lr >= 0, "{} set_lr: invalid learning rate: {}", kApply, lr);
  std::visit([&](auto& o) { o.lr = lr; }, spec_);
  for (const auto& s : steps_) {
    std::lock_guard lock(s->mu_);
    s->optimizer().set_lr(lr);
  }
}

TensorDict InBackwardOptimizers::state_dict() const {
  TensorDict out;
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::lock_guard lock(steps_[i]->mu_);
    for (const auto& [key, t] : steps_[i]->optimizer().state_dict()) out.insert(fmt::format("{}.{}", i, key), t);
  }
  return out;
}

void InBackwardOptimizers::load_state_dict(const TensorDict& sd) {
  std::vector<TensorDict> parts(steps_.size());
  for (const auto& [key, t] : sd) {
    size_t index = 0;
    std::string rest;
    TANDEM_CHECK(split_index(key, index, rest),
                 "{} load_state_dict: unexpected key '{}' (keys are '<parameter index>.<its optimizer's key>')", kApply,
                 key);
    TANDEM_CHECK(index < steps_.size(), "{} load_state_dict: '{}' refers to parameter {}, but there are {}", kApply,
                 key, index, steps_.size());
    parts[index].insert(rest, t);
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    // Without this a dict saved from fewer parameters would silently reset the others' state.
    TANDEM_CHECK(parts[i].contains("param_groups.0.params"),
                 "{} load_state_dict: no entries for parameter {} (shape {}): the state dict was saved from another "
                 "set of parameters",
                 kApply, i, params_[i].shape());
  }
  // Each part is loaded into a scratch optimizer of the same kind first, over a stand-in for the
  // parameter with its shape, dtype and device (one element, expanded): the same checks the real
  // load makes, so a failure anywhere leaves every optimizer as it was.
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor stand_in = zeros({}, TensorOptions(p.dtype(), p.device())).expand(p.shape());
    try {
      make_optimizer(spec_, stand_in)->load_state_dict(parts[i]);
    } catch (const Error& e) {
      fail("{} load_state_dict: parameter {} (shape {}), keys '{}.*': {}", kApply, i, p.shape(), i, e.what());
    }
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::lock_guard lock(steps_[i]->mu_);
    steps_[i]->optimizer().load_state_dict(parts[i]);
  }
}

std::shared_ptr<InBackwardOptimizers> apply_optimizer_in_backward(const OptimizerSpec& spec, const TensorList& params,
                                                                  InBackwardOptions options) {
  // Attached after construction, so a failure there still runs the destructor, which undoes
  // whatever part of the attachment was made.
  std::shared_ptr<InBackwardOptimizers> set(new InBackwardOptimizers(spec, params, options));
  set->attach();
  return set;
}

bool has_optimizer_in_backward(const Tensor& param) {
  if (!param.defined()) return false;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.steps.count(param.impl()) != 0;
}

// ---- the seam for a gradient synchroniser ----

std::shared_ptr<InBackwardStep> take_over_in_backward_step(const Tensor& param, const std::string& owner) {
  TANDEM_CHECK(param.defined(), "[take_over_in_backward_step] undefined tensor (taker {})", owner);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.steps.find(param.impl());
  if (it == r.steps.end()) return nullptr;
  InBackwardStep& s = *it->second;
  // Two takers would both step the parameter after their reductions.
  TANDEM_CHECK(!s.taken_.load(std::memory_order_acquire),
               "[take_over_in_backward_step] {} cannot take over the optimizer-in-backward step of parameter {}: {} "
               "already holds it",
               owner, param.shape(), s.taker_);
  s.taker_ = owner;
  s.taken_.store(true, std::memory_order_release);
  return it->second;
}

void give_back_in_backward_step(const Tensor& param) noexcept {
  if (!param.defined()) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.steps.find(param.impl());
  if (it == r.steps.end()) return;
  it->second->taker_.clear();
  it->second->taken_.store(false, std::memory_order_release);
}

void claim_gradient(const Tensor& param, const std::string& owner) {
  TANDEM_CHECK(param.defined(), "[claim_gradient] undefined tensor (owner {})", owner);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto [it, inserted] = r.claims.try_emplace(param.impl(), Registry::Claim{owner, 0});
  TANDEM_CHECK(it->second.owner == owner, "[claim_gradient] parameter {} is already managed by {}; {} cannot manage it too",
               param.shape(), it->second.owner, owner);
  ++it->second.count;
}

void unclaim_gradient(const Tensor& param) noexcept {
  if (!param.defined()) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.claims.find(param.impl());
  if (it != r.claims.end() && --it->second.count <= 0) r.claims.erase(it);
}

}  // namespace tandem::optim
