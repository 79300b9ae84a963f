#include "core/detail/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/simd_loops.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/matmul.h"
#include "core/detail/copy.h"
#include "core/detail/elementwise.h"
#include "core/detail/fast_math.h"
#include "core/detail/index.h"
#include "core/detail/reduce.h"
#include "core/detail/views.h"
#include "core/parallel.h"

namespace tandem::detail {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// ---- shaping ----

// t ([..., R, C] with `lead` leading dims) as [B, H, R, C]: size-1 dims added in front of fewer
// than two leading dims (any stride does for a size-1 dim), and more than two merged into B (a
// view when their strides chain, else a copy).
Tensor as_4d(const Tensor& t) {
  const int64_t nd = t.dim();
  if (nd == 4) return t;
  if (nd < 4) {
    Shape shape(4, 1);
    Strides strides(4, 0);
    for (int64_t d = 0; d < nd; ++d) {
      shape[4 - nd + d] = t.size(d);
      strides[4 - nd + d] = t.stride(d);
    }
    return make_view(t, shape, strides, t.storage_offset());
  }
  int64_t merged = 1;
  for (int64_t d = 0; d < nd - 3; ++d) merged *= t.size(d);
  return reshape(t, Shape{merged, t.size(nd - 3), t.size(nd - 2), t.size(nd - 1)});
}

// ---- the CPU kernels ----

// The f32 kernels' exp is fast_exp (core/detail/fast_math.h): vectorisable, where std::exp is a
// call per element and the softmax's exps would otherwise cost as much as its GEMMs.
using detail::fast_exp;                                    // f32 (this namespace would hide it)
inline double fast_exp(double x) { return std::exp(x); }  // the f64 kernel is for accuracy, not speed

// C = op(A) · op(B) (+ C when accumulate), row-major with leading dims lda/ldb/ldc: a transposed
// operand is the same memory with its strides swapped (core/detail/matmul.h's host_gemm, BLAS).
template <class C>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const C* A, int64_t lda, const C* B,
          int64_t ldb, bool accumulate, C* Cm, int64_t ldc) {
  host_gemm<C>(M, N, K, A, trans_a ? 1 : lda, trans_a ? lda : 1, B, trans_b ? 1 : ldb, trans_b ? ldb : 1, Cm, ldc,
               accumulate, kOp);
}

// Query and key tiles. 64 x 64 keeps a tile's scores (16 KiB in f32) and the Q, K, V tiles it
// multiplies in L2, and wastes little work on the diagonal tiles of a causal mask.
constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;

// The matrix (b, h) of a 4-D tensor of element type T, read as rows x cols into `dst` (contiguous,
// type C), each element times `mul`.
template <class T, class C>
void load_matrix(const Tensor& t, int64_t b, int64_t h, C mul, C* dst) {
  const int64_t rows = t.size(2), cols = t.size(3);
  const int64_t rs = t.stride(2), cs = t.stride(3);
  const T* src = static_cast<const T*>(t.data_ptr()) + b * t.stride(0) + h * t.stride(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = static_cast<C>(src[r * rs + c * cs]) * mul;
}

// The additive bias of one score tile (queries i0.., keys j0..): -inf above the diagonal under
// causal, the mask's value or -inf where a boolean mask is false. s has nk columns.
template <class T, class C>
void add_bias(const AttentionProblem& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, C* s) {
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  if (p.causal) {
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = std::max<int64_t>(0, i0 + r + 1 - j0); c < nk; ++c) s[r * nk + c] = kNegInf;
  }
  if (!p.mask.defined()) return;
  const Tensor& m = p.mask;
  const int64_t rs = m.stride(2), cs = m.stride(3);
  const int64_t base = b * m.stride(0) + h * m.stride(1) + i0 * rs + j0 * cs;
  if (m.dtype() == Dtype::boolean) {
    const bool* mp = static_cast<const bool*>(m.data_ptr()) + base;
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = 0; c < nk; ++c)
        if (!mp[r * rs + c * cs]) s[r * nk + c] = kNegInf;
  } else {
    const T* mp = static_cast<const T*>(m.data_ptr()) + base;
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = 0; c < nk; ++c) {
        // -inf masks the key whatever its score (NaN included), as a false boolean does and as the
        // CUDA kernel, which skips masked scores, does.
        const C bias = static_cast<C>(mp[r * rs + c * cs]);
        s[r * nk + c] = bias == kNegInf ? kNegInf : s[r * nk + c] + bias;
      }
  }
}

// The dropout factor of each element of a tile: 0 (dropped) or 1 / (1 - p).
template <class C>
void dropout_factors(const AttentionProblem& p, int64_t bh, int64_t i0, int64_t nq, int64_t j0, int64_t nk, C* f) {
  const float drop = static_cast<float>(p.dropout_p);
  const C kept = C(1) / (C(1) - static_cast<C>(p.dropout_p));
  const uint64_t L = static_cast<uint64_t>(p.L()), S = static_cast<uint64_t>(p.S());
  for (int64_t r = 0; r < nq; ++r) {
    const uint64_t row = (static_cast<uint64_t>(bh) * L + static_cast<uint64_t>(i0 + r)) * S;
    // attention_keep's bits, one Philox block per four elements rather than one per element: a
    // block is computed once and its four words used in turn.
    uint64_t block = ~uint64_t{0};
    PhiloxCounter bits{};
    for (int64_t c = 0; c < nk; ++c) {
      const uint64_t e = row + static_cast<uint64_t>(j0 + c);
      if (p.dropout.offset + e / 4 != block) {
        block = p.dropout.offset + e / 4;
        bits = philox_block(p.dropout.seed, block);
      }
      f[r * nk + c] = uniform_f32(bits.w[e % 4]) >= drop ? kept : C(0);
    }
  }
}

// The keys a query tile [i0, i0 + nq) reaches: all S, or under causal those up to its last query.
int64_t key_end(const AttentionProblem& p, int64_t i0, int64_t nq) {
  return p.causal ? std::min(p.S(), i0 + nq) : p.S();
}

template <class T>
void forward_cpu(const AttentionProblem& p, const Tensor& out, const Tensor& lse) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr C kInf = std::numeric_limits<C>::infinity();
  const int64_t B = p.B(), H = p.H(), L = p.L(), S = p.S(), E = p.E(), Ev = p.Ev();
  T* o = static_cast<T*>(out.data_ptr());
  C* lse_p = static_cast<C*>(lse.data_ptr());
  // Each (batch, head) is a problem of its own: chunks of them on the intra-op threads, each with
  // its own scratch, the same bits at any thread count.
  parallel_for(B * H, 1, [&](int64_t bh_begin, int64_t bh_end) {
    std::vector<C> q(L * E), k(S * E), v(S * Ev);
    std::vector<C> s(kQueryTile * kKeyTile), drop(p.dropout_p > 0 ? kQueryTile * kKeyTile : 0);
    std::vector<C> acc(kQueryTile * Ev), m(kQueryTile), l(kQueryTile);
    for (int64_t bh = bh_begin; bh < bh_end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_matrix<T, C>(p.q, b, h, static_cast<C>(p.scale), q.data());  // the scale folded into q
      load_matrix<T, C>(p.k, b, h, C(1), k.data());
      load_matrix<T, C>(p.v, b, h, C(1), v.data());
      for (int64_t i0 = 0; i0 < L; i0 += kQueryTile) {
        const int64_t nq = std::min(kQueryTile, L - i0);
        std::fill(acc.begin(), acc.end(), C(0));
        std::fill(m.begin(), m.end(), -kInf);
        std::fill(l.begin(), l.end(), C(0));
        const int64_t jend = key_end(p, i0, nq);
        for (int64_t j0 = 0; j0 < jend; j0 += kKeyTile) {
          const int64_t nk = std::min(kKeyTile, jend - j0);
          gemm<C>(false, true, nq, nk, E, q.data() + i0 * E, E, k.data() + j0 * E, E, false, s.data(), nk);
          add_bias<T, C>(p, b, h, i0, nq, j0, nk, s.data());
          if (p.dropout_p > 0) dropout_factors<C>(p, bh, i0, nq, j0, nk, drop.data());
          // The online softmax: the running max m and sum l of each row, the accumulator rescaled
          // by exp(old max - new max) whenever the max grows.
          for (int64_t r = 0; r < nq; ++r) {
            C* sr = s.data() + r * nk;
            // The running max lets NaN through (a NaN score makes its row NaN, as softmax does),
            // so that only a row of -inf scores counts as fully masked.
            C mx = m[r];
            for (int64_t c = 0; c < nk; ++c) mx = (sr[c] > mx || sr[c] != sr[c]) ? sr[c] : mx;
            if (mx == -kInf) {  // every key so far masked: nothing to add
              std::fill(sr, sr + nk, C(0));
              continue;
            }
            const C corr = fast_exp(m[r] - mx);  // 0 when m[r] was -inf
            C sum = 0;
            if constexpr (std::is_same_v<C, float>) {
              // The exponentials on the SIMD clones, then the row's sum in the same order: the
              // sum inside the loop kept it scalar.
              exp_shifted_f32_n(sr, mx, nk);
              for (int64_t c = 0; c < nk; ++c) sum += sr[c];
            } else {
              for (int64_t c = 0; c < nk; ++c) {
                sr[c] = fast_exp(sr[c] - mx);
                sum += sr[c];
              }
            }
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            if (corr != C(1))
              for (int64_t e = 0; e < Ev; ++e) acc[r * Ev + e] *= corr;
            if (p.dropout_p > 0)  // the sum l takes every weight; the values only the kept ones
              for (int64_t c = 0; c < nk; ++c) sr[c] *= drop[r * nk + c];
          }
          gemm<C>(false, false, nq, Ev, nk, s.data(), nk, v.data() + j0 * Ev, Ev, true, acc.data(), Ev);
        }
        for (int64_t r = 0; r < nq; ++r) {
          T* orow = o + (bh * L + i0 + r) * Ev;
          const bool empty = l[r] == C(0);  // every key masked: output 0, lse +inf (no gradient)
          const C inv = empty ? C(0) : C(1) / l[r];
          // Written as 0 rather than acc · 0: a NaN or inf value of a masked key would make 0 · NaN.
          for (int64_t e = 0; e < Ev; ++e) orow[e] = static_cast<T>(empty ? C(0) : acc[r * Ev + e] * inv);
          lse_p[bh * L + i0 + r] = empty ? kInf : m[r] + std::log(l[r]);
        }
      }
    }
  });
}

template <class T>
void backward_cpu(const AttentionProblem& p, const Tensor& out, const Tensor& lse, const Tensor& dout,
                  const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dmask) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t B = p.B(), H = p.H(), L = p.L(), S = p.S(), E = p.E(), Ev = p.Ev();
  const C scale = static_cast<C>(p.scale);
  const C* lse_p = static_cast<const C*>(lse.data_ptr());
  const C* delta_p = static_cast<const C*>(delta.data_ptr());
  T* dq_p = static_cast<T*>(dq.data_ptr());
  T* dk_p = static_cast<T*>(dk.data_ptr());
  T* dv_p = static_cast<T*>(dv.data_ptr());
  // Per (batch, head), as the forward: each writes only its own dq, dk, dv and dmask blocks.
  parallel_for(B * H, 1, [&](int64_t bh_begin, int64_t bh_end) {
    std::vector<C> q(L * E), k(S * E), ks(S * E), v(S * Ev), g(L * Ev);
    std::vector<C> gq(L * E), gk(S * E), gv(S * Ev);
    std::vector<C> prob(kQueryTile * kKeyTile), ds(kQueryTile * kKeyTile);
    std::vector<C> drop(p.dropout_p > 0 ? kQueryTile * kKeyTile : 0);
    for (int64_t bh = bh_begin; bh < bh_end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_matrix<T, C>(p.q, b, h, scale, q.data());
      load_matrix<T, C>(p.k, b, h, C(1), k.data());
      // dQ = dS · (scale · K): the scale goes in before the product, which could overflow with it
      // outside (a tiny scale and huge q and k, whose true dQ is finite). dK = dSᵀ · (scale · Q) alike.
      for (int64_t e = 0; e < S * E; ++e) ks[e] = k[e] * scale;
      load_matrix<T, C>(p.v, b, h, C(1), v.data());
      load_matrix<T, C>(dout, b, h, C(1), g.data());
      // A fully masked row (lse +inf) took no part: its q and upstream gradient are zeroed so that
      // an inf or NaN in them cannot reach the other rows' gradients through 0 · inf.
      for (int64_t i = 0; i < L; ++i)
        if (lse_p[bh * L + i] == std::numeric_limits<C>::infinity()) {
          std::fill(q.begin() + i * E, q.begin() + (i + 1) * E, C(0));
          std::fill(g.begin() + i * Ev, g.begin() + (i + 1) * Ev, C(0));
        }
      std::fill(gq.begin(), gq.end(), C(0));
      std::fill(gk.begin(), gk.end(), C(0));
      std::fill(gv.begin(), gv.end(), C(0));
      for (int64_t i0 = 0; i0 < L; i0 += kQueryTile) {
        const int64_t nq = std::min(kQueryTile, L - i0);
        const int64_t jend = key_end(p, i0, nq);
        for (int64_t j0 = 0; j0 < jend; j0 += kKeyTile) {
          const int64_t nk = std::min(kKeyTile, jend - j0);
          // The forward's weights, recomputed from the saved logsumexp.
          gemm<C>(false, true, nq, nk, E, q.data() + i0 * E, E, k.data() + j0 * E, E, false, prob.data(), nk);
          add_bias<T, C>(p, b, h, i0, nq, j0, nk, prob.data());
          for (int64_t r = 0; r < nq; ++r) {
            const C lse_r = lse_p[bh * L + i0 + r];  // +inf for a fully masked row: every weight 0
            C* pr = prob.data() + r * nk;
            if constexpr (std::is_same_v<C, float>) {
              exp_shifted_f32_n(pr, lse_r, nk);
            } else {
              for (int64_t c = 0; c < nk; ++c) pr[c] = fast_exp(pr[c] - lse_r);
            }
          }
          // dP = dO · Vᵀ (of the dropped weights; times the dropout factor for the weights themselves).
          gemm<C>(false, true, nq, nk, Ev, g.data() + i0 * Ev, Ev, v.data() + j0 * Ev, Ev, false, ds.data(), nk);
          if (p.dropout_p > 0) {
            dropout_factors<C>(p, bh, i0, nq, j0, nk, drop.data());
            for (int64_t e = 0; e < nq * nk; ++e) ds[e] *= drop[e];
          }
          // dS = P ∘ (dP - delta): the gradient of the (scaled, biased) scores.
          for (int64_t r = 0; r < nq; ++r) {
            const C d = delta_p[bh * L + i0 + r];
            // A weight of 0 (a masked key, a fully masked row) has no gradient, even where an inf
            // or NaN value or upstream gradient would make 0 · (dP - delta) NaN.
            for (int64_t c = 0; c < nk; ++c) {
              const C pc = prob[r * nk + c];
              ds[r * nk + c] = pc == C(0) ? C(0) : pc * (ds[r * nk + c] - d);
            }
          }
          // dV += (P ∘ dropout)ᵀ · dO
          if (p.dropout_p > 0)
            for (int64_t e = 0; e < nq * nk; ++e) prob[e] *= drop[e];
          gemm<C>(true, false, nk, Ev, nq, prob.data(), nk, g.data() + i0 * Ev, Ev, true, gv.data() + j0 * Ev, Ev);
          // dQ += dS · (scale · K); dK += dSᵀ · (scale · Q).
          gemm<C>(false, false, nq, E, nk, ds.data(), nk, ks.data() + j0 * E, E, true, gq.data() + i0 * E, E);
          gemm<C>(true, false, nk, E, nq, ds.data(), nk, q.data() + i0 * E, E, true, gk.data() + j0 * E, E);
          if (dmask.defined()) {
            T* dm = static_cast<T*>(dmask.data_ptr()) + ((bh * L + i0) * S + j0);
            for (int64_t r = 0; r < nq; ++r)
              for (int64_t c = 0; c < nk; ++c) dm[r * S + c] = static_cast<T>(ds[r * nk + c]);
          }
        }
      }
      for (int64_t e = 0; e < L * E; ++e) {
        const bool masked_row = lse_p[bh * L + e / E] == std::numeric_limits<C>::infinity();
        dq_p[bh * L * E + e] = static_cast<T>(masked_row ? C(0) : gq[e]);  // no gradient, not 0 · inf
      }
      for (int64_t e = 0; e < S * E; ++e) dk_p[bh * S * E + e] = static_cast<T>(gk[e]);
      for (int64_t e = 0; e < S * Ev; ++e) dv_p[bh * S * Ev + e] = static_cast<T>(gv[e]);
    }
  });
}

// Whether the problem has nothing to attend: no output rows or columns, or no keys (every row is
// then fully masked: output 0, no gradient).
bool degenerate(const AttentionProblem& p) {
  return p.B() == 0 || p.H() == 0 || p.L() == 0 || p.S() == 0 || p.Ev() == 0;  // no product: sizes may be huge
}

// A head dim of 0 gives scores of 0 (plus the bias): the kernels get q and k of head dim 1 and
// value 0, which give the same scores, so they never see an empty GEMM.
AttentionProblem without_empty_head_dim(const AttentionProblem& p) {
  if (p.E() > 0) return p;
  AttentionProblem r = p;
  r.q = zeros_of(Shape{p.B(), p.H(), p.L(), 1}, p.q.dtype(), p.q.device(), kOp);
  r.k = zeros_of(Shape{p.B(), p.H(), p.S(), 1}, p.k.dtype(), p.k.device(), kOp);
  return r;
}

}  // namespace

AttentionProblem make_attention_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                        double dropout_p, bool is_causal, std::optional<double> scale) {
  TANDEM_CHECK(q.defined() && k.defined() && v.defined(), "[{}] query, key and value must be defined tensors", kOp);
  TANDEM_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
               "[{}] query, key and value must have the same number of dims, at least 2 ([..., L, E], [..., S, E], "
               "[..., S, Ev]); got query {}, key {}, value {}",
               kOp, q.shape(), k.shape(), v.shape());
  TANDEM_CHECK(is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
               "[{}] query, key and value must have one floating dtype; got {}, {}, {}", kOp, q.dtype(), k.dtype(),
               v.dtype());
  TANDEM_CHECK(k.device() == q.device() && v.device() == q.device(),
               "[{}] query, key and value must be on one device; got {}, {}, {}", kOp, q.device(), k.device(),
               v.device());
  const int64_t nd = q.dim();
  for (int64_t d = 0; d < nd - 2; ++d)
    TANDEM_CHECK(k.size(d) == q.size(d) && v.size(d) == q.size(d),
                 "[{}] query, key and value must have the same leading (batch) dims; got query {}, key {}, value {}",
                 kOp, q.shape(), k.shape(), v.shape());
  TANDEM_CHECK(k.size(nd - 1) == q.size(nd - 1),
               "[{}] query and key must have the same last dim (E); got query {} and key {}", kOp, q.shape(),
               k.shape());
  TANDEM_CHECK(v.size(nd - 2) == k.size(nd - 2),
               "[{}] key and value must have the same number of keys (dim -2); got key {} and value {}", kOp,
               k.shape(), v.shape());
  TANDEM_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "[{}] dropout_p must be in [0, 1), got {}", kOp, dropout_p);
  TANDEM_CHECK(!scale || std::isfinite(*scale), "[{}] scale must be finite, got {}", kOp, scale.value_or(0.0));
  AttentionProblem p;
  const int64_t S = k.size(nd - 2), E = q.size(nd - 1);
  if (mask.defined()) {
    TANDEM_CHECK(!is_causal,
                 "[{}] attn_mask and is_causal cannot both be given (is_causal is a lower-triangular mask; "
                 "combine it into attn_mask)",
                 kOp);
    TANDEM_CHECK(mask.dtype() == Dtype::boolean || mask.dtype() == q.dtype(),
                 "[{}] attn_mask must be bool or the query's dtype {}, got {}", kOp, q.dtype(), mask.dtype());
    TANDEM_CHECK(mask.device() == q.device(), "[{}] attn_mask is on {} but the query is on {}", kOp, mask.device(),
                 q.device());
    Shape full = q.shape();
    full.back() = S;  // [..., L, S]
    bool fits = mask.dim() <= static_cast<int64_t>(full.size());
    for (int64_t d = 0; fits && d < mask.dim(); ++d) {
      const int64_t md = mask.size(mask.dim() - 1 - d), fd = full[full.size() - 1 - d];
      fits = md == fd || md == 1;
    }
    TANDEM_CHECK(fits, "[{}] attn_mask of shape {} does not broadcast to the scores' shape {}", kOp, mask.shape(),
                 full);
    p.mask = as_4d(expand(mask, full));
  }
  p.q = as_4d(q);
  p.k = as_4d(k);
  p.v = as_4d(v);
  p.causal = is_causal;
  p.scale = scale ? *scale : (E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
  p.dropout_p = dropout_p;
  return p;
}

uint64_t attention_dropout_blocks(int64_t B, int64_t H, int64_t L, int64_t S) {
  int64_t n = 0;
  const bool overflow =
      __builtin_mul_overflow(B, H, &n) || __builtin_mul_overflow(n, L, &n) || __builtin_mul_overflow(n, S, &n);
  TANDEM_CHECK(!overflow, "[{}] dropout over B·H·L·S = {}·{}·{}·{} weights: the count overflows int64", kOp, B, H, L,
               S);
  return philox_blocks(n, 1);
}

AttentionForward attention_forward(const AttentionProblem& p0) {
  const Dtype acc = attention_acc_dtype(p0.q.dtype());
  AttentionForward f;
  f.out = make_empty(Shape{p0.B(), p0.H(), p0.L(), p0.Ev()}, p0.q.dtype(), p0.q.device(), kOp);
  f.lse = make_empty(Shape{p0.B(), p0.H(), p0.L()}, acc, p0.q.device(), kOp);
  if (degenerate(p0)) {
    if (f.out.numel() > 0) fill(f.out, 0.0, kOp);
    if (f.lse.numel() > 0) fill(f.lse, std::numeric_limits<double>::infinity(), kOp);
    return f;
  }
  const AttentionProblem p = without_empty_head_dim(p0);
  if (!p.q.is_cpu()) [[unlikely]] {
    device_kernels<AttentionDeviceKernels>(p.q.device(), kOp).forward(p, f.out, f.lse);
    return f;
  }
  TANDEM_DISPATCH_FLOATING(p.q.dtype(), kOp, [&] { forward_cpu<scalar_t>(p, f.out, f.lse); });
  return f;
}

AttentionGrads attention_backward(const AttentionProblem& p0, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, bool want_mask_grad) {
  const Dtype dt = p0.q.dtype();
  const Device dev = p0.q.device();
  AttentionGrads g;
  g.dq = zeros_of(p0.q.shape(), dt, dev, kOp);
  g.dk = zeros_of(p0.k.shape(), dt, dev, kOp);
  g.dv = zeros_of(p0.v.shape(), dt, dev, kOp);
  if (want_mask_grad) g.dmask = zeros_of(Shape{p0.B(), p0.H(), p0.L(), p0.S()}, p0.mask.dtype(), dev, kOp);
  if (degenerate(p0)) return g;
  const AttentionProblem p = without_empty_head_dim(p0);
  Tensor dq = p0.E() > 0 ? g.dq : zeros_of(p.q.shape(), dt, dev, kOp);  // scratch when E is 0
  Tensor dk = p0.E() > 0 ? g.dk : zeros_of(p.k.shape(), dt, dev, kOp);
  // delta_i = Σ_e dout_ie · out_ie, in the accumulation dtype: the row term of softmax's gradient.
  const Dtype acc = attention_acc_dtype(dt);
  Tensor delta = sum_kernel(binary(Binary::mul, cast(dout, acc, kOp), cast(out, acc, kOp)),
                            plan_reduction(out, Shape{3}, false, kOp));
  if (!delta.is_contiguous()) delta = contiguous_copy(delta, kOp);
  if (!p.q.is_cpu()) [[unlikely]] {
    device_kernels<AttentionDeviceKernels>(dev, kOp).backward(p, out, lse, dout, delta, dq, dk, g.dv, g.dmask);
    return g;
  }
  TANDEM_DISPATCH_FLOATING(dt, kOp, [&] { backward_cpu<scalar_t>(p, out, lse, dout, delta, dq, dk, g.dv, g.dmask); });
  return g;
}

}  // namespace tandem::detail
