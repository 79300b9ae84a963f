// The tape: nodes, edges, saved tensors, per-tensor autograd metadata, and `record`, the one
// call every differentiable op makes after computing its forward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/tensor.h"

namespace tandem::autograd {

class Node;

// Where a gradient flows: input slot `input_nr` of node `fn` (an op's grad_fn, or a leaf's
// AccumulateGrad).
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// What a node's forward output looked like, so the engine can check and zero-fill gradients.
struct OutputMeta {
  Shape shape;
  Dtype dtype = f32;
  Device device;
};

using TensorHook = std::function<Tensor(const Tensor& grad)>;  // may return a replacement
using PostAccumulateHook = std::function<void(const Tensor& leaf)>;

template <class Fn>
struct HookList {
  std::vector<std::pair<uint64_t, Fn>> hooks;
  uint64_t next_id = 0;
};

// A tensor saved for backward: checks the version at unpack (in-place change is an error) and
// is released after backward unless retain_graph (then backward again is an error).
class SavedTensor {
 public:
  SavedTensor() = default;
  // `is_output`: the tensor is an output of the node saving it; stored as a detached alias so
  // the node does not keep itself alive through its own output.
  SavedTensor(const Tensor& t, bool is_output);
  Tensor unpack(const Node& owner) const;
  void release() { tensor_ = Tensor(); released_ = true; }
  bool defined() const { return tensor_.defined() || released_; }

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
  bool released_ = false;
};

// Nodes alive in the process (all threads): tests use it to prove the tape keeps nothing.
int64_t live_node_count();

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // grads has one entry per forward output (zero-filled by the engine where none arrived);
  // returns one gradient per next_edges entry (undefined where the input needs none).
  virtual TensorList apply(TensorList&& grads) = 0;
  virtual std::string name() const = 0;
  virtual void release_saved() {}

  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  // Tensor hooks on this node's outputs (non-leaf tensors), keyed by output index.
  std::vector<std::shared_ptr<HookList<TensorHook>>> output_hooks;

 private:
  uint64_t sequence_nr_;
};

// Gradients arriving at a leaf are accumulated into its .grad here; its post-accumulate-grad
// hooks fire right after, once per backward.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;  // set on leaves by requires_grad_()
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // set on op outputs
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves: created on first use
  std::shared_ptr<HookList<TensorHook>> leaf_hooks;
  std::shared_ptr<HookList<PostAccumulateHook>> post_accumulate_hooks;
};

AutogradMeta* meta(const Tensor& t);            // nullptr when none
AutogradMeta& ensure_meta(const Tensor& t);
bool requires_grad(const Tensor& t);            // leaf flag or has a grad_fn
Edge gradient_edge(const Tensor& t);            // grad_fn/output_nr, or the leaf's accumulator

// True when grad mode is on and any of the defined tensors requires grad: the fast check every
// op makes before building a node.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const TensorList& inputs);

// The generic node every built-in op uses: a backward lambda over saved tensors.
struct BackwardContext {
  const TensorList& grads;               // one per forward output
  std::vector<bool> needs_input_grad;    // one per input
  const Node& node;
  std::vector<SavedTensor>& saved_slots;
  Tensor saved(size_t i) const { return saved_slots.at(i).unpack(node); }
};
using BackwardFn = std::function<TensorList(BackwardContext& ctx)>;

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return name_; }
  void release_saved() override;
  std::vector<SavedTensor> saved;

 private:
  const char* name_;
  BackwardFn fn_;
};

// Records an op on the tape if grad mode is on and an input requires grad. `saved_inputs` and
// `saved_outputs` are what backward needs (ctx.saved(i) indexes inputs first, then outputs).
// backward returns one gradient per input, in order (undefined where not needed).
void record(const char* name, std::initializer_list<const Tensor*> inputs,
            std::initializer_list<Tensor*> outputs, BackwardFn backward,
            TensorList saved_inputs = {}, TensorList saved_outputs = {});
void record(const char* name, const TensorList& inputs, TensorList& outputs, BackwardFn backward,
            TensorList saved_inputs = {}, TensorList saved_outputs = {});

// Attaches `node` as the history of `outputs` (output i gets output_nr i) and fills its output
// metadata; the engine and custom Functions use it.
void set_history(const std::shared_ptr<Node>& node, std::initializer_list<Tensor*> outputs);
void set_history(const std::shared_ptr<Node>& node, TensorList& outputs);
std::vector<Edge> collect_edges(const TensorList& inputs);

// Every in-place op calls this first: modifying a tensor that requires grad while grad mode is
// on is an error ("[op_] ..."), since Tandem does not rebase history in place; under no_grad
// (optimizers, initialisation) it is allowed. Callers bump the version after mutating.
void check_inplace(const Tensor& self, const char* op);

// Reduces a broadcast gradient back to `shape` (sums over broadcast dims): every binary op's
// backward uses it.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace tandem::autograd
