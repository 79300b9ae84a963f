#include "autograd/hooks.h"

namespace tandem {

using autograd::HookList;

namespace {
template <class Fn>
HookHandle add_hook(std::shared_ptr<HookList<Fn>>& list, Fn fn) {
  if (!list) list = std::make_shared<HookList<Fn>>();
  uint64_t id = list->next_id++;
  list->hooks.emplace_back(id, std::move(fn));
  std::weak_ptr<HookList<Fn>> weak = list;
  return HookHandle([weak, id] {
    if (auto l = weak.lock()) std::erase_if(l->hooks, [id](const auto& p) { return p.first == id; });
  });
}
}  // namespace

HookHandle register_hook(const Tensor& t, autograd::TensorHook hook) {
  TANDEM_CHECK(t.defined(), "[register_hook] undefined tensor");
  TANDEM_CHECK(autograd::requires_grad(t),
               "[register_hook] cannot register a hook on a tensor (shape {}) that does not require grad", t.shape());
  auto& m = autograd::ensure_meta(t);
  if (m.grad_fn) {
    auto& node = *m.grad_fn;
    if (node.output_hooks.size() <= m.output_nr) node.output_hooks.resize(m.output_nr + 1);
    return add_hook(node.output_hooks[m.output_nr], std::move(hook));
  }
  return add_hook(m.leaf_hooks, std::move(hook));
}

HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, autograd::PostAccumulateHook hook) {
  TANDEM_CHECK(leaf.defined(), "[register_post_accumulate_grad_hook] undefined tensor");
  auto* m = autograd::meta(leaf);
  TANDEM_CHECK(m && m->requires_grad && !m->grad_fn,
               "[register_post_accumulate_grad_hook] only leaf tensors that require grad have post-accumulate-grad "
               "hooks (got a tensor of shape {})",
               leaf.shape());
  return add_hook(m->post_accumulate_hooks, std::move(hook));
}

}  // namespace tandem
