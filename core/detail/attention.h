// Fused scaled dot-product attention: softmax(q kᵀ · scale + mask) v, computed tile by tile with
// an online softmax so that neither the forward nor what it saves for backward holds an L×S
// matrix (FlashAttention's scheme, Dao et al. 2022/2023). The forward and backward computations
// and the CPU kernels are here; autograd/attention_grad.cpp records the backward, and
// cuda/attention.cu registers the device kernels.
//
// The problem, once core has validated and shaped it (AttentionProblem below): q [B, H, L, E],
// k [B, H, S, E], v [B, H, S, Ev], any strides; out [B, H, L, Ev]. For every (b, h) and query row i:
//   s_ij = (scale · q_i)·k_j + bias_ij             (bias: 0, -inf where a boolean mask is false or
//                                                   j > i under is_causal, or the additive mask;
//                                                   the scale goes in first, so a tiny or zero scale
//                                                   with huge q and k gives small scores, not inf
//                                                   or 0 · inf = NaN)
//   lse_i = log Σ_j exp(s_ij)                      (+inf for a row whose keys are all masked)
//   p_ij = exp(s_ij - lse_i)                       (0 for such a row: its output and gradients are 0)
//   out_i = Σ_j p_ij · keep_ij / (1 - dropout_p) · v_j
// The per-row logsumexp is what forward saves; backward recomputes p tile by tile from it.
//
// Dropout. keep_ij is drawn from the Philox generator reserved once per forward (philox_reserve of
// attention_dropout_blocks): element e = ((b·H + h)·L + i)·S + j keeps when the f32 uniform of word
// e % 4 of block (offset + e / 4) is >= dropout_p. Backward redraws the same bits, so no mask is
// stored, and CPU and CUDA keep the same elements for one seed.
//
// Accumulation is in f32 for f32, bf16 and f16 inputs, and in f64 for f64.
#pragma once

#include <cstdint>
#include <optional>

#include "core/philox.h"
#include "core/random.h"
#include "core/tensor.h"

namespace tandem::detail {

// Everything a kernel needs. Tensors are 4-D as above (core reshapes the leading batch dims into
// B and adds size-1 dims where there are fewer). `mask`, when defined, is the user's mask expanded
// (stride 0 where it broadcasts) to [B, H, L, S]: bool (true takes part) or q's dtype (added).
struct AttentionProblem {
  Tensor q, k, v, mask;
  bool causal = false;  // key j takes part for query i only when j <= i (PyTorch's top-left tril)
  double scale = 1.0;
  double dropout_p = 0.0;  // 0: no dropout, and `dropout` is not read
  PhiloxState dropout;     // where the keep bits were reserved
  int64_t B() const { return q.size(0); }
  int64_t H() const { return q.size(1); }
  int64_t L() const { return q.size(2); }
  int64_t S() const { return k.size(2); }
  int64_t E() const { return q.size(3); }
  int64_t Ev() const { return v.size(3); }
};

// Validates the public op's arguments ("[scaled_dot_product_attention] ..." errors naming the
// shapes and dtypes) and shapes them into a problem: views, or a copy only where more than two
// leading dims do not merge into one. The scale defaults to 1/sqrt(E). Reserves no dropout bits.
AttentionProblem make_attention_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                        double dropout_p, bool is_causal, std::optional<double> scale);

// The Philox blocks one forward reserves for its keep bits (one 32-bit word per element). Throws
// "[scaled_dot_product_attention] ..." when B·H·L·S overflows int64 (sizes a stride-0 view can
// have): no generator range could number its elements.
uint64_t attention_dropout_blocks(int64_t B, int64_t H, int64_t L, int64_t S);

// keep_ij for element e (see above): the same expression on the host and the device.
TANDEM_HOST_DEVICE inline bool attention_keep(uint64_t seed, uint64_t offset, uint64_t e, float p) {
  const PhiloxCounter b = philox_block(seed, offset + e / 4);
  return uniform_f32(b.w[e % 4]) >= p;
}

// The accumulation dtype: f64 for f64, f32 otherwise (the saved logsumexp's dtype).
inline Dtype attention_acc_dtype(Dtype d) { return d == Dtype::f64 ? Dtype::f64 : Dtype::f32; }

// out [B, H, L, Ev] (q's dtype, contiguous) and lse [B, H, L] (attention_acc_dtype, contiguous).
struct AttentionForward {
  Tensor out, lse;
};
AttentionForward attention_forward(const AttentionProblem& p);

// The gradients of q, k, v (their dtypes, contiguous, their shapes) and, when want_mask_grad, of
// the additive mask as a full [B, H, L, S] tensor of the mask's dtype (the caller sums it to the
// mask's own shape). `out` and `lse` are the forward's; `dout` has out's shape, any strides.
struct AttentionGrads {
  Tensor dq, dk, dv, dmask;
};
AttentionGrads attention_backward(const AttentionProblem& p, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, bool want_mask_grad);

// ---- device kernels ----
// The table a device backend registers (cuda/attention.cu). Core has validated the problem (one
// device, q/k/v of one floating dtype, B·H·L·S > 0 and E, Ev > 0, mask as above) and allocated the
// outputs, contiguous and zero-filled only where said:
//   forward:  out [B, H, L, Ev] (q's dtype), lse [B, H, L] (acc dtype).
//   backward: dq, dk, dv (q's dtype and their shapes), dmask [B, H, L, S] of the mask's dtype or
//             undefined when not wanted; `delta` [B, H, L] (acc dtype) already holds
//             Σ_e dout_ie · out_ie for every row (core computes it: it is one reduction).
// The kernels compute what the CPU's do, up to the order of f32 sums, including fully masked rows
// (out 0, lse +inf, no gradient) and the dropout bits.
struct AttentionDeviceKernels {
  virtual ~AttentionDeviceKernels() = default;
  virtual void forward(const AttentionProblem& p, const Tensor& out, const Tensor& lse) = 0;
  virtual void backward(const AttentionProblem& p, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& dmask) = 0;
};

}  // namespace tandem::detail
