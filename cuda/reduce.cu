// CUDA kernels of the reductions (core/detail/reduce.h) and their backward steps.
//
// One kernel shape serves every reduction: the plan's kept dims are M outputs, its reduced dims
// K elements each. A 2-D block either spreads the K elements of a few outputs over threadIdx.x
// (when the reduced dims are the fast ones: coalesced along K) or spreads neighbouring outputs
// over threadIdx.x and the K elements over threadIdx.y (column sums: coalesced along M). When
// there are too few outputs to fill the GPU, K is also split over gridDim.y and a second kernel
// combines the per-split partials in split order. Every combine is a fixed tree, never an
// atomic, so results are identical run to run. f16/bf16 accumulate in f32, integers in i64.
#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/iter.h"
#include "core/detail/reduce.h"
#include "cuda/detail/block_reduce.cuh"
#include "cuda/detail/launch.h"

namespace tandem::cuda {

namespace {

using detail::Extreme;
using detail::ReduceGradOp;
using detail::ReduceOp;
using detail::ReducePlan;

constexpr int kMaxDims = 12;

// Row-major index -> element offset over up to kMaxDims strided dims.
struct Dims {
  int n = 0;
  int64_t size[kMaxDims];
  int64_t stride[kMaxDims];
  __device__ int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; --d) {
      const int64_t q = i / size[d];
      off += (i - q * size[d]) * stride[d];
      i = q;
    }
    return off;
  }
};

// Coalesces (sizes, strides), outermost first, into d; false when more than kMaxDims remain.
bool make_dims(const Shape& sizes, const Strides& strides, Dims& d) {
  d.n = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    if (d.n > 0 && d.stride[d.n - 1] == strides[i] * sizes[i]) {
      d.size[d.n - 1] *= sizes[i];
      d.stride[d.n - 1] = strides[i];
      continue;
    }
    if (d.n == kMaxDims) return false;
    d.size[d.n] = sizes[i];
    d.stride[d.n] = strides[i];
    ++d.n;
  }
  return true;
}

struct Layout {
  Dims outer, inner;
  int64_t M = 0, K = 0, k_per_split = 1;
  int splits = 1;
  bool x_on_k = true;
};

template <class T>
using sum_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;
template <class T>
using sum_out_t = std::conditional_t<std::is_integral_v<T>, int64_t, T>;

// ---- reduction ops: identity, reduce (one element, its index in the slice), combine, write ----

template <class T>
struct SumOp {
  using acc = sum_acc_t<T>;
  sum_out_t<T>* out;
  acc divisor;
  bool divide;
  __device__ acc identity() const { return acc(0); }
  __device__ acc reduce(acc a, T v, int64_t) const { return a + static_cast<acc>(v); }
  __device__ acc combine(acc a, acc b) const { return a + b; }
  __device__ void write(int64_t o, acc a) const {
    if constexpr (std::is_integral_v<acc>) {
      out[o] = a;
    } else {
      out[o] = static_cast<T>(divide ? a / divisor : a);
    }
  }
};

template <class A>
__device__ inline A lowest_of() {
  if constexpr (std::numeric_limits<A>::has_infinity) {
    return -dinf<A>();
  } else {
    return std::numeric_limits<A>::lowest();
  }
}
template <class A>
__device__ inline A highest_of() {
  if constexpr (std::numeric_limits<A>::has_infinity) {
    return dinf<A>();
  } else {
    return std::numeric_limits<A>::max();
  }
}

// amax/amin: a NaN, once seen, wins.
template <class T, bool kMax>
struct ExtremeOp {
  using acc = acc_t<T>;
  T* out;
  __device__ acc identity() const { return kMax ? lowest_of<acc>() : highest_of<acc>(); }
  __device__ acc combine(acc a, acc b) const {
    if (dnan(a)) return a;
    if (dnan(b)) return b;
    if constexpr (kMax) {
      return b > a ? b : a;
    } else {
      return b < a ? b : a;
    }
  }
  __device__ acc reduce(acc a, T v, int64_t) const { return combine(a, static_cast<acc>(v)); }
  __device__ void write(int64_t o, acc a) const { out[o] = static_cast<T>(a); }
};

template <class A>
struct ValueIndex {
  A v;
  int64_t i;
};

// max/min with indices: the first occurrence wins ties, and the first NaN wins everything, so the
// result does not depend on the order partials are combined in.
template <class T, bool kMax>
struct ArgOp {
  using A = acc_t<T>;
  using acc = ValueIndex<A>;
  T* values;  // may be null
  int64_t* indices;
  __device__ acc identity() const {
    return {kMax ? lowest_of<A>() : highest_of<A>(), std::numeric_limits<int64_t>::max()};
  }
  __device__ acc combine(acc a, acc b) const {
    const bool an = dnan(a.v), bn = dnan(b.v);
    if (an || bn) {
      if (an && bn) return b.i < a.i ? b : a;
      return an ? a : b;
    }
    if (kMax ? b.v > a.v : b.v < a.v) return b;
    if (b.v == a.v && b.i < a.i) return b;
    return a;
  }
  __device__ acc reduce(acc a, T v, int64_t k) const { return combine(a, acc{static_cast<A>(v), k}); }
  __device__ void write(int64_t o, acc a) const {
    if (values) values[o] = static_cast<T>(a.v);
    indices[o] = a.i;
  }
};

template <class A>
struct Welford {
  A n, mean, m2;
};

// var/std: Welford per thread, Chan's formula to combine (no E[x^2] - E[x]^2 cancellation).
template <class T>
struct VarOp {
  using A = acc_t<T>;
  using acc = Welford<A>;
  T* out;
  A denom;
  bool take_sqrt;
  __device__ acc identity() const { return {A(0), A(0), A(0)}; }
  __device__ acc reduce(acc a, T v, int64_t) const {
    const A x = static_cast<A>(v);
    a.n += A(1);
    const A d = x - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (x - a.mean);
    return a;
  }
  __device__ acc combine(acc a, acc b) const {
    if (a.n == A(0)) return b;
    if (b.n == A(0)) return a;
    const A n = a.n + b.n;
    const A d = b.mean - a.mean;
    const A wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
  }
  __device__ void write(int64_t o, acc a) const {
    const A v = a.m2 / denom;
    out[o] = static_cast<T>(take_sqrt ? dsqrt(v) : v);
  }
};

template <class A>
struct MaxSum {
  A m, s;
};

// logsumexp: a running (max, sum of exp(x - max)); an infinite or NaN max is the answer itself.
template <class T>
struct LogSumExpOp {
  using A = acc_t<T>;
  using acc = MaxSum<A>;
  T* out;
  __device__ acc identity() const { return {-dinf<A>(), A(0)}; }
  __device__ acc reduce(acc a, T v, int64_t) const {
    const A x = static_cast<A>(v);
    if (dnan(a.m)) return a;
    if (dnan(x)) return {x, A(0)};
    if (x == -dinf<A>()) return a;
    if (x > a.m) return {x, a.s * dexp(a.m - x) + A(1)};
    return {a.m, a.s + dexp(x - a.m)};
  }
  __device__ acc combine(acc a, acc b) const {
    if (dnan(a.m)) return a;
    if (dnan(b.m)) return b;
    if (a.m == -dinf<A>()) return b;
    if (b.m == -dinf<A>()) return a;
    if (a.m < b.m) {
      const acc t = a;
      a = b;
      b = t;
    }
    return {a.m, a.s + b.s * dexp(b.m - a.m)};
  }
  __device__ void write(int64_t o, acc a) const {
    const bool finite = !dnan(a.m) && a.m != dinf<A>() && a.m != -dinf<A>();
    out[o] = static_cast<T>(finite ? a.m + dlog(a.s) : a.m);
  }
};

template <class T>
struct NormOp {
  using A = acc_t<T>;
  using acc = A;
  T* out;
  __device__ acc identity() const { return A(0); }
  __device__ acc reduce(acc a, T v, int64_t) const {
    const A x = static_cast<A>(v);
    return a + x * x;
  }
  __device__ acc combine(acc a, acc b) const { return a + b; }
  __device__ void write(int64_t o, acc a) const { out[o] = static_cast<T>(dsqrt(a)); }
};

// ---- the kernels ----

template <class T, class Op>
__global__ void __launch_bounds__(kBlockThreads) reduce_kernel(const T* __restrict__ x, Layout L, Op op,
                                                               typename Op::acc* __restrict__ partial) {
  using Acc = typename Op::acc;
  __shared__ Acc sm[kBlockThreads];
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  int64_t o;
  int k0, kstep;
  if (L.x_on_k) {
    o = int64_t(blockIdx.x) * by + ty;
    k0 = tx;
    kstep = bx;
  } else {
    o = int64_t(blockIdx.x) * bx + tx;
    k0 = ty;
    kstep = by;
  }
  const int64_t kbeg = int64_t(blockIdx.y) * L.k_per_split;
  const int64_t kend = min(L.K, kbeg + L.k_per_split);
  Acc acc = op.identity();
  if (o < L.M) {
    const T* base = x + L.outer.offset(o);
    if (L.inner.n <= 1) {
      const int64_t s = L.inner.n == 1 ? L.inner.stride[0] : 0;
      for (int64_t k = kbeg + k0; k < kend; k += kstep) acc = op.reduce(acc, base[k * s], k);
    } else {
      for (int64_t k = kbeg + k0; k < kend; k += kstep) acc = op.reduce(acc, base[L.inner.offset(k)], k);
    }
  }
  const int tid = ty * bx + tx;
  sm[tid] = acc;
  __syncthreads();
  if (L.x_on_k) {
    for (int s = bx / 2; s > 0; s >>= 1) {
      if (tx < s) sm[tid] = op.combine(sm[tid], sm[tid + s]);
      __syncthreads();
    }
  } else {
    for (int s = by / 2; s > 0; s >>= 1) {
      if (ty < s) sm[tid] = op.combine(sm[tid], sm[tid + s * bx]);
      __syncthreads();
    }
  }
  const bool leader = L.x_on_k ? tx == 0 : ty == 0;
  if (leader && o < L.M) {
    if (L.splits == 1) {
      op.write(o, sm[tid]);
    } else {
      partial[int64_t(blockIdx.y) * L.M + o] = sm[tid];
    }
  }
}

// Combines the splits of each output in split order.
template <class Op>
__global__ void finish_kernel(const typename Op::acc* __restrict__ partial, int64_t M, int splits, Op op) {
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < M; o += int64_t(gridDim.x) * blockDim.x) {
    typename Op::acc a = partial[o];
    for (int s = 1; s < splits; ++s) a = op.combine(a, partial[int64_t(s) * M + o]);
    op.write(o, a);
  }
}

bool make_layout(const ReducePlan& pl, Layout& L) {
  if (!make_dims(pl.outer_sizes, pl.outer_strides, L.outer)) return false;
  if (!make_dims(pl.inner_sizes, pl.inner_strides, L.inner)) return false;
  L.M = pl.out_numel;
  L.K = pl.count;
  return true;
}

template <class T, class Op>
void launch_reduce(const Tensor& a_in, const ReducePlan& pl_in, const Op& op, const char* name) {
  if (pl_in.out_numel == 0) return;
  Tensor a = a_in;
  ReducePlan pl = pl_in;
  Layout L;
  if (!make_layout(pl, L)) {
    // Too many strided dims to index directly: a contiguous copy coalesces them.
    a = detail::materialize(a_in, name);
    pl = detail::replan(a, pl_in);
    TANDEM_CHECK(make_layout(pl, L), "[{}] cannot reduce a tensor of shape {} on CUDA: more than {} separate dims",
                 name, a.shape(), kMaxDims);
  }
  const bool inner_fast = L.inner.n > 0 && L.inner.stride[L.inner.n - 1] == 1;
  const bool outer_fast = L.outer.n > 0 && L.outer.stride[L.outer.n - 1] == 1;
  L.x_on_k = inner_fast || !outer_fast;
  int bx = 32, by;
  if (L.x_on_k) {
    while (bx < kBlockThreads && int64_t(bx) * 16 < L.K) bx *= 2;
    by = kBlockThreads / bx;
  } else {
    while (bx > 1 && bx / 2 >= L.M) bx /= 2;
    by = kBlockThreads / bx;
  }
  const int64_t per_block = L.x_on_k ? by : bx;
  const int64_t k_threads = L.x_on_k ? bx : by;
  const int64_t blocks_x = (L.M + per_block - 1) / per_block;
  // Enough blocks to fill the GPU, at least 64 elements per thread per split; the split count
  // depends only on the shape, so the summation order is fixed.
  constexpr int64_t kTargetBlocks = 1024;
  int64_t splits = 1;
  if (blocks_x < kTargetBlocks && L.K > k_threads * 64) {
    splits = std::min<int64_t>((kTargetBlocks + blocks_x - 1) / blocks_x, (L.K + k_threads * 64 - 1) / (k_threads * 64));
    splits = std::min<int64_t>(splits, 65535);
  }
  L.k_per_split = std::max<int64_t>(1, (L.K + splits - 1) / splits);
  L.splits = static_cast<int>(std::max<int64_t>(1, (L.K + L.k_per_split - 1) / L.k_per_split));
  TANDEM_CHECK(blocks_x < (int64_t{1} << 31), "[{}] too many outputs for one CUDA launch ({})", name, L.M);

  using Acc = typename Op::acc;
  DeviceGuard guard(a.device());
  cudaStream_t stream = current_stream(a.device());
  Tensor scratch;
  Acc* partial = nullptr;
  if (L.splits > 1) {
    const int64_t bytes = int64_t(L.splits) * L.M * int64_t(sizeof(Acc));
    scratch = make_empty(Shape{(bytes + 7) / 8}, i64, a.device(), name);
    partial = static_cast<Acc*>(scratch.data_ptr());
  }
  const T* x = static_cast<const T*>(a.data_ptr());
  reduce_kernel<T, Op><<<dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(L.splits)), dim3(bx, by), 0,
                         stream>>>(x, L, op, partial);
  TANDEM_CUDA_CHECK_LAUNCH("reduce_kernel");
  if (L.splits > 1) {
    finish_kernel<Op><<<blocks_for(L.M), kBlockThreads, 0, stream>>>(partial, L.M, L.splits, op);
    TANDEM_CUDA_CHECK_LAUNCH("reduce finish_kernel");
  }
}

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// ---- elementwise backward steps ----

constexpr int kMaxPwDims = 16;

// Up to three operands broadcast over one shape; offsets in elements.
struct Bcast3 {
  int n = 0;
  int64_t size[kMaxPwDims];
  int64_t stride[3][kMaxPwDims];
  __device__ void offsets(int64_t i, int64_t& o0, int64_t& o1, int64_t& o2) const {
    o0 = o1 = o2 = 0;
    for (int d = n - 1; d >= 0; --d) {
      const int64_t q = i / size[d];
      const int64_t c = i - q * size[d];
      o0 += c * stride[0][d];
      o1 += c * stride[1][d];
      o2 += c * stride[2][d];
      i = q;
    }
  }
};

Bcast3 make_bcast(const Shape& shape, const std::array<Strides, 3>& st, const char* op) {
  Bcast3 b;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (b.n > 0) {
      bool merge = true;
      for (int j = 0; j < 3; ++j) merge = merge && b.stride[j][b.n - 1] == st[j][i] * shape[i];
      if (merge) {
        b.size[b.n - 1] *= shape[i];
        for (int j = 0; j < 3; ++j) b.stride[j][b.n - 1] = st[j][i];
        continue;
      }
    }
    TANDEM_CHECK(b.n < kMaxPwDims, "[{}] a tensor of shape {} has too many dims for the CUDA kernel (at most {})", op,
                 shape, kMaxPwDims);
    b.size[b.n] = shape[i];
    for (int j = 0; j < 3; ++j) b.stride[j][b.n] = st[j][i];
    ++b.n;
  }
  return b;
}

template <class T>
__global__ void pointwise_grad_kernel(ReduceGradOp op, T* __restrict__ out, const T* in0, const T* in1, const T* in2,
                                      Bcast3 b, int64_t n, acc_t<T> p) {
  using A = acc_t<T>;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t o0, o1, o2;
    b.offsets(i, o0, o1, o2);
    const A x0 = in0 ? static_cast<A>(in0[o0]) : A(0);
    const A x1 = in1 ? static_cast<A>(in1[o1]) : A(0);
    const A x2 = in2 ? static_cast<A>(in2[o2]) : A(0);
    A r;
    switch (op) {
      case ReduceGradOp::scale: r = x0 * p; break;
      case ReduceGradOp::extreme_mask: r = (x0 == x1 || (dnan(x0) && dnan(x1))) ? A(1) : A(0); break;
      case ReduceGradOp::extreme_split: r = x0 != A(0) ? x1 / x2 : A(0); break;
      case ReduceGradOp::var_factor: r = x0 * A(2) / p; break;
      case ReduceGradOp::std_factor: r = x1 == A(0) ? A(0) : x0 / (p * x1); break;  // std 0: constant slice
      case ReduceGradOp::center_scale: r = x2 * (x0 - x1); break;
      case ReduceGradOp::logsumexp: r = x2 * dexp(x0 - x1); break;
      case ReduceGradOp::norm: r = x1 == A(0) ? A(0) : x2 * x0 / x1; break;
      default: r = A(0); break;
    }
    out[i] = static_cast<T>(r);
  }
}

template <class T>
__global__ void index_grad_kernel(T* __restrict__ out, const T* __restrict__ g, const int64_t* __restrict__ idx,
                                  Bcast3 b, int64_t n, int64_t dim_stride) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oo, og, oi;
    b.offsets(i, oo, og, oi);
    out[oo + idx[oi] * dim_stride] = g[og];
  }
}

class CudaReduceKernels final : public detail::ReduceDeviceKernels {
 public:
  void reduce(ReduceOp op, const Tensor& a, const ReducePlan& pl, const Tensor& out, int64_t correction) override {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean: {
        const bool mean = op == ReduceOp::mean;
        const char* name = mean ? "mean" : "sum";
        TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
          using T = scalar_t;
          SumOp<T> o{ptr<sum_out_t<T>>(out), static_cast<sum_acc_t<T>>(mean ? pl.count : 1), mean};
          launch_reduce<T>(a, pl, o, name);
        });
        return;
      }
      case ReduceOp::amax:
      case ReduceOp::amin: {
        const char* name = op == ReduceOp::amax ? "amax" : "amin";
        TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
          using T = scalar_t;
          if (op == ReduceOp::amax) {
            launch_reduce<T>(a, pl, ExtremeOp<T, true>{ptr<T>(out)}, name);
          } else {
            launch_reduce<T>(a, pl, ExtremeOp<T, false>{ptr<T>(out)}, name);
          }
        });
        return;
      }
      case ReduceOp::var:
      case ReduceOp::std: {
        const bool take_sqrt = op == ReduceOp::std;
        const char* name = take_sqrt ? "std" : "var";
        TANDEM_DISPATCH_FLOATING(a.dtype(), name, [&] {
          using T = scalar_t;
          const auto denom = static_cast<acc_t<T>>(pl.var_denominator(correction));
          launch_reduce<T>(a, pl, VarOp<T>{ptr<T>(out), denom, take_sqrt}, name);
        });
        return;
      }
      case ReduceOp::logsumexp:
        TANDEM_DISPATCH_FLOATING(a.dtype(), "logsumexp", [&] {
          using T = scalar_t;
          launch_reduce<T>(a, pl, LogSumExpOp<T>{ptr<T>(out)}, "logsumexp");
        });
        return;
      case ReduceOp::norm:
        TANDEM_DISPATCH_FLOATING(a.dtype(), "norm", [&] {
          using T = scalar_t;
          launch_reduce<T>(a, pl, NormOp<T>{ptr<T>(out)}, "norm");
        });
        return;
    }
    fail("[reduce] unknown CUDA reduction {}", static_cast<int>(op));
  }

  void extreme_with_index(const Tensor& a, const ReducePlan& pl, Extreme which, const Tensor& values,
                          const Tensor& indices) override {
    const char* name = which == Extreme::max ? "max" : "min";
    TANDEM_DISPATCH_ALL(a.dtype(), name, [&] {
      using T = scalar_t;
      if (which == Extreme::max) {
        launch_reduce<T>(a, pl, ArgOp<T, true>{ptr<T>(values), ptr<int64_t>(indices)}, name);
      } else {
        launch_reduce<T>(a, pl, ArgOp<T, false>{ptr<T>(values), ptr<int64_t>(indices)}, name);
      }
    });
  }

  void pointwise_grad(ReduceGradOp op, const Tensor& out, const Tensor& in0, const Tensor& in1, const Tensor& in2,
                      double p) override {
    const char* name = "reduce_backward";
    const int64_t n = out.numel();
    if (n == 0) return;
    // The kernel writes element i at out[i]: core hands it a fresh dense output.
    TANDEM_CHECK(out.is_contiguous(), "[{}] internal: the output (shape {}, strides {}) must be contiguous", name,
                 out.shape(), out.strides());
    std::array<Strides, 3> st;
    const Tensor* ins[3] = {&in0, &in1, &in2};
    for (int j = 0; j < 3; ++j) {
      if (ins[j]->defined()) {
        TANDEM_CHECK(ins[j]->dtype() == out.dtype(), "[{}] internal: operand dtype {} differs from {}", name,
                     ins[j]->dtype(), out.dtype());
        st[j] = broadcast_strides(*ins[j], out.shape());
      } else {
        st[j] = Strides(out.shape().size(), 0);
      }
    }
    const Bcast3 b = make_bcast(out.shape(), st, name);
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    TANDEM_DISPATCH_FLOATING(out.dtype(), name, [&] {
      using T = scalar_t;
      pointwise_grad_kernel<T><<<blocks_for(n, 4), kBlockThreads, 0, stream>>>(
          op, ptr<T>(out), ptr<const T>(in0), ptr<const T>(in1), ptr<const T>(in2), b, n, static_cast<acc_t<T>>(p));
      TANDEM_CUDA_CHECK_LAUNCH("pointwise_grad_kernel");
    });
  }

  void index_grad(const Tensor& out, const Tensor& out_keep, const Tensor& g_keep, const Tensor& index_keep,
                  int64_t dim_stride) override {
    const char* name = "max_backward";
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    if (out.numel() == 0) return;
    TANDEM_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream));  // zero bits are 0.0
    const Shape& ks = out_keep.shape();
    const int64_t n = out_keep.numel();
    if (n == 0) return;
    std::array<Strides, 3> st = {out_keep.strides(), broadcast_strides(g_keep, ks), broadcast_strides(index_keep, ks)};
    const Bcast3 b = make_bcast(ks, st, name);
    TANDEM_DISPATCH_FLOATING(out.dtype(), name, [&] {
      using T = scalar_t;
      index_grad_kernel<T><<<blocks_for(n), kBlockThreads, 0, stream>>>(ptr<T>(out), ptr<const T>(g_keep),
                                                                         ptr<const int64_t>(index_keep), b, n,
                                                                         dim_stride);
      TANDEM_CUDA_CHECK_LAUNCH("index_grad_kernel");
    });
  }
};

}  // namespace

void install_reduce_kernels() {
  static CudaReduceKernels kernels;
  register_device_kernels<detail::ReduceDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
