// CUDA kernels of the NN functional ops (core/detail/nn_ops.h): softmax/log_softmax, layer norm and
// dropout, forward and backward.
//
// Row ops (softmax over the last dim, layer norm) run one warp per row for short rows and one
// block per row otherwise, with 16-byte vector loads when the row allows. A block keeps its row in
// shared memory (when it fits in 48 KiB), so each pass after the first reads shared memory: one
// global read and one global write per element. Accumulation is in acc_t (f32 for f16/bf16),
// with the CPU's algorithms: max, then sum of exp(x - max); mean, then mean squared deviation.
#include <algorithm>
#include <array>

#include "core/detail/kernel_tables.h"
#include "core/detail/nn_ops.h"
#include "cuda/detail/block_reduce.cuh"
#include "cuda/detail/device_error.h"
#include "cuda/detail/launch.h"

namespace tandem::cuda {

namespace {

constexpr int64_t kMaxCacheBytes = 48 * 1024;
constexpr int64_t kWarpRowMax = 1024;  // rows up to this length get a warp each

// Threads along a row: all 32 lanes of a warp (kWarp) or the whole block.
template <bool kWarp>
struct RowGroup {
  int64_t row;
  int lane, size;
  __device__ RowGroup() {
    if constexpr (kWarp) {
      row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
      lane = threadIdx.x & 31;
      size = 32;
    } else {
      row = blockIdx.x;
      lane = threadIdx.x;
      size = blockDim.x;
    }
  }
  template <class A, class F>
  __device__ A reduce(A v, F f, A identity, A* scratch) const {
    if constexpr (kWarp) {
      return warp_reduce(v, f);
    } else {
      return block_reduce(v, f, identity, scratch);
    }
  }
};

// ---- softmax ----

template <class T, int V, bool kWarp, bool kCached>
__global__ void __launch_bounds__(1024) softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;  // warp mode only: whole warps leave together
  const T* xr = x + grp.row * n;
  T* yr = y + grp.row * n;
  extern __shared__ __align__(16) unsigned char row_cache[];
  T* cache = reinterpret_cast<T*>(row_cache);
  const int64_t nv = n / V;
  A m = -dinf<A>();
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(xr + i * V);
    if constexpr (kCached) store_vec<T, V>(cache + i * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) m = MaxFn()(m, static_cast<A>(v.v[k]));
  }
  m = grp.reduce(m, MaxFn(), -dinf<A>(), red);
  const T* src = kCached ? cache : xr;
  A s = A(0);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(src + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) s += dexp(static_cast<A>(v.v[k]) - m);
  }
  s = grp.reduce(s, SumFn(), A(0), red);
  const A ls = dlog(s), inv = A(1) / s;
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(src + i * V);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A e = static_cast<A>(v.v[k]) - m;
      o.v[k] = static_cast<T>(log ? e - ls : dexp(e) * inv);
    }
    store_vec<T, V>(yr + i * V, o);
  }
}

// Softmax over a non-innermost dim: a thread per (outer, inner) column, coalesced along inner.
template <class T>
__global__ void softmax_inner_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                                     int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t total = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner, i = c - o * inner;
    const T* xc = x + o * n * inner + i;
    T* yc = y + o * n * inner + i;
    A m = -dinf<A>();
    for (int64_t j = 0; j < n; ++j) m = MaxFn()(m, static_cast<A>(xc[j * inner]));
    A s = A(0);
    for (int64_t j = 0; j < n; ++j) s += dexp(static_cast<A>(xc[j * inner]) - m);
    const A ls = m + dlog(s), inv = A(1) / s;
    for (int64_t j = 0; j < n; ++j) {
      const A v = static_cast<A>(xc[j * inner]);
      yc[j * inner] = static_cast<T>(log ? v - ls : dexp(v - m) * inv);
    }
  }
}

// softmax: gx = y (g - sum(g y)); log_softmax: gx = g - exp(y) sum(g).
template <class T, int V, bool kWarp>
__global__ void __launch_bounds__(1024) softmax_backward_rows_kernel(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gx,
                                             int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;
  const T* gr = g + grp.row * n;
  const T* yr = y + grp.row * n;
  T* out = gx + grp.row * n;
  const int64_t nv = n / V;
  A s = A(0);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> gv = load_vec<T, V>(gr + i * V);
    const Vec<T, V> yv = load_vec<T, V>(yr + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A gk = static_cast<A>(gv.v[k]);
      s += log ? gk : gk * static_cast<A>(yv.v[k]);
    }
  }
  s = grp.reduce(s, SumFn(), A(0), red);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> gv = load_vec<T, V>(gr + i * V);
    const Vec<T, V> yv = load_vec<T, V>(yr + i * V);
    Vec<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A gk = static_cast<A>(gv.v[k]), yk = static_cast<A>(yv.v[k]);
      o.v[k] = static_cast<T>(log ? gk - dexp(yk) * s : yk * (gk - s));
    }
    store_vec<T, V>(out + i * V, o);
  }
}

template <class T>
__global__ void softmax_backward_inner_kernel(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ gx,
                                              int64_t outer, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  const int64_t total = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner, i = c - o * inner;
    const int64_t base = o * n * inner + i;
    A s = A(0);
    for (int64_t j = 0; j < n; ++j) {
      const A gk = static_cast<A>(g[base + j * inner]);
      s += log ? gk : gk * static_cast<A>(y[base + j * inner]);
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t k = base + j * inner;
      const A gk = static_cast<A>(g[k]), yk = static_cast<A>(y[k]);
      gx[k] = static_cast<T>(log ? gk - dexp(yk) * s : yk * (gk - s));
    }
  }
}

// ---- layer norm ----

template <class T, int V, bool kWarp, bool kCached>
__global__ void __launch_bounds__(1024) layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                  T* __restrict__ y, acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                                  int64_t rows, int64_t n, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;
  const T* xr = x + grp.row * n;
  T* yr = y + grp.row * n;
  extern __shared__ __align__(16) unsigned char row_cache[];
  T* cache = reinterpret_cast<T*>(row_cache);
  const int64_t nv = n / V;
  A s = A(0);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(xr + i * V);
    if constexpr (kCached) store_vec<T, V>(cache + i * V, v);
#pragma unroll
    for (int k = 0; k < V; ++k) s += static_cast<A>(v.v[k]);
  }
  const A mean = grp.reduce(s, SumFn(), A(0), red) / A(n);
  const T* src = kCached ? cache : xr;
  A ss = A(0);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(src + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A d = static_cast<A>(v.v[k]) - mean;
      ss += d * d;
    }
  }
  const A var = grp.reduce(ss, SumFn(), A(0), red) / A(n);
  const A rstd = A(1) / dsqrt(var + eps);
  if (grp.lane == 0) {
    mean_out[grp.row] = mean;
    rstd_out[grp.row] = rstd;
  }
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> v = load_vec<T, V>(src + i * V);
    Vec<T, V> wv, bv, o;
    if (w) wv = load_vec<T, V>(w + i * V);
    if (b) bv = load_vec<T, V>(b + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A r = (static_cast<A>(v.v[k]) - mean) * rstd;
      if (w) r *= static_cast<A>(wv.v[k]);
      if (b) r += static_cast<A>(bv.v[k]);
      o.v[k] = static_cast<T>(r);
    }
    store_vec<T, V>(yr + i * V, o);
  }
}

// dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), dy = g * w.
template <class T, int V, bool kWarp>
__global__ void __launch_bounds__(1024) layer_norm_dx_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                     const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                     T* __restrict__ dx, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;
  const T* gr = g + grp.row * n;
  const T* xr = x + grp.row * n;
  T* out = dx + grp.row * n;
  const A mu = mean[grp.row], rs = rstd[grp.row];
  const int64_t nv = n / V;
  A c1 = A(0), c2 = A(0);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> gv = load_vec<T, V>(gr + i * V);
    const Vec<T, V> xv = load_vec<T, V>(xr + i * V);
    Vec<T, V> wv;
    if (w) wv = load_vec<T, V>(w + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A xhat = (static_cast<A>(xv.v[k]) - mu) * rs;
      const A dy = w ? static_cast<A>(gv.v[k]) * static_cast<A>(wv.v[k]) : static_cast<A>(gv.v[k]);
      c1 += dy * xhat;
      c2 += dy;
    }
  }
  c1 = grp.reduce(c1, SumFn(), A(0), red) / A(n);
  c2 = grp.reduce(c2, SumFn(), A(0), red) / A(n);
  for (int64_t i = grp.lane; i < nv; i += grp.size) {
    const Vec<T, V> gv = load_vec<T, V>(gr + i * V);
    const Vec<T, V> xv = load_vec<T, V>(xr + i * V);
    Vec<T, V> wv, o;
    if (w) wv = load_vec<T, V>(w + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A xhat = (static_cast<A>(xv.v[k]) - mu) * rs;
      const A dy = w ? static_cast<A>(gv.v[k]) * static_cast<A>(wv.v[k]) : static_cast<A>(gv.v[k]);
      o.v[k] = static_cast<T>(rs * (dy - c2 - xhat * c1));
    }
    store_vec<T, V>(out + i * V, o);
  }
}

constexpr int kColThreads = 32, kRowThreads = 8;

// dw = sum over rows of g xhat, db = sum of g: 32 columns per block, the rows of one split spread
// over threadIdx.y and combined in a fixed tree; splits (gridDim.y) go to `partial` when > 1.
template <class T>
__global__ void layer_norm_wb_kernel(const T* __restrict__ g, const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                     const acc_t<T>* __restrict__ rstd, int64_t rows, int64_t n, int64_t rows_per_split,
                                     T* __restrict__ dw, T* __restrict__ db, acc_t<T>* __restrict__ partial) {
  using A = acc_t<T>;
  __shared__ A sw[kRowThreads][kColThreads + 1];
  __shared__ A sb[kRowThreads][kColThreads + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = int64_t(blockIdx.x) * kColThreads + tx;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = min(rows, r0 + rows_per_split);
  A aw = A(0), ab = A(0);
  if (j < n) {
    for (int64_t r = r0 + ty; r < r1; r += kRowThreads) {
      const A gj = static_cast<A>(g[r * n + j]);
      aw += gj * ((static_cast<A>(x[r * n + j]) - mean[r]) * rstd[r]);
      ab += gj;
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s >>= 1) {
    if (ty < s) {
      sw[ty][tx] += sw[ty + s][tx];
      sb[ty][tx] += sb[ty + s][tx];
    }
    __syncthreads();
  }
  if (ty != 0 || j >= n) return;
  if (gridDim.y == 1) {
    if (dw) dw[j] = static_cast<T>(sw[0][tx]);
    if (db) db[j] = static_cast<T>(sb[0][tx]);
  } else {
    partial[(int64_t(blockIdx.y) * 2) * n + j] = sw[0][tx];
    partial[(int64_t(blockIdx.y) * 2 + 1) * n + j] = sb[0][tx];
  }
}

template <class T>
__global__ void layer_norm_wb_finish_kernel(const acc_t<T>* __restrict__ partial, int64_t n, int splits,
                                            T* __restrict__ dw, T* __restrict__ db) {
  using A = acc_t<T>;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
    A aw = A(0), ab = A(0);
    for (int s = 0; s < splits; ++s) {
      aw += partial[(int64_t(s) * 2) * n + j];
      ab += partial[(int64_t(s) * 2 + 1) * n + j];
    }
    if (dw) dw[j] = static_cast<T>(aw);
    if (db) db[j] = static_cast<T>(ab);
  }
}

// ---- dropout ----

template <class T>
__global__ void dropout_kernel(const T* __restrict__ x, const float* __restrict__ u, T* __restrict__ out,
                               T* __restrict__ mask, int64_t n, float p, acc_t<T> scale) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const bool keep = u[i] >= p;
    // Dropped elements are written as 0, not x * 0, so an inf/NaN input does not leak.
    out[i] = static_cast<T>(keep ? static_cast<A>(x[i]) * scale : A(0));
    mask[i] = static_cast<T>(keep ? scale : A(0));
  }
}

template <class T>
__global__ void dropout_backward_kernel(const T* __restrict__ g, const T* __restrict__ mask, T* __restrict__ out,
                                        int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const A m = static_cast<A>(mask[i]);
    out[i] = static_cast<T>(m == A(0) ? A(0) : static_cast<A>(g[i]) * m);
  }
}

// ---- fused cross-entropy ----

// Whether a row's target is a class (not ignore_index, not out of range).
__device__ inline bool is_class(int64_t t, int64_t C) { return t >= 0 && t < C; }

// Per row: lse = log sum exp(x), then the loss of core/detail/nn_ops.h's formula. One warp or block per row.
// A target that is neither a class nor ignore_index is recorded in `sink` (raised at the host's
// next sync, cuda/detail/device_error.h) and its row counts as ignored: nothing is read out of bounds.
template <class T, bool kWarp>
__global__ void __launch_bounds__(1024) cross_entropy_kernel(const T* __restrict__ x, const int64_t* __restrict__ target,
                                                             const T* __restrict__ w, T* __restrict__ loss,
                                                             acc_t<T>* __restrict__ lse_out, T* __restrict__ kept,
                                                             int64_t rows, int64_t C, int64_t ignore_index,
                                                             acc_t<T> eps, ErrorSink sink) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;
  const T* xr = x + grp.row * C;
  A m = -dinf<A>();
  for (int64_t c = grp.lane; c < C; c += grp.size) m = MaxFn()(m, static_cast<A>(xr[c]));
  m = grp.reduce(m, MaxFn(), -dinf<A>(), red);
  A s = A(0), sw = A(0), wsum = A(0);
  for (int64_t c = grp.lane; c < C; c += grp.size) {
    const A xc = static_cast<A>(xr[c]);
    s += dexp(xc - m);
    const A wc = w ? static_cast<A>(w[c]) : A(1);
    sw += wc * xc;
    wsum += wc;
  }
  s = grp.reduce(s, SumFn(), A(0), red);
  if (eps != A(0)) {
    sw = grp.reduce(sw, SumFn(), A(0), red);
    wsum = grp.reduce(wsum, SumFn(), A(0), red);
  }
  if (grp.lane != 0) return;
  const A lse = m + dlog(s);
  const int64_t t = target[grp.row];
  lse_out[grp.row] = lse;
  if (t == ignore_index || !is_class(t, C)) {
    if (t != ignore_index) report_error(sink, t, grp.row);
    loss[grp.row] = static_cast<T>(A(0));
    kept[grp.row] = static_cast<T>(A(0));
    return;
  }
  const A wt = w ? static_cast<A>(w[t]) : A(1);
  A l = (A(1) - eps) * wt * (lse - static_cast<A>(xr[t]));
  if (eps != A(0)) l += eps / A(C) * (lse * wsum - sw);
  loss[grp.row] = static_cast<T>(l);
  kept[grp.row] = static_cast<T>(wt);
}

// dx_c = g (softmax_c ((1 - eps) w_t + eps / C sum w) - (1 - eps) w_t [c == t] - eps / C w_c).
template <class T, bool kWarp>
__global__ void __launch_bounds__(1024) cross_entropy_backward_kernel(
    const T* __restrict__ g, const T* __restrict__ x, const int64_t* __restrict__ target, const T* __restrict__ w,
    const acc_t<T>* __restrict__ lse, T* __restrict__ dx, int64_t rows, int64_t C, int64_t ignore_index, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ A red[32];
  const RowGroup<kWarp> grp;
  if (grp.row >= rows) return;
  const T* xr = x + grp.row * C;
  T* dr = dx + grp.row * C;
  const int64_t t = target[grp.row];
  if (t == ignore_index || !is_class(t, C)) {  // a bad target was reported by the forward
    for (int64_t c = grp.lane; c < C; c += grp.size) dr[c] = static_cast<T>(A(0));
    return;
  }
  A wsum = A(C);
  if (w && eps != A(0)) {
    A ws = A(0);
    for (int64_t c = grp.lane; c < C; c += grp.size) ws += static_cast<A>(w[c]);
    wsum = grp.reduce(ws, SumFn(), A(0), red);
  }
  const A gr = static_cast<A>(g[grp.row]);
  const A wt = w ? static_cast<A>(w[t]) : A(1);
  const A hard = (A(1) - eps) * wt;
  const A soft = eps / A(C);
  const A coef = hard + soft * wsum;
  const A l = lse[grp.row];
  for (int64_t c = grp.lane; c < C; c += grp.size) {
    const A wc = w ? static_cast<A>(w[c]) : A(1);
    A d = dexp(static_cast<A>(xr[c]) - l) * coef - soft * wc;
    if (c == t) d -= hard;
    dr[c] = static_cast<T>(gr * d);
  }
}

// ---- launch helpers ----

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Vector width for rows of n elements starting at every pointer in ps.
template <class T>
int row_vec(int64_t n, std::initializer_list<const void*> ps) {
  constexpr int V = kVec16<T>;
  if (V == 1 || n % V != 0) return 1;
  for (const void* p : ps)
    if (p != nullptr && !aligned16(p)) return 1;
  return V;
}

int block_threads_for(int64_t vectors) {
  if (vectors >= 4096) return 1024;
  if (vectors >= 1024) return 512;
  return 256;
}

// Launches kernel<V, kWarp, kCached> over `rows` rows of n elements: a warp per row for short
// rows, else a block per row (its row cached in shared memory when `cacheable` and it fits).
template <class T, class Launch>
void launch_rows(int64_t rows, int64_t n, int vec, bool cacheable, const Launch& launch) {
  constexpr int VF = kVec16<T>;
  if (rows == 0 || n == 0) return;
  TANDEM_CHECK(rows < (int64_t{1} << 31), "[nn] too many rows for one CUDA launch ({})", rows);
  if (n <= kWarpRowMax) {
    constexpr int kWarps = kBlockThreads / 32;
    const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
    if (vec == VF) {
      launch(std::integral_constant<int, VF>{}, std::true_type{}, std::false_type{}, blocks, kBlockThreads, 0);
    } else {
      launch(std::integral_constant<int, 1>{}, std::true_type{}, std::false_type{}, blocks, kBlockThreads, 0);
    }
    return;
  }
  const int threads = block_threads_for(n / vec);
  const unsigned blocks = static_cast<unsigned>(rows);
  const int64_t cache_bytes = n * int64_t(sizeof(T));
  // The 48 KiB a launch may use without opting in covers the kernel's static shared memory too
  // (the block-reduce scratch): leave 1 KiB for it, or rows just under 48 KiB fail to launch.
  const bool cached = cacheable && cache_bytes <= kMaxCacheBytes - 1024;
  const size_t smem = cached ? static_cast<size_t>(cache_bytes) : 0;
  if (vec == VF) {
    if (cached) {
      launch(std::integral_constant<int, VF>{}, std::false_type{}, std::true_type{}, blocks, threads, smem);
    } else {
      launch(std::integral_constant<int, VF>{}, std::false_type{}, std::false_type{}, blocks, threads, smem);
    }
  } else {
    if (cached) {
      launch(std::integral_constant<int, 1>{}, std::false_type{}, std::true_type{}, blocks, threads, smem);
    } else {
      launch(std::integral_constant<int, 1>{}, std::false_type{}, std::false_type{}, blocks, threads, smem);
    }
  }
}

// A warp per row up to kWarpRowMax elements, else a block per row; scalar loads.
template <class Launch>
void launch_rows_scalar(int64_t rows, int64_t n, const Launch& launch) {
  if (rows == 0) return;
  TANDEM_CHECK(rows < (int64_t{1} << 31), "[nn] too many rows for one CUDA launch ({})", rows);
  if (n <= kWarpRowMax) {
    constexpr int kWarps = kBlockThreads / 32;
    launch(std::true_type{}, static_cast<unsigned>((rows + kWarps - 1) / kWarps), kBlockThreads);
  } else {
    launch(std::false_type{}, static_cast<unsigned>(rows), block_threads_for(n));
  }
}

class CudaNnKernels final : public detail::NnDeviceKernels {
 public:
  void softmax(const Tensor& a, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) override {
    const char* name = log ? "log_softmax" : "softmax";
    DeviceGuard guard(a.device());
    cudaStream_t stream = current_stream(a.device());
    TANDEM_DISPATCH_FLOATING(a.dtype(), name, [&] {
      using T = scalar_t;
      const T* xp = ptr<const T>(a);
      T* yp = ptr<T>(y);
      if (inner == 1) {
        const int vec = row_vec<T>(n, {xp, yp});
        launch_rows<T>(outer, n, vec, true, [&](auto V, auto warp, auto cached, unsigned blocks, int threads, size_t smem) {
          softmax_rows_kernel<T, decltype(V)::value, decltype(warp)::value, decltype(cached)::value>
              <<<blocks, threads, smem, stream>>>(xp, yp, outer, n, log);
          TANDEM_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
        });
      } else {
        softmax_inner_kernel<T><<<blocks_for(outer * inner), kBlockThreads, 0, stream>>>(xp, yp, outer, n, inner, log);
        TANDEM_CUDA_CHECK_LAUNCH("softmax_inner_kernel");
      }
    });
  }

  void softmax_backward(const Tensor& g, const Tensor& y, const Tensor& gx, int64_t outer, int64_t n, int64_t inner,
                        bool log) override {
    const char* name = log ? "log_softmax_backward" : "softmax_backward";
    DeviceGuard guard(y.device());
    cudaStream_t stream = current_stream(y.device());
    TANDEM_DISPATCH_FLOATING(y.dtype(), name, [&] {
      using T = scalar_t;
      const T* gp = ptr<const T>(g);
      const T* yp = ptr<const T>(y);
      T* op = ptr<T>(gx);
      if (inner == 1) {
        const int vec = row_vec<T>(n, {gp, yp, op});
        launch_rows<T>(outer, n, vec, false, [&](auto V, auto warp, auto, unsigned blocks, int threads, size_t) {
          softmax_backward_rows_kernel<T, decltype(V)::value, decltype(warp)::value>
              <<<blocks, threads, 0, stream>>>(gp, yp, op, outer, n, log);
          TANDEM_CUDA_CHECK_LAUNCH("softmax_backward_rows_kernel");
        });
      } else {
        softmax_backward_inner_kernel<T>
            <<<blocks_for(outer * inner), kBlockThreads, 0, stream>>>(gp, yp, op, outer, n, inner, log);
        TANDEM_CUDA_CHECK_LAUNCH("softmax_backward_inner_kernel");
      }
    });
  }

  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, int64_t rows, int64_t cols,
                  const detail::LayerNormForward& out) override {
    DeviceGuard guard(x.device());
    cudaStream_t stream = current_stream(x.device());
    TANDEM_DISPATCH_FLOATING(x.dtype(), "layer_norm", [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      const T* xp = ptr<const T>(x);
      const T* wp = ptr<const T>(weight);
      const T* bp = ptr<const T>(bias);
      T* yp = ptr<T>(out.y);
      A* mp = ptr<A>(out.mean);
      A* rp = ptr<A>(out.rstd);
      const int vec = row_vec<T>(cols, {xp, wp, bp, yp});
      launch_rows<T>(rows, cols, vec, true, [&](auto V, auto warp, auto cached, unsigned blocks, int threads, size_t smem) {
        layer_norm_kernel<T, decltype(V)::value, decltype(warp)::value, decltype(cached)::value>
            <<<blocks, threads, smem, stream>>>(xp, wp, bp, yp, mp, rp, rows, cols, static_cast<A>(eps));
        TANDEM_CUDA_CHECK_LAUNCH("layer_norm_kernel");
      });
    });
  }

  void layer_norm_backward(const Tensor& g, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                           const Tensor& weight, int64_t rows, int64_t cols,
                           const std::array<Tensor, 3>& out) override {
    const char* name = "layer_norm_backward";
    DeviceGuard guard(x.device());
    cudaStream_t stream = current_stream(x.device());
    TANDEM_DISPATCH_FLOATING(x.dtype(), name, [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      const T* gp = ptr<const T>(g);
      const T* xp = ptr<const T>(x);
      const T* wp = ptr<const T>(weight);
      const A* mp = ptr<const A>(mean);
      const A* rp = ptr<const A>(rstd);
      T* dx = ptr<T>(out[0]);
      T* dw = ptr<T>(out[1]);
      T* db = ptr<T>(out[2]);
      if (dx != nullptr && rows > 0) {
        const int vec = row_vec<T>(cols, {gp, xp, wp, dx});
        launch_rows<T>(rows, cols, vec, false, [&](auto V, auto warp, auto, unsigned blocks, int threads, size_t) {
          layer_norm_dx_kernel<T, decltype(V)::value, decltype(warp)::value>
              <<<blocks, threads, 0, stream>>>(gp, xp, wp, mp, rp, dx, rows, cols);
          TANDEM_CUDA_CHECK_LAUNCH("layer_norm_dx_kernel");
        });
      }
      if ((dw != nullptr || db != nullptr) && cols > 0) {
        if (rows == 0) {
          // Sums over no rows: zero gradients (zero bits are 0.0).
          if (dw) TANDEM_CUDA_CHECK(cudaMemsetAsync(dw, 0, cols * sizeof(T), stream));
          if (db) TANDEM_CUDA_CHECK(cudaMemsetAsync(db, 0, cols * sizeof(T), stream));
          return;
        }
        // Split the rows so the grid fills the GPU; the split count depends only on the shape.
        const int64_t col_blocks = (cols + kColThreads - 1) / kColThreads;
        int64_t splits = std::min<int64_t>((rows + 63) / 64, std::max<int64_t>(1, (1024 + col_blocks - 1) / col_blocks));
        splits = std::clamp<int64_t>(splits, 1, 65535);
        const int64_t rows_per_split = (rows + splits - 1) / splits;
        splits = (rows + rows_per_split - 1) / rows_per_split;
        TANDEM_CHECK(col_blocks < (int64_t{1} << 31), "[{}] too many columns for one CUDA launch ({})", name, cols);
        Tensor scratch;
        A* partial = nullptr;
        if (splits > 1) {
          scratch = make_empty(Shape{2 * splits * cols}, mean.dtype(), x.device(), name);
          partial = ptr<A>(scratch);
        }
        layer_norm_wb_kernel<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)),
                                  dim3(kColThreads, kRowThreads), 0, stream>>>(gp, xp, mp, rp, rows, cols,
                                                                               rows_per_split, dw, db, partial);
        TANDEM_CUDA_CHECK_LAUNCH("layer_norm_wb_kernel");
        if (splits > 1) {
          layer_norm_wb_finish_kernel<T><<<blocks_for(cols), kBlockThreads, 0, stream>>>(
              partial, cols, static_cast<int>(splits), dw, db);
          TANDEM_CUDA_CHECK_LAUNCH("layer_norm_wb_finish_kernel");
        }
      }
    });
  }

  void dropout(const Tensor& x, const Tensor& uniform, double p, const Tensor& out, const Tensor& mask) override {
    const int64_t n = x.numel();
    if (n == 0) return;
    DeviceGuard guard(x.device());
    cudaStream_t stream = current_stream(x.device());
    TANDEM_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      const A scale = p < 1 ? static_cast<A>(1.0 / (1.0 - p)) : A(0);
      dropout_kernel<T><<<blocks_for(n, 4), kBlockThreads, 0, stream>>>(
          ptr<const T>(x), ptr<const float>(uniform), ptr<T>(out), ptr<T>(mask), n, static_cast<float>(p), scale);
      TANDEM_CUDA_CHECK_LAUNCH("dropout_kernel");
    });
  }

  void dropout_backward(const Tensor& g, const Tensor& mask, const Tensor& out) override {
    const int64_t n = mask.numel();
    if (n == 0) return;
    DeviceGuard guard(mask.device());
    cudaStream_t stream = current_stream(mask.device());
    TANDEM_DISPATCH_FLOATING(mask.dtype(), "dropout_backward", [&] {
      using T = scalar_t;
      dropout_backward_kernel<T>
          <<<blocks_for(n, 4), kBlockThreads, 0, stream>>>(ptr<const T>(g), ptr<const T>(mask), ptr<T>(out), n);
      TANDEM_CUDA_CHECK_LAUNCH("dropout_backward_kernel");
    });
  }

  void cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, int64_t ignore_index,
                     double label_smoothing, const detail::CrossEntropyRows& out) override {
    const int64_t rows = logits.size(0), C = logits.size(1);
    DeviceGuard guard(logits.device());
    cudaStream_t stream = current_stream(logits.device());
    const detail::IndexCheck check = detail::IndexCheck::for_classes("cross_entropy", C, ignore_index);
    const ErrorSink sink = error_sink(logits.device().index, &check);
    TANDEM_DISPATCH_FLOATING(logits.dtype(), "cross_entropy", [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      auto run = [&](auto warp, unsigned blocks, int threads) {
        cross_entropy_kernel<T, decltype(warp)::value><<<blocks, threads, 0, stream>>>(
            ptr<const T>(logits), ptr<const int64_t>(target), ptr<const T>(weight), ptr<T>(out.loss),
            ptr<A>(out.lse), ptr<T>(out.kept), rows, C, ignore_index, static_cast<A>(label_smoothing), sink);
        TANDEM_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
      };
      launch_rows_scalar(rows, C, run);
    });
  }

  void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& weight,
                              const Tensor& lse, int64_t ignore_index, double label_smoothing,
                              const Tensor& grad_logits) override {
    const int64_t rows = logits.size(0), C = logits.size(1);
    DeviceGuard guard(logits.device());
    cudaStream_t stream = current_stream(logits.device());
    TANDEM_DISPATCH_FLOATING(logits.dtype(), "cross_entropy_backward", [&] {
      using T = scalar_t;
      using A = acc_t<T>;
      auto run = [&](auto warp, unsigned blocks, int threads) {
        cross_entropy_backward_kernel<T, decltype(warp)::value><<<blocks, threads, 0, stream>>>(
            ptr<const T>(g), ptr<const T>(logits), ptr<const int64_t>(target), ptr<const T>(weight),
            ptr<const A>(lse), ptr<T>(grad_logits), rows, C, ignore_index, static_cast<A>(label_smoothing));
        TANDEM_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
      };
      launch_rows_scalar(rows, C, run);
    });
  }
};

}  // namespace

void install_nn_kernels() {
  static CudaNnKernels kernels;
  register_device_kernels<detail::NnDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
