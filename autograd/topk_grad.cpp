// The public topk of autograd/ops.h: forward through core/detail/topk.h; differentiable in the
// values, whose gradient goes back to the selected positions (zeros elsewhere).
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/index.h"
#include "core/detail/topk.h"

namespace tandem {

using autograd::BackwardContext;

std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  auto [values, indices] = detail::topk(a, k, dim, largest, sorted);
  if (autograd::any_requires_grad({&a})) {
    const int64_t d = wrap_dim(dim, a.dim(), "topk");
    // The indices along dim are distinct, so scatter-adding the gradient into zeros places it.
    autograd::record(
        "TopkBackward", {&a}, {&values},
        [d, shape = a.shape()](BackwardContext& ctx) -> TensorList {
          const Tensor& g = ctx.grads[0];
          Tensor zeros = detail::zeros_of(shape, g.dtype(), g.device(), "topk_backward");
          return {detail::scatter_add(zeros, d, ctx.saved(0), g)};
        },
        {indices});
  }
  return {values, indices};
}

}  // namespace tandem
