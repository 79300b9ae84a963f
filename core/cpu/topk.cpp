#include "core/detail/topk.h"

#include <algorithm>
#include <vector>

#include "core/detail/kernel_tables.h"

namespace tandem::detail {

namespace {

// A 0-dim tensor as the 1-D view of its one element (topk treats it as a dim of size 1).
Tensor as_1d(const Tensor& t) { return t.dim() == 0 ? make_view(t, Shape{1}, Strides{1}, t.storage_offset()) : t; }

// Row by row along `dim` (a has at least one dim and elements; k >= 1): rank the row's elements by
// (key, index), keep the first k, put them in index order when !sorted, and copy them out.
template <class T>
void topk_cpu(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
              const Tensor& indices) {
  using Key = topk_key_t<T>;
  const int64_t nd = a.dim();
  const int64_t n = a.size(dim);
  const int64_t in_step = dim_step_bytes(a, dim) / static_cast<int64_t>(sizeof(T));
  const int64_t out_step = dim_step_bytes(values, dim) / static_cast<int64_t>(sizeof(T));  // indices: the same
  const T* in = static_cast<const T*>(a.data_ptr());
  T* vo = static_cast<T*>(values.data_ptr());
  int64_t* io = static_cast<int64_t*>(indices.data_ptr());
  // The rows: every position of the dims other than `dim`, walked as an odometer over those of
  // more than one element (a size-1 dim's stride may be anything: it never moves the walk).
  std::vector<int64_t> sizes, in_strides, out_strides;
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim || a.size(d) == 1) continue;
    sizes.push_back(a.size(d));
    in_strides.push_back(a.stride(d));
    out_strides.push_back(values.stride(d));
  }
  const int64_t rows = a.numel() / n;
  std::vector<int64_t> counter(sizes.size(), 0);
  std::vector<std::pair<Key, int64_t>> ranked(static_cast<size_t>(n));
  int64_t in_row = 0, out_row = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) ranked[j] = {topk_key(in[in_row + j * in_step], largest), j};
    // (key, index) pairs are distinct, so any selection algorithm gives the same k in the same
    // order: partial_sort for few of many, nth_element and a sort of the rest otherwise.
    if (k == n) {
      std::sort(ranked.begin(), ranked.end());
    } else if (k <= n / 8) {
      std::partial_sort(ranked.begin(), ranked.begin() + k, ranked.end());
    } else {
      std::nth_element(ranked.begin(), ranked.begin() + k, ranked.end());
      std::sort(ranked.begin(), ranked.begin() + k);
    }
    if (!sorted) {
      std::sort(ranked.begin(), ranked.begin() + k,
                [](const std::pair<Key, int64_t>& x, const std::pair<Key, int64_t>& y) { return x.second < y.second; });
    }
    for (int64_t t = 0; t < k; ++t) {
      const int64_t j = ranked[t].second;
      vo[out_row + t * out_step] = in[in_row + j * in_step];  // the element itself: NaN payloads survive
      io[out_row + t * out_step] = j;
    }
    for (size_t d = sizes.size(); d-- > 0;) {
      in_row += in_strides[d];
      out_row += out_strides[d];
      if (++counter[d] < sizes[d]) break;
      in_row -= in_strides[d] * sizes[d];
      out_row -= out_strides[d] * sizes[d];
      counter[d] = 0;
    }
  }
}

}  // namespace

std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim, bool largest, bool sorted) {
  const char* op = "topk";
  TANDEM_CHECK(a.defined(), "[topk] got an undefined tensor");
  TANDEM_CHECK(a.dtype() != boolean, "[topk] expected a numeric dtype, got bool (shape {})", a.shape());
  const int64_t d = wrap_dim(dim, a.dim(), op);
  const int64_t n = a.dim() == 0 ? 1 : a.size(d);
  TANDEM_CHECK(k >= 0 && k <= n,
               "[topk] k ({}) is out of range for dim {} of size {} (input shape {}); k must be in [0, {}]", k, dim, n,
               a.shape(), n);
  Shape out_shape = a.shape();
  if (a.dim() > 0) out_shape[d] = k;
  Tensor values = make_empty(out_shape, a.dtype(), a.device(), op);
  Tensor indices = make_empty(out_shape, i64, a.device(), op);
  // A 0-dim input with k = 0 still gives its element: its result has no room for fewer (PyTorch's rule).
  const int64_t kk = a.dim() == 0 ? 1 : k;
  if (a.numel() == 0 || kk == 0) return {values, indices};
  const Tensor a1 = as_1d(a), v1 = as_1d(values), i1 = as_1d(indices);
  if (!a.is_cpu()) [[unlikely]] {
    device_kernels<TopkDeviceKernels>(a.device(), op).topk(a1, kk, d, largest, sorted, v1, i1);
    return {values, indices};
  }
  TANDEM_DISPATCH_NUMERIC(a.dtype(), op, [&] { topk_cpu<scalar_t>(a1, kk, d, largest, sorted, v1, i1); });
  return {values, indices};
}

}  // namespace tandem::detail
