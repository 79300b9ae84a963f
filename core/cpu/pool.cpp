// Max, average and adaptive-average pooling (core/detail/pool.h): window geometry and checks, the CPU
// kernels, and the hand-off to a device's PoolDeviceKernels.
#include "core/detail/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TANDEM_POOL_AVX512 1
#else
#define TANDEM_POOL_AVX512 0
#endif

#include "core/detail/checks.h"
#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/parallel.h"

namespace tandem::detail {

namespace {

PoolDeviceKernels& device_table(const Tensor& t, const char* op) {
  return device_kernels<PoolDeviceKernels>(t.device(), op);
}

// floor(a / b) for b > 0 (PyTorch's div_rtn).
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

}  // namespace

Window2d pool2d_window(const Tensor& input, const Pool2dArgs& a, const char* op) {
  check_floating(input, op);
  check_4d(input, op);
  const Size2 stride = a.stride.value_or(a.kernel);
  check_positive(a.kernel, "kernel_size", op);
  check_positive(stride, "stride", op);
  check_positive(a.dilation, "dilation", op);
  TANDEM_CHECK(a.padding.h >= 0 && a.padding.w >= 0, "[{}] padding must be non-negative, got {}", op, a.padding);
  TANDEM_CHECK(a.padding.h <= a.kernel.h / 2 && a.padding.w <= a.kernel.w / 2,
               "[{}] padding {} must be at most half of kernel_size {}", op, a.padding, a.kernel);
  TANDEM_CHECK(input.size(1) > 0 && input.size(2) > 0 && input.size(3) > 0,
               "[{}] expected non-empty channel and spatial dims, got input {}", op, input.shape());
  Window2d w;
  w.H = input.size(2);
  w.W = input.size(3);
  w.kh = a.kernel.h;
  w.kw = a.kernel.w;
  w.sh = stride.h;
  w.sw = stride.w;
  w.ph = a.padding.h;
  w.pw = a.padding.w;
  w.dh = a.dilation.h;
  w.dw = a.dilation.w;
  auto out_size = [&](int64_t in, int64_t k, int64_t p, int64_t s, int64_t d) {
    int64_t n = floor_div(in + 2 * p - d * (k - 1) - 1 + (a.ceil_mode ? s - 1 : 0), s) + 1;
    if (a.ceil_mode && (n - 1) * s >= in + p) --n;  // the last window starts inside the input or left padding
    return n;
  };
  w.OH = out_size(w.H, w.kh, w.ph, w.sh, w.dh);
  w.OW = out_size(w.W, w.kw, w.pw, w.sw, w.dw);
  TANDEM_CHECK(w.OH > 0 && w.OW > 0,
               "[{}] input {} is too small for kernel_size {} (dilation {}, padding {}): the output would be {}x{}",
               op, input.shape(), a.kernel, a.dilation, a.padding, w.OH, w.OW);
  return w;
}

namespace {

// Rows [h0, h1) (stepping by d) of the window that starts at `start`, clipped to [0, n).
void dilated_span(int64_t start, int64_t k, int64_t d, int64_t n, int64_t& h0, int64_t& h1) {
  h0 = start;
  h1 = std::min(start + (k - 1) * d + 1, n);
  while (h0 < 0) h0 += d;
}

// avg_pool2d's window [h0, h1) x [w0, w1) of output (oh, ow), clipped to the input, and its divisor.
struct AvgCell {
  int64_t h0, h1, w0, w1, divisor;
};

AvgCell avg_cell(int64_t oh, int64_t ow, const Window2d& w, const AvgPoolOptions& avg) {
  AvgCell c;
  c.h0 = oh * w.sh - w.ph;
  c.w0 = ow * w.sw - w.pw;
  c.h1 = std::min(c.h0 + w.kh, w.H + w.ph);
  c.w1 = std::min(c.w0 + w.kw, w.W + w.pw);
  const int64_t padded = (c.h1 - c.h0) * (c.w1 - c.w0);
  c.h0 = std::max<int64_t>(c.h0, 0);
  c.w0 = std::max<int64_t>(c.w0, 0);
  c.h1 = std::min(c.h1, w.H);
  c.w1 = std::min(c.w1, w.W);
  if (avg.divisor_override) {
    c.divisor = *avg.divisor_override;
  } else {
    c.divisor = avg.count_include_pad ? padded : (c.h1 - c.h0) * (c.w1 - c.w0);
  }
  return c;
}

int64_t planes_of(const Tensor& t) { return t.size(0) * t.size(1); }

#if TANDEM_POOL_AVX512
// The CPU runs AVX-512F: asked once (the library is built for the baseline x86-64, so the kernel
// below is compiled for AVX-512 on its own and only called where the CPU has it).
bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// One f32 plane's 2x2/2 max pool (every window inside the input) on AVX-512: 16 outputs of a row
// at a time, their four window elements de-interleaved from two rows of 32 inputs. The same
// chain of "greater than" in row-major order as the scalar walk, so values and indices are
// bitwise the scalar's; a row's tail is masked. The scalar loop took a tenth of the CNN's step
// (scalar loads and selects, ~30 instructions an output); this takes a few per 16. Returns false
// when the plane holds a NaN: the caller then rewrites it by the general rule.
__attribute__((target("avx512f"))) bool max_pool2x2_plane_avx512(const float* xs, float* ys, int64_t* is,
                                                                 int64_t W, int64_t OH, int64_t OW) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lanes = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);  // 2 * lane: the window's column
  const __m512i one = _mm512_set1_epi64(1), below = _mm512_set1_epi64(W), below_right = _mm512_set1_epi64(W + 1);
  __mmask16 nan = 0;
  for (int64_t oh = 0; oh < OH; ++oh) {
    const float* top = xs + 2 * oh * W;
    const float* bottom = top + W;
    for (int64_t ow = 0; ow < OW; ow += 16) {
      const int64_t n = std::min<int64_t>(16, OW - ow);  // outputs in this step
      const auto out_mask = static_cast<__mmask16>((1u << n) - 1);
      const auto lo_mask = static_cast<__mmask16>(n >= 8 ? 0xFFFFu : (1u << (2 * n)) - 1);
      const auto hi_mask = static_cast<__mmask16>(n > 8 ? (1u << (2 * n - 16)) - 1 : 0u);
      const __m512 t0 = _mm512_maskz_loadu_ps(lo_mask, top + 2 * ow);
      const __m512 t1 = _mm512_maskz_loadu_ps(hi_mask, top + 2 * ow + 16);
      const __m512 b0 = _mm512_maskz_loadu_ps(lo_mask, bottom + 2 * ow);
      const __m512 b1 = _mm512_maskz_loadu_ps(hi_mask, bottom + 2 * ow + 16);
      const __m512 a = _mm512_permutex2var_ps(t0, even, t1), b = _mm512_permutex2var_ps(t0, odd, t1);
      const __m512 c = _mm512_permutex2var_ps(b0, even, b1), d = _mm512_permutex2var_ps(b0, odd, b1);
      nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q);
      const __mmask16 tb = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
      const __m512 ab = _mm512_mask_blend_ps(tb, a, b);
      const __mmask16 tc = _mm512_cmp_ps_mask(c, ab, _CMP_GT_OQ);
      const __m512 abc = _mm512_mask_blend_ps(tc, ab, c);
      const __mmask16 td = _mm512_cmp_ps_mask(d, abc, _CMP_GT_OQ);
      _mm512_mask_storeu_ps(ys + oh * OW + ow, out_mask, _mm512_mask_blend_ps(td, abc, d));
      // Indices: the window's first element 2 oh W + 2 (ow + lane), plus the winner's offset in it
      // (0, 1, W, W + 1), 8 lanes of i64 at a time.
      for (int half = 0; half < 2; ++half) {
        const int shift = 8 * half;
        __m512i k = _mm512_maskz_mov_epi64(static_cast<__mmask8>(tb >> shift), one);
        k = _mm512_mask_mov_epi64(k, static_cast<__mmask8>(tc >> shift), below);
        k = _mm512_mask_mov_epi64(k, static_cast<__mmask8>(td >> shift), below_right);
        const __m512i first = _mm512_add_epi64(_mm512_set1_epi64(2 * oh * W + 2 * (ow + shift)), lanes);
        _mm512_mask_storeu_epi64(is + oh * OW + ow + shift, static_cast<__mmask8>(out_mask >> shift),
                                 _mm512_add_epi64(first, k));
      }
    }
  }
  return nan == 0;
}
#endif

// The SIMD 2x2/2 plane kernel for element type T, where this CPU has one: f32 on AVX-512.
template <class T>
bool has_max_pool2x2_simd() {
#if TANDEM_POOL_AVX512
  return std::is_same_v<T, float> && cpu_has_avx512f();
#else
  return false;
#endif
}
template <class T>
bool max_pool2x2_plane_simd(const T*, T*, int64_t*, int64_t, int64_t, int64_t) {
  TANDEM_CHECK(false, "[max_pool2d] internal: no SIMD kernel for this dtype");
  return false;
}
#if TANDEM_POOL_AVX512
bool max_pool2x2_plane_simd(const float* xs, float* ys, int64_t* is, int64_t W, int64_t OH, int64_t OW) {
  return max_pool2x2_plane_avx512(xs, ys, is, W, OH, OW);
}
#endif

}  // namespace

std::pair<Tensor, Tensor> max_pool2d_kernel(const Tensor& input, const Pool2dArgs& args) {
  const char* op = "max_pool2d";
  const Window2d w = pool2d_window(input, args, op);
  const Tensor x = materialize(input, op);
  const Shape out_shape{x.size(0), x.size(1), w.OH, w.OW};
  Tensor out = make_empty(out_shape, x.dtype(), x.device(), op);
  Tensor idx = make_empty(out_shape, i64, x.device(), op);
  const int64_t planes = planes_of(x);
  if (planes == 0) return {out, idx};
  if (!x.is_cpu()) {
    device_table(x, op).max_pool2d(x, out, idx, planes, w);
    return {out, idx};
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    int64_t* ip = static_cast<int64_t*>(idx.data_ptr());
    // The general walk: each window clipped to the input, the first maximum in row-major order
    // or the last NaN (PyTorch's rule).
    auto walk_plane = [&](int64_t p) {
      const T* xs = xp + p * w.H * w.W;
      for (int64_t oh = 0; oh < w.OH; ++oh) {
        int64_t h0, h1;
        dilated_span(oh * w.sh - w.ph, w.kh, w.dh, w.H, h0, h1);
        for (int64_t ow = 0; ow < w.OW; ++ow) {
          int64_t w0, w1;
          dilated_span(ow * w.sw - w.pw, w.kw, w.dw, w.W, w0, w1);
          int64_t best = h0 * w.W + w0;
          Acc m = -std::numeric_limits<Acc>::infinity();
          for (int64_t ih = h0; ih < h1; ih += w.dh) {
            for (int64_t iw = w0; iw < w1; iw += w.dw) {
              const Acc v = static_cast<Acc>(xs[ih * w.W + iw]);
              if (v > m || std::isnan(v)) {
                m = v;
                best = ih * w.W + iw;
              }
            }
          }
          const int64_t o = (p * w.OH + oh) * w.OW + ow;
          yp[o] = static_cast<T>(m);
          ip[o] = best;
        }
      }
    };
    // The usual 2x2/2 pool after a conv, every window inside the input, walked in a third of the
    // time (the general walk took a fifth of a small CNN's step): no clipping, and selects
    // instead of branches, since which element wins is data and the branches mispredict. Without
    // a NaN in the plane the rule is a plain "greater than" in row-major order; a plane with one
    // takes the general walk.
    const bool two_by_two = w.kh == 2 && w.kw == 2 && w.sh == 2 && w.sw == 2 && w.ph == 0 && w.pw == 0 &&
                            w.dh == 1 && w.dw == 1 && 2 * w.OH <= w.H && 2 * w.OW <= w.W;
    const bool simd = two_by_two && has_max_pool2x2_simd<T>();
    // Planes are independent: chunks of them on the intra-op threads.
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      for (int64_t p = p_begin; p < p_end; ++p) {
        if (!two_by_two) {
          walk_plane(p);
          continue;
        }
        const T* xs = xp + p * w.H * w.W;
        T* ys = yp + p * w.OH * w.OW;
        int64_t* is = ip + p * w.OH * w.OW;
        if (simd) {
          if (!max_pool2x2_plane_simd(xs, ys, is, w.W, w.OH, w.OW)) walk_plane(p);
          continue;
        }
        int nan = 0;
        for (int64_t oh = 0; oh < w.OH; ++oh) {
          const T* top = xs + 2 * oh * w.W;
          const T* bottom = top + w.W;
          const int64_t base = 2 * oh * w.W;
          for (int64_t ow = 0; ow < w.OW; ++ow) {
            const Acc a = static_cast<Acc>(top[2 * ow]), b = static_cast<Acc>(top[2 * ow + 1]);
            const Acc c = static_cast<Acc>(bottom[2 * ow]), d = static_cast<Acc>(bottom[2 * ow + 1]);
            nan |= (a != a) | (b != b) | (c != c) | (d != d);
            const bool tb = b > a;
            const Acc ab = tb ? b : a;
            const bool tc = c > ab;
            const Acc abc = tc ? c : ab;
            const bool td = d > abc;
            ys[oh * w.OW + ow] = static_cast<T>(td ? d : abc);
            // The winner's offset in the window (0, 1, W, W + 1) by arithmetic: no branch.
            const int64_t kb = tb, kc = kb + tc * (w.W - kb), kd = kc + td * (w.W + 1 - kc);
            is[oh * w.OW + ow] = base + 2 * ow + kd;
          }
        }
        if (nan) walk_plane(p);  // rewrites the plane by the rule
      }
    });
  });
  return {out, idx};
}

Tensor max_pool2d_backward_kernel(const Tensor& grad, const Tensor& indices, const Tensor& input,
                                  const Pool2dArgs& args) {
  const char* op = "max_pool2d_backward";
  const Window2d w = pool2d_window(input, args, op);
  check_same_device(op, {{"grad", grad}, {"indices", indices}, {"input", input}});
  const Shape out_shape{input.size(0), input.size(1), w.OH, w.OW};
  TANDEM_CHECK(grad.shape() == out_shape && grad.dtype() == input.dtype() && indices.shape() == out_shape &&
                   indices.dtype() == i64,
               "[{}] gradient {} {} and indices {} {} do not match the output {} {}", op, grad.dtype(), grad.shape(),
               indices.dtype(), indices.shape(), input.dtype(), out_shape);
  const Tensor g = materialize(grad, op), idx = materialize(indices, op);
  Tensor gx = make_empty(input.shape(), input.dtype(), input.device(), op);
  const int64_t planes = planes_of(input);
  if (planes == 0) return gx;
  if (!gx.is_cpu()) {
    device_table(gx, op).max_pool2d_backward(g, idx, gx, planes, w);
    return gx;
  }
  TANDEM_DISPATCH_FLOATING(gx.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* gp = static_cast<const T*>(g.data_ptr());
    const int64_t* ip = static_cast<const int64_t*>(idx.data_ptr());
    T* xp = static_cast<T*>(gx.data_ptr());
    const int64_t hw = w.H * w.W, ohw = w.OH * w.OW;
    // Planes are independent: chunks of them on the intra-op threads, each with its own scratch.
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      if (std::is_same_v<T, Acc>) {
        // Accumulating in the element type itself: straight into the gradient, no scratch plane
        // to fill and copy out (the same additions in the same order).
        for (int64_t p = p_begin; p < p_end; ++p) {
          T* xs = xp + p * hw;
          std::fill(xs, xs + hw, T(0));
          const int64_t* is = ip + p * ohw;
          const T* gs = gp + p * ohw;
          for (int64_t o = 0; o < ohw; ++o) {
            const int64_t i = is[o];
            if (i >= 0 && i < hw) xs[i] = static_cast<T>(static_cast<Acc>(xs[i]) + static_cast<Acc>(gs[o]));
          }
        }
        return;
      }
      std::vector<Acc> acc(hw);
      for (int64_t p = p_begin; p < p_end; ++p) {
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t o = 0; o < ohw; ++o) {
          const int64_t i = ip[p * ohw + o];
          if (i >= 0 && i < hw) acc[i] += static_cast<Acc>(gp[p * ohw + o]);
        }
        for (int64_t i = 0; i < hw; ++i) xp[p * hw + i] = static_cast<T>(acc[i]);
      }
    });
  });
  return gx;
}

namespace {
void check_avg(const AvgPoolOptions& avg, const char* op) {
  TANDEM_CHECK(!avg.divisor_override || *avg.divisor_override != 0, "[{}] divisor_override must be non-zero", op);
}
}  // namespace

Tensor avg_pool2d_kernel(const Tensor& input, const Pool2dArgs& args, const AvgPoolOptions& avg) {
  const char* op = "avg_pool2d";
  check_avg(avg, op);
  const Window2d w = pool2d_window(input, args, op);
  TANDEM_CHECK(w.dh == 1 && w.dw == 1, "[{}] internal: no dilation for average pooling", op);
  const Tensor x = materialize(input, op);
  Tensor out = make_empty(Shape{x.size(0), x.size(1), w.OH, w.OW}, x.dtype(), x.device(), op);
  const int64_t planes = planes_of(x);
  if (planes == 0) return out;
  if (!x.is_cpu()) {
    device_table(x, op).avg_pool2d(x, out, planes, w, avg);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    // Planes on the intra-op threads (each written by one: the same bits at any thread count).
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      for (int64_t p = p_begin; p < p_end; ++p) {
        const T* xs = xp + p * w.H * w.W;
        for (int64_t oh = 0; oh < w.OH; ++oh) {
          for (int64_t ow = 0; ow < w.OW; ++ow) {
            const AvgCell c = avg_cell(oh, ow, w, avg);
            Acc s = 0;
            for (int64_t ih = c.h0; ih < c.h1; ++ih)
              for (int64_t iw = c.w0; iw < c.w1; ++iw) s += static_cast<Acc>(xs[ih * w.W + iw]);
            const bool empty = c.h0 >= c.h1 || c.w0 >= c.w1;
            yp[(p * w.OH + oh) * w.OW + ow] = static_cast<T>(empty ? Acc(0) : s / static_cast<Acc>(c.divisor));
          }
        }
      }
    });
  });
  return out;
}

Tensor avg_pool2d_backward_kernel(const Tensor& grad, const Tensor& input, const Pool2dArgs& args,
                                  const AvgPoolOptions& avg) {
  const char* op = "avg_pool2d_backward";
  check_avg(avg, op);
  const Window2d w = pool2d_window(input, args, op);
  check_same_device(op, {{"grad", grad}, {"input", input}});
  const Shape out_shape{input.size(0), input.size(1), w.OH, w.OW};
  TANDEM_CHECK(grad.shape() == out_shape && grad.dtype() == input.dtype(),
               "[{}] gradient {} {} does not match the output {} {}", op, grad.dtype(), grad.shape(), input.dtype(),
               out_shape);
  const Tensor g = materialize(grad, op);
  Tensor gx = make_empty(input.shape(), input.dtype(), input.device(), op);
  const int64_t planes = planes_of(input);
  if (planes == 0) return gx;
  if (!gx.is_cpu()) {
    device_table(gx, op).avg_pool2d_backward(g, gx, planes, w, avg);
    return gx;
  }
  TANDEM_DISPATCH_FLOATING(gx.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* xp = static_cast<T*>(gx.data_ptr());
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      std::vector<Acc> acc(w.H * w.W);
      for (int64_t p = p_begin; p < p_end; ++p) {
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t oh = 0; oh < w.OH; ++oh) {
          for (int64_t ow = 0; ow < w.OW; ++ow) {
            const AvgCell c = avg_cell(oh, ow, w, avg);
            const Acc v = static_cast<Acc>(gp[(p * w.OH + oh) * w.OW + ow]) / static_cast<Acc>(c.divisor);
            for (int64_t ih = c.h0; ih < c.h1; ++ih)
              for (int64_t iw = c.w0; iw < c.w1; ++iw) acc[ih * w.W + iw] += v;
          }
        }
        T* xs = xp + p * w.H * w.W;
        for (int64_t i = 0; i < w.H * w.W; ++i) xs[i] = static_cast<T>(acc[i]);
      }
    });
  });
  return gx;
}

namespace {
Window2d adaptive_window(const Tensor& input, Size2 output_size, const char* op) {
  check_floating(input, op);
  check_4d(input, op);
  check_positive(output_size, "output_size", op);
  TANDEM_CHECK(input.size(1) > 0 && input.size(2) > 0 && input.size(3) > 0,
               "[{}] expected non-empty channel and spatial dims, got input {}", op, input.shape());
  Window2d w;
  w.H = input.size(2);
  w.W = input.size(3);
  w.OH = output_size.h;
  w.OW = output_size.w;
  return w;
}
}  // namespace

Tensor adaptive_avg_pool2d_kernel(const Tensor& input, Size2 output_size) {
  const char* op = "adaptive_avg_pool2d";
  const Window2d w = adaptive_window(input, output_size, op);
  const Tensor x = materialize(input, op);
  Tensor out = make_empty(Shape{x.size(0), x.size(1), w.OH, w.OW}, x.dtype(), x.device(), op);
  const int64_t planes = planes_of(x);
  if (planes == 0) return out;
  if (!x.is_cpu()) {
    device_table(x, op).adaptive_avg_pool2d(x, out, planes, w);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* yp = static_cast<T*>(out.data_ptr());
    // Planes on the intra-op threads (each written by one: the same bits at any thread count).
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      for (int64_t p = p_begin; p < p_end; ++p) {
        const T* xs = xp + p * w.H * w.W;
        for (int64_t oh = 0; oh < w.OH; ++oh) {
          const int64_t h0 = adaptive_start(oh, w.OH, w.H), h1 = adaptive_end(oh, w.OH, w.H);
          for (int64_t ow = 0; ow < w.OW; ++ow) {
            const int64_t w0 = adaptive_start(ow, w.OW, w.W), w1 = adaptive_end(ow, w.OW, w.W);
            Acc s = 0;
            for (int64_t ih = h0; ih < h1; ++ih)
              for (int64_t iw = w0; iw < w1; ++iw) s += static_cast<Acc>(xs[ih * w.W + iw]);
            yp[(p * w.OH + oh) * w.OW + ow] = static_cast<T>(s / static_cast<Acc>((h1 - h0) * (w1 - w0)));
          }
        }
      }
    });
  });
  return out;
}

Tensor adaptive_avg_pool2d_backward_kernel(const Tensor& grad, const Tensor& input) {
  const char* op = "adaptive_avg_pool2d_backward";
  TANDEM_CHECK(grad.defined() && grad.dim() == 4, "[{}] expected a 4-D gradient, got {}", op,
               grad.defined() ? grad.shape() : Shape{});
  const Window2d w = adaptive_window(input, Size2(grad.size(2), grad.size(3)), op);
  check_same_device(op, {{"grad", grad}, {"input", input}});
  TANDEM_CHECK(grad.size(0) == input.size(0) && grad.size(1) == input.size(1) && grad.dtype() == input.dtype(),
               "[{}] gradient {} {} does not match input {} {}", op, grad.dtype(), grad.shape(), input.dtype(),
               input.shape());
  const Tensor g = materialize(grad, op);
  Tensor gx = make_empty(input.shape(), input.dtype(), input.device(), op);
  const int64_t planes = planes_of(input);
  if (planes == 0) return gx;
  if (!gx.is_cpu()) {
    device_table(gx, op).adaptive_avg_pool2d_backward(g, gx, planes, w);
    return gx;
  }
  TANDEM_DISPATCH_FLOATING(gx.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const T* gp = static_cast<const T*>(g.data_ptr());
    T* xp = static_cast<T*>(gx.data_ptr());
    parallel_for(planes, units_per_grain(w.H * w.W), [&](int64_t p_begin, int64_t p_end) {
      std::vector<Acc> acc(w.H * w.W);
      for (int64_t p = p_begin; p < p_end; ++p) {
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t oh = 0; oh < w.OH; ++oh) {
          const int64_t h0 = adaptive_start(oh, w.OH, w.H), h1 = adaptive_end(oh, w.OH, w.H);
          for (int64_t ow = 0; ow < w.OW; ++ow) {
            const int64_t w0 = adaptive_start(ow, w.OW, w.W), w1 = adaptive_end(ow, w.OW, w.W);
            const Acc v = static_cast<Acc>(gp[(p * w.OH + oh) * w.OW + ow]) / static_cast<Acc>((h1 - h0) * (w1 - w0));
            for (int64_t ih = h0; ih < h1; ++ih)
              for (int64_t iw = w0; iw < w1; ++iw) acc[ih * w.W + iw] += v;
          }
        }
        T* xs = xp + p * w.H * w.W;
        for (int64_t i = 0; i < w.H * w.W; ++i) xs[i] = static_cast<T>(acc[i]);
      }
    });
  });
  return gx;
}

}  // namespace tandem::detail
