// Tensor gradient hooks and leaf post-accumulate-grad hooks, removed by RAII handles.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "autograd/node.h"

namespace tandem {

// Removes its hook when destroyed or on remove(). Movable, not copyable.
class HookHandle {
 public:
  HookHandle() = default;
  explicit HookHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  HookHandle(HookHandle&& o) noexcept : remover_(std::exchange(o.remover_, {})) {}
  HookHandle& operator=(HookHandle&& o) noexcept {
    if (this != &o) {
      remove();
      remover_ = std::exchange(o.remover_, {});
    }
    return *this;
  }
  HookHandle(const HookHandle&) = delete;
  HookHandle& operator=(const HookHandle&) = delete;
  ~HookHandle() { remove(); }
  void remove() noexcept {
    if (remover_) std::exchange(remover_, {})();
  }
  // Forgets the hook without removing it: it then lives as long as what it is attached to.
  void release() noexcept { remover_ = {}; }
  bool active() const { return static_cast<bool>(remover_); }

 private:
  std::function<void()> remover_;
};

// Runs on the gradient flowing into `t` during backward; returning a defined tensor replaces
// the gradient (it must keep the shape, else backward throws "[hook] ...").
[[nodiscard]] HookHandle register_hook(const Tensor& t, autograd::TensorHook hook);

// On a leaf that requires grad: runs once per backward, right after the leaf's .grad is final.
[[nodiscard]] HookHandle register_post_accumulate_grad_hook(const Tensor& leaf, autograd::PostAccumulateHook hook);

}  // namespace tandem
