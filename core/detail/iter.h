// Strided iteration over N operands that share one (broadcast) shape.
//
// Every CPU elementwise kernel goes through `strided_loop`: it merges dims that are contiguous
// for all operands, then hands the kernel 1-D runs (pointers, byte strides, length), so the
// common contiguous case is one run the compiler vectorises.
#pragma once

#include <array>
#include <cstdint>

#include "core/parallel.h"
#include "core/tensor.h"

namespace tandem {

template <size_t N>
struct StridedRun {
  std::array<char*, N> ptr;
  std::array<int64_t, N> stride;  // bytes
  int64_t n;
};

// Strides of `t` viewed as `shape` (which t broadcasts to), in elements: broadcast dims get 0.
Strides broadcast_strides(const Tensor& t, const Shape& shape);

// `parallel`: the runs are split into chunks over the intra-op threads (core/parallel.h), so the
// kernel is called concurrently and must write only through its own run's pointers; callers ask
// for it only where operand 0 is the output and every output element is its own (no zero stride).
template <size_t N, class Kernel>
void strided_loop(const Shape& shape, const std::array<Strides, N>& elem_strides,
                  const std::array<char*, N>& base, const std::array<int64_t, N>& itemsizes,
                  Kernel&& kernel, bool parallel = false) {
  const size_t nd = shape.size();
  // Nothing to do when a size is 0 (the others may then multiply past int64: checked first).
  for (int64_t d : shape)
    if (d == 0) return;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // Coalesce: walk from the innermost dim outwards, merging dim i into the current one when
  // every operand's stride satisfies stride[i] == stride[cur] * size[cur].
  int64_t sizes[64];
  int64_t strides[N][64];
  int nd_c = 0;
  for (size_t k = nd; k-- > 0;) {
    if (shape[k] == 1) continue;
    if (nd_c > 0) {
      bool merge = true;
      for (size_t j = 0; j < N; ++j)
        if (elem_strides[j][k] != strides[j][nd_c - 1] * sizes[nd_c - 1]) merge = false;
      if (merge) {
        sizes[nd_c - 1] *= shape[k];
        continue;
      }
    }
    TANDEM_CHECK(nd_c < 64, "[iter] too many dims ({})", nd);
    sizes[nd_c] = shape[k];
    for (size_t j = 0; j < N; ++j) strides[j][nd_c] = elem_strides[j][k];
    ++nd_c;
  }
  if (nd_c == 0) {  // a single element
    sizes[0] = 1;
    for (size_t j = 0; j < N; ++j) strides[j][0] = 0;
    nd_c = 1;
  }
  const int64_t outer = numel / sizes[0];
  // Runs [begin, end) of the outer index: the first one's pointers from its unravelled index,
  // then the counter walk (dims 1..nd_c-1, innermost first), never stepping past the last run.
  auto runs = [&](int64_t begin, int64_t end) {
    StridedRun<N> run;
    for (size_t j = 0; j < N; ++j) run.stride[j] = strides[j][0] * itemsizes[j];
    run.n = sizes[0];
    int64_t counter[64] = {0};
    std::array<char*, N> ptr = base;
    int64_t idx = begin;
    for (int d = 1; d < nd_c; ++d) {
      counter[d] = idx % sizes[d];
      idx /= sizes[d];
      for (size_t j = 0; j < N; ++j) ptr[j] += counter[d] * strides[j][d] * itemsizes[j];
    }
    for (int64_t o = begin; o < end; ++o) {
      run.ptr = ptr;
      kernel(run);
      if (o + 1 == end) break;
      for (int d = 1; d < nd_c; ++d) {
        ++counter[d];
        for (size_t j = 0; j < N; ++j) ptr[j] += strides[j][d] * itemsizes[j];
        if (counter[d] < sizes[d]) break;
        for (size_t j = 0; j < N; ++j) ptr[j] -= strides[j][d] * itemsizes[j] * sizes[d];
        counter[d] = 0;
      }
    }
  };
  if (parallel && outer > 1) {
    parallel_for(outer, units_per_grain(sizes[0]), runs);
  } else if (parallel) {
    // One long strided run: pieces of it.
    parallel_for(sizes[0], kDefaultGrain, [&](int64_t begin, int64_t end) {
      StridedRun<N> run;
      for (size_t j = 0; j < N; ++j) {
        run.stride[j] = strides[j][0] * itemsizes[j];
        run.ptr[j] = base[j] + begin * run.stride[j];
      }
      run.n = end - begin;
      kernel(run);
    });
  } else {
    runs(0, outer);
  }
}

namespace detail {
// for_each_run and for_each_output_run: the operands' strides as `shape` sees them, then the loop.
template <size_t N, class Kernel>
void run_operands(const Shape& shape, const std::array<const Tensor*, N>& ts, Kernel&& kernel, bool parallel_output) {
  std::array<Strides, N> st;
  std::array<char*, N> base;
  std::array<int64_t, N> isz;
  for (size_t j = 0; j < N; ++j) {
    st[j] = broadcast_strides(*ts[j], shape);
    base[j] = static_cast<char*>(ts[j]->data_ptr());
    isz[j] = static_cast<int64_t>(ts[j]->element_size());
  }
  bool parallel = parallel_output;
  for (size_t d = 0; d < shape.size() && parallel; ++d)
    if (shape[d] > 1 && st[0][d] == 0) parallel = false;
  strided_loop<N>(shape, st, base, isz, std::forward<Kernel>(kernel), parallel);
}
}  // namespace detail

// Convenience: iterate tensors that all have `shape` (or broadcast to it).
template <size_t N, class Kernel>
void for_each_run(const Shape& shape, const std::array<const Tensor*, N>& ts, Kernel&& kernel) {
  detail::run_operands<N>(shape, ts, std::forward<Kernel>(kernel), false);
}

// for_each_run with the runs on the intra-op threads, for kernels that write operand 0 (the
// output) elementwise and nothing else: each output element then has one writer, whatever the
// thread count, so the results are the same bits. An output that repeats elements (a zero
// stride on a dim longer than 1) runs serially.
template <size_t N, class Kernel>
void for_each_output_run(const Shape& shape, const std::array<const Tensor*, N>& ts, Kernel&& kernel) {
  detail::run_operands<N>(shape, ts, std::forward<Kernel>(kernel), true);
}

}  // namespace tandem
