// The public scaled_dot_product_attention of autograd/ops.h: forward through core/detail/attention.h,
// whose backward recomputes the attention weights tile by tile from the saved per-row logsumexp.
// Saved for backward: q, k, v, the mask, the output and the logsumexp (O(L) per row, never L x S);
// the dropout bits are redrawn from the Philox state the forward reserved.
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/detail/attention.h"
#include "core/detail/reduce.h"
#include "core/detail/views.h"

namespace tandem {

using autograd::BackwardContext;

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                    double dropout_p, bool is_causal, std::optional<double> scale) {
  detail::AttentionProblem p = detail::make_attention_problem(q, k, v, attn_mask, dropout_p, is_causal, scale);
  if (dropout_p > 0) p.dropout = philox_reserve(detail::attention_dropout_blocks(p.B(), p.H(), p.L(), p.S()));
  detail::AttentionForward f = detail::attention_forward(p);
  Shape out_shape = q.shape();
  out_shape.back() = v.shape().back();
  Tensor out = detail::view(f.out, out_shape);  // the contiguous [B, H, L, Ev] result in q's leading dims
  if (autograd::any_requires_grad({&q, &k, &v, &attn_mask})) {
    TensorList saved{q, k, v, f.lse};
    if (attn_mask.defined()) saved.push_back(attn_mask);
    autograd::record(
        "ScaledDotProductAttentionBackward", {&q, &k, &v, &attn_mask}, {&out},
        [dropout_p, is_causal, scale, dropout = p.dropout, has_mask = attn_mask.defined()](
            BackwardContext& ctx) -> TensorList {
          const Tensor q = ctx.saved(0), k = ctx.saved(1), v = ctx.saved(2), lse = ctx.saved(3);
          const Tensor mask = has_mask ? ctx.saved(4) : Tensor();
          const Tensor out = ctx.saved(has_mask ? 5 : 4);
          detail::AttentionProblem p = detail::make_attention_problem(q, k, v, mask, dropout_p, is_causal, scale);
          p.dropout = dropout;
          const Shape out4{p.B(), p.H(), p.L(), p.Ev()};
          const bool want_mask_grad = has_mask && ctx.needs_input_grad[3];
          detail::AttentionGrads g = detail::attention_backward(p, detail::reshape(out, out4), lse,
                                                                detail::reshape(ctx.grads[0], out4), want_mask_grad);
          Tensor dmask;
          if (want_mask_grad) {
            Shape full = q.shape();
            full.back() = k.shape()[k.dim() - 2];
            dmask = detail::sum_to_shape(detail::reshape(g.dmask, full), mask.shape(), "scaled_dot_product_attention");
          }
          return {detail::reshape(g.dq, q.shape()), detail::reshape(g.dk, k.shape()), detail::reshape(g.dv, v.shape()),
                  dmask};
        },
        saved, {out});
  }
  return out;
}

}  // namespace tandem
