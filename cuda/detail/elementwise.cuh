// The CUDA elementwise engine shared by cuda/elementwise*.cu: "for each output element, load the
// operands through their offsets, apply the functor of core/detail/elementwise.h, store".
//
// launch<Out, In...>(op, out, {operands}, f) picks one of two kernels:
// - flat: the output contiguous, every input contiguous with the output's numel or a single
//   element (or an immediate value); each thread does VEC consecutive elements with aligned
//   16-byte vector loads and stores when every pointer allows it (4 floats, 8 halves);
// - strided: anything else, through OffsetCalc (cuda/detail/indexing.h), one element per thread.
// Operands are read in their element type and computed in acc_t (f32 for f16/bf16), as the CPU
// loops do; an immediate operand (a Scalar) is converted to the compute type as the CPU does.
#pragma once

// fmt 9's format-string checks need this under nvcc; cuda/CMakeLists.txt sets it for every .cu
// file, this keeps the header usable from a standalone nvcc call.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/detail/elementwise.h"
#include "cuda/detail/indexing.h"
#include "cuda/detail/launch.h"
#include "cuda/runtime.h"

namespace tandem::cuda::ew_impl {

using tandem::detail::load;
using tandem::detail::store;

// An input: a tensor (broadcast to the output's shape) or an immediate value.
struct Operand {
  const Tensor* t = nullptr;
  double imm = 0;
  Operand(const Tensor& x) : t(&x) {}     // NOLINT: implicit, operands are listed in braces
  Operand(double v) : imm(v) {}           // NOLINT
};

template <size_t I, class... T>
using nth_t = std::tuple_element_t<I, std::tuple<T...>>;

template <class O, class... I>
struct Sig {
  using Out = O;
  static constexpr int N = static_cast<int>(sizeof...(I));
  template <size_t K>
  using In = nth_t<K, I...>;
  static constexpr size_t kMaxSize = std::max({sizeof(O), sizeof(I)...});
  // Elements per thread in the flat kernel: 16 bytes of the widest operand, at most 8.
  static constexpr int VEC = static_cast<int>(16 / kMaxSize < 8 ? 16 / kMaxSize : 8);
};

template <int N>
struct Args {
  char* out;
  const char* in[N > 0 ? N : 1];    // null: the operand is imm[j]
  double imm[N > 0 ? N : 1];
  bool scalar[N > 0 ? N : 1];       // flat kernel: one element read for every output element
};

template <class T, int VEC>
struct alignas(sizeof(T) * VEC) AlignedVec {
  T v[VEC];
};

// Per-operand register arrays (a minimal tuple that needs nothing from std in device code).
template <size_t I, class T>
struct Slot {
  T v;
};
template <class Seq, class... T>
struct Regs;
template <size_t... I, class... T>
struct Regs<std::index_sequence<I...>, T...> : Slot<I, T>... {};
template <size_t I, class T>
TANDEM_HOST_DEVICE __forceinline__ T& slot(Slot<I, T>& s) {
  return s.v;
}
template <class T, int VEC>
struct Arr {
  T v[VEC];
};

template <class S, size_t K, int N>
TANDEM_HOST_DEVICE __forceinline__ acc_t<typename S::template In<K>> load_one(const Args<N>& a, int64_t i) {
  using T = typename S::template In<K>;
  if (a.in[K] == nullptr) return static_cast<acc_t<T>>(a.imm[K]);
  return load(reinterpret_cast<const T*>(a.in[K])[a.scalar[K] ? 0 : i]);
}

template <class S, size_t K, int N, int VEC>
TANDEM_HOST_DEVICE __forceinline__ void load_vec(const Args<N>& a, int64_t i, Arr<acc_t<typename S::template In<K>>, VEC>& r) {
  using T = typename S::template In<K>;
  if (a.in[K] == nullptr || a.scalar[K]) {
    const acc_t<T> v = load_one<S, K>(a, 0);
TANDEM_UNROLL
    for (int k = 0; k < VEC; ++k) r.v[k] = v;
  } else {
    const AlignedVec<T, VEC> t = *reinterpret_cast<const AlignedVec<T, VEC>*>(a.in[K] + i * sizeof(T));
TANDEM_UNROLL
    for (int k = 0; k < VEC; ++k) r.v[k] = load(t.v[k]);
  }
}

template <class S, class F, size_t... K>
TANDEM_HOST_DEVICE __forceinline__ void flat_scalar(const Args<S::N>& a, int64_t i, const F& f, std::index_sequence<K...>) {
  using Out = typename S::Out;
  reinterpret_cast<Out*>(a.out)[i] = store<Out>(f(load_one<S, K>(a, i)...));
}

template <class S, class F, size_t... K>
TANDEM_HOST_DEVICE __forceinline__ void flat_vector(const Args<S::N>& a, int64_t i, const F& f, std::index_sequence<K...>) {
  using Out = typename S::Out;
  constexpr int VEC = S::VEC;
  Regs<std::index_sequence<K...>, Arr<acc_t<typename S::template In<K>>, VEC>...> r;
  (load_vec<S, K>(a, i, slot<K>(r)), ...);
  AlignedVec<Out, VEC> o;
TANDEM_UNROLL
  for (int k = 0; k < VEC; ++k) o.v[k] = store<Out>(f(slot<K>(r).v[k]...));
  *reinterpret_cast<AlignedVec<Out, VEC>*>(a.out + i * sizeof(Out)) = o;
}

// The work of thread `tid` of `threads` (host-callable, so the indexing can be checked on a CPU).
template <class S, class F>
TANDEM_HOST_DEVICE __forceinline__ void flat_thread(const Args<S::N>& a, int64_t n, bool vectorised, const F& f,
                                                    int64_t tid, int64_t threads) {
  constexpr int VEC = S::VEC;
  using Seq = std::make_index_sequence<S::N>;
  if (vectorised) {
    int64_t i = tid * VEC;
    for (; i + VEC <= n; i += threads * VEC) flat_vector<S>(a, i, f, Seq{});
    for (; i < n; ++i) flat_scalar<S>(a, i, f, Seq{});  // the one thread whose chunk holds the tail
  } else {
    for (int64_t i = tid; i < n; i += threads) flat_scalar<S>(a, i, f, Seq{});
  }
}

template <class S, class F>
__global__ void __launch_bounds__(kBlockThreads) flat_kernel(Args<S::N> a, int64_t n, bool vectorised, F f) {
  flat_thread<S>(a, n, vectorised, f, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

template <class S, size_t K, int N>
TANDEM_HOST_DEVICE __forceinline__ acc_t<typename S::template In<K>> load_at(const Args<N>& a, int64_t off) {
  using T = typename S::template In<K>;
  if (a.in[K] == nullptr) return static_cast<acc_t<T>>(a.imm[K]);
  return load(reinterpret_cast<const T*>(a.in[K])[off]);
}

template <class S, class F, size_t... K>
TANDEM_HOST_DEVICE __forceinline__ void strided_one(const Args<S::N>& a, const Offsets<S::N + 1>& o, const F& f,
                                            std::index_sequence<K...>) {
  using Out = typename S::Out;
  reinterpret_cast<Out*>(a.out)[o.v[0]] = store<Out>(f(load_at<S, K>(a, o.v[K + 1])...));
}

template <class S, class F>
TANDEM_HOST_DEVICE __forceinline__ void strided_thread(const Args<S::N>& a, const OffsetCalc<S::N + 1>& calc,
                                                       int64_t n, const F& f, int64_t tid, int64_t threads) {
  using Seq = std::make_index_sequence<S::N>;
  for (int64_t i = tid; i < n; i += threads) strided_one<S>(a, calc.get(i), f, Seq{});
}

template <class S, class F>
__global__ void __launch_bounds__(kBlockThreads) strided_kernel(Args<S::N> a, OffsetCalc<S::N + 1> calc, int64_t n,
                                                                F f) {
  strided_thread<S>(a, calc, n, f, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// What a launch does, decided on the host from the operands' geometry.
template <int N>
struct Plan {
  Args<N> a{};
  OffsetCalc<N + 1> calc;
  int64_t n = 0;
  bool flat = false;
  bool vectorised = false;
};

template <class Out, class... In>
Plan<sizeof...(In)> plan(const char* op, const Tensor& out, const std::array<Operand, sizeof...(In)>& ins) {
  using S = Sig<Out, In...>;
  constexpr int N = S::N;
  Plan<N> p;
  p.n = out.numel();
  p.a.out = static_cast<char*>(out.data_ptr());
  std::array<const Tensor*, N + 1> ts{};
  ts[0] = &out;
  for (int j = 0; j < N; ++j) {
    ts[j + 1] = ins[j].t;
    p.a.in[j] = ins[j].t ? static_cast<const char*>(ins[j].t->data_ptr()) : nullptr;
    p.a.imm[j] = ins[j].imm;
  }
  p.calc = make_offset_calc<N + 1>(out.shape(), ts, op);
  p.flat = p.calc.is_flat();
  if (p.flat) {
    constexpr size_t VEC = S::VEC;
    constexpr std::array<size_t, N + 1> sizes{sizeof(Out), sizeof(In)...};
    p.vectorised = p.n >= static_cast<int64_t>(VEC) && aligned(p.a.out, sizes[0] * VEC);
    for (int j = 0; j < N; ++j) {
      p.a.scalar[j] = p.calc.is_broadcast_scalar(j + 1);
      if (p.a.in[j] != nullptr && !p.a.scalar[j]) p.vectorised = p.vectorised && aligned(p.a.in[j], sizes[j + 1] * VEC);
    }
  }
  return p;
}

// out[i] = f(ins[i]...) over out's shape; Out and In... are the element types (out's dtype and
// the operands' dtypes, already checked by core). Launches on out's device's current stream.
template <class Out, class... In, class F>
void launch(const char* op, const Tensor& out, const std::array<Operand, sizeof...(In)>& ins, const F& f) {
  using S = Sig<Out, In...>;
  if (out.numel() == 0) return;
  const Plan<S::N> p = plan<Out, In...>(op, out, ins);
  DeviceGuard guard(out.device());
  cudaStream_t stream = current_stream(out.device());
  if (p.flat) {
    flat_kernel<S><<<blocks_for(p.n, p.vectorised ? S::VEC : 1), kBlockThreads, 0, stream>>>(p.a, p.n, p.vectorised, f);
  } else {
    strided_kernel<S><<<blocks_for(p.n), kBlockThreads, 0, stream>>>(p.a, p.calc, p.n, f);
  }
  TANDEM_CUDA_CHECK_LAUNCH(op);
}

// ---- the families, one per .cu file (cuda/elementwise.cu holds the table that calls them) ----
void binary(tandem::detail::Binary op, const Tensor& out, const Operand& a, const Operand& b, const Scalar& alpha,
            Dtype dtype);
void unary(tandem::detail::Unary op, const Tensor& out, const Tensor& a);
void pow_scalar(const Tensor& out, const Tensor& a, double exponent);
void clamp(const Tensor& out, const Tensor& a, std::optional<double> lo, std::optional<double> hi);
void pointwise3(tandem::detail::Pointwise3 op, const Tensor& self, const Tensor& a, const Tensor& b,
                const Scalar& alpha);
void lerp(const Tensor& self, const Tensor& end, const Scalar& weight);
void unary_grad(tandem::detail::Unary op, const Tensor& out, const Tensor& g, const Tensor& s);
void clamp_grad(const Tensor& out, const Tensor& g, const Tensor& x, std::optional<double> lo,
                std::optional<double> hi);
void pow_scalar_grad(const Tensor& out, const Tensor& g, const Tensor& x, double exponent);
void grad3(tandem::detail::Grad3 op, const Tensor& out, const Tensor& g, const Tensor& a, const Tensor& b);
void where_grad(const Tensor& out, const Tensor& cond, const Tensor& g, bool take_true);

}  // namespace tandem::cuda::ew_impl
