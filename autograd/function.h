// Custom differentiable functions, PyTorch style:
//
//   struct Square : tandem::autograd::Function<Square> {
//     static Tensor forward(AutogradContext& ctx, const Tensor& x) {
//       ctx.save_for_backward({x});
//       return x * x;
//     }
//     static TensorList backward(AutogradContext& ctx, const TensorList& grads) {
//       return {grads[0] * 2 * ctx.saved()[0]};
//     }
//   };
//   Tensor y = Square::apply(x);
//
// forward runs with grad mode off; backward returns one gradient per Tensor argument.
#pragma once

#include <any>
#include <map>
#include <string>
#include <type_traits>

#include "autograd/node.h"

namespace tandem::autograd {

class AutogradContext {
 public:
  void save_for_backward(const TensorList& tensors) { to_save_ = tensors; }
  TensorList saved() const;
  bool needs_input_grad(size_t i) const { return i < needs_.size() && needs_[i]; }
  std::map<std::string, std::any> data;  // anything else backward needs

 private:
  template <class> friend struct Function;
  friend class CustomNode;
  friend void finish_custom_function(const std::shared_ptr<class CustomNode>& node, const TensorList& inputs,
                                     TensorList& outputs, bool any_grad);
  TensorList to_save_;
  std::vector<SavedTensor> saved_;
  std::vector<bool> needs_;
  const Node* node_ = nullptr;
};

class CustomNode final : public Node {
 public:
  using Backward = std::function<TensorList(AutogradContext&, const TensorList&)>;
  CustomNode(std::string name, Backward fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return name_; }
  void release_saved() override;
  AutogradContext ctx;

 private:
  std::string name_;
  Backward fn_;
};

// Wires a finished forward into the tape: the node's edges, saved tensors and outputs.
void finish_custom_function(const std::shared_ptr<CustomNode>& node, const TensorList& inputs,
                            TensorList& outputs, bool any_grad);

template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    TensorList inputs;
    (collect(inputs, args), ...);
    bool any_grad = any_requires_grad(inputs);
    // Edges before the node: a leaf's AccumulateGrad created here must precede it in tape order.
    std::vector<Edge> edges = any_grad ? collect_edges(inputs) : std::vector<Edge>{};
    auto node = std::make_shared<CustomNode>(typeid(Derived).name(), [](AutogradContext& c, const TensorList& g) {
      return Derived::backward(c, g);
    });
    node->next_edges = std::move(edges);
    using Out = decltype(Derived::forward(node->ctx, std::forward<Args>(args)...));
    Out out;
    {
      GradModeGuard no_grad(false);
      out = Derived::forward(node->ctx, std::forward<Args>(args)...);
    }
    if constexpr (std::is_same_v<Out, Tensor>) {
      TensorList outs{out};
      finish_custom_function(node, inputs, outs, any_grad);
      return outs[0];
    } else {
      finish_custom_function(node, inputs, out, any_grad);
      return out;
    }
  }

 private:
  template <class A>
  static void collect(TensorList& inputs, const A& a) {
    if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) inputs.push_back(a);
  }
};

}  // namespace tandem::autograd
