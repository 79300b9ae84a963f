// CUDA kernel of topk (core/detail/topk.h). Every element of a's rows (the positions of the other
// dims, each a run along `dim`) gets the CPU's rank key (detail::topk_key) and its index; CUB's
// stable segmented sort orders each row by key, equal keys keeping the lower index first: the
// CPU's (key, index) order, so both select and order the same elements, ties and NaN included.
// The first k of a row are the result; with sorted=false their indices are sorted once more, into
// the CPU's index order. Values are copied from a by index (the element itself, NaN payloads and
// all). A whole-row sort is O(n) work per row with no limit on n or on the number of rows: a GPT
// sampler's [batch, 50257] logits are one segmented sort.
#include <cub/device/device_segmented_sort.cuh>

#include "core/detail/kernel_tables.h"
#include "core/detail/topk.h"
#include "cuda/detail/launch.h"
#include "cuda/detail/strided.cuh"

namespace tandem::cuda {

namespace {

using namespace geom;

// The dims of a other than `dim` (the rows, in row-major order; those of one element left out,
// whose strides may be anything) and the strides of a and of the (contiguous) outputs over them.
struct Rows {
  Dims dims;
  ElemStrides in, out;
};

Rows rows_of(const Tensor& a, const Tensor& out, int64_t dim, const char* op) {
  Shape sizes;
  Strides in, o;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d == dim || a.size(d) == 1) continue;
    sizes.push_back(a.size(d));
    in.push_back(a.stride(d));
    o.push_back(out.stride(d));
  }
  Rows r;
  r.dims = dims_of(sizes, op);
  r.in = strides_of(in);
  r.out = strides_of(o);
  return r;
}

// keys[e], index[e] for element j of row r, e = r * n + j.
template <class T, class K>
__global__ void topk_keys_kernel(const T* a, Rows rows, int64_t step, int64_t n, int64_t total, bool largest, K* keys,
                                 int64_t* index) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / n, j = e % n;
    keys[e] = detail::topk_key(a[offset_of(r, rows.dims, rows.in) + j * step], largest);
    index[e] = j;
  }
}

// offsets[s] = s * size for s in [0, segments]: where each row's run starts (and the last ends).
__global__ void segment_offsets_kernel(int64_t* offsets, int64_t segments, int64_t size) {
  for (int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; s <= segments; s += int64_t(gridDim.x) * blockDim.x)
    offsets[s] = s * size;
}

// out[r * k + t] = sorted[r * n + t] for t < k: the first k of each sorted row, compacted.
__global__ void first_k_kernel(const int64_t* sorted, int64_t n, int64_t k, int64_t total, int64_t* out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = sorted[(e / k) * n + e % k];
}

// Result t of row r: the element of a at index j = chosen[r * chosen_stride + t].
template <class T>
__global__ void topk_write_kernel(const T* a, Rows rows, int64_t in_step, int64_t out_step, const int64_t* chosen,
                                  int64_t chosen_stride, int64_t k, int64_t total, T* values, int64_t* indices) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / k, t = e % k;
    const int64_t j = chosen[r * chosen_stride + t];
    const int64_t o = offset_of(r, rows.dims, rows.out) + t * out_step;
    values[o] = a[offset_of(r, rows.dims, rows.in) + j * in_step];
    indices[o] = j;
  }
}

Tensor segment_offsets(int64_t segments, int64_t size, Device device, cudaStream_t stream, const char* op) {
  Tensor offsets = make_empty(Shape{segments + 1}, i64, device, op);
  segment_offsets_kernel<<<blocks_for(segments + 1), kBlockThreads, 0, stream>>>(
      static_cast<int64_t*>(offsets.data_ptr()), segments, size);
  TANDEM_CUDA_CHECK_LAUNCH("segment_offsets_kernel");
  return offsets;
}

// Scratch for CUB from the caching allocator, on the stream.
Tensor scratch(size_t bytes, Device device, const char* op) {
  return make_empty(Shape{static_cast<int64_t>((bytes + 7) / 8) + 1}, i64, device, op);
}

class CudaTopkKernels final : public detail::TopkDeviceKernels {
 public:
  void topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
            const Tensor& indices) override {
    const char* op = "topk";
    const Device device = a.device();
    DeviceGuard guard(device);
    cudaStream_t stream = current_stream(device);
    const int64_t n = a.size(dim), rows = a.numel() / n, total = rows * n, picked = rows * k;
    const Rows geometry = rows_of(a, values, dim, op);
    const int64_t in_step = dim_step_bytes(a, dim) / static_cast<int64_t>(a.element_size());
    const int64_t out_step = dim_step_bytes(values, dim) / static_cast<int64_t>(values.element_size());
    const Tensor offsets = segment_offsets(rows, n, device, stream, op);
    const auto* row_starts = static_cast<const int64_t*>(offsets.data_ptr());
    Tensor index_in = make_empty(Shape{total}, i64, device, op);
    Tensor index_out = make_empty(Shape{total}, i64, device, op);
    TANDEM_DISPATCH_NUMERIC(a.dtype(), op, [&] {
      using T = scalar_t;
      using K = detail::topk_key_t<T>;
      const Dtype key_dtype = sizeof(K) == 8 ? i64 : i32;  // storage for the unsigned keys
      Tensor keys_in = make_empty(Shape{total}, key_dtype, device, op);
      Tensor keys_out = make_empty(Shape{total}, key_dtype, device, op);
      auto* kin = static_cast<K*>(keys_in.data_ptr());
      auto* kout = static_cast<K*>(keys_out.data_ptr());
      auto* iin = static_cast<int64_t*>(index_in.data_ptr());
      auto* iout = static_cast<int64_t*>(index_out.data_ptr());
      const auto* x = static_cast<const T*>(a.data_ptr());
      topk_keys_kernel<T, K><<<blocks_for(total), kBlockThreads, 0, stream>>>(x, geometry, in_step, n, total, largest,
                                                                               kin, iin);
      TANDEM_CUDA_CHECK_LAUNCH("topk_keys_kernel");
      size_t bytes = 0;
      TANDEM_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(nullptr, bytes, kin, kout, iin, iout, total, rows,
                                                                  row_starts, row_starts + 1, stream));
      Tensor temp = scratch(bytes, device, op);
      TANDEM_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(temp.data_ptr(), bytes, kin, kout, iin, iout, total,
                                                                  rows, row_starts, row_starts + 1, stream));
      const int64_t* chosen = iout;
      int64_t chosen_stride = n;
      Tensor first, in_order, k_offsets;
      if (!sorted && k > 1) {
        // The selected indices of each row, sorted: the CPU's index order (they are distinct).
        first = make_empty(Shape{picked}, i64, device, op);
        in_order = make_empty(Shape{picked}, i64, device, op);
        first_k_kernel<<<blocks_for(picked), kBlockThreads, 0, stream>>>(iout, n, k, picked,
                                                                          static_cast<int64_t*>(first.data_ptr()));
        TANDEM_CUDA_CHECK_LAUNCH("first_k_kernel");
        k_offsets = segment_offsets(rows, k, device, stream, op);
        const auto* k_starts = static_cast<const int64_t*>(k_offsets.data_ptr());
        const auto* fin = static_cast<const int64_t*>(first.data_ptr());
        auto* fout = static_cast<int64_t*>(in_order.data_ptr());
        bytes = 0;
        TANDEM_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(nullptr, bytes, fin, fout, picked, rows, k_starts,
                                                             k_starts + 1, stream));
        Tensor temp2 = scratch(bytes, device, op);
        TANDEM_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeys(temp2.data_ptr(), bytes, fin, fout, picked, rows, k_starts,
                                                             k_starts + 1, stream));
        chosen = fout;
        chosen_stride = k;
      }
      topk_write_kernel<T><<<blocks_for(picked), kBlockThreads, 0, stream>>>(
          x, geometry, in_step, out_step, chosen, chosen_stride, k, picked, static_cast<T*>(values.data_ptr()),
          static_cast<int64_t*>(indices.data_ptr()));
      TANDEM_CUDA_CHECK_LAUNCH("topk_write_kernel");
    });
  }
};

}  // namespace

void install_topk_kernels() {
  static CudaTopkKernels table;
  register_device_kernels<detail::TopkDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
