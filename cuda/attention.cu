// CUDA kernels of fused scaled dot-product attention (core/detail/attention.h), forward and
// backward. A plain tiled scheme, written for correctness and clarity rather than speed: a block of
// 256 threads per (batch·head, tile of t rows), the tiles it multiplies in shared memory in the
// accumulation type (f32 for f32/f16/bf16, f64 for f64), with FlashAttention's online softmax in
// the forward and the scores recomputed from the saved logsumexp in the backward.
//
//   forward      block per (b·h, query tile): Q (pre-scaled), then for each key tile K, the scores,
//                the running max/sum, V, and O = O·alpha + P·V. Writes out and lse.
//   backward dq  block per (b·h, query tile): for each key tile, dS = P∘(dP - delta) and dQ += dS·K;
//                dS is also the mask's gradient, written here once per element.
//   backward dkv block per (b·h, key tile): for each query tile, dV += Wᵀ·dO (W the dropped weights)
//                and dK += dSᵀ·(scale·Q).
// Two backward kernels, each owning the rows it writes, so no atomics are needed and the result is
// deterministic; the price is computing the score tiles twice.
//
// The tile edge t (64, 32, 16 or 8, the same for queries and keys) is chosen on the host per kernel
// from the head dims: the largest whose shared memory stays under kSmemTarget, else the largest the
// device allows at all; head dims too large even for t = 8 get a tandem::Error naming them (with
// an H100's 227 KiB per block the backward's limit is about E = Ev = 1200 for f32, f16 and bf16,
// which shared memory holds as f32, and 600 for f64). Within a block, thread x of a t×t score tile
// takes (row x / t, column x % t): a warp reads one row of the first operand (a broadcast) and
// consecutive rows of the second, whose shared rows are padded to an odd length so those reads hit
// distinct banks.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "core/detail/attention.h"
#include "core/detail/kernel_tables.h"
#include "cuda/detail/block_reduce.cuh"
#include "cuda/detail/launch.h"

namespace tandem::cuda {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A block's shared memory we aim to stay under: two blocks fit one H100 SM (228 KiB).
constexpr int64_t kSmemTarget = 96 * 1024;
constexpr int kTiles[] = {64, 32, 16, 8};
// Blocks launched at most; each loops over its share of the (b·h, tile) items.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// The softmax's running max, letting NaN through (MaxFn drops a NaN b): a NaN score makes its row
// NaN, as on the CPU and in softmax, and only a row of -inf scores counts as fully masked.
struct NanMaxFn {
  template <class A>
  __device__ A operator()(A a, A b) const { return (b > a || b != b) ? b : a; }
};

// A [B, H, rows, cols] operand: its first element and element strides (any, 0 included).
template <class T>
struct Operand {
  const T* data = nullptr;
  int64_t sb = 0, sh = 0, sr = 0, sc = 0;
};

template <class T>
Operand<T> operand_of(const Tensor& t) {
  TANDEM_CHECK(t.dim() == 4, "[{}] internal: the CUDA kernels take 4-D [B, H, rows, cols] tensors, got {}", kOp,
               t.shape());
  return Operand<T>{static_cast<const T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

enum class MaskKind : int { none, boolean, additive };

// Everything the kernels read, by value. A = acc_t<T>.
template <class T>
struct Inputs {
  using A = acc_t<T>;
  Operand<T> q, k, v, dout;
  const void* mask = nullptr;  // uint8_t (bool) or T (additive), per mask_kind
  int64_t mb = 0, mh = 0, ml = 0, ms = 0;
  MaskKind mask_kind = MaskKind::none;
  int64_t BH = 0, H = 0, L = 0, S = 0, E = 0, Ev = 0;
  int t = 0;  // the tile edge
  bool causal = false;
  A scale = A(1);
  // Dropout: keep_scale = 1 / (1 - p), as the CPU computes it; p == 0 means none.
  float dropout_p = 0.0f;
  A keep_scale = A(1);
  uint64_t seed = 0, offset = 0;
};

template <class T>
Inputs<T> inputs_of(const detail::AttentionProblem& p, const Tensor& dout, int t) {
  using A = acc_t<T>;
  Inputs<T> in;
  in.q = operand_of<T>(p.q);
  in.k = operand_of<T>(p.k);
  in.v = operand_of<T>(p.v);
  if (dout.defined()) in.dout = operand_of<T>(dout);
  if (p.mask.defined()) {
    TANDEM_CHECK(p.mask.dim() == 4, "[{}] internal: the mask must be [B, H, L, S], got {}", kOp, p.mask.shape());
    in.mask = p.mask.data_ptr();
    in.mb = p.mask.stride(0);
    in.mh = p.mask.stride(1);
    in.ml = p.mask.stride(2);
    in.ms = p.mask.stride(3);
    in.mask_kind = p.mask.dtype() == boolean ? MaskKind::boolean : MaskKind::additive;
  }
  in.BH = p.B() * p.H();
  in.H = p.H();
  in.L = p.L();
  in.S = p.S();
  in.E = p.E();
  in.Ev = p.Ev();
  in.t = t;
  in.causal = p.causal;
  in.scale = static_cast<A>(p.scale);
  if (p.dropout_p > 0) {
    in.dropout_p = static_cast<float>(p.dropout_p);
    in.keep_scale = A(1) / (A(1) - static_cast<A>(p.dropout_p));
    in.seed = p.dropout.seed;
    in.offset = p.dropout.offset;
  }
  return in;
}

// ---- shared memory layouts ----
// Offsets (in accumulator elements) of each array of a kernel's shared memory, for tile edge t:
// the host sizes the launch from `total`, the kernel takes its pointers from the same offsets.
// Rows that a warp reads across (the second operand of a score dot product) have an odd length.
__host__ __device__ inline int64_t odd(int64_t n) { return n | 1; }

struct ForwardSmem {
  int64_t ldq, ldkv, lds;
  int64_t q, kv, o, s, m, l, alpha, total;
  __host__ __device__ ForwardSmem(int64_t t, int64_t E, int64_t Ev) {
    ldq = odd(E);
    ldkv = odd(E > Ev ? E : Ev);  // K, then V, share one buffer
    lds = t + 1;
    q = 0;
    kv = q + t * ldq;
    o = kv + t * ldkv;
    s = o + t * Ev;
    m = s + t * lds;
    l = m + t;
    alpha = l + t;
    total = alpha + t;
  }
};

struct DqSmem {
  int64_t ldq, ldv, lds;
  int64_t q, dout, k, v, dq, ds, lse, delta, total;
  __host__ __device__ DqSmem(int64_t t, int64_t E, int64_t Ev) {
    ldq = odd(E);
    ldv = odd(Ev);
    lds = t + 1;
    q = 0;
    dout = q + t * ldq;
    k = dout + t * ldv;
    v = k + t * ldq;
    dq = v + t * ldv;
    ds = dq + t * E;
    lse = ds + t * lds;
    delta = lse + t;
    total = delta + t;
  }
};

struct DkvSmem {
  int64_t ldq, ldv, lds;
  int64_t k, v, q, dout, dk, dv, w, ds, lse, delta, total;
  __host__ __device__ DkvSmem(int64_t t, int64_t E, int64_t Ev) {
    ldq = odd(E);
    ldv = odd(Ev);
    lds = t + 1;
    k = 0;
    v = k + t * ldq;
    q = v + t * ldv;
    dout = q + t * ldq;
    dk = dout + t * ldv;
    dv = dk + t * E;
    w = dv + t * Ev;
    ds = w + t * lds;
    lse = ds + t * lds;
    delta = lse + t;
    total = delta + t;
  }
};

// ---- device helpers ----

template <class A>
__device__ inline A* smem_base() {
  extern __shared__ __align__(16) unsigned char attention_smem[];
  return reinterpret_cast<A*>(attention_smem);
}

// Rows [r0, r0 + t) of the (b, h) matrix of `src` (cols wide) into dst (row length ld), times mul;
// rows past `rows` are zeros, so the padding of a last tile adds nothing.
template <class T, class A>
__device__ inline void load_rows(A* dst, int64_t ld, const Operand<T>& src, int64_t b, int64_t h, int64_t r0,
                                 int64_t rows, int t, int cols, A mul) {
  const T* base = src.data + b * src.sb + h * src.sh;
  for (int x = threadIdx.x; x < t * cols; x += kThreads) {
    const int r = x / cols, c = x - r * cols;
    const int64_t row = r0 + r;
    dst[r * ld + c] = row < rows ? static_cast<A>(base[row * src.sr + c * src.sc]) * mul : A(0);
  }
}

// Per-row values [bh·n + r0, + t) of a contiguous [B·H, n] array; `pad` past n.
template <class A>
__device__ inline void load_row_stats(A* dst, const A* src, int64_t bh, int64_t n, int64_t r0, int t, A pad) {
  for (int r = threadIdx.x; r < t; r += kThreads) dst[r] = r0 + r < n ? src[bh * n + r0 + r] : pad;
}

template <class A>
__device__ inline A dot(const A* a, const A* b, int64_t n) {
  A s = A(0);
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// bias_ij of the scores, for i < L and j < S: -inf where causal or a boolean mask excludes the
// key, the additive mask's value, else 0.
template <class T>
__device__ inline acc_t<T> score_bias(const Inputs<T>& in, int64_t b, int64_t h, int64_t i, int64_t j) {
  using A = acc_t<T>;
  if (in.causal && j > i) return -dinf<A>();
  if (in.mask_kind == MaskKind::none) return A(0);
  const int64_t off = b * in.mb + h * in.mh + i * in.ml + j * in.ms;
  if (in.mask_kind == MaskKind::boolean) return static_cast<const uint8_t*>(in.mask)[off] ? A(0) : -dinf<A>();
  return static_cast<A>(static_cast<const T*>(in.mask)[off]);
}

// Whether dropout keeps element (bh, i, j): the CPU's bits, element e = ((b·H + h)·L + i)·S + j.
template <class T>
__device__ inline bool keeps(const Inputs<T>& in, int64_t bh, int64_t i, int64_t j) {
  const uint64_t e = (static_cast<uint64_t>(bh) * static_cast<uint64_t>(in.L) + static_cast<uint64_t>(i)) *
                         static_cast<uint64_t>(in.S) +
                     static_cast<uint64_t>(j);
  return detail::attention_keep(in.seed, in.offset, e, in.dropout_p);
}

// One score's backward terms: w = p_ij·keep_ij/(1 - p), the weight that multiplied v_j, and
// ds = p_ij·(dP_ij - delta_i), the gradient of s_ij. Both 0 where the key is masked or the row is
// fully masked (lse +inf), whatever dout holds. q_row is pre-scaled.
template <class A>
struct ScoreGrad {
  A w, ds;
};

template <class T>
__device__ inline ScoreGrad<acc_t<T>> score_grad(const Inputs<T>& in, const acc_t<T>* q_row, const acc_t<T>* k_row,
                                                 const acc_t<T>* dout_row, const acc_t<T>* v_row, acc_t<T> lse,
                                                 acc_t<T> delta, int64_t b, int64_t h, int64_t bh, int64_t i,
                                                 int64_t j) {
  using A = acc_t<T>;
  if (lse == dinf<A>()) return {A(0), A(0)};
  const A bias = score_bias(in, b, h, i, j);
  if (bias == -dinf<A>()) return {A(0), A(0)};
  const A p = dexp(dot(q_row, k_row, in.E) + bias - lse);
  A w = p, dp = dot(dout_row, v_row, in.Ev);
  if (in.dropout_p != 0.0f) {  // the weight was dropped or scaled, and so is its gradient
    const bool keep = keeps(in, bh, i, j);
    w = keep ? p * in.keep_scale : A(0);
    dp = keep ? dp * in.keep_scale : A(0);
  }
  return {w, p * (dp - delta)};
}

// ---- forward ----

template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const Inputs<T> in, T* __restrict__ out, acc_t<T>* __restrict__ lse) {
  using A = acc_t<T>;
  const int t = in.t;
  const int E = static_cast<int>(in.E), Ev = static_cast<int>(in.Ev);
  const ForwardSmem lay(t, E, Ev);
  A* const smem = smem_base<A>();
  A* const sq = smem + lay.q;
  A* const skv = smem + lay.kv;
  A* const so = smem + lay.o;
  A* const ss = smem + lay.s;
  A* const sm = smem + lay.m;
  A* const sl = smem + lay.l;
  A* const salpha = smem + lay.alpha;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t tiles = (in.L + t - 1) / t, items = in.BH * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t bh = item / tiles, q0 = (item % tiles) * t;
    const int64_t b = bh / in.H, h = bh % in.H;
    __syncthreads();  // the previous item's reads of shared memory are done
    load_rows(sq, lay.ldq, in.q, b, h, q0, in.L, t, E, in.scale);  // the scale folded into q, as on the CPU
    for (int x = threadIdx.x; x < t * Ev; x += kThreads) so[x] = A(0);
    for (int r = threadIdx.x; r < t; r += kThreads) {
      sm[r] = -dinf<A>();
      sl[r] = A(0);
    }
    // Under causal, keys past the tile's last query are masked for all of its rows: skip them.
    const int64_t key_end = in.causal ? min(in.S, q0 + t) : in.S;
    for (int64_t k0 = 0; k0 < key_end; k0 += t) {
      __syncthreads();  // Q and the accumulators are set / the previous tile's P·V is done with skv, ss
      load_rows(skv, lay.ldkv, in.k, b, h, k0, in.S, t, E, A(1));
      __syncthreads();
      for (int x = threadIdx.x; x < t * t; x += kThreads) {
        const int r = x / t, c = x - r * t;
        const int64_t i = q0 + r, j = k0 + c;
        A s = -dinf<A>();
        if (i < in.L && j < in.S) {
          const A bias = score_bias(in, b, h, i, j);
          if (bias != -dinf<A>()) s = dot(sq + r * lay.ldq, skv + c * lay.ldkv, E) + bias;
        }
        ss[r * lay.lds + c] = s;
      }
      __syncthreads();
      // K is no longer read: V takes its buffer while the warps update the softmax rows.
      load_rows(skv, lay.ldkv, in.v, b, h, k0, in.S, t, Ev, A(1));
      // Online softmax, a warp per row: the new running max m, p = exp(s - m) (0 while every key so
      // far is masked), alpha = exp(old m - new m) rescales what the row has summed so far. The sum
      // l takes every weight, the values (through ss) only the kept ones.
      for (int r = warp; r < t; r += kWarps) {
        A* const row = ss + r * lay.lds;
        A mx = -dinf<A>();
        for (int c = lane; c < t; c += 32) mx = NanMaxFn()(mx, row[c]);
        mx = warp_reduce(mx, NanMaxFn());
        const A m_old = sm[r], m_new = NanMaxFn()(m_old, mx);
        A sum = A(0);
        for (int c = lane; c < t; c += 32) {
          A p = m_new == -dinf<A>() ? A(0) : dexp(row[c] - m_new);
          sum += p;
          if (in.dropout_p != 0.0f && p != A(0)) p = keeps(in, bh, q0 + r, k0 + c) ? p * in.keep_scale : A(0);
          row[c] = p;
        }
        sum = warp_reduce(sum, SumFn());
        if (lane == 0) {
          const A alpha = m_new == -dinf<A>() ? A(1) : dexp(m_old - m_new);
          sl[r] = sl[r] * alpha + sum;
          sm[r] = m_new;
          salpha[r] = alpha;
        }
      }
      __syncthreads();
      for (int x = threadIdx.x; x < t * Ev; x += kThreads) {
        const int r = x / Ev, c = x - r * Ev;
        const A* const prow = ss + r * lay.lds;
        A acc = so[x] * salpha[r];
        for (int kj = 0; kj < t; ++kj) acc += prow[kj] * skv[kj * lay.ldkv + c];
        so[x] = acc;
      }
    }
    __syncthreads();
    // A row whose keys were all masked has l = 0: output 0 and lse +inf (backward gives it no gradient).
    for (int x = threadIdx.x; x < t * Ev; x += kThreads) {
      const int r = x / Ev, c = x - r * Ev;
      const int64_t i = q0 + r;
      if (i < in.L) {
        const A l = sl[r];
        out[(bh * in.L + i) * in.Ev + c] = static_cast<T>(l == A(0) ? A(0) : so[x] / l);  // NaN stays NaN
      }
    }
    for (int r = threadIdx.x; r < t; r += kThreads) {
      const int64_t i = q0 + r;
      if (i < in.L) lse[bh * in.L + i] = sl[r] == A(0) ? dinf<A>() : sm[r] + dlog(sl[r]);
    }
  }
}

// ---- backward ----

// dq (and dmask): a block per (b·h, query tile), looping over the key tiles.
template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const Inputs<T> in, const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ delta,
                        T* __restrict__ dq, T* __restrict__ dmask) {
  using A = acc_t<T>;
  const int t = in.t;
  const int E = static_cast<int>(in.E), Ev = static_cast<int>(in.Ev);
  const DqSmem lay(t, E, Ev);
  A* const smem = smem_base<A>();
  A* const sq = smem + lay.q;
  A* const sdo = smem + lay.dout;
  A* const sk = smem + lay.k;
  A* const sv = smem + lay.v;
  A* const sdq = smem + lay.dq;
  A* const sds = smem + lay.ds;
  A* const slse = smem + lay.lse;
  A* const sdelta = smem + lay.delta;
  const int64_t tiles = (in.L + t - 1) / t, items = in.BH * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t bh = item / tiles, q0 = (item % tiles) * t;
    const int64_t b = bh / in.H, h = bh % in.H;
    __syncthreads();  // the previous item's reads of shared memory are done
    load_rows(sq, lay.ldq, in.q, b, h, q0, in.L, t, E, in.scale);
    load_rows(sdo, lay.ldv, in.dout, b, h, q0, in.L, t, Ev, A(1));
    load_row_stats(slse, lse, bh, in.L, q0, t, dinf<A>());
    load_row_stats(sdelta, delta, bh, in.L, q0, t, A(0));
    for (int x = threadIdx.x; x < t * E; x += kThreads) sdq[x] = A(0);
    // Causal key tiles past the diagonal add nothing to dq; the mask's gradient is written for every
    // element (its buffer is not zero-filled), so with one wanted they are all visited.
    const int64_t key_end = in.causal && dmask == nullptr ? min(in.S, q0 + t) : in.S;
    for (int64_t k0 = 0; k0 < key_end; k0 += t) {
      __syncthreads();  // the previous tile's dQ update is done with sk, sds
      load_rows(sk, lay.ldq, in.k, b, h, k0, in.S, t, E, A(1));
      load_rows(sv, lay.ldv, in.v, b, h, k0, in.S, t, Ev, A(1));
      __syncthreads();
      for (int x = threadIdx.x; x < t * t; x += kThreads) {
        const int r = x / t, c = x - r * t;
        const int64_t i = q0 + r, j = k0 + c;
        A ds = A(0);
        if (i < in.L && j < in.S) {
          ds = score_grad(in, sq + r * lay.ldq, sk + c * lay.ldq, sdo + r * lay.ldv, sv + c * lay.ldv, slse[r],
                          sdelta[r], b, h, bh, i, j)
                   .ds;
          if (dmask != nullptr) dmask[(bh * in.L + i) * in.S + j] = static_cast<T>(ds);
        }
        // dQ = dS · (scale · K): the scale goes in before the product, which could overflow
        // with it outside (tiny scales, huge q and k: the true dQ is finite).
        sds[r * lay.lds + c] = ds * static_cast<A>(in.scale);
      }
      __syncthreads();
      for (int x = threadIdx.x; x < t * E; x += kThreads) {
        const int r = x / E, c = x - r * E;
        const A* const dsrow = sds + r * lay.lds;
        A acc = sdq[x];
        for (int kj = 0; kj < t; ++kj) acc += dsrow[kj] * sk[kj * lay.ldq + c];
        sdq[x] = acc;
      }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < t * E; x += kThreads) {
      const int r = x / E, c = x - r * E;
      const int64_t i = q0 + r;
      // A fully masked row has no gradient (not 0 · inf where a key holds inf).
      if (i < in.L) dq[(bh * in.L + i) * in.E + c] = static_cast<T>(slse[r] == dinf<A>() ? A(0) : sdq[x]);
    }
  }
}

// dk and dv: a block per (b·h, key tile), looping over the query tiles.
template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(const Inputs<T> in, const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ delta,
                         T* __restrict__ dk, T* __restrict__ dv) {
  using A = acc_t<T>;
  const int t = in.t;
  const int E = static_cast<int>(in.E), Ev = static_cast<int>(in.Ev);
  const DkvSmem lay(t, E, Ev);
  A* const smem = smem_base<A>();
  A* const sk = smem + lay.k;
  A* const sv = smem + lay.v;
  A* const sq = smem + lay.q;
  A* const sdo = smem + lay.dout;
  A* const sdk = smem + lay.dk;
  A* const sdv = smem + lay.dv;
  A* const sw = smem + lay.w;
  A* const sds = smem + lay.ds;
  A* const slse = smem + lay.lse;
  A* const sdelta = smem + lay.delta;
  const int64_t tiles = (in.S + t - 1) / t, items = in.BH * tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t bh = item / tiles, k0 = (item % tiles) * t;
    const int64_t b = bh / in.H, h = bh % in.H;
    __syncthreads();  // the previous item's reads of shared memory are done
    load_rows(sk, lay.ldq, in.k, b, h, k0, in.S, t, E, A(1));
    load_rows(sv, lay.ldv, in.v, b, h, k0, in.S, t, Ev, A(1));
    for (int x = threadIdx.x; x < t * E; x += kThreads) sdk[x] = A(0);
    for (int x = threadIdx.x; x < t * Ev; x += kThreads) sdv[x] = A(0);
    // Under causal, queries before the tile's first key see none of its keys: start at k0 (a tile
    // with k0 >= L gets no query at all, and writes its zeros below).
    const int64_t q_begin = in.causal ? k0 : 0;
    for (int64_t q0 = q_begin; q0 < in.L; q0 += t) {
      __syncthreads();  // the previous tile's dK, dV updates are done with sq, sdo, sw, sds
      load_rows(sq, lay.ldq, in.q, b, h, q0, in.L, t, E, in.scale);
      load_rows(sdo, lay.ldv, in.dout, b, h, q0, in.L, t, Ev, A(1));
      load_row_stats(slse, lse, bh, in.L, q0, t, dinf<A>());
      load_row_stats(sdelta, delta, bh, in.L, q0, t, A(0));
      __syncthreads();
      // A fully masked row (lse +inf) took no part: zero its q and upstream gradient, so an inf or
      // NaN there cannot reach dK and dV through 0 · inf (as the CPU does).
      for (int x = threadIdx.x; x < t * E; x += kThreads)
        if (slse[x / E] == dinf<A>()) sq[(x / E) * lay.ldq + x % E] = A(0);
      for (int x = threadIdx.x; x < t * Ev; x += kThreads)
        if (slse[x / Ev] == dinf<A>()) sdo[(x / Ev) * lay.ldv + x % Ev] = A(0);
      __syncthreads();
      for (int x = threadIdx.x; x < t * t; x += kThreads) {
        const int r = x / t, c = x - r * t;  // r: a query of this tile, c: a key
        const int64_t i = q0 + r, j = k0 + c;
        ScoreGrad<A> g{A(0), A(0)};
        if (i < in.L && j < in.S)
          g = score_grad(in, sq + r * lay.ldq, sk + c * lay.ldq, sdo + r * lay.ldv, sv + c * lay.ldv, slse[r],
                         sdelta[r], b, h, bh, i, j);
        sw[r * lay.lds + c] = g.w;
        sds[r * lay.lds + c] = g.ds;
      }
      __syncthreads();
      for (int x = threadIdx.x; x < t * Ev; x += kThreads) {
        const int kj = x / Ev, c = x - kj * Ev;
        A acc = sdv[x];
        for (int qi = 0; qi < t; ++qi) acc += sw[qi * lay.lds + kj] * sdo[qi * lay.ldv + c];
        sdv[x] = acc;
      }
      for (int x = threadIdx.x; x < t * E; x += kThreads) {
        const int kj = x / E, c = x - kj * E;
        A acc = sdk[x];
        for (int qi = 0; qi < t; ++qi) acc += sds[qi * lay.lds + kj] * sq[qi * lay.ldq + c];  // sq holds scale·q
        sdk[x] = acc;
      }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < t * E; x += kThreads) {
      const int r = x / E, c = x - r * E;
      const int64_t j = k0 + r;
      if (j < in.S) dk[(bh * in.S + j) * in.E + c] = static_cast<T>(sdk[x]);
    }
    for (int x = threadIdx.x; x < t * Ev; x += kThreads) {
      const int r = x / Ev, c = x - r * Ev;
      const int64_t j = k0 + r;
      if (j < in.S) dv[(bh * in.S + j) * in.Ev + c] = static_cast<T>(sdv[x]);
    }
  }
}

// ---- host side ----

struct Tiling {
  int t;
  size_t bytes;
};

// The tile edge for a kernel whose layout is Smem: the largest of kTiles under kSmemTarget, else the
// largest the device allows a block (its opt-in maximum), else an error naming the head dims.
template <class Smem>
Tiling pick_tiling(const char* kernel, Dtype dtype, size_t acc_bytes, int64_t E, int64_t Ev, Device device) {
  int optin = 0;
  TANDEM_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, static_cast<int>(device.index)));
  const auto limit = static_cast<size_t>(optin);
  const size_t target = std::min(limit, static_cast<size_t>(kSmemTarget));
  auto bytes_for = [&](int t) { return static_cast<size_t>(Smem(t, E, Ev).total) * acc_bytes; };
  for (int t : kTiles)
    if (bytes_for(t) <= target) return {t, bytes_for(t)};
  for (int t : kTiles)
    if (bytes_for(t) <= limit) return {t, bytes_for(t)};
  constexpr int smallest = kTiles[std::size(kTiles) - 1];
  fail("[{}] head dims E = {} and Ev = {} are too large for the CUDA {} kernel in {}: its smallest tile ({} rows) "
       "needs {} bytes of shared memory per block and {} allows {}",
       kOp, E, Ev, kernel, dtype, smallest, bytes_for(smallest), device, optin);
}

// Launches `kernel` over `items` (b·h, tile) items with `bytes` of dynamic shared memory.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), const char* name, int64_t items, size_t bytes, cudaStream_t stream,
            Args&&... args) {
  // Above 48 KiB a kernel must opt in; setting it every time is cheap and always right.
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  const auto blocks = static_cast<unsigned>(std::min(items, kMaxBlocks));
  kernel<<<blocks, kThreads, bytes, stream>>>(std::forward<Args>(args)...);
  TANDEM_CUDA_CHECK_LAUNCH(name);
}

class CudaAttentionKernels final : public detail::AttentionDeviceKernels {
 public:
  void forward(const detail::AttentionProblem& p, const Tensor& out, const Tensor& lse) override {
    const Device device = p.q.device();
    DeviceGuard guard(device);
    cudaStream_t stream = current_stream(device);
    TANDEM_DISPATCH_FLOATING(p.q.dtype(), kOp, [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      const Tiling tl = pick_tiling<ForwardSmem>("forward", p.q.dtype(), sizeof(A), p.E(), p.Ev(), device);
      const Inputs<T> in = inputs_of<T>(p, Tensor(), tl.t);
      const int64_t items = in.BH * ((in.L + tl.t - 1) / tl.t);
      launch(attention_forward_kernel<T>, "attention_forward_kernel", items, tl.bytes, stream, in,
             static_cast<T*>(out.data_ptr()), static_cast<A*>(lse.data_ptr()));
    });
  }

  void backward(const detail::AttentionProblem& p, const Tensor& out, const Tensor& lse, const Tensor& dout,
                const Tensor& delta, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                const Tensor& dmask) override {
    const Device device = p.q.device();
    DeviceGuard guard(device);
    cudaStream_t stream = current_stream(device);
    TANDEM_CHECK(!dmask.defined() || dmask.dtype() == p.q.dtype(),
                 "[{}] internal: the mask's gradient must have the query's dtype {}, got {}", kOp, p.q.dtype(),
                 dmask.dtype());
    TANDEM_DISPATCH_FLOATING(p.q.dtype(), kOp, [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      // Both tilings first: nothing is launched when either kernel cannot run.
      const Tiling tq = pick_tiling<DqSmem>("backward (dq)", p.q.dtype(), sizeof(A), p.E(), p.Ev(), device);
      const Tiling tkv = pick_tiling<DkvSmem>("backward (dk, dv)", p.q.dtype(), sizeof(A), p.E(), p.Ev(), device);
      const auto* lse_p = static_cast<const A*>(lse.data_ptr());
      const auto* delta_p = static_cast<const A*>(delta.data_ptr());
      T* dmask_p = dmask.defined() ? static_cast<T*>(dmask.data_ptr()) : nullptr;
      const Inputs<T> inq = inputs_of<T>(p, dout, tq.t);
      launch(attention_dq_kernel<T>, "attention_dq_kernel", inq.BH * ((inq.L + tq.t - 1) / tq.t), tq.bytes, stream,
             inq, lse_p, delta_p, static_cast<T*>(dq.data_ptr()), dmask_p);
      const Inputs<T> inkv = inputs_of<T>(p, dout, tkv.t);
      launch(attention_dkv_kernel<T>, "attention_dkv_kernel", inkv.BH * ((inkv.S + tkv.t - 1) / tkv.t), tkv.bytes,
             stream, inkv, lse_p, delta_p, static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()));
    });
  }
};

}  // namespace

void install_attention_kernels() {
  static CudaAttentionKernels table;
  register_device_kernels<detail::AttentionDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
