// The CPU loop engine of the elementwise ops, shared by core/elementwise*.cpp.
//
// Everything funnels into `map`: out[i] = f(in0[i], in1[i], ...) with the inputs broadcast to
// out's shape. Its fast paths are plain pointer loops the compiler vectorises: all operands
// contiguous with out's numel, or (two inputs) one of them a single element. Everything else
// goes through for_each_run, which coalesces dims into 1-D runs; runs that turn out contiguous
// (or contiguous against a broadcast operand) take the same plain loops. The fast path runs in
// chunks on the intra-op threads (core/parallel.h) past kDefaultGrain elements.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/cpu/simd_loops.h"
#include "core/detail/elementwise.h"
#include "core/detail/iter.h"
#include "core/parallel.h"

namespace tandem::detail {

// An operand of a bf16 block: bf16 runs are converted into f32 a block at a time by the SIMD
// conversions of core/cpu/simd_loops.h (the same bits as load()); other types are read where
// they are.
template <class T, int64_t K>
struct StagedOperand {
  const T* p = nullptr;
  TANDEM_INLINE void stage(const T* src, int64_t) { p = src; }
  TANDEM_INLINE auto operator[](int64_t k) const { return load(p[k]); }
};
template <int64_t K>
struct StagedOperand<BFloat16, K> {
  float buf[K];
  TANDEM_INLINE void stage(const BFloat16* src, int64_t m) { bf16_to_f32_n(src, buf, m); }
  TANDEM_INLINE float operator[](int64_t k) const { return buf[k]; }
};

// contig_loop with a bf16 operand or result: blocks of 256 are converted in, computed in f32 by
// the same functor, and converted out, so the conversions run as SIMD loops of their own. Every
// input of a block is read before any of it is stored (in-place ops, as below).
template <class Out, class... In, class F, size_t... I>
void contig_loop_bf16(char* out, const std::array<const char*, sizeof...(In)>& in, int64_t n, const F& f_ref,
                      std::index_sequence<I...>) {
  Out* o = reinterpret_cast<Out*>(out);
  if constexpr (std::is_same_v<F, Identity> && sizeof...(In) == 1) {
    using Src = std::tuple_element_t<0, std::tuple<In...>>;
    if constexpr (std::is_same_v<Out, float> && std::is_same_v<Src, BFloat16>) {
      return bf16_to_f32_n(reinterpret_cast<const BFloat16*>(in[0]), o, n);  // a cast: no staging
    } else if constexpr (std::is_same_v<Out, BFloat16> && std::is_same_v<Src, float>) {
      return f32_to_bf16_n(reinterpret_cast<const float*>(in[0]), o, n);
    }
  }
  const F f = f_ref;
  constexpr int64_t kBlock = 256;
  std::tuple<const In*...> p{reinterpret_cast<const In*>(in[I])...};
  std::tuple<StagedOperand<In, kBlock>...> staged;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t m = n - i < kBlock ? n - i : kBlock;
    (std::get<I>(staged).stage(std::get<I>(p) + i, m), ...);
    if constexpr (std::is_same_v<Out, BFloat16>) {
      float tmp[kBlock];
      constexpr bool all_bf16 = (std::is_same_v<In, BFloat16> && ...);
      if constexpr (all_bf16 && std::is_same_v<F, Gelu> && sizeof...(In) == 1) {
        gelu_f32_n(std::get<0>(staged).buf, tmp, m);  // GELU in f32 on the SIMD clones, as below
      } else if constexpr (all_bf16 && std::is_same_v<F, GeluGradX> && sizeof...(In) == 2) {
        gelu_grad_f32_n(std::get<0>(staged).buf, std::get<1>(staged).buf, tmp, m);
      } else {
        for (int64_t k = 0; k < m; ++k) tmp[k] = static_cast<float>(f(std::get<I>(staged)[k]...));
      }
      f32_to_bf16_n(tmp, o + i, m);
    } else {
      for (int64_t k = 0; k < m; ++k) o[i + k] = store<Out>(f(std::get<I>(staged)[k]...));
    }
  }
}

// Blocks of 8 computed into a local buffer, then stored: the loads of a block provably come
// before its stores even when out aliases an input (in-place ops), so the block vectorises
// without runtime alias checks, also at -O2 (whose cheap cost model refuses versioned loops).
// The functor is copied so its parameters cannot alias out either.
// bf16 operands, and exact GELU in f32, take the SIMD loops of core/cpu/simd_loops.h.
template <class Out, class... In, class F, size_t... I>
TANDEM_INLINE void contig_loop(char* out, const std::array<const char*, sizeof...(In)>& in, int64_t n, const F& f_ref,
                               std::index_sequence<I...> seq) {
  if constexpr (std::is_same_v<Out, BFloat16> || (std::is_same_v<In, BFloat16> || ...)) {
    return contig_loop_bf16<Out, In...>(out, in, n, f_ref, seq);
  }
  // Exact GELU and its gradient in f32: the SIMD clones of core/cpu/simd_loops.h (same bits).
  if constexpr (std::is_same_v<F, Gelu> && std::is_same_v<Out, float> && sizeof...(In) == 1 &&
                (std::is_same_v<In, float> && ...)) {
    return gelu_f32_n(reinterpret_cast<const float*>(in[0]), reinterpret_cast<float*>(out), n);
  }
  if constexpr (std::is_same_v<F, GeluGradX> && std::is_same_v<Out, float> && sizeof...(In) == 2 &&
                (std::is_same_v<In, float> && ...)) {
    return gelu_grad_f32_n(reinterpret_cast<const float*>(in[0]), reinterpret_cast<const float*>(in[1]),
                           reinterpret_cast<float*>(out), n);
  }
  const F f = f_ref;
  Out* o = reinterpret_cast<Out*>(out);
  std::tuple<const In*...> p{reinterpret_cast<const In*>(in[I])...};
  constexpr int64_t kBlock = 8;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    Out tmp[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) tmp[k] = store<Out>(f(load(std::get<I>(p)[i + k])...));
    for (int64_t k = 0; k < kBlock; ++k) o[i + k] = tmp[k];
  }
  for (; i < n; ++i) o[i] = store<Out>(f(load(std::get<I>(p)[i])...));
}

template <class Out, class... In, class F, size_t... I>
TANDEM_INLINE void strided_loop_n(char* out, int64_t out_stride, const std::array<const char*, sizeof...(In)>& in,
                                  const std::array<int64_t, sizeof...(In)>& stride, int64_t n, const F& f,
                                  std::index_sequence<I...>) {
  for (int64_t i = 0; i < n; ++i) {
    *reinterpret_cast<Out*>(out + i * out_stride) =
        store<Out>(f(load(*reinterpret_cast<const In*>(in[I] + i * stride[I]))...));
  }
}

// A 1-D run: contiguous, one-operand-broadcast (two inputs), or general strided.
template <class Out, class... In, class F>
TANDEM_INLINE void run_1d(char* out, int64_t out_stride, const std::array<const char*, sizeof...(In)>& in,
                          const std::array<int64_t, sizeof...(In)>& stride, int64_t n, const F& f) {
  constexpr size_t N = sizeof...(In);
  using Seq = std::make_index_sequence<N>;
  constexpr std::array<int64_t, N> sizes{static_cast<int64_t>(sizeof(In))...};
  if (out_stride == static_cast<int64_t>(sizeof(Out))) {
    bool contiguous = true;
    for (size_t j = 0; j < N; ++j) contiguous = contiguous && stride[j] == sizes[j];
    if (contiguous) return contig_loop<Out, In...>(out, in, n, f, Seq{});
    if constexpr (N == 2) {
      using In0 = std::tuple_element_t<0, std::tuple<In...>>;
      using In1 = std::tuple_element_t<1, std::tuple<In...>>;
      if (stride[0] == sizes[0] && stride[1] == 0) {
        auto b = load(*reinterpret_cast<const In1*>(in[1]));
        auto g = [&f, b](auto x) { return f(x, b); };
        return contig_loop<Out, In0>(out, {in[0]}, n, g, std::make_index_sequence<1>{});
      }
      if (stride[0] == 0 && stride[1] == sizes[1]) {
        auto a = load(*reinterpret_cast<const In0*>(in[0]));
        auto g = [&f, a](auto x) { return f(a, x); };
        return contig_loop<Out, In1>(out, {in[1]}, n, g, std::make_index_sequence<1>{});
      }
    }
  }
  strided_loop_n<Out, In...>(out, out_stride, in, stride, n, f, Seq{});
}

// out[i] = f(ins...[i]); every input has element type In_j and broadcasts to out's shape.
template <class Out, class... In, class F>
void map(const Tensor& out, const std::array<const Tensor*, sizeof...(In)>& ins, const F& f) {
  constexpr size_t N = sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.is_contiguous()) {
    std::array<const char*, N> p;
    std::array<int64_t, N> stride;
    bool fast = true;
    for (size_t j = 0; j < N; ++j) {
      const Tensor& t = *ins[j];
      p[j] = static_cast<const char*>(t.data_ptr());
      if (t.numel() == n && t.is_contiguous()) {
        stride[j] = static_cast<int64_t>(t.element_size());
      } else if (t.numel() == 1) {
        stride[j] = 0;
      } else {
        fast = false;
        break;
      }
    }
    if (fast) {
      // Chunks of the one run on the intra-op threads; each element is computed once, by the
      // same functor, so the bits do not depend on the thread count.
      char* o = static_cast<char*>(out.data_ptr());
      parallel_for(n, kDefaultGrain, [&](int64_t begin, int64_t end) {
        std::array<const char*, N> q = p;
        for (size_t j = 0; j < N; ++j) q[j] += stride[j] * begin;
        run_1d<Out, In...>(o + begin * static_cast<int64_t>(sizeof(Out)), sizeof(Out), q, stride, end - begin, f);
      });
      return;
    }
  }
  std::array<const Tensor*, N + 1> all;
  all[0] = &out;
  for (size_t j = 0; j < N; ++j) all[j + 1] = ins[j];
  // Strided or broadcast operands: runs on the intra-op threads (each output element has one).
  for_each_output_run<N + 1>(out.shape(), all, [&](const StridedRun<N + 1>& r) {
    std::array<const char*, N> p;
    std::array<int64_t, N> stride;
    for (size_t j = 0; j < N; ++j) {
      p[j] = r.ptr[j + 1];
      stride[j] = r.stride[j + 1];
    }
    run_1d<Out, In...>(r.ptr[0], r.stride[0], p, stride, r.n, f);
  });
}

// The type a functor computes in for element type T (f32 for the 2-byte floats).
template <class T> using C_t = acc_t<T>;

}  // namespace tandem::detail
