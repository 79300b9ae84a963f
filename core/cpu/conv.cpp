#include "core/detail/conv.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/onednn.h"
#include "core/detail/checks.h"
#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/elementwise.h"
#include "core/detail/matmul.h"
#include "core/detail/reduce.h"
#include "core/parallel.h"

namespace tandem::detail {

namespace {

ConvDeviceKernels& device_table(const Tensor& t, const char* op) {
  return device_kernels<ConvDeviceKernels>(t.device(), op);
}

bool is_half_precision(Dtype d) { return d == f16 || d == bf16; }

// The n samples from n0 of a contiguous [N, ...] tensor whose samples hold `per_sample` elements.
Tensor samples(const Tensor& t, int64_t n0, int64_t n, int64_t per_sample, const Shape& sample_shape) {
  Shape s{n};
  for (int64_t d : sample_shape) s.push_back(d);
  return make_view(t, s, contiguous_strides(s), t.storage_offset() + n0 * per_sample);
}

// ---- CPU im2col / col2im (f32, f64) ----

// Output columns [lo, hi) whose input column ow * sw + off lies inside [0, W).
void valid_columns(int64_t off, const Window2d& w, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : std::min(w.OW, (-off + w.sw - 1) / w.sw);
  hi = w.W - off <= 0 ? 0 : std::min(w.OW, (w.W - off + w.sw - 1) / w.sw);
  hi = std::max(hi, lo);
}

// dst[0, n) = src[0, n) for the short runs of im2col, inline: 32-byte blocks, the last one
// overlapping the one before (a call to memmove per row of a 28-wide image cost a third of im2col).
template <class T>
inline void copy_run(T* __restrict dst, const T* __restrict src, int64_t n) {
  constexpr int64_t kBlock = 32 / sizeof(T);
  if (n < kBlock) {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    return;
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) std::memcpy(dst + i, src + i, 32);
  if (i < n) std::memcpy(dst + n - kBlock, src + n - kBlock, 32);
}

// Stride-1 windows whose output is as wide as the input (the "same" convolutions: 3x3 with
// padding 1, ...): each tap's row of the column matrix is then the input plane shifted by a
// constant, one contiguous copy (or add, for col2im) over the output rows that stay inside the
// input, with the few positions that wrap around a row edge zeroed.
bool shifts_plane(const Window2d& w) { return w.sh == 1 && w.sw == 1 && w.OW == w.W; }

struct TapSpan {
  int64_t oh_lo, oh_hi;  // output rows whose input row is inside the input
  int64_t lo, hi;        // output columns likewise
  int64_t shift;         // input index - output index (shifts_plane only)
};

TapSpan tap_span(const Window2d& w, int64_t ki, int64_t kj) {
  TapSpan t;
  const int64_t voff = ki * w.dh - w.ph, off = kj * w.dw - w.pw;
  t.oh_lo = std::clamp<int64_t>(-voff, 0, w.OH);
  t.oh_hi = std::clamp<int64_t>(w.H - voff, t.oh_lo, w.OH);
  valid_columns(off, w, t.lo, t.hi);
  t.shift = voff * w.W + off;
  return t;
}

// Zeroes the wrapped positions (columns outside [lo, hi)) of output rows [oh_lo, oh_hi).
template <class T>
void zero_wrapped(T* row, const TapSpan& t, int64_t W) {
  for (int64_t oh = t.oh_lo; oh < t.oh_hi; ++oh) {
    std::fill(row + oh * W, row + oh * W + t.lo, T(0));
    std::fill(row + oh * W + t.hi, row + (oh + 1) * W, T(0));
  }
}

template <class T>
void im2col_cpu(const T* x, T* col, int64_t C, const Window2d& w) {
  const int64_t ohw = w.OH * w.OW;
  const bool shifted = shifts_plane(w);
  // Channels fill disjoint blocks of rows: chunks of them on the intra-op threads.
  parallel_for(C, units_per_grain(w.kh * w.kw * w.OH * w.OW), [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      const T* xc = x + c * w.H * w.W;
      for (int64_t ki = 0; ki < w.kh; ++ki) {
        for (int64_t kj = 0; kj < w.kw; ++kj) {
          T* row = col + ((c * w.kh + ki) * w.kw + kj) * ohw;
          if (shifted) {
            const TapSpan t = tap_span(w, ki, kj);
            std::fill(row, row + t.oh_lo * w.W, T(0));
            std::fill(row + t.oh_hi * w.W, row + ohw, T(0));
            if (t.oh_lo < t.oh_hi && t.lo < t.hi) {
              const int64_t first = t.oh_lo * w.W + t.lo, last = (t.oh_hi - 1) * w.W + t.hi;
              std::memcpy(row + first, xc + first + t.shift, static_cast<size_t>(last - first) * sizeof(T));
            }
            zero_wrapped(row, t, w.W);
            continue;
          }
          const int64_t off = kj * w.dw - w.pw;
          int64_t lo, hi;
          valid_columns(off, w, lo, hi);
          for (int64_t oh = 0; oh < w.OH; ++oh) {
            T* r = row + oh * w.OW;
            const int64_t ih = oh * w.sh - w.ph + ki * w.dh;
            if (ih < 0 || ih >= w.H) {
              std::fill(r, r + w.OW, T(0));
              continue;
            }
            const T* xr = xc + ih * w.W + off;
            std::fill(r, r + lo, T(0));
            if (w.sw == 1) {
              copy_run(r + lo, xr + lo, hi - lo);
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) r[ow] = xr[ow * w.sw];
            }
            std::fill(r + hi, r + w.OW, T(0));
          }
        }
      }
    }
  });
}

// `col` is scratch: the shifted path zeroes its entries that fall in the padding.
template <class T>
void col2im_cpu(T* col, T* x, int64_t C, const Window2d& w) {
  const int64_t ohw = w.OH * w.OW;
  const bool shifted = shifts_plane(w);
  // Each channel adds into its own input plane only: chunks of channels on the intra-op threads.
  parallel_for(C, units_per_grain(w.kh * w.kw * w.OH * w.OW), [&](int64_t c_begin, int64_t c_end) {
    std::fill(x + c_begin * w.H * w.W, x + c_end * w.H * w.W, T(0));
    for (int64_t c = c_begin; c < c_end; ++c) {
      T* xc = x + c * w.H * w.W;
      for (int64_t ki = 0; ki < w.kh; ++ki) {
        for (int64_t kj = 0; kj < w.kw; ++kj) {
          T* row = col + ((c * w.kh + ki) * w.kw + kj) * ohw;
          if (shifted) {
            const TapSpan t = tap_span(w, ki, kj);
            if (t.oh_lo >= t.oh_hi || t.lo >= t.hi) continue;
            zero_wrapped(row, t, w.W);
            const int64_t first = t.oh_lo * w.W + t.lo, last = (t.oh_hi - 1) * w.W + t.hi;
            T* dst = xc + t.shift;
            for (int64_t d = first; d < last; ++d) dst[d] += row[d];
            continue;
          }
          const int64_t off = kj * w.dw - w.pw;
          int64_t lo, hi;
          valid_columns(off, w, lo, hi);
          for (int64_t oh = 0; oh < w.OH; ++oh) {
            const int64_t ih = oh * w.sh - w.ph + ki * w.dh;
            if (ih < 0 || ih >= w.H) continue;
            const T* r = row + oh * w.OW;
            T* xr = xc + ih * w.W + off;
            if (w.sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) xr[ow] += r[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) xr[ow * w.sw] += r[ow];
            }
          }
        }
      }
    }
  });
}

template <class F>
void dispatch_f32_f64(Dtype d, F&& f) {
  if (d == f32) {
    f(float{});
  } else {
    f(double{});
  }
}

// col (contiguous [n, C kh kw, OH OW]) = im2col of the n samples of x (contiguous) from n0.
void im2col(const Tensor& x, int64_t n0, int64_t n, const Tensor& col, const Conv2dGeometry& g) {
  const Window2d& w = g.win;
  const int64_t per_sample = g.C * w.H * w.W;
  if (!x.is_cpu()) {
    device_table(x, "conv2d").im2col(samples(x, n0, n, per_sample, {g.C, w.H, w.W}), col, n, g.C, w);
    return;
  }
  dispatch_f32_f64(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* xp = static_cast<const T*>(x.data_ptr()) + n0 * per_sample;
    T* cp = static_cast<T*>(col.data_ptr());
    for (int64_t i = 0; i < n; ++i) im2col_cpu(xp + i * per_sample, cp + i * g.col_rows() * g.out_plane(), g.C, w);
  });
}

// The n samples of gx (contiguous) from n0 = col2im of col.
void col2im(const Tensor& col, const Tensor& gx, int64_t n0, int64_t n, const Conv2dGeometry& g) {
  const Window2d& w = g.win;
  const int64_t per_sample = g.C * w.H * w.W;
  if (!gx.is_cpu()) {
    device_table(gx, "conv2d_backward").col2im(col, samples(gx, n0, n, per_sample, {g.C, w.H, w.W}), n, g.C, w);
    return;
  }
  dispatch_f32_f64(gx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* cp = static_cast<T*>(col.data_ptr());
    T* xp = static_cast<T*>(gx.data_ptr()) + n0 * per_sample;
    for (int64_t i = 0; i < n; ++i) col2im_cpu(cp + i * g.col_rows() * g.out_plane(), xp + i * per_sample, g.C, w);
  });
}

// Samples per im2col chunk. The CPU unfolds one sample at a time, so its column matrix (a few
// hundred KiB to a few MiB) is still in cache when the GEMM reads it; a device takes as many as
// fit in 256 MiB, so its strided batched GEMMs are large.
int64_t chunk_samples(const Conv2dGeometry& g, const Tensor& x) {
  if (g.direct()) return std::max<int64_t>(g.N, 1);
  if (x.is_cpu()) return 1;
  const int64_t per_sample = std::max<int64_t>(g.col_rows() * g.out_plane() * static_cast<int64_t>(itemsize(x.dtype())), 1);
  return std::clamp<int64_t>((int64_t{256} << 20) / per_sample, 1, std::max<int64_t>(g.N, 1));
}

// The GEMM operands of one chunk, batch dims [n, groups]: the weight per group as
// [Og, Kg] (shared by the samples), the columns per sample and group as [Kg, OH OW], the
// output (or its gradient) per sample and group as [Og, OH OW].
struct ConvOperands {
  int64_t Og, Kg, ohw;
  Strides w_batch, col_batch, out_batch;
};

ConvOperands conv_operands(const Conv2dGeometry& g) {
  ConvOperands o;
  o.Og = g.O / g.groups;
  o.Kg = g.col_rows() / g.groups;
  o.ohw = g.out_plane();
  o.w_batch = Strides{0, o.Og * o.Kg};
  o.col_batch = Strides{g.col_rows() * o.ohw, o.Kg * o.ohw};
  o.out_batch = Strides{g.O * o.ohw, o.Og * o.ohw};
  return o;
}

// The nb samples' output planes at c (contiguous [nb, O, ohw]) set to their channel's bias.
void fill_bias_cpu(const Tensor& bias, void* c, int64_t nb, int64_t O, int64_t ohw) {
  dispatch_f32_f64(bias.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* b = static_cast<const T*>(bias.data_ptr());
    T* out = static_cast<T*>(c);
    for (int64_t n = 0; n < nb; ++n)
      for (int64_t o = 0; o < O; ++o) std::fill_n(out + (n * O + o) * ohw, ohw, b[o * bias.stride(0)]);
  });
}

// grad_bias[o] = the sum of g[n, o] over n and the plane: a pairwise sum per plane, the planes
// summed in f64.
Tensor bias_grad_cpu(const Tensor& g, int64_t N, int64_t O, int64_t ohw, const char* op) {
  Tensor out = make_empty(Shape{O}, g.dtype(), g.device(), op);
  dispatch_f32_f64(g.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* gp = static_cast<const T*>(g.data_ptr());
    std::vector<double> acc(O, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        const T* plane = gp + (n * O + o) * ohw;
        acc[o] += pairwise_sum<T>(0, ohw, [plane](int64_t i) { return plane[i]; });
      }
    T* op_ = static_cast<T*>(out.data_ptr());
    for (int64_t o = 0; o < O; ++o) op_[o] = static_cast<T>(acc[o]);
  });
  return out;
}

// The CPU computes f16/bf16 convolutions in f32 (converted once each way).
Tensor to_f32(const Tensor& t, const char* op) { return t.defined() ? convert(t, f32, op) : Tensor(); }

}  // namespace

void check_positive(Size2 s, const char* what, const char* op) {
  TANDEM_CHECK(s.h > 0 && s.w > 0, "[{}] {} must be positive, got {}", op, what, s);
}

void check_4d(const Tensor& t, const char* op) {
  TANDEM_CHECK(t.dim() == 4, "[{}] expected input [N, C, H, W] (or [C, H, W]), got {}", op, t.shape());
}

Conv2dGeometry conv2d_geometry(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dArgs& a) {
  const char* op = "conv2d";
  check_floating(input, op);
  TANDEM_CHECK(weight.defined(), "[conv2d] got an undefined weight");
  check_4d(input, op);
  TANDEM_CHECK(weight.dim() == 4, "[conv2d] expected weight [out_channels, in_channels / groups, kh, kw], got {}",
               weight.shape());
  TANDEM_CHECK(weight.dtype() == input.dtype(), "[conv2d] weight has dtype {} but input has {}", weight.dtype(),
               input.dtype());
  check_same_device(op, {{"input", input}, {"weight", weight}});
  check_positive(a.stride, "stride", op);
  check_positive(a.dilation, "dilation", op);
  TANDEM_CHECK(a.padding.h >= 0 && a.padding.w >= 0, "[conv2d] padding must be non-negative, got {}", a.padding);
  TANDEM_CHECK(a.groups > 0, "[conv2d] groups must be positive, got {}", a.groups);
  Conv2dGeometry g;
  g.N = input.size(0);
  g.C = input.size(1);
  g.O = weight.size(0);
  g.groups = a.groups;
  TANDEM_CHECK(g.C % a.groups == 0, "[conv2d] groups {} does not divide the {} input channels of input {}", a.groups,
               g.C, input.shape());
  TANDEM_CHECK(g.O % a.groups == 0, "[conv2d] groups {} does not divide the {} output channels of weight {}",
               a.groups, g.O, weight.shape());
  TANDEM_CHECK(weight.size(1) * a.groups == g.C,
               "[conv2d] input {} has {} channels but weight {} expects {} x groups {}", input.shape(), g.C,
               weight.shape(), weight.size(1), a.groups);
  TANDEM_CHECK(weight.size(2) > 0 && weight.size(3) > 0, "[conv2d] weight {} has an empty kernel", weight.shape());
  if (bias.defined()) {
    TANDEM_CHECK(bias.dtype() == input.dtype(), "[conv2d] bias has dtype {} but input has {}", bias.dtype(),
                 input.dtype());
    check_same_device(op, {{"input", input}, {"bias", bias}});
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == g.O, "[conv2d] bias must have shape [{}] (out_channels of weight {}), got {}",
                 g.O, weight.shape(), bias.shape());
  }
  Window2d& w = g.win;
  w.H = input.size(2);
  w.W = input.size(3);
  w.kh = weight.size(2);
  w.kw = weight.size(3);
  w.sh = a.stride.h;
  w.sw = a.stride.w;
  w.ph = a.padding.h;
  w.pw = a.padding.w;
  w.dh = a.dilation.h;
  w.dw = a.dilation.w;
  const int64_t eh = w.dh * (w.kh - 1) + 1, ew_ = w.dw * (w.kw - 1) + 1;
  TANDEM_CHECK(eh <= w.H + 2 * w.ph && ew_ <= w.W + 2 * w.pw,
               "[conv2d] kernel {}x{} (dilation {}, so {}x{} in effect) is larger than the padded input {}x{} "
               "(input {}, padding {})",
               w.kh, w.kw, a.dilation, eh, ew_, w.H + 2 * w.ph, w.W + 2 * w.pw, input.shape(), a.padding);
  w.OH = (w.H + 2 * w.ph - eh) / w.sh + 1;
  w.OW = (w.W + 2 * w.pw - ew_) / w.sw + 1;
  return g;
}

Tensor conv2d_kernel(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  const char* op = "conv2d";
  const Conv2dGeometry g = conv2d_geometry(input, weight, bias, args);
  if (input.is_cpu() && is_half_precision(input.dtype()))
    return detail::cast(conv2d_kernel(to_f32(input, op), to_f32(weight, op), to_f32(bias, op), args), input.dtype(), op);
  const Tensor x = materialize(input, op), w = materialize(weight, op);
  Tensor out = make_empty(Shape{g.N, g.O, g.win.OH, g.win.OW}, x.dtype(), x.device(), op);
  if (out.numel() == 0) return out;
  if (x.is_cpu() && x.dtype() == f32) {
    const Tensor b = bias.defined() ? materialize(bias, op) : Tensor();
    if (onednn_conv2d_forward(g, static_cast<const float*>(x.data_ptr()), static_cast<const float*>(w.data_ptr()),
                              b.defined() ? static_cast<const float*>(b.data_ptr()) : nullptr,
                              static_cast<float*>(out.data_ptr())))
      return out;
  }
  // Every output plane starts as its channel's bias; the GEMMs add to it (beta = 1). The CPU
  // fills each chunk's planes just before its GEMM, while they are in cache.
  const bool has_bias = bias.defined();
  if (has_bias && !x.is_cpu()) {
    Tensor b = make_view(bias, Shape{g.O, 1, 1}, Strides{bias.stride(0), 0, 0}, bias.storage_offset());
    detail::copy(out, b, op);
  }
  const ConvOperands o = conv_operands(g);
  const int64_t chunk = chunk_samples(g, x);
  Tensor col;
  if (!g.direct()) col = make_empty(Shape{chunk, g.col_rows(), o.ohw}, x.dtype(), x.device(), op);
  const size_t es = itemsize(x.dtype());
  for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.N - n0);
    const void* cols = static_cast<const char*>(x.data_ptr()) + n0 * g.col_rows() * o.ohw * es;
    if (!g.direct()) {
      im2col(x, n0, nb, col, g);
      cols = col.data_ptr();
    }
    MatOperand A{w.data_ptr(), o.w_batch, o.Kg, 1};
    MatOperand B{cols, o.col_batch, o.ohw, 1};
    void* C = static_cast<char*>(out.data_ptr()) + n0 * g.O * o.ohw * es;
    if (has_bias && x.is_cpu()) fill_bias_cpu(bias, C, nb, g.O, o.ohw);
    batched_gemm(x.device(), x.dtype(), Shape{nb, g.groups}, o.Og, o.ohw, o.Kg, A, B, C, o.out_batch,
                 nb * g.O * o.ohw, has_bias, op);
  }
  return out;
}

std::array<Tensor, 3> conv2d_backward_kernel(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                             const Conv2dArgs& args, bool need_input, bool need_weight,
                                             bool need_bias) {
  const char* op = "conv2d_backward";
  const Conv2dGeometry g = conv2d_geometry(input, weight, Tensor(), args);
  const Shape out_shape{g.N, g.O, g.win.OH, g.win.OW};
  TANDEM_CHECK(grad.defined() && grad.shape() == out_shape && grad.dtype() == input.dtype(),
               "[{}] gradient {} {} does not match the output {} {}", op, grad.defined() ? grad.dtype() : input.dtype(),
               grad.defined() ? grad.shape() : Shape{}, input.dtype(), out_shape);
  check_same_device(op, {{"grad", grad}, {"input", input}});
  if (input.is_cpu() && is_half_precision(input.dtype())) {
    auto r = conv2d_backward_kernel(to_f32(grad, op), to_f32(input, op), to_f32(weight, op), args, need_input,
                                    need_weight, need_bias);
    for (Tensor& t : r)
      if (t.defined()) t = detail::cast(t, input.dtype(), op);
    return r;
  }
  std::array<Tensor, 3> out;
  const Tensor gy = materialize(grad, op);
  if (need_bias) {
    out[2] = gy.is_cpu() ? bias_grad_cpu(gy, g.N, g.O, g.out_plane(), op)
                         : sum_kernel(gy, plan_reduction(gy, Shape{0, 2, 3}, false, op));
  }
  if (!need_input && !need_weight) return out;
  const Tensor x = materialize(input, op), w = materialize(weight, op);
  const Device dev = x.device();
  const Dtype dt = x.dtype();
  const ConvOperands o = conv_operands(g);
  Tensor gx, gw;
  if (need_input) gx = make_empty(x.shape(), dt, dev, op);
  if (need_weight) gw = make_empty(w.shape(), dt, dev, op);
  if (g.N == 0 || o.ohw == 0) {
    // No output element: nothing flows back.
    if (gx.defined()) detail::fill(gx, 0, op);
    if (gw.defined()) detail::fill(gw, 0, op);
    return {gx, gw, out[2]};
  }
  if (x.is_cpu() && dt == f32) {
    // oneDNN's direct kernels where they take this geometry; im2col + GEMM for the rest.
    if (onednn_conv2d_backward(g, static_cast<const float*>(gy.data_ptr()), static_cast<const float*>(x.data_ptr()),
                               static_cast<const float*>(w.data_ptr()),
                               need_input ? static_cast<float*>(gx.data_ptr()) : nullptr,
                               need_weight ? static_cast<float*>(gw.data_ptr()) : nullptr))
      return {gx, gw, out[2]};
  }
  const int64_t chunk = chunk_samples(g, x);
  Tensor col;
  if (!g.direct()) col = make_empty(Shape{chunk, g.col_rows(), o.ohw}, dt, dev, op);
  const size_t es = itemsize(dt);
  for (int64_t n0 = 0; n0 < g.N; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.N - n0);
    const Shape batch{nb, g.groups};
    MatOperand G{static_cast<const char*>(gy.data_ptr()) + n0 * g.O * o.ohw * es, o.out_batch, o.ohw, 1};
    const int64_t col_offset = n0 * g.col_rows() * o.ohw * es;  // into x or gx when direct
    if (need_weight) {
      // grad_W[g] (+)= sum over the chunk of g[n, g] col[n, g]^T: [Og, OH OW] x [OH OW, Kg].
      const void* cols = static_cast<const char*>(x.data_ptr()) + col_offset;
      if (!g.direct()) {
        im2col(x, n0, nb, col, g);
        cols = col.data_ptr();
      }
      MatOperand colT{cols, o.col_batch, 1, o.ohw};
      batched_gemm(dev, dt, batch, o.Og, o.Kg, o.ohw, G, colT, gw.data_ptr(), o.w_batch, gw.numel(), n0 > 0, op);
    }
    if (need_input) {
      // col[n, g] = W[g]^T g[n, g]: [Kg, Og] x [Og, OH OW], folded back onto the input.
      MatOperand WT{w.data_ptr(), o.w_batch, 1, o.Kg};
      void* dst = g.direct() ? static_cast<char*>(gx.data_ptr()) + col_offset : col.data_ptr();
      batched_gemm(dev, dt, batch, o.Kg, o.ohw, o.Og, WT, G, dst, o.col_batch, nb * g.col_rows() * o.ohw, false, op);
      if (!g.direct()) col2im(col, gx, n0, nb, g);
    }
  }
  return {gx, gw, out[2]};
}

}  // namespace tandem::detail
