// Gradient utilities, as torch::nn::utils: clip_grad_norm_.
#pragma once

#include <functional>

#include "autograd/hooks.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace tandem::nn::utils {

// Scales the gradients of `parameters` in place so that their total norm is at most max_norm,
// and returns the total norm they had before, as torch::nn::utils::clip_grad_norm_ does:
//
//   total = the norm_type-norm of the per-gradient norm_type-norms, over every parameter whose
//           .grad is defined (the norm of all gradients concatenated into one vector); with
//           norm_type = infinity, the largest |element| of any gradient
//   coef  = max_norm / (total + 1e-6); every gradient is multiplied by it when coef < 1
//
// Parameters without a gradient are skipped; with none at all the result is 0 and nothing
// changes. A non-finite total throws only with error_if_nonfinite; otherwise the gradients are
// scaled by the coefficient it gives (NaN for a NaN total, 0 for an infinite one), as in PyTorch.
// norm_type is a positive number or infinity (PyTorch also takes 0 and negative orders, which
// are not norms, and which nobody clips by); max_norm is non-negative.
//
// Gradients may live on any device, CUDA included: the per-gradient norms are computed where the
// gradients are (in f32, or f64 for f64 gradients), gathered on the first gradient's device, and
// the host waits once, to read the total.
//
// Call it between backward and the optimizer's step. Under DistributedDataParallel that is after
// backward returns, when every .grad already holds the gradient averaged over the ranks: each rank
// then computes the same total and clips the same way, as one process training on the whole batch
// would. With an optimizer in backward (optim::apply_optimizer_in_backward, also under DDP) the
// steps have already run, with the unclipped gradients, when backward returns: a parameter that
// has one is an error ("[clip_grad_norm_] parameter 3 (shape [8, 4]) has an optimizer in backward
// ..."), checked before anything is computed or changed.
double clip_grad_norm_(const TensorList& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
double clip_grad_norm_(const Tensor& parameter, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
// The same over named parameters (module.named_parameters()): errors name the parameter
// ("parameter fc1.weight (shape [8, 4]) ...").
double clip_grad_norm_(const TensorDict& named_parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// ---- The seam for what must repeat a clipping elsewhere ----
// A ZeroRedundancyOptimizer under a Join watches its parameters: a rank that has run out of data
// no longer runs the user's loop, so it repeats, before it steps its share, the clip_grad_norm_
// calls a rank still training made. An observer is told of every call that clips the gradient of
// one of `watched`, with `clipped`, the call's parameters whose .grad is defined (what the norm is
// taken over): `check` after the arguments were checked and before anything is computed (an
// exception refuses the call with nothing changed), `done` once the call has clipped (not when it
// threw). The handle removes the observer. Observers run on the thread that clips; the registry
// itself is thread-safe (several ranks in one process).
struct GradientClipObserver {
  std::function<void(const TensorList& clipped)> check;
  std::function<void(const TensorList& clipped, double max_norm, double norm_type)> done;
};
[[nodiscard]] HookHandle observe_gradient_clipping(const TensorList& watched, GradientClipObserver observer);

}  // namespace tandem::nn::utils
