// Grad mode: whether ops record onto the tape. Per thread, so each rank of the `threads`
// backend has its own autograd state.
#pragma once

namespace tandem::autograd {

bool grad_mode_enabled();
void set_grad_mode(bool enabled);

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(grad_mode_enabled()) { set_grad_mode(enabled); }
  ~GradModeGuard() { set_grad_mode(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace tandem::autograd

namespace tandem {
struct NoGradGuard : autograd::GradModeGuard {
  NoGradGuard() : GradModeGuard(false) {}
};
struct EnableGradGuard : autograd::GradModeGuard {
  EnableGradGuard() : GradModeGuard(true) {}
};
}  // namespace tandem
