#include "autograd/detail/loss_grad.h"

#include "autograd/node.h"
#include "core/detail/nn_ops.h"

namespace tandem::autograd {

std::pair<Tensor, Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, const Tensor& weight,
                                             int64_t ignore_index, double label_smoothing) {
  detail::CrossEntropyRows r =
      detail::cross_entropy_rows_kernel(logits, target, weight, ignore_index, label_smoothing);
  Tensor loss = r.loss;
  if (any_requires_grad({&logits})) {
    record(
        "CrossEntropyBackward", {&logits}, {&loss},
        [target, weight, lse = r.lse, ignore = ignore_index,
         eps = label_smoothing](BackwardContext& ctx) -> TensorList {
          return {detail::cross_entropy_rows_backward_kernel(ctx.grads[0], ctx.saved(0), target, weight, lse, ignore,
                                                             eps)};
        },
        {logits});
  }
  return {loss, r.kept};
}

}  // namespace tandem::autograd
