#include "nn/utils.h"

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/optim_in_backward.h"

namespace tandem::nn::utils {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// observe_gradient_clipping's observers, each with the parameters it watches.
struct ClipWatch {
  std::unordered_set<const TensorImpl*> watched;
  GradientClipObserver observer;
};
struct ClipWatches {
  std::mutex mu;
  std::vector<std::shared_ptr<ClipWatch>> all;
};
ClipWatches& clip_watches() {
  static ClipWatches* w = new ClipWatches;  // never destroyed: handles may outlive static destruction
  return *w;
}

// The observers watching any of `clipped`; they are called outside the registry's lock (they may
// throw, or take locks of their own).
std::vector<std::shared_ptr<ClipWatch>> clip_observers_of(const TensorList& clipped) {
  std::vector<std::shared_ptr<ClipWatch>> told;
  ClipWatches& w = clip_watches();
  std::lock_guard lock(w.mu);
  for (const auto& watch : w.all)
    for (const Tensor& p : clipped)
      if (watch->watched.count(p.impl())) {
        told.push_back(watch);
        break;
      }
  return told;
}

// The norm_type-norm of one gradient as a 0-dim tensor on its device: f64 for f64 gradients, f32
// otherwise (a half gradient is widened first, so neither its squares nor its norm round to 11
// or 8 bits).
Tensor gradient_norm(const Tensor& g, double norm_type) {
  const Tensor x = (g.dtype() == f64 || g.dtype() == f32) ? g : g.to(f32);
  if (norm_type == 2) return norm(x);
  if (norm_type == kInf) return abs(x).max();
  if (norm_type == 1) return abs(x).sum();
  return pow(pow(abs(x), norm_type).sum(), 1.0 / norm_type);
}

// The same norm of a 1-D tensor of norms: the total.
Tensor combine_norms(const Tensor& norms, double norm_type) {
  if (norm_type == 2) return norm(norms);
  if (norm_type == kInf) return norms.max();
  if (norm_type == 1) return norms.sum();
  return pow(pow(norms, norm_type).sum(), 1.0 / norm_type);
}

// parameters[i] is called name_of(i) in errors.
double clip(const TensorList& parameters, const std::function<std::string(size_t)>& name_of, double max_norm,
            double norm_type, bool error_if_nonfinite) {
  TANDEM_CHECK(norm_type > 0, "[clip_grad_norm_] norm_type must be positive (a p-norm) or infinity, got {}",
               norm_type);
  TANDEM_CHECK(max_norm >= 0, "[clip_grad_norm_] max_norm must be non-negative, got {}", max_norm);
  // Every check before anything is computed or scaled.
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& p = parameters[i];
    TANDEM_CHECK(p.defined(), "[clip_grad_norm_] parameter {} is an undefined tensor", name_of(i));
    TANDEM_CHECK(!optim::has_optimizer_in_backward(p),
                 "[clip_grad_norm_] parameter {} (shape {}) has an optimizer in backward "
                 "(apply_optimizer_in_backward): its step already ran during backward, with the unclipped "
                 "gradient, so there is nothing left to clip. To clip, train it with a plain optimizer: zero_grad(), "
                 "backward(), clip_grad_norm_(), step()",
                 name_of(i), p.shape());
    // The gradients are scaled in place, all or none: one that could not be must fail here, before
    // any other is touched.
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    TANDEM_CHECK(is_floating(g.dtype()), "[clip_grad_norm_] parameter {} has {} gradient; only floating gradients can be clipped",
                 name_of(i), g.dtype());
    for (int64_t d = 0; d < g.dim(); ++d)
      TANDEM_CHECK(!(g.stride(d) == 0 && g.size(d) > 1),
                   "[clip_grad_norm_] parameter {}'s gradient (shape {}, strides {}) is an expanded view whose elements "
                   "share memory, so it cannot be scaled in place; give the parameter a gradient of its own (clone it)",
                   name_of(i), g.shape(), g.strides());
  }
  TensorList grads, clipped;
  grads.reserve(parameters.size());
  for (const Tensor& p : parameters) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(std::move(g));
    clipped.push_back(p);
  }
  if (grads.empty()) return 0.0;
  const std::vector<std::shared_ptr<ClipWatch>> observers = clip_observers_of(clipped);
  for (const auto& o : observers)
    if (o->observer.check) o->observer.check(clipped);  // may refuse: nothing is computed yet

  NoGradGuard no_grad;
  // One pass over the gradients for the per-gradient norms, which stay on the device until the
  // total is read; an empty gradient adds nothing to any norm (and has no maximum).
  const Device device = grads[0].device();
  TensorList norms;
  norms.reserve(grads.size());
  for (const Tensor& g : grads) {
    if (g.numel() == 0) continue;
    Tensor n = gradient_norm(g, norm_type);
    norms.push_back(n.device() == device ? n : n.to(device));
  }
  double total = 0;
  if (!norms.empty()) {
    const Tensor total_t = norms.size() == 1 ? norms[0] : combine_norms(stack(norms), norm_type);
    total = total_t.item<double>();  // the host's one wait
  }
  if (!std::isfinite(total) && error_if_nonfinite)
    fail("[clip_grad_norm_] the total norm of order {} of the gradients is {}, so they cannot be clipped (pass "
         "error_if_nonfinite = false to scale them by it anyway)",
         norm_type, total);
  const double coef = max_norm / (total + 1e-6);
  // Not `coef < 1`: a NaN coefficient (a NaN total) is applied too, as in PyTorch.
  if (!(coef >= 1.0))
    for (const Tensor& g : grads) g.mul_(coef);
  for (const auto& o : observers)
    if (o->observer.done) o->observer.done(clipped, max_norm, norm_type);
  return total;
}

}  // namespace

HookHandle observe_gradient_clipping(const TensorList& watched, GradientClipObserver observer) {
  auto watch = std::make_shared<ClipWatch>();
  for (const Tensor& p : watched)
    if (p.defined()) watch->watched.insert(p.impl());
  watch->observer = std::move(observer);
  ClipWatches& w = clip_watches();
  {
    std::lock_guard lock(w.mu);
    w.all.push_back(watch);
  }
  return HookHandle([watch] {
    ClipWatches& all = clip_watches();
    std::lock_guard lock(all.mu);
    std::erase(all.all, watch);
  });
}

double clip_grad_norm_(const TensorList& parameters, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip(
      parameters, [](size_t i) { return std::to_string(i); }, max_norm, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_(TensorList{parameter}, max_norm, norm_type, error_if_nonfinite);
}

double clip_grad_norm_(const TensorDict& named_parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const std::vector<std::string> names = named_parameters.keys();
  return clip(
      named_parameters.values(), [&names](size_t i) { return names[i]; }, max_norm, norm_type, error_if_nonfinite);
}

}  // namespace tandem::nn::utils
