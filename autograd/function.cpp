#include "autograd/function.h"

namespace tandem::autograd {

TensorList AutogradContext::saved() const {
  TensorList out;
  out.reserve(saved_.size());
  for (const auto& s : saved_) out.push_back(s.unpack(*node_));
  return out;
}

TensorList CustomNode::apply(TensorList&& grads) {
  TensorList result = fn_(ctx, grads);
  TANDEM_CHECK(result.size() == next_edges.size(),
               "[Function] backward of {} returned {} gradients, but forward took {} tensor inputs", name(),
               result.size(), next_edges.size());
  for (size_t i = 0; i < result.size(); ++i) {
    if (!result[i].defined() || !next_edges[i].valid()) continue;
    const auto& expected = next_edges[i].fn->outputs[next_edges[i].input_nr];
    TANDEM_CHECK(result[i].shape() == expected.shape,
                 "[Function] backward of {} returned a gradient of shape {} for input {} of shape {}", name(),
                 result[i].shape(), i, expected.shape);
  }
  return result;
}

void CustomNode::release_saved() {
  for (auto& s : ctx.saved_) s.release();
}

void finish_custom_function(const std::shared_ptr<CustomNode>& node, const TensorList& inputs, TensorList& outputs,
                            bool any_grad) {
  for (size_t i = 0; i < outputs.size(); ++i)
    TANDEM_CHECK(outputs[i].defined(), "[Function] forward of {} returned an undefined tensor as output {}",
                 node->name(), i);
  if (!any_grad) return;
  node->ctx.node_ = node.get();
  for (const Edge& e : node->next_edges) node->ctx.needs_.push_back(e.valid());
  // Outputs that alias an input would get a new history while the input keeps its own;
  // make them distinct tensors first.
  for (auto& out : outputs) {
    for (const auto& in : inputs)
      if (out.is_same(in)) out = make_view(in, in.shape(), in.strides(), in.storage_offset());
  }
  set_history(node, outputs);
  for (const auto& t : node->ctx.to_save_) {
    bool is_output = false;
    for (const auto& o : outputs) is_output |= o.is_same(t);
    node->ctx.saved_.emplace_back(t, is_output);
  }
  node->ctx.to_save_.clear();
}

}  // namespace tandem::autograd
