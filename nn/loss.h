// Loss functions (torch.nn.functional semantics), built from the public differentiable ops so
// autograd handles them.
#pragma once

#include "core/tensor.h"

namespace tandem::nn {

enum class Reduction { none, mean, sum };

struct NLLLossOptions {
  Tensor weight;  // optional per-class weights [C]
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
};

struct CrossEntropyOptions {
  Tensor weight;  // optional per-class weights [C]
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::mean;
  double label_smoothing = 0.0;  // in [0, 1]
};

// input: log-probabilities [N, C] or [N, C, d1, ...] (or [C] with a 0-dim target); target:
// class indices (i64 or i32) [N] or [N, d1, ...]. Targets equal to ignore_index contribute
// nothing; the mean divides by the summed weight of the targets that are not ignored (by their
// count without weights). When that sum is 0 the mean is NaN (0 / 0, as in PyTorch) and its
// gradient 0. A target outside [0, C) is an error naming the class count.
Tensor nll_loss(const Tensor& input, const Tensor& target, const NLLLossOptions& options = {});

// nll_loss(log_softmax(logits, class dim), target), with optional label smoothing (PyTorch's
// formula: (1 - eps) * nll + eps / C * sum over classes of -log p). `target` may also be
// class probabilities of the logits' shape (floating), as in PyTorch.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// Shorthands for the common arguments.
Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction, int64_t ignore_index = -100);
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);

// (input - target)^2 reduced; input and target must have the same shape.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

namespace functional {
using nn::cross_entropy;
using nn::mse_loss;
using nn::nll_loss;
}  // namespace functional

}  // namespace tandem::nn
