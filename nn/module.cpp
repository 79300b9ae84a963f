#include "nn/module.h"

#include <ostream>
#include <sstream>
#include <unordered_set>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::nn {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string join_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += "'" + n + "'";
  }
  return out;
}

// Replaces the data behind `slot`'s TensorImpl by `fresh` (a tensor nobody else references),
// keeping the impl and its autograd metadata, so every handle to the parameter stays valid.
// New values for a module's tensor: a version bump, so that tensors saved for a pending backward
// notice (TensorImpl::rebind).
void replace_data(const Tensor& slot, const Tensor& fresh) {
  slot.impl()->rebind(*fresh.impl(), /*bump_version=*/true);
}

}  // namespace

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

// enable_shared_from_this is value-initialised, not moved: the new object starts unowned.
Module::Module(Module&& other)
    : std::enable_shared_from_this<Module>(),
      type_name_(other.type_name_),
      training_(other.training_),
      parameters_(std::move(other.parameters_)),
      buffers_(std::move(other.buffers_)),
      children_(std::move(other.children_)),
      pre_hooks_(std::move(other.pre_hooks_)) {
  // A moved-from container is only "valid but unspecified": make the old object plainly empty.
  other.parameters_.clear();
  other.buffers_.clear();
  other.children_.clear();
}

namespace {
// The module whose default forward(Tensor) is handing its input to forward_inputs on this thread.
thread_local const Module* t_forwarding_one_input = nullptr;
}  // namespace

Tensor Module::forward(const Tensor& input) {
  TANDEM_CHECK(max_inputs() > 1, "[{}] this module does not implement forward(const Tensor&)", type_name_);
  // A forward_inputs that hands a single input back to forward would loop forever.
  TANDEM_CHECK(t_forwarding_one_input != this,
               "[{}] takes several inputs but implements neither forward(const Tensor&) nor forward_inputs for one "
               "input (its forward_inputs called forward for it)",
               type_name_);
  const Module* previous = std::exchange(t_forwarding_one_input, this);
  struct Restore {
    const Module* previous;
    ~Restore() { t_forwarding_one_input = previous; }
  } restore{previous};
  return forward_inputs({input});
}

Tensor Module::forward_inputs(const TensorList& inputs) {
  TANDEM_CHECK(!inputs.empty(), "[{}] forward got no input", type_name_);
  TANDEM_CHECK(inputs.size() <= max_inputs(), "[{}] takes {} input{}, got {}", type_name_, max_inputs(),
               max_inputs() == 1 ? "" : "s at most", inputs.size());
  // A module that declares several inputs but does not take them would loop through forward.
  TANDEM_CHECK(max_inputs() == 1, "[{}] declares {} inputs (max_inputs) but does not implement forward_inputs",
               type_name_, max_inputs());
  return forward(inputs[0]);
}

Tensor Module::call(const TensorList& inputs) {
  TANDEM_CHECK(!inputs.empty(), "[{}] called with no input", type_name_);
  if (inputs.size() == 1) return (*this)(inputs[0]);
  TANDEM_CHECK(inputs.size() <= max_inputs(), "[{}] takes {} input{}, got {}", type_name_, max_inputs(),
               max_inputs() == 1 ? "" : "s at most", inputs.size());
  return forward_inputs(run_pre_forward_hooks(inputs));
}

void Module::check_new_name(const std::string& name, const char* what) const {
  TANDEM_CHECK(!name.empty(), "[{}] {} name must not be empty", type_name_, what);
  TANDEM_CHECK(name.find('.') == std::string::npos, "[{}] {} name '{}' must not contain '.'", type_name_, what,
               name);
  TANDEM_CHECK(!parameters_.contains(name) && !buffers_.contains(name) && !children_.contains(name),
               "[{}] cannot register {} '{}': the name is already taken", type_name_, what, name);
}

Tensor Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  check_new_name(name, "parameter");
  TANDEM_CHECK(tensor.defined(), "[{}] parameter '{}' is an undefined tensor", type_name_, name);
  TANDEM_CHECK(tensor.is_leaf(), "[{}] parameter '{}' must be a leaf tensor (it has grad_fn {}); pass t.detach()",
               type_name_, name, tensor.grad_fn() ? tensor.grad_fn()->name() : "?");
  TANDEM_CHECK(!requires_grad || tensor.is_floating_point(),
               "[{}] parameter '{}' of dtype {} cannot require grad (only floating tensors can)", type_name_, name,
               tensor.dtype());
  tensor.requires_grad_(requires_grad);
  return parameters_.insert(std::move(name), std::move(tensor));
}

Tensor Module::register_buffer(std::string name, Tensor tensor) {
  check_new_name(name, "buffer");
  TANDEM_CHECK(tensor.defined(), "[{}] buffer '{}' is an undefined tensor", type_name_, name);
  return buffers_.insert(std::move(name), std::move(tensor));
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  check_new_name(name, "submodule");
  TANDEM_CHECK(module != nullptr, "[{}] submodule '{}' is null", type_name_, name);
  TANDEM_CHECK(module.get() != this, "[{}] cannot register a module as its own submodule '{}'", type_name_, name);
  children_.insert(std::move(name), std::move(module));
}

// ---- listings ----

namespace {
// Depth-first walk over (prefix, module) pairs, each module once.
template <class Fn>
void walk(const Module& root, const std::string& prefix, std::unordered_set<const Module*>& seen, Fn&& fn) {
  if (!seen.insert(&root).second) return;
  fn(prefix, root);
  for (const auto& [name, child] : root.named_children()) walk(*child, join_name(prefix, name), seen, fn);
}
}  // namespace

namespace {
// Parameters or buffers (`own` picks which) of the module tree with dotted names, each tensor
// once, in registration order.
template <class Own>
TensorDict collect_named(const Module& root, bool recurse, Own own) {
  TensorDict out;
  std::unordered_set<const TensorImpl*> seen_tensors;
  auto add_own = [&](const std::string& prefix, const Module& m) {
    for (const auto& [name, t] : own(m)) {
      if (seen_tensors.insert(t.impl()).second) out.insert(join_name(prefix, name), t);
    }
  };
  if (!recurse) {
    add_own("", root);
    return out;
  }
  std::unordered_set<const Module*> seen;
  walk(root, "", seen, add_own);
  return out;
}
}  // namespace

TensorDict Module::named_parameters(bool recurse) const {
  return collect_named(*this, recurse, [](const Module& m) -> const auto& { return m.parameters_; });
}

TensorDict Module::named_buffers(bool recurse) const {
  return collect_named(*this, recurse, [](const Module& m) -> const auto& { return m.buffers_; });
}

TensorList Module::parameters(bool recurse) const { return named_parameters(recurse).values(); }
TensorList Module::buffers(bool recurse) const { return named_buffers(recurse).values(); }

OrderedDict<std::shared_ptr<Module>> Module::named_children() const { return children_; }
std::vector<std::shared_ptr<Module>> Module::children() const { return children_.values(); }

std::shared_ptr<Module> Module::self_ptr() {
  if (auto owned = weak_from_this().lock()) return owned;
  // A module living on the stack (or as a plain member) is not owned by a shared_ptr: hand out
  // a non-owning one so named_modules() works for it too.
  return std::shared_ptr<Module>(std::shared_ptr<Module>(), this);
}

OrderedDict<std::shared_ptr<Module>> Module::named_modules(const std::string& prefix, bool include_self) {
  OrderedDict<std::shared_ptr<Module>> out;
  std::unordered_set<const Module*> seen;
  if (include_self) out.insert(prefix, self_ptr());
  seen.insert(this);
  // Recursive lambda over children keeps registration (pre-)order.
  std::function<void(const std::string&, const Module&)> visit = [&](const std::string& pre, const Module& m) {
    for (const auto& [name, child] : m.children_) {
      if (!seen.insert(child.get()).second) continue;
      std::string full = join_name(pre, name);
      out.insert(full, child);
      visit(full, *child);
    }
  };
  visit(prefix, *this);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::modules(bool include_self) {
  return named_modules("", include_self).values();
}

std::pair<const Module*, std::string> Module::resolve(const std::string& dotted, const char* what) const {
  const Module* m = this;
  size_t start = 0;
  for (size_t dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', start)) {
    std::string part = dotted.substr(start, dot - start);
    const auto* child = m->children_.find(part);
    TANDEM_CHECK(child, "[{}] no {} named '{}': '{}' has no submodule '{}'", type_name_, what, dotted,
                 m->type_name_, part);
    m = child->get();
    start = dot + 1;
  }
  return {m, dotted.substr(start)};
}

Tensor Module::parameter(const std::string& dotted_name) const {
  auto [m, leaf] = resolve(dotted_name, "parameter");
  const Tensor* t = m->parameters_.find(leaf);
  TANDEM_CHECK(t, "[{}] no parameter named '{}'", type_name_, dotted_name);
  return *t;
}

Tensor Module::buffer(const std::string& dotted_name) const {
  auto [m, leaf] = resolve(dotted_name, "buffer");
  const Tensor* t = m->buffers_.find(leaf);
  TANDEM_CHECK(t, "[{}] no buffer named '{}'", type_name_, dotted_name);
  return *t;
}

std::shared_ptr<Module> Module::submodule(const std::string& dotted_name) const {
  auto [m, leaf] = resolve(dotted_name, "submodule");
  const auto* c = m->children_.find(leaf);
  TANDEM_CHECK(c, "[{}] no submodule named '{}'", type_name_, dotted_name);
  return *c;
}

bool Module::has_parameter(const std::string& dotted_name) const {
  try {
    parameter(dotted_name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool Module::has_buffer(const std::string& dotted_name) const {
  try {
    buffer(dotted_name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void Module::set_buffer(const std::string& dotted_name, Tensor tensor) {
  auto [m, leaf] = resolve(dotted_name, "buffer");
  TANDEM_CHECK(tensor.defined(), "[{}] set_buffer('{}'): the new value is an undefined tensor", type_name_,
               dotted_name);
  Tensor* slot = const_cast<Module*>(m)->buffers_.find(leaf);
  TANDEM_CHECK(slot, "[{}] set_buffer: no buffer named '{}'", type_name_, dotted_name);
  *slot = std::move(tensor);
}

void Module::set_parameter(const std::string& dotted_name, Tensor tensor) {
  auto [owner, leaf] = resolve(dotted_name, "parameter");
  auto* m = const_cast<Module*>(owner);
  Tensor* slot = m->parameters_.find(leaf);
  TANDEM_CHECK(slot, "[set_parameter] {} has no parameter named '{}'", type_name_, dotted_name);
  TANDEM_CHECK(tensor.defined(), "[set_parameter] the new value of '{}' is an undefined tensor", dotted_name);
  TANDEM_CHECK(tensor.is_leaf(), "[set_parameter] the new value of '{}' must be a leaf tensor (it has grad_fn {})",
               dotted_name, tensor.grad_fn() ? tensor.grad_fn()->name() : "?");
  TANDEM_CHECK(tensor.shape() == slot->shape() && tensor.dtype() == slot->dtype() && tensor.device() == slot->device(),
               "[set_parameter] '{}' is {} {} on {} but the new value is {} {} on {}", dotted_name, slot->shape(),
               slot->dtype(), slot->device(), tensor.shape(), tensor.dtype(), tensor.device());
  *slot = std::move(tensor);
  m->parameter_replaced(leaf, *slot);
}

void Module::parameter_replaced(const std::string&, const Tensor&) {}

// ---- modes and gradients ----

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard guard;
  for (const auto& [name, p] : named_parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      // A gradient produced with create_graph may carry history; zero a detached alias.
      g.detach().zero_();
    }
  }
}

// ---- conversion ----

template <class Fn>
void Module::for_each_tensor(Fn&& fn) {
  std::unordered_set<const Module*> seen;
  std::function<void(Module&)> visit = [&](Module& m) {
    if (!seen.insert(&m).second) return;
    for (auto& [name, t] : m.parameters_) fn(t, true);
    for (auto& [name, t] : m.buffers_) fn(t, false);
    for (auto& [name, c] : m.children_) visit(*c);
  };
  visit(*this);
}

Module& Module::to(Dtype dtype) {
  TANDEM_CHECK(is_floating(dtype), "[{}] to({}): modules can only be cast to a floating dtype", type_name_, dtype);
  NoGradGuard guard;
  std::unordered_set<const TensorImpl*> done;  // a shared tensor is converted once
  for_each_tensor([&](Tensor& t, bool) {
    if (!t.is_floating_point() || t.dtype() == dtype || !done.insert(t.impl()).second) return;
    Tensor grad = t.grad();
    Tensor fresh = to_dtype(t.detach(), dtype).contiguous();
    if (fresh.storage() == t.storage()) fresh = fresh.clone();
    if (grad.defined()) t.set_grad(Tensor());
    replace_data(t, fresh);
    if (grad.defined()) t.set_grad(to_dtype(grad.detach(), dtype).contiguous());
  });
  return *this;
}

Module& Module::to(Device device) {
  NoGradGuard guard;
  std::unordered_set<const TensorImpl*> done;
  for_each_tensor([&](Tensor& t, bool) {
    if (t.device() == device || !done.insert(t.impl()).second) return;
    Tensor grad = t.grad();
    Tensor fresh = t.detach().to(device);
    if (grad.defined()) t.set_grad(Tensor());
    replace_data(t, fresh);
    if (grad.defined()) t.set_grad(grad.detach().to(device));
  });
  return *this;
}

// ---- state ----

void Module::collect_state(const std::string& prefix, TensorDict& out, bool detach) const {
  for (const auto& [name, t] : parameters_) out.insert(join_name(prefix, name), detach ? t.detach() : t);
  for (const auto& [name, t] : buffers_) out.insert(join_name(prefix, name), detach ? t.detach() : t);
  for (const auto& [name, child] : children_) child->collect_state(join_name(prefix, name), out, detach);
}

TensorDict Module::state_dict() const {
  TensorDict out;
  collect_state("", out, true);
  return out;
}

LoadStateDictResult Module::check_state_dict(const TensorDict& state_dict, bool strict) const {
  TensorDict own;
  collect_state("", own, false);
  LoadStateDictResult result;
  std::vector<std::string> mismatches;
  for (const auto& [name, t] : own) {
    const Tensor* src = state_dict.find(name);
    if (!src) {
      result.missing_keys.push_back(name);
      continue;
    }
    TANDEM_CHECK(src->defined(), "[load_state_dict] entry '{}' is an undefined tensor", name);
    if (src->shape() != t.shape()) {
      mismatches.push_back(
          fmt::format("size mismatch for '{}': the state dict has {}, the module has {}", name, src->shape(), t.shape()));
    } else if (src->is_floating_point() && !t.is_floating_point()) {
      mismatches.push_back(
          fmt::format("entry '{}' has dtype {} but the module's tensor is {}", name, src->dtype(), t.dtype()));
    }
  }
  for (const auto& [name, t] : state_dict) {
    if (!own.contains(name)) result.unexpected_keys.push_back(name);
  }
  std::string problems;
  auto add_problem = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (strict && !result.missing_keys.empty()) add_problem("missing keys: " + join_list(result.missing_keys));
  if (strict && !result.unexpected_keys.empty()) add_problem("unexpected keys: " + join_list(result.unexpected_keys));
  for (const auto& m : mismatches) add_problem(m);
  TANDEM_CHECK(problems.empty(), "[load_state_dict] cannot load into {}: {}", type_name_, problems);
  return result;
}

LoadStateDictResult Module::load_state_dict(const TensorDict& state_dict, bool strict) {
  LoadStateDictResult result = check_state_dict(state_dict, strict);  // all of it, before any copy
  TensorDict own;
  collect_state("", own, false);
  NoGradGuard guard;
  for (const auto& [name, t] : own)
    if (const Tensor* src = state_dict.find(name); src && !src->is_same(t)) copy_(t, src->detach());
  return result;
}

// ---- hooks ----

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  TANDEM_CHECK(static_cast<bool>(hook), "[{}] register_forward_pre_hook: empty hook", type_name_);
  // It sees, and may replace, the first input.
  return register_forward_pre_hook(ForwardPreHookInputs(
      [hook = std::move(hook)](Module& m, const TensorList& inputs) -> std::optional<TensorList> {
        std::optional<Tensor> first = hook(m, inputs[0]);
        if (!first) return std::nullopt;
        TensorList out = inputs;
        out[0] = std::move(*first);
        return out;
      }));
}

HookHandle Module::register_forward_pre_hook(ForwardPreHookInputs hook) {
  TANDEM_CHECK(static_cast<bool>(hook), "[{}] register_forward_pre_hook: empty hook", type_name_);
  if (!pre_hooks_) pre_hooks_ = std::make_shared<PreHooks>();
  uint64_t id = pre_hooks_->next_id++;
  pre_hooks_->hooks.emplace_back(id, std::move(hook));
  std::weak_ptr<PreHooks> weak = pre_hooks_;
  return HookHandle([weak, id] {
    if (auto l = weak.lock()) std::erase_if(l->hooks, [id](const auto& p) { return p.first == id; });
  });
}

HookHandle Module::register_forward_pre_hook(std::function<void(Module&)> hook) {
  TANDEM_CHECK(static_cast<bool>(hook), "[{}] register_forward_pre_hook: empty hook", type_name_);
  return register_forward_pre_hook(
      ForwardPreHookInputs([hook = std::move(hook)](Module& m, const TensorList&) -> std::optional<TensorList> {
        hook(m);
        return std::nullopt;
      }));
}

Tensor Module::run_pre_forward_hooks(const Tensor& input) {
  if (!pre_hooks_ || pre_hooks_->hooks.empty()) return input;
  return run_pre_forward_hooks(TensorList{input})[0];
}

TensorList Module::run_pre_forward_hooks(const TensorList& inputs) {
  if (!pre_hooks_ || pre_hooks_->hooks.empty()) return inputs;
  // A copy: a hook may remove itself (or add others) while running.
  auto hooks = pre_hooks_->hooks;
  TensorList x = inputs;
  for (auto& [id, hook] : hooks) {
    if (auto replaced = hook(*this, x)) {
      TANDEM_CHECK(replaced->size() == x.size(), "[{}] a pre-forward hook replaced {} inputs with {}", type_name_,
                   x.size(), replaced->size());
      x = std::move(*replaced);
    }
  }
  return x;
}

// ---- printing ----

std::string Module::str() const {
  std::string head = type_name_ + "(" + extra_repr();
  if (children_.empty()) return head + ")";
  std::string out = head + "\n";
  for (const auto& [name, child] : children_) {
    std::string inner = child->str();
    // Indent nested lines so the tree reads like PyTorch's repr.
    std::string indented;
    for (char c : inner) {
      indented += c;
      if (c == '\n') indented += "  ";
    }
    out += "  (" + name + "): " + indented + "\n";
  }
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

}  // namespace tandem::nn
