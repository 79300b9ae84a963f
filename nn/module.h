// Module: the base of every layer. It owns named parameters, buffers and child modules (in
// registration order), the train/eval flag, pre-forward hooks, dtype/device conversion and the
// state dict. Semantics follow PyTorch's C++ frontend (torch::nn::Module).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/hooks.h"
#include "core/tensor.h"

namespace tandem::nn {

// An insertion-ordered map from names to values with O(1) lookup: what named_parameters(),
// state_dict() and load_safetensors() return.
template <class V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<Item> items) {
    for (const auto& it : items) insert(it.first, it.second);
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool contains(const std::string& key) const { return index_.count(key) != 0; }

  const V* find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  V* find(const std::string& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V& at(const std::string& key) const {
    const V* v = find(key);
    if (!v) fail("[OrderedDict] no entry named '{}'", key);
    return *v;
  }
  V& at(const std::string& key) {
    V* v = find(key);
    if (!v) fail("[OrderedDict] no entry named '{}'", key);
    return *v;
  }
  const V& operator[](const std::string& key) const { return at(key); }

  // Adds a new entry; a duplicate name is an error (use insert_or_assign to overwrite).
  V& insert(std::string key, V value) {
    if (contains(key)) fail("[OrderedDict] duplicate entry '{}'", key);
    index_.emplace(key, items_.size());
    items_.emplace_back(std::move(key), std::move(value));
    return items_.back().second;
  }
  V& insert_or_assign(std::string key, V value) {
    if (V* v = find(key)) return *v = std::move(value);
    return insert(std::move(key), std::move(value));
  }
  void clear() {
    items_.clear();
    index_.clear();
  }

  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& it : items_) out.push_back(it.first);
    return out;
  }
  std::vector<V> values() const {
    std::vector<V> out;
    out.reserve(items_.size());
    for (const auto& it : items_) out.push_back(it.second);
    return out;
  }
  const std::vector<Item>& items() const { return items_; }

  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

using TensorDict = OrderedDict<Tensor>;

class Module;

// A pre-forward hook sees the module and its input; returning a tensor replaces the input (in a
// call with several inputs, the first).
using ForwardPreHook = std::function<std::optional<Tensor>(Module& module, const Tensor& input)>;
// A pre-forward hook that sees every input of a call (module(tokens, mask): both); returning a
// list replaces them all.
using ForwardPreHookInputs = std::function<std::optional<TensorList>(Module& module, const TensorList& inputs)>;

// What load_state_dict(strict = false) could not match.
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  // Not copyable: a copy would share every parameter's TensorImpl with the original while
  // looking independent. Moving is allowed (protected, so only whole derived objects move, see
  // below); assignment is not.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module& operator=(Module&&) = delete;

  // The class name ("Linear", "Sequential", ...), used in errors and printing.
  const std::string& type_name() const { return type_name_; }

  // The computation. The default throws (a module is only callable when it defines forward),
  // unless the module takes several inputs (max_inputs() > 1): then it is forward_inputs({input}).
  virtual Tensor forward(const Tensor& input);
  // The computation on several inputs (tokens and a padding mask; a query, a key and a value,
  // then masks), as PyTorch's forward(*args): a module that takes several overrides this and
  // max_inputs(). An undefined Tensor stands for an optional input left out (no mask). The
  // default hands a single input to forward(Tensor) and refuses more.
  virtual Tensor forward_inputs(const TensorList& inputs);
  // The most inputs forward_inputs takes: 1 unless overridden. Sequential hands the extra inputs
  // of its call to the children that take more than one.
  virtual size_t max_inputs() const { return 1; }
  // What callers use: runs the pre-forward hooks (which may replace the input), then forward.
  Tensor operator()(const Tensor& input) { return forward(run_pre_forward_hooks(input)); }
  // module(tokens, mask), module(q, k, v, Tensor(), attn_mask): the hooks, then forward_inputs.
  template <class... More>
    requires(std::is_convertible_v<const More&, const Tensor&> && ...)
  Tensor operator()(const Tensor& first, const Tensor& second, const More&... more) {
    return call(TensorList{first, second, Tensor(more)...});
  }
  // The same with the inputs in a list (one or more): one input goes to forward, several to
  // forward_inputs.
  Tensor call(const TensorList& inputs);

  // ---- registration (names: non-empty, no '.', unique among parameters, buffers, children) ----
  // The tensor must be a leaf; it is made to require grad when `requires_grad` (floating only).
  // Returns the handle stored in the module (same TensorImpl as `tensor`).
  Tensor register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  Tensor register_buffer(std::string name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }

  // ---- access (dotted names reach into children: "encoder.fc.weight") ----
  // Recursive listings are depth first in registration order; a tensor or module reachable
  // under several names is listed once, under the first.
  TensorDict named_parameters(bool recurse = true) const;
  TensorDict named_buffers(bool recurse = true) const;
  TensorList parameters(bool recurse = true) const;
  TensorList buffers(bool recurse = true) const;
  OrderedDict<std::shared_ptr<Module>> named_children() const;
  std::vector<std::shared_ptr<Module>> children() const;
  // Includes this module under `prefix` (default "") first when include_self.
  OrderedDict<std::shared_ptr<Module>> named_modules(const std::string& prefix = "", bool include_self = true);
  std::vector<std::shared_ptr<Module>> modules(bool include_self = true);

  Tensor parameter(const std::string& dotted_name) const;  // throws when absent
  Tensor buffer(const std::string& dotted_name) const;
  std::shared_ptr<Module> submodule(const std::string& dotted_name) const;
  bool has_parameter(const std::string& dotted_name) const;
  bool has_buffer(const std::string& dotted_name) const;
  // Replaces the buffer registered under `dotted_name` by `tensor` (any shape/dtype: this is a
  // reassignment, as `module.running_mean = t` in PyTorch). Layers read their buffers through
  // buffer() at forward time, so the replacement takes effect immediately.
  void set_buffer(const std::string& dotted_name, Tensor tensor);
  // Replaces the parameter registered under `dotted_name` by `tensor`, keeping its name and its
  // place in the registry: PyTorch's `lm_head.weight = wte.weight`. This is how weights are tied:
  //   model.set_parameter("lm_head.weight", model.wte->weight);
  // afterwards both modules hold one TensorImpl, and the owning layer's member (Linear::weight)
  // names it too (see parameter_replaced). `tensor` is taken as it is (a leaf, its requires_grad
  // unchanged) and must have the old parameter's shape, dtype and device; otherwise
  // "[set_parameter] ..." names both. The old tensor is dropped from the module (an optimizer or
  // DDP built on it earlier keeps the old one: tie before building them).
  void set_parameter(const std::string& dotted_name, Tensor tensor);

  // ---- modes and gradients ----
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // set_to_none drops the gradients; otherwise existing gradients are zeroed in place.
  void zero_grad(bool set_to_none = true);

  // ---- conversion ----
  // Casts every floating parameter and buffer (and existing gradients) to `dtype`, recursively.
  // The conversion happens in place of each tensor's data: the TensorImpl behind every handle
  // is kept and its storage/dtype replaced, so the layer's members (Linear::weight), optimizers
  // built earlier, tensors shared between modules, and hooks registered on parameters all keep
  // working, as with PyTorch's `module.to()`. Views taken of a parameter before the call keep
  // the old data. Integer and bool tensors (num_batches_tracked) are left as they are.
  Module& to(Dtype dtype);
  Module& to(Device device);

  // ---- state ----
  // Parameters then buffers of each module, parents before children (PyTorch's order); values
  // are detached aliases of the module's tensors (no copy). Shared tensors appear under every
  // name, as in PyTorch.
  TensorDict state_dict() const;
  // Copies (under no_grad, casting dtype) into the module's existing tensors. Every shape must
  // match. With strict, missing or unexpected keys are an error naming all of them; nothing is
  // copied unless the whole dict is acceptable.
  LoadStateDictResult load_state_dict(const TensorDict& state_dict, bool strict = true);
  // What load_state_dict checks, without changing anything: throws its error, or returns what a
  // non-strict load would leave out.
  LoadStateDictResult check_state_dict(const TensorDict& state_dict, bool strict = true) const;

  // ---- hooks ----
  [[nodiscard]] HookHandle register_forward_pre_hook(ForwardPreHook hook);
  // A hook that only observes (DDP uses this kind to prepare a step before forward runs).
  [[nodiscard]] HookHandle register_forward_pre_hook(std::function<void(Module&)> hook);
  [[nodiscard]] HookHandle register_forward_pre_hook(ForwardPreHookInputs hook);
  // Runs the hooks in registration order, threading the (possibly replaced) inputs through them.
  Tensor run_pre_forward_hooks(const Tensor& input);
  TensorList run_pre_forward_hooks(const TensorList& inputs);

  // A readable tree: "Sequential(\n  (0): Linear(in_features=4, out_features=3, bias=true)\n...".
  std::string str() const;
  // The one-line description inside str(); layers override it.
  virtual std::string extra_repr() const { return ""; }

 protected:
  // Hands the registry (parameters, buffers, children, pre-forward hooks, mode) over to the new
  // object. The tensors and child modules are the same objects, so a derived class's members
  // (Linear::weight, a shared_ptr to a child), which its implicit move constructor moves
  // alongside, keep naming exactly what is registered; optimizers and tensor hooks built on
  // the parameters keep working. The new object is not owned by any shared_ptr yet. `other` is
  // left empty (no parameters, buffers, children or hooks). Sequential uses this to take module
  // values: Sequential(Linear(4, 8), ReLU()).
  Module(Module&& other);

  // Throws "[<type>] ..." style errors with the module type.
  void add_child(std::string name, std::shared_ptr<Module> module);
  // The module's own slots, for layers that must look their buffers up by name.
  const TensorDict& own_parameters() const { return parameters_; }
  const TensorDict& own_buffers() const { return buffers_; }
  // Called on the module that owns the slot after set_parameter replaced its parameter `name`: a
  // layer that keeps a member handle to a parameter (Linear::weight) points it at `tensor` here,
  // so forward uses the new tensor. The default does nothing (right for modules that read their
  // parameters through parameter()); the built-in layers update their weight and bias.
  virtual void parameter_replaced(const std::string& name, const Tensor& tensor);

 private:
  void check_new_name(const std::string& name, const char* what) const;
  template <class Fn>
  void for_each_tensor(Fn&& fn);  // fn(Tensor&, bool is_parameter) over every slot, recursively
  void collect_state(const std::string& prefix, TensorDict& out, bool detach) const;
  std::pair<const Module*, std::string> resolve(const std::string& dotted, const char* what) const;
  std::shared_ptr<Module> self_ptr();

  std::string type_name_;
  bool training_ = true;
  TensorDict parameters_;
  TensorDict buffers_;
  OrderedDict<std::shared_ptr<Module>> children_;
  struct PreHooks {
    std::vector<std::pair<uint64_t, ForwardPreHookInputs>> hooks;
    uint64_t next_id = 0;
  };
  std::shared_ptr<PreHooks> pre_hooks_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace tandem::nn
