#include "core/detail/nn_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/detail/checks.h"
#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/iter.h"
#include "core/detail/reduce.h"  // pairwise_sum
#include "core/detail/views.h"
#include "core/parallel.h"

namespace tandem::detail {

namespace {

// a viewed as [outer, n, inner] around `dim` (a contiguous).
struct SliceGeometry {
  int64_t outer = 1, n = 1, inner = 1;
};

SliceGeometry slice_geometry(const Shape& s, int64_t dim) {
  SliceGeometry g;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < dim) g.outer *= s[i];
    else if (i == dim) g.n = s[i];
    else g.inner *= s[i];
  }
  return g;
}

template <class T>
using A = acc_t<T>;

NnDeviceKernels& device_table(const Tensor& t, const char* op) { return device_kernels<NnDeviceKernels>(t.device(), op); }

}  // namespace

Tensor softmax_kernel(const Tensor& a_in, int64_t dim, bool log, const char* op) {
  TANDEM_CHECK(a_in.defined(), "[{}] got an undefined tensor", op);
  const int64_t d = wrap_dim(dim, a_in.dim(), op);
  Tensor a = materialize(a_in, op);
  Tensor y = make_empty(a.shape(), a.dtype(), a.device(), op);
  const SliceGeometry sg = slice_geometry(a.shape(), d);
  const int64_t n = sg.n, inner = sg.inner;
  if (!a.is_cpu()) {
    check_floating(a, op);
    if (a.numel() > 0) device_table(a, op).softmax(a, y, sg.outer, n, inner, log);
    return y;
  }
  // Nothing to compute, and the scratch below is sized by a dim, which an empty tensor may have
  // huge ([0, 2^62]): return before allocating it.
  if (a.numel() == 0) {
    check_floating(a, op);
    return y;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    const T* xp = static_cast<const T*>(a.data_ptr());
    T* yp = static_cast<T*>(y.data_ptr());
    const Acc ninf = -std::numeric_limits<Acc>::infinity();
    // Rows (slices) are independent: chunks of them on the intra-op threads, each with its own
    // scratch, the same bits at any thread count.
    const int64_t grain = units_per_grain(n * inner);
    if (inner == 1) {
      parallel_for(sg.outer, grain, [&](int64_t begin, int64_t end) {
        std::vector<Acc> e(n);
        for (int64_t o = begin; o < end; ++o) {
          const T* x = xp + o * n;
          T* out = yp + o * n;
          Acc m = ninf;
          for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<Acc>(x[j]));
          Acc s = 0;
          for (int64_t j = 0; j < n; ++j) {
            e[j] = static_cast<Acc>(x[j]) - m;
            s += std::exp(e[j]);
          }
          if (log) {
            const Acc ls = std::log(s);
            for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(e[j] - ls);
          } else {
            const Acc inv = Acc(1) / s;
            for (int64_t j = 0; j < n; ++j) out[j] = static_cast<T>(std::exp(e[j]) * inv);
          }
        }
      });
      return;
    }
    // Reducing over a non-innermost dim: sweep whole rows of `inner` so memory stays sequential.
    parallel_for(sg.outer, grain, [&](int64_t begin, int64_t end) {
      std::vector<Acc> m(inner), s(inner);
      for (int64_t o = begin; o < end; ++o) {
        const T* x = xp + o * n * inner;
        T* out = yp + o * n * inner;
        std::fill(m.begin(), m.end(), ninf);
        std::fill(s.begin(), s.end(), Acc(0));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < inner; ++i) m[i] = std::max(m[i], static_cast<Acc>(x[j * inner + i]));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < inner; ++i) s[i] += std::exp(static_cast<Acc>(x[j * inner + i]) - m[i]);
        if (log) {
          for (int64_t i = 0; i < inner; ++i) s[i] = m[i] + std::log(s[i]);
          for (int64_t j = 0; j < n; ++j)
            for (int64_t i = 0; i < inner; ++i) out[j * inner + i] = static_cast<T>(static_cast<Acc>(x[j * inner + i]) - s[i]);
        } else {
          for (int64_t i = 0; i < inner; ++i) s[i] = Acc(1) / s[i];
          for (int64_t j = 0; j < n; ++j)
            for (int64_t i = 0; i < inner; ++i)
              out[j * inner + i] = static_cast<T>(std::exp(static_cast<Acc>(x[j * inner + i]) - m[i]) * s[i]);
        }
      }
    });
  });
  return y;
}

Tensor softmax_backward_kernel(const Tensor& g_in, const Tensor& y_in, int64_t dim, bool log, const char* op) {
  check_same_device(op, {{"grad", g_in}, {"output", y_in}});
  const int64_t d = wrap_dim(dim, y_in.dim(), op);
  Tensor g = materialize(g_in, op);
  Tensor y = materialize(y_in, op);
  Tensor gx = make_empty(y.shape(), y.dtype(), y.device(), op);
  const SliceGeometry sg = slice_geometry(y.shape(), d);
  const int64_t n = sg.n, inner = sg.inner;
  if (!y.is_cpu()) {
    check_floating(y, op, "output");
    TANDEM_CHECK(g.dtype() == y.dtype() && g.shape() == y.shape(), "[{}] gradient {} {} does not match output {} {}",
                 op, g.dtype(), g.shape(), y.dtype(), y.shape());
    if (y.numel() > 0) device_table(y, op).softmax_backward(g, y, gx, sg.outer, n, inner, log);
    return gx;
  }
  if (y.numel() == 0) {  // as in the forward: no scratch sized by a dim of an empty tensor
    check_floating(y, op, "output");
    return gx;
  }
  TANDEM_DISPATCH_FLOATING(y.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* yp = static_cast<const T*>(y.data_ptr());
    T* op_ = static_cast<T*>(gx.data_ptr());
    parallel_for(sg.outer, units_per_grain(n * inner), [&](int64_t begin, int64_t end) {
      std::vector<Acc> s(inner);
      for (int64_t o = begin; o < end; ++o) {
        const int64_t base = o * n * inner;
        std::fill(s.begin(), s.end(), Acc(0));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = base + j * inner + i;
            const Acc gk = static_cast<Acc>(gp[k]);
            s[i] += log ? gk : gk * static_cast<Acc>(yp[k]);
          }
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = base + j * inner + i;
            const Acc gk = static_cast<Acc>(gp[k]), yk = static_cast<Acc>(yp[k]);
            op_[k] = static_cast<T>(log ? gk - std::exp(yk) * s[i] : yk * (gk - s[i]));
          }
      }
    });
  });
  return gx;
}

LayerNormForward layer_norm_kernel(const Tensor& x_in, const Shape& ns, const Tensor& weight_in,
                                   const Tensor& bias_in, double eps) {
  const char* op = "layer_norm";
  check_floating(x_in, op);
  TANDEM_CHECK(!ns.empty(), "[layer_norm] normalized_shape must have at least one dim (input {})", x_in.shape());
  const int64_t k = static_cast<int64_t>(ns.size());
  bool match = x_in.dim() >= k;
  for (int64_t i = 0; match && i < k; ++i) match = x_in.size(x_in.dim() - k + i) == ns[i];
  TANDEM_CHECK(match, "[layer_norm] normalized_shape {} does not match the trailing dims of input {}", ns,
               x_in.shape());
  for (const Tensor* p : {&weight_in, &bias_in}) {
    if (!p->defined()) continue;
    const char* what = p == &weight_in ? "weight" : "bias";
    TANDEM_CHECK(p->shape() == ns, "[layer_norm] {} must have shape normalized_shape {}, got {}", what, ns,
                 p->shape());
    TANDEM_CHECK(p->dtype() == x_in.dtype(), "[layer_norm] {} has dtype {} but input has {}", what, p->dtype(),
                 x_in.dtype());
    check_same_device(op, {{"input", x_in}, {what, *p}});
  }
  Tensor x = materialize(x_in, op);
  Tensor w = weight_in.defined() ? materialize(weight_in, op) : Tensor();
  Tensor b = bias_in.defined() ? materialize(bias_in, op) : Tensor();
  const int64_t D = numel_of(ns);
  const int64_t rows = D == 0 ? 0 : x.numel() / D;
  const Dtype stat_dtype = (x.dtype() == f64) ? f64 : f32;
  LayerNormForward r;
  r.y = make_empty(x.shape(), x.dtype(), x.device(), op);
  r.mean = make_empty(Shape{rows}, stat_dtype, x.device(), op);
  r.rstd = make_empty(Shape{rows}, stat_dtype, x.device(), op);
  if (!x.is_cpu()) {
    if (rows > 0) device_table(x, op).layer_norm(x, w, b, eps, rows, D, r);
    return r;
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const T* bp = b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr;
    T* yp = static_cast<T*>(r.y.data_ptr());
    Acc* mp = static_cast<Acc*>(r.mean.data_ptr());
    Acc* rp = static_cast<Acc*>(r.rstd.data_ptr());
    parallel_for(rows, units_per_grain(D), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const T* xr = xp + row * D;
        T* yr = yp + row * D;
        const Acc mean = pairwise_sum<Acc>(0, D, [xr](int64_t j) { return static_cast<Acc>(xr[j]); }) / Acc(D);
        const Acc var = pairwise_sum<Acc>(0, D, [xr, mean](int64_t j) {
                          Acc v = static_cast<Acc>(xr[j]) - mean;
                          return v * v;
                        }) /
                        Acc(D);
        const Acc rstd = Acc(1) / std::sqrt(var + static_cast<Acc>(eps));
        mp[row] = mean;
        rp[row] = rstd;
        for (int64_t j = 0; j < D; ++j) {
          Acc v = (static_cast<Acc>(xr[j]) - mean) * rstd;
          if (wp) v *= static_cast<Acc>(wp[j]);
          if (bp) v += static_cast<Acc>(bp[j]);
          yr[j] = static_cast<T>(v);
        }
      }
    });
  });
  return r;
}

std::array<Tensor, 3> layer_norm_backward_kernel(const Tensor& g_in, const Tensor& x_in, const Tensor& mean,
                                                 const Tensor& rstd, const Tensor& weight_in, const Shape& ns, bool need_x,
                                                 bool need_w, bool need_b) {
  const char* op = "layer_norm_backward";
  check_same_device(op, {{"grad", g_in}, {"input", x_in}, {"mean", mean}, {"rstd", rstd}, {"weight", weight_in}});
  Tensor g = materialize(g_in, op);
  Tensor x = materialize(x_in, op);
  Tensor w = weight_in.defined() ? materialize(weight_in, op) : Tensor();
  const int64_t D = numel_of(ns);
  const int64_t rows = D == 0 ? 0 : x.numel() / D;
  std::array<Tensor, 3> out;
  if (need_x) out[0] = make_empty(x.shape(), x.dtype(), x.device(), op);
  if (need_w) out[1] = make_empty(ns, x.dtype(), x.device(), op);
  if (need_b) out[2] = make_empty(ns, x.dtype(), x.device(), op);
  if (!x.is_cpu()) {
    TANDEM_CHECK(g.dtype() == x.dtype() && g.shape() == x.shape(), "[{}] gradient {} {} does not match input {} {}",
                 op, g.dtype(), g.shape(), x.dtype(), x.shape());
    device_table(x, op).layer_norm_backward(g, x, materialize(mean, op), materialize(rstd, op), w, rows, D, out);
    return out;
  }
  if (rows == 0) {
    // No row: the weight and bias gradients are zeros, and the scratch below, sized by D, is not
    // needed (an empty input's normalized dims may be huge: [0, 2^61] normalized over its last dim).
    for (int k = 1; k < 3; ++k)
      if (out[k].defined() && out[k].numel() > 0) std::memset(out[k].data_ptr(), 0, static_cast<size_t>(out[k].nbytes()));
    return out;
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    const T* gp = static_cast<const T*>(g.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = w.defined() ? static_cast<const T*>(w.data_ptr()) : nullptr;
    const Acc* mp = static_cast<const Acc*>(mean.data_ptr());
    const Acc* rp = static_cast<const Acc*>(rstd.data_ptr());
    T* dx = need_x ? static_cast<T*>(out[0].data_ptr()) : nullptr;
    // Weight/bias gradients sum over rows: accumulate blocks of rows, then the blocks in order, so
    // the rounding error grows with rows / block + block rather than with rows. The blocks of a
    // wave run on the intra-op threads, each into its own partial sums, which are then added in
    // block order: the bits do not depend on the thread count. A wave bounds the partials' memory.
    constexpr int64_t kBlock = 128, kWave = 64;
    const int64_t nw = need_w ? D : 0, nb = need_b ? D : 0;
    std::vector<Acc> dw(nw, Acc(0)), db(nb, Acc(0));
    const int64_t blocks = (rows + kBlock - 1) / kBlock;
    std::vector<Acc> partial(static_cast<size_t>(std::min(blocks, kWave) * (nw + nb)));
    for (int64_t w0 = 0; w0 < blocks; w0 += kWave) {
      const int64_t wave = std::min(kWave, blocks - w0);
      parallel_for(wave, units_per_grain(kBlock * D), [&](int64_t k_begin, int64_t k_end) {
        std::vector<Acc> xhat(D), dy(D);
        for (int64_t k = k_begin; k < k_end; ++k) {
          Acc* bw = partial.data() + k * (nw + nb);
          Acc* bb = bw + nw;
          std::fill(bw, bw + nw + nb, Acc(0));
          const int64_t r0 = (w0 + k) * kBlock, r1 = std::min(rows, r0 + kBlock);
          for (int64_t row = r0; row < r1; ++row) {
            const T* gr = gp + row * D;
            const T* xr = xp + row * D;
            const Acc mu = mp[row], rs = rp[row];
            Acc c1 = 0, c2 = 0;
            for (int64_t j = 0; j < D; ++j) {
              const Acc gj = static_cast<Acc>(gr[j]);
              xhat[j] = (static_cast<Acc>(xr[j]) - mu) * rs;
              dy[j] = wp ? gj * static_cast<Acc>(wp[j]) : gj;
              c1 += dy[j] * xhat[j];
              c2 += dy[j];
              if (need_w) bw[j] += gj * xhat[j];
              if (need_b) bb[j] += gj;
            }
            if (dx) {
              c1 /= Acc(D);
              c2 /= Acc(D);
              T* dr = dx + row * D;
              for (int64_t j = 0; j < D; ++j) dr[j] = static_cast<T>(rs * (dy[j] - c2 - xhat[j] * c1));
            }
          }
        }
      });
      for (int64_t k = 0; k < wave; ++k) {
        const Acc* bw = partial.data() + k * (nw + nb);
        for (int64_t j = 0; j < nw; ++j) dw[j] += bw[j];
        for (int64_t j = 0; j < nb; ++j) db[j] += bw[nw + j];
      }
    }
    if (need_w) {
      T* o = static_cast<T*>(out[1].data_ptr());
      for (int64_t j = 0; j < D; ++j) o[j] = static_cast<T>(dw[j]);
    }
    if (need_b) {
      T* o = static_cast<T*>(out[2].data_ptr());
      for (int64_t j = 0; j < D; ++j) o[j] = static_cast<T>(db[j]);
    }
  });
  return out;
}

std::pair<Tensor, Tensor> dropout_kernel(const Tensor& x, const Tensor& uniform, double p) {
  const char* op = "dropout";
  check_same_device(op, {{"input", x}, {"uniform", uniform}});
  TANDEM_CHECK(uniform.dtype() == f32 && uniform.shape() == x.shape(),
               "[dropout] internal: uniform samples must be f32 of shape {}, got {} {}", x.shape(), uniform.dtype(),
               uniform.shape());
  Tensor out = make_empty(x.shape(), x.dtype(), x.device(), op);
  Tensor mask = make_empty(x.shape(), x.dtype(), x.device(), op);
  if (!x.is_cpu()) {
    check_floating(x, op);
    device_table(x, op).dropout(materialize(x, op), materialize(uniform, op), p, out, mask);
    return {out, mask};
  }
  TANDEM_DISPATCH_FLOATING(x.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    const Acc scale = p < 1 ? static_cast<Acc>(1.0 / (1.0 - p)) : Acc(0);
    const float pf = static_cast<float>(p);
    // Runs on the intra-op threads: for_each_output_run vets operand 0 (out); operand 1 (mask) is
    // written too, and is as fresh, so it also has one writer per element.
    for_each_output_run<4>(x.shape(), {&out, &mask, &x, &uniform}, [&](const StridedRun<4>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        const bool keep = *reinterpret_cast<const float*>(r.ptr[3] + i * r.stride[3]) >= pf;
        const Acc xi = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        // Dropped elements are written as 0, not x * 0, so an inf/NaN input does not leak.
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(keep ? xi * scale : Acc(0));
        *reinterpret_cast<T*>(r.ptr[1] + i * r.stride[1]) = static_cast<T>(keep ? scale : Acc(0));
      }
    });
  });
  return {out, mask};
}

Tensor dropout_backward_kernel(const Tensor& g, const Tensor& mask) {
  const char* op = "dropout_backward";
  check_same_device(op, {{"grad", g}, {"mask", mask}});
  Tensor out = make_empty(mask.shape(), mask.dtype(), mask.device(), op);
  if (!mask.is_cpu()) {
    check_floating(mask, op, "mask");
    TANDEM_CHECK(g.dtype() == mask.dtype(), "[{}] gradient dtype {} does not match {}", op, g.dtype(), mask.dtype());
    Tensor gb = g.shape() == mask.shape() ? g : detail::expand(g, mask.shape());  // core's: records nothing
    device_table(mask, op).dropout_backward(materialize(gb, op), materialize(mask, op), out);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(mask.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = A<T>;
    for_each_output_run<3>(mask.shape(), {&out, &g, &mask}, [&](const StridedRun<3>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        const Acc m = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        const Acc gi = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(m == Acc(0) ? Acc(0) : gi * m);
      }
    });
  });
  return out;
}

CrossEntropyRows cross_entropy_rows_kernel(const Tensor& logits_in, const Tensor& target_in, const Tensor& weight_in,
                                           int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy";
  check_same_device(op, {{"logits", logits_in}, {"target", target_in}, {"weight", weight_in}});
  TANDEM_CHECK(!logits_in.is_cpu(), "[{}] internal: the fused kernel is for device tensors", op);
  TANDEM_CHECK(logits_in.dim() == 2 && target_in.dim() == 1 && target_in.size(0) == logits_in.size(0) &&
                   target_in.dtype() == i64,
               "[{}] internal: fused rows need logits [M, C] and i64 target [M], got {} and {} {}", op,
               logits_in.shape(), target_in.dtype(), target_in.shape());
  check_floating(logits_in, op, "logits");
  const int64_t rows = logits_in.size(0), classes = logits_in.size(1);
  if (weight_in.defined())
    TANDEM_CHECK(weight_in.dtype() == logits_in.dtype() && weight_in.shape() == Shape{classes},
                 "[{}] internal: weight must be {} [{}], got {} {}", op, logits_in.dtype(), classes, weight_in.dtype(),
                 weight_in.shape());
  Tensor logits = materialize(logits_in, op);
  Tensor target = materialize(target_in, op);
  Tensor weight = weight_in.defined() ? materialize(weight_in, op) : Tensor();
  const Dtype stat_dtype = logits.dtype() == f64 ? f64 : f32;
  CrossEntropyRows r;
  r.loss = make_empty(Shape{rows}, logits.dtype(), logits.device(), op);
  r.lse = make_empty(Shape{rows}, stat_dtype, logits.device(), op);
  r.kept = make_empty(Shape{rows}, logits.dtype(), logits.device(), op);
  if (rows > 0) device_table(logits, op).cross_entropy(logits, target, weight, ignore_index, label_smoothing, r);
  return r;
}

Tensor cross_entropy_rows_backward_kernel(const Tensor& g, const Tensor& logits, const Tensor& target,
                                          const Tensor& weight, const Tensor& lse, int64_t ignore_index,
                                          double label_smoothing) {
  const char* op = "cross_entropy_backward";
  check_same_device(op, {{"grad", g}, {"logits", logits}, {"target", target}, {"weight", weight}, {"lse", lse}});
  TANDEM_CHECK(!logits.is_cpu(), "[{}] internal: the fused kernel is for device tensors", op);
  TANDEM_CHECK(g.dtype() == logits.dtype() && g.numel() == logits.size(0),
               "[{}] gradient {} {} does not match the {} rows of logits {}", op, g.dtype(), g.shape(), logits.size(0),
               logits.dtype());
  Tensor out = make_empty(logits.shape(), logits.dtype(), logits.device(), op);
  if (logits.numel() > 0)
    device_table(logits, op).cross_entropy_backward(materialize(g, op), materialize(logits, op),
                                                    materialize(target, op),
                                                    weight.defined() ? materialize(weight, op) : Tensor(),
                                                    materialize(lse, op), ignore_index, label_smoothing, out);
  return out;
}

}  // namespace tandem::detail
