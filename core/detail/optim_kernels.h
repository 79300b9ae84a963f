// Fused optimizer steps for parameters on a device: the seam between nn/optim.cpp (which keeps
// the state, the step counts and the CPU loops) and a backend's kernels (cuda/optim.cu), in core
// because backends know only core. Each call updates a list of parameters in one pass over
// param, grad and state, with the arithmetic of torch.optim's update rules in the parameters'
// accumulation type (f32 for f16/bf16, which are read and written in their own type).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tandem::detail {

struct SgdStepOptions {
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
};

struct SgdStepTensors {
  Tensor param, grad;
  Tensor momentum_buffer;  // undefined without momentum
  bool first = false;      // the buffer is uninitialised and takes the first direction
};

struct AdamStepOptions {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false, maximize = false;
  bool decoupled = false;  // AdamW: p *= 1 - lr * wd instead of adding wd * p to the gradient
};

struct AdamStepTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  Tensor max_exp_avg_sq;  // amsgrad only
  double step_size = 0;   // lr / (1 - beta1^step), per parameter: steps may differ
  double bias_correction2_sqrt = 1;
};

// A backend's fused steps. Every tensor of one call is on one device, of one floating dtype,
// contiguous, of its parameter's shape, and no two of a parameter's tensors share storage.
struct OptimDeviceKernels {
  virtual ~OptimDeviceKernels() = default;
  virtual void sgd_step(const std::vector<SgdStepTensors>& tensors, const SgdStepOptions& options) = 0;
  virtual void adam_step(const std::vector<AdamStepTensors>& tensors, const AdamStepOptions& options) = 0;
};

}  // namespace tandem::detail
