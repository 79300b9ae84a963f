// CUDA kernels of the index family (core/detail/index.h): index_select (and embedding), gather,
// masked_fill, the range check of check_index_range (nll_loss's targets), and the deterministic
// scatter-adds behind scatter_add, index_select's backward and embedding's backward.
//
// Copies and selects move element bits (one kernel per element size, not per dtype). The
// scatter-adds sort (destination, source position) pairs with CUB's stable radix sort and let
// one thread per destination sum its sources in source order: no float atomics, so results are
// deterministic run to run and, for f32/f64, bit-identical to the CPU's in-order sums.
//
// Index bounds: kernels skip an out-of-range index (no stray memory access) and, when asked to
// check, record it in the device's deferred error (cuda/detail/device_error.h), which the host raises at
// its next synchronisation: no op here syncs the host. The forward ops check; the backward
// kernels reuse indices their forward checked.
#include <cub/device/device_radix_sort.cuh>

#include <cstring>

#include "core/detail/kernel_tables.h"
#include "core/detail/index.h"
#include "core/detail/iter.h"
#include "cuda/detail/device_error.h"
#include "cuda/detail/launch.h"
#include "cuda/detail/strided.cuh"

namespace tandem::cuda {

namespace {

using detail::dispatch_index;  // core/detail/index.h: the index dtype of a kernel
using namespace geom;

// ---------------------------------------------------------------- index_select

// Generic: out (any strides) over its shape; the coordinate along dim goes through index.
template <class E, class I>
__global__ void index_select_kernel(E* out, const E* src, Dims dims, ElemStrides out_st, ElemStrides src_st, int dim,
                                    const I* index, int64_t index_stride, int64_t limit, int64_t n,
                                    ErrorSink sink) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = e, oo = 0, so = 0, kpos = 0;
    for (int d = dims.nd - 1; d >= 0; --d) {
      const int64_t c = rem % dims.size[d];
      rem /= dims.size[d];
      oo += c * out_st.s[d];
      if (d == dim) {
        kpos = c;
      } else {
        so += c * src_st.s[d];
      }
    }
    const int64_t k = static_cast<int64_t>(index[kpos * index_stride]);
    if (k < 0 || k >= limit) {
      report_error(sink, k, kpos);
      continue;
    }
    out[oo] = src[so + k * src_st.s[dim]];
  }
}

// Contiguous src [outer, limit, inner] and out [outer, K, inner]: one block per (o, k) row, its
// threads over the row (embedding lookups: coalesced row copies, no divisions per element).
template <class E, class I>
__global__ void index_select_rows_kernel(E* out, const E* src, int64_t outer, int64_t K, int64_t limit, int64_t inner,
                                         const I* index, int64_t index_stride, ErrorSink sink) {
  for (int64_t row = blockIdx.x; row < outer * K; row += gridDim.x) {
    const int64_t o = row / K, kpos = row % K;
    const int64_t k = static_cast<int64_t>(index[kpos * index_stride]);
    if (k < 0 || k >= limit) {
      if (threadIdx.x == 0) report_error(sink, k, kpos);
      continue;
    }
    const E* s = src + (o * limit + k) * inner;
    E* d = out + row * inner;
    for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) d[c] = s[c];
  }
}

// ---------------------------------------------------------------- gather

template <class E, class I>
__global__ void gather_kernel(E* out, const E* a, const I* index, Dims dims, ElemStrides out_st, ElemStrides a_st,
                              ElemStrides idx_st, int dim, int64_t limit, int64_t n, ErrorSink sink) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = e, oo = 0, ao = 0, io = 0;
    for (int d = dims.nd - 1; d >= 0; --d) {
      const int64_t c = rem % dims.size[d];
      rem /= dims.size[d];
      oo += c * out_st.s[d];
      io += c * idx_st.s[d];
      if (d != dim) ao += c * a_st.s[d];
    }
    const int64_t k = static_cast<int64_t>(index[io]);
    if (k < 0 || k >= limit) {
      report_error(sink, k, e);
      continue;
    }
    out[oo] = a[ao + k * a_st.s[dim]];
  }
}

// ---------------------------------------------------------------- check_range

// Records the first value (lowest logical position) outside [0, limit) other than `allowed`.
template <class I>
__global__ void check_range_kernel(const I* index, Dims dims, ElemStrides st, int64_t limit, bool has_allowed,
                                   int64_t allowed, int64_t n, ErrorSink sink) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = static_cast<int64_t>(index[offset_of(e, dims, st)]);
    if ((k < 0 || k >= limit) && !(has_allowed && k == allowed)) report_error(sink, k, e);
  }
}

// ---------------------------------------------------------------- masked_fill

template <class E>
__global__ void masked_fill_contiguous_kernel(E* out, const E* a, const bool* mask, E value, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = mask[e] ? value : a[e];
}

template <class E>
__global__ void masked_fill_kernel(E* out, const E* a, const bool* mask, Dims dims, ElemStrides a_st, ElemStrides m_st,
                                   E value, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = e, ao = 0, mo = 0;
    for (int d = dims.nd - 1; d >= 0; --d) {
      const int64_t c = rem % dims.size[d];
      rem /= dims.size[d];
      ao += c * a_st.s[d];
      mo += c * m_st.s[d];
    }
    out[e] = mask[mo] ? value : a[ao];
  }
}

// ---------------------------------------------------------------- sorted scatter-add

// keys[k] = index[k] (the destination slice), vals[k] = k; out of range -> the sentinel `limit`.
template <class I>
__global__ void slice_keys_kernel(const I* index, int64_t index_stride, int64_t n, int64_t limit, uint64_t* keys,
                                  int64_t* vals) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(index[k * index_stride]);
    keys[k] = (v < 0 || v >= limit) ? static_cast<uint64_t>(limit) : static_cast<uint64_t>(v);
    vals[k] = k;
  }
}

// keys[p] = the element offset in contiguous `out` that position p of index scatters into,
// vals[p] = p; out of range -> the sentinel out.numel(), reported.
template <class I>
__global__ void element_keys_kernel(const I* index, Dims dims, ElemStrides idx_st, ElemStrides out_st, int dim,
                                    int64_t limit, int64_t n, uint64_t sentinel, uint64_t* keys, int64_t* vals,
                                    ErrorSink sink) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = e, io = 0, oo = 0;
    for (int d = dims.nd - 1; d >= 0; --d) {
      const int64_t c = rem % dims.size[d];
      rem /= dims.size[d];
      io += c * idx_st.s[d];
      if (d != dim) oo += c * out_st.s[d];
    }
    const int64_t k = static_cast<int64_t>(index[io]);
    vals[e] = e;
    if (k < 0 || k >= limit) {
      keys[e] = sentinel;
      report_error(sink, k, e);
      continue;
    }
    keys[e] = static_cast<uint64_t>(oo + k * out_st.s[dim]);
  }
}

// For out [outer, N, inner] and src [outer, K, inner] (contiguous) with (keys, vals) sorted by
// key: the first item j of each run of equal keys sums src slices vals[j..] into out slice key,
// in order. One thread per item, looping over outer * inner (small rows).
template <class T>
__global__ void segment_add_items_kernel(T* out, const T* src, const uint64_t* keys, const int64_t* vals, int64_t K,
                                         int64_t outer, int64_t N, int64_t inner, uint64_t sentinel) {
  using C = acc_t<T>;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < K; j += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t key = keys[j];
    if (key == sentinel || (j > 0 && keys[j - 1] == key)) continue;
    for (int64_t oc = 0; oc < outer * inner; ++oc) {
      const int64_t o = oc / inner, c = oc % inner;
      T& dst = out[(o * N + static_cast<int64_t>(key)) * inner + c];
      C acc = static_cast<C>(dst);
      for (int64_t m = j; m < K && keys[m] == key; ++m) acc = acc + static_cast<C>(src[(o * K + vals[m]) * inner + c]);
      dst = static_cast<T>(acc);
    }
  }
}

// The same with one block per item and its threads over outer * inner (embedding rows).
template <class T>
__global__ void segment_add_rows_kernel(T* out, const T* src, const uint64_t* keys, const int64_t* vals, int64_t K,
                                        int64_t outer, int64_t N, int64_t inner, uint64_t sentinel) {
  using C = acc_t<T>;
  for (int64_t j = blockIdx.x; j < K; j += gridDim.x) {
    const uint64_t key = keys[j];
    if (key == sentinel || (j > 0 && keys[j - 1] == key)) continue;
    for (int64_t oc = threadIdx.x; oc < outer * inner; oc += blockDim.x) {
      const int64_t o = oc / inner, c = oc % inner;
      T& dst = out[(o * N + static_cast<int64_t>(key)) * inner + c];
      C acc = static_cast<C>(dst);
      for (int64_t m = j; m < K && keys[m] == key; ++m) acc = acc + static_cast<C>(src[(o * K + vals[m]) * inner + c]);
      dst = static_cast<T>(acc);
    }
  }
}

int bits_for(uint64_t max_key) {
  int b = 1;
  while (b < 64 && (max_key >> b) != 0) ++b;
  return b;
}

// Sorts (keys, vals) of n items by key (stable, only the low `end_bit` bits) on the stream; returns
// the buffers that hold the result. Scratch goes through the caching allocator.
struct Sorted {
  Tensor keys, vals;
};
Sorted sort_pairs(Tensor keys_a, Tensor vals_a, int64_t n, uint64_t max_key, Device device, cudaStream_t stream,
                  const char* op) {
  Tensor keys_b = make_empty(Shape{n}, i64, device, op);
  Tensor vals_b = make_empty(Shape{n}, i64, device, op);
  cub::DoubleBuffer<uint64_t> keys(static_cast<uint64_t*>(keys_a.data_ptr()), static_cast<uint64_t*>(keys_b.data_ptr()));
  cub::DoubleBuffer<int64_t> vals(static_cast<int64_t*>(vals_a.data_ptr()), static_cast<int64_t*>(vals_b.data_ptr()));
  const int end_bit = bits_for(max_key);
  size_t bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, vals, n, 0, end_bit, stream));
  Tensor temp = make_empty(Shape{static_cast<int64_t>((bytes + 7) / 8) + 1}, i64, device, op);
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, keys, vals, n, 0, end_bit, stream));
  Sorted s;
  s.keys = keys.Current() == keys_a.data_ptr() ? keys_a : keys_b;
  s.vals = vals.Current() == vals_a.data_ptr() ? vals_a : vals_b;
  return s;
}

void segment_add(const Tensor& out, const Tensor& src, const Sorted& s, int64_t K, int64_t outer, int64_t N,
                 int64_t inner, uint64_t sentinel, cudaStream_t stream, const char* op) {
  const auto* keys = static_cast<const uint64_t*>(s.keys.data_ptr());
  const auto* vals = static_cast<const int64_t*>(s.vals.data_ptr());
  TANDEM_DISPATCH_NUMERIC(out.dtype(), op, [&] {
    auto* o = static_cast<scalar_t*>(out.data_ptr());
    const auto* x = static_cast<const scalar_t*>(src.data_ptr());
    if (outer * inner >= 32) {
      const int threads = outer * inner >= 256 ? 256 : 128;
      segment_add_rows_kernel<scalar_t><<<blocks_for(K, 1, 1), threads, 0, stream>>>(o, x, keys, vals, K, outer, N,
                                                                                      inner, sentinel);
      TANDEM_CUDA_CHECK_LAUNCH("segment_add_rows_kernel");
    } else {
      segment_add_items_kernel<scalar_t><<<blocks_for(K), kBlockThreads, 0, stream>>>(o, x, keys, vals, K, outer, N,
                                                                                       inner, sentinel);
      TANDEM_CUDA_CHECK_LAUNCH("segment_add_items_kernel");
    }
  });
}

// ---------------------------------------------------------------- the table

class CudaIndexKernels final : public detail::IndexDeviceKernels {
 public:
  void index_select(const Tensor& out, const Tensor& src, int64_t dim, const Tensor& index,
                    const detail::IndexCheck* check) override {
    const char* op = "index_select";
    const int64_t n = out.numel();
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const ErrorSink sink = error_sink(out.device().index, check);
    const int64_t K = out.size(dim), limit = src.size(dim);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= out.size(d);
    for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.size(d);
    const bool rows = out.is_contiguous() && src.is_contiguous() && inner >= 32;
    const Dims dims = dims_of(out.shape(), op);
    const ElemStrides out_st = strides_of(out.strides()), src_st = strides_of(src.strides());
    dispatch_bits(out.dtype(), [&](auto etag) {
      using E = decltype(etag);
      auto* o = static_cast<E*>(out.data_ptr());
      const auto* s = static_cast<const E*>(src.data_ptr());
      dispatch_index(index.dtype(), op, [&](auto itag) {
        using I = decltype(itag);
        const auto* ix = static_cast<const I*>(index.data_ptr());
        if (rows) {
          const int threads = inner >= 256 ? 256 : (inner >= 128 ? 128 : 64);
          index_select_rows_kernel<E, I><<<blocks_for(outer * K, 1, 1), threads, 0, stream>>>(
              o, s, outer, K, limit, inner, ix, index.stride(0), sink);
          TANDEM_CUDA_CHECK_LAUNCH("index_select_rows_kernel");
        } else {
          index_select_kernel<E, I><<<blocks_for(n), kBlockThreads, 0, stream>>>(
              o, s, dims, out_st, src_st, static_cast<int>(dim), ix, index.stride(0), limit, n, sink);
          TANDEM_CUDA_CHECK_LAUNCH("index_select_kernel");
        }
      });
    });
  }

  void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) override {
    const char* op = "index_add";
    const int64_t K = index.numel();
    if (K == 0 || out.numel() == 0) return;
    TANDEM_CHECK(out.is_contiguous() && src.is_contiguous(), "[{}] internal: non-contiguous operands", op);
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const int64_t N = out.size(dim);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= out.size(d);
    for (int64_t d = dim + 1; d < out.dim(); ++d) inner *= out.size(d);
    Tensor keys = make_empty(Shape{K}, i64, out.device(), op);
    Tensor vals = make_empty(Shape{K}, i64, out.device(), op);
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = decltype(itag);
      slice_keys_kernel<I><<<blocks_for(K), kBlockThreads, 0, stream>>>(
          static_cast<const I*>(index.data_ptr()), index.stride(0), K, N, static_cast<uint64_t*>(keys.data_ptr()),
          static_cast<int64_t*>(vals.data_ptr()));
      TANDEM_CUDA_CHECK_LAUNCH("slice_keys_kernel");
    });
    const uint64_t sentinel = static_cast<uint64_t>(N);
    const Sorted s = sort_pairs(keys, vals, K, sentinel, out.device(), stream, op);
    segment_add(out, src, s, K, outer, N, inner, sentinel, stream, op);
  }

  void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index,
              const detail::IndexCheck* check) override {
    const char* op = "gather";
    const int64_t n = index.numel();
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const ErrorSink sink = error_sink(out.device().index, check);
    const Dims dims = dims_of(index.shape(), op);
    const ElemStrides out_st = strides_of(out.strides()), a_st = strides_of(a.strides()),
                      idx_st = strides_of(index.strides());
    const int64_t limit = a.size(dim);
    dispatch_bits(out.dtype(), [&](auto etag) {
      using E = decltype(etag);
      dispatch_index(index.dtype(), op, [&](auto itag) {
        using I = decltype(itag);
        gather_kernel<E, I><<<blocks_for(n), kBlockThreads, 0, stream>>>(
            static_cast<E*>(out.data_ptr()), static_cast<const E*>(a.data_ptr()),
            static_cast<const I*>(index.data_ptr()), dims, out_st, a_st, idx_st, static_cast<int>(dim), limit, n,
            sink);
        TANDEM_CUDA_CHECK_LAUNCH("gather_kernel");
      });
    });
  }

  void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                   const detail::IndexCheck* check) override {
    const char* op = "scatter_add";
    const int64_t n = index.numel();
    if (n == 0) return;
    TANDEM_CHECK(out.is_contiguous() && src.is_contiguous(), "[{}] internal: non-contiguous operands", op);
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const ErrorSink sink = error_sink(out.device().index, check);
    Tensor keys = make_empty(Shape{n}, i64, out.device(), op);
    Tensor vals = make_empty(Shape{n}, i64, out.device(), op);
    const uint64_t sentinel = static_cast<uint64_t>(out.numel());
    const Dims dims = dims_of(index.shape(), op);
    const ElemStrides idx_st = strides_of(index.strides()), out_st = strides_of(out.strides());
    dispatch_index(index.dtype(), op, [&](auto itag) {
      using I = decltype(itag);
      element_keys_kernel<I><<<blocks_for(n), kBlockThreads, 0, stream>>>(
          static_cast<const I*>(index.data_ptr()), dims, idx_st, out_st, static_cast<int>(dim), out.size(dim), n,
          sentinel, static_cast<uint64_t*>(keys.data_ptr()), static_cast<int64_t*>(vals.data_ptr()), sink);
      TANDEM_CUDA_CHECK_LAUNCH("element_keys_kernel");
    });
    const Sorted s = sort_pairs(keys, vals, n, sentinel, out.device(), stream, op);
    segment_add(out, src, s, n, 1, out.numel(), 1, sentinel, stream, op);
  }

  void check_range(const Tensor& index, const detail::IndexCheck& check) override {
    const int64_t n = index.numel();
    if (n == 0) return;
    DeviceGuard guard(index.device());
    cudaStream_t stream = current_stream(index.device());
    const ErrorSink sink = error_sink(index.device().index, &check);
    const Dims dims = dims_of(index.shape(), check.op);
    const ElemStrides st = strides_of(index.strides());
    const bool has_allowed = check.kind == detail::IndexCheck::Kind::class_target;
    dispatch_index(index.dtype(), check.op, [&](auto itag) {
      using I = decltype(itag);
      check_range_kernel<I><<<blocks_for(n), kBlockThreads, 0, stream>>>(
          static_cast<const I*>(index.data_ptr()), dims, st, check.size, has_allowed, check.ignore_index, n, sink);
      TANDEM_CUDA_CHECK_LAUNCH("check_range_kernel");
    });
  }

  void masked_fill(const Tensor& out, const Tensor& a, const Tensor& mask, const Scalar& value) override {
    const char* op = "masked_fill";
    const int64_t n = out.numel();
    if (n == 0) return;
    DeviceGuard guard(out.device());
    cudaStream_t stream = current_stream(out.device());
    const bool contiguous = a.is_contiguous() && mask.is_contiguous() && mask.shape() == a.shape();
    const Dims dims = dims_of(a.shape(), op);
    const ElemStrides a_st = strides_of(a.strides()), m_st = strides_of(broadcast_strides(mask, a.shape()));
    const auto* m = static_cast<const bool*>(mask.data_ptr());
    TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
      // The CPU's conversion of value (through the compute type), then moved as bits.
      const scalar_t v = static_cast<scalar_t>(static_cast<acc_t<scalar_t>>(value.value));
      using E = typename Bits<sizeof(scalar_t)>::type;
      E bits;
      std::memcpy(&bits, &v, sizeof(E));
      auto* o = static_cast<E*>(out.data_ptr());
      const auto* x = static_cast<const E*>(a.data_ptr());
      if (contiguous) {
        masked_fill_contiguous_kernel<E><<<blocks_for(n), kBlockThreads, 0, stream>>>(o, x, m, bits, n);
        TANDEM_CUDA_CHECK_LAUNCH("masked_fill_contiguous_kernel");
      } else {
        masked_fill_kernel<E><<<blocks_for(n), kBlockThreads, 0, stream>>>(o, x, m, dims, a_st, m_st, bits, n);
        TANDEM_CUDA_CHECK_LAUNCH("masked_fill_kernel");
      }
    });
  }
};

}  // namespace

void install_index_kernels() {
  static CudaIndexKernels table;
  register_device_kernels<detail::IndexDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
