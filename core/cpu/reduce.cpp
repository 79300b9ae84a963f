#include "core/detail/reduce.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "core/detail/checks.h"
#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/iter.h"
#include "core/parallel.h"

namespace tandem::detail {

namespace {

// Sums accumulate integers (and bool) in int64, floats in acc_t (f32 for the 2-byte types).
template <class T>
using sum_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<acc_t<T>>;

template <class Acc, class T>
Acc slice_sum(const T* p, int64_t stride, int64_t n) {
  if (stride == 1) return pairwise_sum<Acc>(0, n, [p](int64_t i) { return static_cast<Acc>(p[i]); });
  return pairwise_sum<Acc>(0, n, [p, stride](int64_t i) { return static_cast<Acc>(p[i * stride]); });
}

// Mean and sum of squared deviations (M2) of load(0 .. n), two pairwise passes over the values
// shifted by the first one. Two passes: no E[x^2] - E[x]^2 cancellation. The shift: on a constant
// slice every x - shift is exactly 0, so the mean is the value itself and M2 exactly 0, which an
// unshifted mean (sum / n) cannot promise: 0.1 + 0.1 + 0.1 over 3 is not 0.1 in f64, and
// [0.1, 0.1, 0.1] had std 1.7e-17. (Welford, the CUDA kernel's scheme, is exact there too, but
// its per-element dependency chain does not vectorise on the CPU, as these passes do.)
template <class Acc>
struct Moments {
  Acc shift;  // the first value
  Acc dm;     // mean - shift
  Acc m2;
  Acc mean() const { return shift + dm; }
};

template <class Acc, class Load>
Moments<Acc> shifted_moments(int64_t n, const Load& load, bool want_m2) {
  if (n == 0) return {Acc(0), std::numeric_limits<Acc>::quiet_NaN(), Acc(0)};
  const Acc shift = load(0);
  const Acc dm = pairwise_sum<Acc>(0, n, [&](int64_t k) { return load(k) - shift; }) / static_cast<Acc>(n);
  if (!want_m2) return {shift, dm, Acc(0)};
  const Acc m2 = pairwise_sum<Acc>(0, n, [&](int64_t k) {
    const Acc d = (load(k) - shift) - dm;
    return d * d;
  });
  return {shift, dm, m2};
}

// want_m2 false: the mean alone (one pass), as var/std's backward needs it.
template <class Acc, class T>
Moments<Acc> slice_moments(const T* p, int64_t stride, int64_t n, bool want_m2 = true) {
  if (stride == 1) return shifted_moments<Acc>(n, [p](int64_t i) { return static_cast<Acc>(p[i]); }, want_m2);
  return shifted_moments<Acc>(n, [p, stride](int64_t i) { return static_cast<Acc>(p[i * stride]); }, want_m2);
}

// Calls fn(out_index, slice_ptr, slice_stride, slice_len) once per output element. The output
// elements are split into chunks over the intra-op threads (about kDefaultGrain input elements a
// chunk); each slice is reduced whole by one call, so the results do not depend on the thread
// count, and fn must only write what belongs to its own out_index.
template <class T, class Fn>
void for_each_slice(const ReducePlan& pl, const Tensor& a, Fn&& fn) {
  if (pl.out_numel == 0) return;
  const T* base = static_cast<const T*>(a.data_ptr());
  if (pl.count == 0) {
    // Empty slices: nothing is read, so nothing is addressed (an empty input's strides may be near
    // INT64_MAX, and stepping by them would overflow).
    for (int64_t o = 0; o < pl.out_numel; ++o) fn(o, base, int64_t{1}, int64_t{0});
    return;
  }
  const size_t no = pl.outer_sizes.size();
  const size_t ni = pl.inner_sizes.size();
  const bool one_d = ni <= 1;
  const int64_t stride = ni == 1 ? pl.inner_strides[0] : 1;
  parallel_for(pl.out_numel, units_per_grain(pl.count), [&](int64_t begin, int64_t end) {
    // std::unique_ptr, not std::vector: vector<bool> has no contiguous data().
    std::unique_ptr<T[]> buf(one_d ? nullptr : new T[static_cast<size_t>(pl.count)]);
    std::vector<int64_t> ctr(no, 0), ictr(ni, 0);
    // The chunk's first slice: `begin` unravelled over the kept dims (row-major).
    int64_t off = 0;
    for (size_t d = no, rest = static_cast<size_t>(begin); d-- > 0;) {
      ctr[d] = static_cast<int64_t>(rest % static_cast<size_t>(pl.outer_sizes[d]));
      rest /= static_cast<size_t>(pl.outer_sizes[d]);
      off += ctr[d] * pl.outer_strides[d];
    }
    for (int64_t o = begin; o < end; ++o) {
      const T* p = base + off;
      if (one_d) {
        fn(o, p, stride, pl.count);
      } else {
        // The reduced dims do not coalesce: gather the slice in row-major order of those dims.
        int64_t ioff = 0;
        std::fill(ictr.begin(), ictr.end(), 0);
        for (int64_t k = 0; k < pl.count; ++k) {
          buf[k] = p[ioff];
          for (size_t d = ni; d-- > 0;) {
            ioff += pl.inner_strides[d];
            if (++ictr[d] < pl.inner_sizes[d]) break;
            ioff -= pl.inner_strides[d] * pl.inner_sizes[d];
            ictr[d] = 0;
          }
        }
        fn(o, static_cast<const T*>(buf.get()), int64_t{1}, pl.count);
      }
      if (o + 1 == end) break;  // the step past the chunk's last slice is never formed
      for (size_t d = no; d-- > 0;) {
        off += pl.outer_strides[d];
        if (++ctr[d] < pl.outer_sizes[d]) break;
        off -= pl.outer_strides[d] * pl.outer_sizes[d];
        ctr[d] = 0;
      }
    }
  });
}

// An empty input's sizes need not have products that fit in int64 (a [3, 0, 2^62] tensor exists): the
// output's element count is checked, since an output that large cannot exist, and the reduced count
// saturates, since it then only matters as "not zero" (the zero dim is kept, so nothing is reduced).
ReducePlan plan_from_mask(const Tensor& a, std::vector<bool> reduced, bool keepdim, const char* op = "reduce") {
  ReducePlan p;
  p.reduced = std::move(reduced);
  p.keepdim = keepdim;
  const Shape& s = a.shape();
  const Strides& st = a.strides();
  std::vector<std::pair<int64_t, int64_t>> inner;  // (size, stride), outermost first
  for (size_t i = 0; i < s.size(); ++i) {
    if (p.reduced[i]) {
      p.keep_shape.push_back(1);
      if (keepdim) p.out_shape.push_back(1);
      if (__builtin_mul_overflow(p.count, s[i], &p.count)) [[unlikely]]
        p.count = std::numeric_limits<int64_t>::max();
      if (s[i] != 1) inner.emplace_back(s[i], st[i]);
    } else {
      p.keep_shape.push_back(s[i]);
      p.out_shape.push_back(s[i]);
      p.out_numel = checked_mul(p.out_numel, s[i], op);
      if (s[i] != 1) {
        p.outer_sizes.push_back(s[i]);
        p.outer_strides.push_back(st[i]);
      }
    }
  }
  // Coalesce reduced dims whose memory is one strided run (keeps row-major order). The products are
  // checked: an empty input's sizes and strides may overflow them, and such dims stay apart.
  for (auto [size, stride] : inner) {
    size_t n = p.inner_sizes.size();
    int64_t span = 0, merged = 0;
    if (n > 0 && !__builtin_mul_overflow(stride, size, &span) && p.inner_strides[n - 1] == span &&
        !__builtin_mul_overflow(p.inner_sizes[n - 1], size, &merged)) {
      p.inner_sizes[n - 1] = merged;
      p.inner_strides[n - 1] = stride;
    } else {
      p.inner_sizes.push_back(size);
      p.inner_strides.push_back(stride);
    }
  }
  return p;
}

template <class T>
T* out_ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Column sums of a rows x cols block (row stride ld) into out, pairwise over the rows (whole
// rows at a time, so the inner loop is a vectorisable row add).
template <class T, class Acc>
void column_sums(const T* __restrict x, int64_t rows, int64_t cols, int64_t ld, Acc* __restrict out) {
  constexpr int64_t kBase = 64;
  if (rows <= kBase) {
    std::fill(out, out + cols, Acc(0));
    for (int64_t r = 0; r < rows; ++r) {
      const T* __restrict row = x + r * ld;
      for (int64_t j = 0; j < cols; ++j) out[j] = wrapping_add<Acc>(out[j], static_cast<Acc>(row[j]));
    }
    return;
  }
  const int64_t half = rows / 2;
  std::vector<Acc> upper(cols);
  column_sums<T, Acc>(x, half, cols, ld, out);
  column_sums<T, Acc>(x + half * ld, rows - half, cols, ld, upper.data());
  for (int64_t j = 0; j < cols; ++j) out[j] = wrapping_add<Acc>(out[j], upper[j]);
}

// Writes sum / divisor of each slice into `out` (contiguous, plan.out_numel elements).
void sum_into(const Tensor& a, const ReducePlan& pl, const Tensor& out, double divisor) {
  TANDEM_DISPATCH_ALL(a.dtype(), "sum", [&] {
    using T = scalar_t;
    using Acc = sum_acc_t<T>;
    using O = std::conditional_t<std::is_integral_v<T>, int64_t, T>;
    O* o = out_ptr<O>(out);
    const Acc div = static_cast<Acc>(divisor);
    auto finish = [&](Acc v) {
      if constexpr (std::is_integral_v<Acc>) {
        return static_cast<O>(v);
      } else {
        return static_cast<O>(divisor == 1 ? v : v / div);
      }
    };
    // Leading dims reduced, trailing kept, contiguous input (bias gradients, sum over the
    // batch): accumulate whole rows at once, in blocks of rows to bound the rounding error.
    const Shape& s = a.shape();
    size_t first_kept = 0;
    while (first_kept < s.size() && pl.reduced[first_kept]) ++first_kept;
    bool prefix = first_kept > 0 && a.is_contiguous();
    for (size_t i = first_kept; i < s.size() && prefix; ++i) prefix = !pl.reduced[i];
    const int64_t cols = pl.out_numel;
    if (prefix && cols > 1 && pl.count > 1) {
      const T* x = static_cast<const T*>(a.data_ptr());
      // Blocks of columns on the intra-op threads: each column's sum is the same whatever the block.
      parallel_for(cols, std::max<int64_t>(16, units_per_grain(pl.count)), [&](int64_t begin, int64_t end) {
        std::vector<Acc> total(end - begin);
        column_sums<T, Acc>(x + begin, pl.count, end - begin, cols, total.data());
        for (int64_t j = begin; j < end; ++j) o[j] = finish(total[j - begin]);
      });
      return;
    }
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      o[i] = finish(slice_sum<Acc>(p, stride, n));
    });
  });
}

template <class T>
bool is_nan(T v) {
  if constexpr (is_float_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

void require_nonempty(const Tensor& a, const ReducePlan& pl, const char* op) {
  TANDEM_CHECK(pl.count > 0 || pl.out_numel == 0,
               "[{}] cannot reduce over an empty set of elements (input shape {}); the result has no identity", op,
               a.shape());
}

ReduceDeviceKernels& device_table(const Tensor& t, const char* op) {
  return device_kernels<ReduceDeviceKernels>(t.device(), op);
}

}  // namespace

ReducePlan plan_reduction(const Tensor& a, const Shape& dims, bool keepdim, const char* op) {
  const int64_t nd = a.dim();
  std::vector<bool> reduced(nd, dims.empty());
  std::vector<bool> seen(std::max<int64_t>(nd, 1), false);
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, nd, op);
    TANDEM_CHECK(!seen[w], "[{}] dim {} appears more than once in dims {}", op, w, dims);
    seen[w] = true;
    if (nd > 0) reduced[w] = true;
  }
  return plan_from_mask(a, std::move(reduced), keepdim, op);
}

ReducePlan plan_full_reduction(const Tensor& a, const char* op) {
  return plan_from_mask(a, std::vector<bool>(a.dim(), true), false, op);
}

ReducePlan replan(const Tensor& t, const ReducePlan& like) { return plan_from_mask(t, like.reduced, like.keepdim); }

Tensor keepdim_view(const Tensor& r, const ReducePlan& pl) {
  const size_t nd = pl.keep_shape.size();
  if (static_cast<size_t>(r.dim()) == nd) return r;
  Strides st(nd, 0);
  size_t j = 0;
  for (size_t i = 0; i < nd; ++i) {
    if (!pl.reduced[i]) st[i] = r.strides()[j++];
  }
  return make_view(r, pl.keep_shape, st, r.storage_offset());
}

Dtype sum_dtype(Dtype in) { return is_integral(in, /*include_bool=*/true) ? i64 : in; }

Tensor sum_kernel(const Tensor& a, const ReducePlan& pl) {
  TANDEM_CHECK(a.defined(), "[sum] got an undefined tensor");
  Tensor out = make_empty(pl.out_shape, sum_dtype(a.dtype()), a.device(), "sum");
  if (!a.is_cpu()) {
    device_table(a, "sum").reduce(ReduceOp::sum, a, pl, out, 0);
    return out;
  }
  sum_into(a, pl, out, 1.0);
  return out;
}

Tensor mean_kernel(const Tensor& a, const ReducePlan& pl) {
  TANDEM_CHECK(a.defined(), "[mean] got an undefined tensor");
  check_floating(a, "mean");
  Tensor out = make_empty(pl.out_shape, a.dtype(), a.device(), "mean");
  if (!a.is_cpu()) {
    device_table(a, "mean").reduce(ReduceOp::mean, a, pl, out, 0);
    return out;
  }
  sum_into(a, pl, out, static_cast<double>(pl.count));
  return out;
}

Tensor sum_to_shape(const Tensor& g, const Shape& shape, const char* op) {
  const Shape& gs = g.shape();
  if (gs == shape) return g;
  TANDEM_CHECK(gs.size() >= shape.size(), "[{}] cannot sum a tensor of shape {} to shape {}", op, gs, shape);
  const size_t lead = gs.size() - shape.size();
  std::vector<bool> reduced(gs.size(), false);
  bool any = false;
  for (size_t i = 0; i < gs.size(); ++i) {
    if (i < lead) {
      reduced[i] = true;
    } else if (shape[i - lead] != gs[i]) {
      TANDEM_CHECK(shape[i - lead] == 1, "[{}] cannot sum a tensor of shape {} to shape {}", op, gs, shape);
      reduced[i] = true;
    }
    any = any || reduced[i];
  }
  ReducePlan pl = plan_from_mask(g, std::move(reduced), true);
  // Keepdim order with the leading dims dropped is exactly `shape`'s contiguous order.
  Tensor out = make_empty(shape, sum_dtype(g.dtype()), g.device(), op);
  if (any) {
    if (!g.is_cpu()) {
      device_table(g, op).reduce(ReduceOp::sum, g, pl, out, 0);
    } else {
      sum_into(g, pl, out, 1.0);
    }
  } else {
    out = materialize(make_view(g, shape, Strides(std::vector<int64_t>(g.strides().begin() + lead, g.strides().end())),
                                g.storage_offset()),
                      op);
  }
  return out;
}

Tensor extreme_kernel(const Tensor& a, const ReducePlan& pl, Extreme which, const char* op) {
  TANDEM_CHECK(a.defined(), "[{}] got an undefined tensor", op);
  require_nonempty(a, pl, op);
  Tensor out = make_empty(pl.out_shape, a.dtype(), a.device(), op);
  if (!a.is_cpu()) {
    device_table(a, op).reduce(which == Extreme::max ? ReduceOp::amax : ReduceOp::amin, a, pl, out, 0);
    return out;
  }
  TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    T* o = out_ptr<T>(out);
    auto run = [&](auto is_max) {
      // Branch-free select so the loop vectorises; a NaN, once taken, is never replaced
      // (every comparison with it is false), which is how NaN propagates.
      auto pick = [](Acc best, Acc v) {
        if constexpr (decltype(is_max)::value) {
          return (v > best || is_nan(v)) ? v : best;
        } else {
          return (v < best || is_nan(v)) ? v : best;
        }
      };
      for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
        Acc best = static_cast<Acc>(p[0]);
        if (stride == 1) {
          // Eight independent lanes break the loop-carried dependency (max is order-free).
          Acc lane[8];
          for (int k = 0; k < 8; ++k) lane[k] = best;
          int64_t k = 1;
          for (; k + 8 <= n; k += 8)
            for (int l = 0; l < 8; ++l) lane[l] = pick(lane[l], static_cast<Acc>(p[k + l]));
          for (; k < n; ++k) best = pick(best, static_cast<Acc>(p[k]));
          for (int l = 0; l < 8; ++l) best = pick(best, lane[l]);
        } else {
          for (int64_t k = 1; k < n; ++k) best = pick(best, static_cast<Acc>(p[k * stride]));
        }
        o[i] = static_cast<T>(best);
      });
    };
    if (which == Extreme::max) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  });
  return out;
}

std::pair<Tensor, Tensor> extreme_with_index_kernel(const Tensor& a, const ReducePlan& pl, Extreme which,
                                                    bool want_values, const char* op) {
  TANDEM_CHECK(a.defined(), "[{}] got an undefined tensor", op);
  require_nonempty(a, pl, op);
  Tensor values = want_values ? make_empty(pl.out_shape, a.dtype(), a.device(), op) : Tensor();
  Tensor indices = make_empty(pl.out_shape, i64, a.device(), op);
  if (!a.is_cpu()) {
    device_table(a, op).extreme_with_index(a, pl, which, values, indices);
    return {values, indices};
  }
  TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    T* vo = want_values ? out_ptr<T>(values) : nullptr;
    int64_t* io = out_ptr<int64_t>(indices);
    const bool is_max = which == Extreme::max;
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      Acc best = static_cast<Acc>(p[0]);
      int64_t arg = 0;
      if (!is_nan(best)) {
        for (int64_t k = 1; k < n; ++k) {
          Acc v = static_cast<Acc>(p[k * stride]);
          if (is_nan(v)) {
            best = v;
            arg = k;
            break;
          }
          if (is_max ? v > best : v < best) {
            best = v;
            arg = k;
          }
        }
      }
      if (vo) vo[i] = static_cast<T>(best);
      io[i] = arg;
    });
  });
  return {values, indices};
}

Tensor var_kernel(const Tensor& a, const ReducePlan& pl, int64_t correction, bool take_sqrt) {
  const char* op = take_sqrt ? "std" : "var";
  TANDEM_CHECK(a.defined(), "[{}] got an undefined tensor", op);
  check_floating(a, op);
  Tensor out = make_empty(pl.out_shape, a.dtype(), a.device(), op);
  if (!a.is_cpu()) {
    device_table(a, op).reduce(take_sqrt ? ReduceOp::std : ReduceOp::var, a, pl, out, correction);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    T* o = out_ptr<T>(out);
    const Acc denom = static_cast<Acc>(pl.var_denominator(correction));
    // Exactly 0 on a constant slice (see shifted_moments). N - correction <= 0 divides by 0
    // (NaN, or inf), as PyTorch's forward does.
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      Acc v = slice_moments<Acc>(p, stride, n).m2 / denom;
      o[i] = static_cast<T>(take_sqrt ? std::sqrt(v) : v);
    });
  });
  return out;
}

Tensor logsumexp_kernel(const Tensor& a, const ReducePlan& pl) {
  TANDEM_CHECK(a.defined(), "[logsumexp] got an undefined tensor");
  check_floating(a, "logsumexp");
  Tensor out = make_empty(pl.out_shape, a.dtype(), a.device(), "logsumexp");
  if (!a.is_cpu()) {
    device_table(a, "logsumexp").reduce(ReduceOp::logsumexp, a, pl, out, 0);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), "logsumexp", [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    T* o = out_ptr<T>(out);
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      Acc m = -std::numeric_limits<Acc>::infinity();
      for (int64_t k = 0; k < n; ++k) {
        Acc v = static_cast<Acc>(p[k * stride]);
        if (v != v) {
          m = v;
          break;
        }
        m = std::max(m, v);
      }
      // Shifting by the max keeps exp() in range; an infinite (or NaN) max is the answer itself.
      if (!std::isfinite(m)) {
        o[i] = static_cast<T>(m);
        return;
      }
      Acc s = pairwise_sum<Acc>(0, n, [&](int64_t k) { return std::exp(static_cast<Acc>(p[k * stride]) - m); });
      o[i] = static_cast<T>(m + std::log(s));
    });
  });
  return out;
}

Tensor norm_kernel(const Tensor& a, const ReducePlan& pl) {
  TANDEM_CHECK(a.defined(), "[norm] got an undefined tensor");
  check_floating(a, "norm");
  Tensor out = make_empty(pl.out_shape, a.dtype(), a.device(), "norm");
  if (!a.is_cpu()) {
    device_table(a, "norm").reduce(ReduceOp::norm, a, pl, out, 0);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), "norm", [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    T* o = out_ptr<T>(out);
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      Acc s = pairwise_sum<Acc>(0, n, [&](int64_t k) {
        Acc v = static_cast<Acc>(p[k * stride]);
        return v * v;
      });
      o[i] = static_cast<T>(std::sqrt(s));
    });
  });
  return out;
}

// ---- backward kernels ----

Tensor expand_grad(const Tensor& g, const ReducePlan& pl, const Shape& in_shape, double scale) {
  TANDEM_CHECK(g.defined(), "[sum_backward] got an undefined tensor");
  Tensor gv = keepdim_view(g, pl);
  Tensor out = make_empty(in_shape, g.dtype(), g.device(), "sum_backward");
  if (!g.is_cpu()) {
    check_floating(g, "sum_backward", "grad");
    device_table(g, "sum_backward").pointwise_grad(ReduceGradOp::scale, out, gv, Tensor(), Tensor(), scale);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(g.dtype(), "sum_backward", [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    const Acc sc = static_cast<Acc>(scale);
    for_each_run<2>(in_shape, {&out, &gv}, [&](const StridedRun<2>& r) {
      char* d = r.ptr[0];
      const char* s = r.ptr[1];
      for (int64_t i = 0; i < r.n; ++i, d += r.stride[0], s += r.stride[1])
        *reinterpret_cast<T*>(d) = static_cast<T>(static_cast<Acc>(*reinterpret_cast<const T*>(s)) * sc);
    });
  });
  return out;
}

Tensor extreme_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& pl) {
  check_same_device("amax_backward", {{"grad", g}, {"input", a}, {"result", result}});
  Tensor rv = keepdim_view(result, pl);
  Tensor gv = keepdim_view(g, pl);
  Tensor mask = make_empty(a.shape(), a.dtype(), a.device(), "amax_backward");
  if (!a.is_cpu()) {
    check_floating(a, "amax_backward");
    ReduceDeviceKernels& k = device_table(a, "amax_backward");
    k.pointwise_grad(ReduceGradOp::extreme_mask, mask, a, rv, Tensor(), 0);
    ReducePlan mp = replan(mask, pl);
    Tensor cnt = sum_kernel(mask, mp);
    k.pointwise_grad(ReduceGradOp::extreme_split, mask, mask, gv, keepdim_view(cnt, mp), 0);
    return mask;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), "amax_backward", [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    for_each_run<3>(a.shape(), {&mask, &a, &rv}, [&](const StridedRun<3>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        Acc x = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        Acc m = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        bool hit = x == m || (x != x && m != m);
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(hit ? Acc(1) : Acc(0));
      }
    });
    ReducePlan mp = replan(mask, pl);
    Tensor cnt = sum_kernel(mask, mp);
    Tensor cv = keepdim_view(cnt, mp);
    for_each_run<3>(a.shape(), {&mask, &gv, &cv}, [&](const StridedRun<3>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        T* m = reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]);
        Acc gi = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        Acc c = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        *m = static_cast<T>(static_cast<Acc>(*m) != Acc(0) ? gi / c : Acc(0));
      }
    });
  });
  return mask;
}

Tensor index_grad(const Tensor& g, const Tensor& indices, const ReducePlan& pl, const Shape& in_shape, int64_t dim) {
  check_same_device("max_backward", {{"grad", g}, {"indices", indices}});
  Tensor out = make_empty(in_shape, g.dtype(), g.device(), "max_backward");
  Tensor gv = keepdim_view(g, pl);
  Tensor iv = keepdim_view(indices, pl);
  Tensor ov = make_view(out, pl.keep_shape, out.strides(), 0);
  const int64_t dim_stride = in_shape.empty() ? 0 : out.strides()[dim];
  if (!g.is_cpu()) {
    check_floating(g, "max_backward", "grad");
    device_table(g, "max_backward").index_grad(out, ov, gv, iv, dim_stride);
    return out;
  }
  if (out.numel() == 0) return out;  // nothing is scattered (the address rule, core/shape.h)
  std::memset(out.data_ptr(), 0, out.nbytes());  // all-zero bits are 0.0 in every float type
  TANDEM_DISPATCH_FLOATING(g.dtype(), "max_backward", [&] {
    using T = scalar_t;
    const int64_t sb = in_shape.empty() ? 0 : dim_step_bytes(out, dim);
    for_each_run<3>(pl.keep_shape, {&ov, &gv, &iv}, [&](const StridedRun<3>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        int64_t idx = *reinterpret_cast<const int64_t*>(r.ptr[2] + i * r.stride[2]);
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0] + idx * sb) =
            *reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]);
      }
    });
  });
  return out;
}

Tensor var_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& pl, int64_t correction,
                bool is_std) {
  const char* op = is_std ? "std_backward" : "var_backward";
  check_same_device(op, {{"grad", g}, {"input", a}, {"result", result}});
  Tensor mean = make_empty(pl.out_shape, a.dtype(), a.device(), op);
  Tensor factor = make_empty(pl.out_shape, a.dtype(), a.device(), op);
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  if (!a.is_cpu()) {
    check_floating(a, op);
    ReduceDeviceKernels& k = device_table(a, op);
    k.reduce(ReduceOp::mean, a, pl, mean, 0);
    const double denom = pl.var_denominator(correction);
    if (is_std) {
      k.pointwise_grad(ReduceGradOp::std_factor, factor, g, result, Tensor(), denom);
    } else {
      k.pointwise_grad(ReduceGradOp::var_factor, factor, g, Tensor(), Tensor(), denom);
    }
    k.pointwise_grad(ReduceGradOp::center_scale, out, a, keepdim_view(mean, pl), keepdim_view(factor, pl), 0);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    // The forward's mean, so x - mean is exactly 0 on a constant slice.
    T* mo = out_ptr<T>(mean);
    for_each_slice<T>(pl, a, [&](int64_t i, const T* p, int64_t stride, int64_t n) {
      mo[i] = static_cast<T>(slice_moments<Acc>(p, stride, n, /*want_m2=*/false).mean());
    });
    const Acc denom = static_cast<Acc>(pl.var_denominator(correction));
    for_each_run<3>(pl.out_shape, {&factor, &g, &result}, [&](const StridedRun<3>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        Acc gi = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        Acc res = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        // Where std is 0 the slice is constant and its gradient 0 (PyTorch masks it the same
        // way); g / (denom * 0) * 0 would be NaN.
        Acc f = is_std ? (res == Acc(0) ? Acc(0) : gi / (denom * res)) : gi * Acc(2) / denom;
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(f);
      }
    });
    Tensor mv = keepdim_view(mean, pl);
    Tensor fv = keepdim_view(factor, pl);
    for_each_run<4>(a.shape(), {&out, &a, &mv, &fv}, [&](const StridedRun<4>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        Acc x = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        Acc m = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        Acc f = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[3] + i * r.stride[3]));
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(f * (x - m));
      }
    });
  });
  return out;
}

namespace {
// out = f(x, result, g) elementwise over a's shape, result and g broadcast over reduced dims.
template <class F>
Tensor pointwise_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& pl, const char* op,
                      ReduceGradOp device_op, F f) {
  check_same_device(op, {{"grad", g}, {"input", a}, {"result", result}});
  Tensor rv = keepdim_view(result, pl);
  Tensor gv = keepdim_view(g, pl);
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  if (!a.is_cpu()) {
    check_floating(a, op);
    device_table(a, op).pointwise_grad(device_op, out, a, rv, gv, 0);
    return out;
  }
  TANDEM_DISPATCH_FLOATING(a.dtype(), op, [&] {
    using T = scalar_t;
    using Acc = acc_t<T>;
    for_each_run<4>(a.shape(), {&out, &a, &rv, &gv}, [&](const StridedRun<4>& r) {
      for (int64_t i = 0; i < r.n; ++i) {
        Acc x = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[1] + i * r.stride[1]));
        Acc res = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[2] + i * r.stride[2]));
        Acc gi = static_cast<Acc>(*reinterpret_cast<const T*>(r.ptr[3] + i * r.stride[3]));
        *reinterpret_cast<T*>(r.ptr[0] + i * r.stride[0]) = static_cast<T>(f(x, res, gi));
      }
    });
  });
  return out;
}
}  // namespace

Tensor logsumexp_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& pl) {
  return pointwise_grad(g, a, result, pl, "logsumexp_backward", ReduceGradOp::logsumexp,
                        [](auto x, auto res, auto gi) { return gi * std::exp(x - res); });
}

Tensor norm_grad(const Tensor& g, const Tensor& a, const Tensor& result, const ReducePlan& pl) {
  return pointwise_grad(g, a, result, pl, "norm_backward", ReduceGradOp::norm, [](auto x, auto res, auto gi) {
    using Acc = decltype(x);
    return res == Acc(0) ? Acc(0) : gi * x / res;
  });
}

}  // namespace tandem::detail
