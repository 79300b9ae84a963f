// Tensor::str() (PyTorch's layout: nesting, aligned columns, 4 decimals or scientific notation,
// "..." summaries, 80-column wrapping) and the whole-tensor comparisons equal / allclose.
#include "core/print.h"

#include <atomic>
#include <cmath>

#include "core/detail/iter.h"
#include "core/detail/copy.h"  // to_device

namespace tandem {

namespace {

constexpr int64_t kSummarizeThreshold = 1000;  // PyTorch's print threshold
constexpr int64_t kEdgeItems = 3;
constexpr size_t kLineWidth = 80;

std::atomic<StrSuffixProvider> suffix_provider{nullptr};

double read_double(const char* p, Dtype d) {
  switch (d) {
    case f32: return *reinterpret_cast<const float*>(p);
    case f64: return *reinterpret_cast<const double*>(p);
    case f16: return static_cast<float>(*reinterpret_cast<const Half*>(p));
    case bf16: return static_cast<float>(*reinterpret_cast<const BFloat16*>(p));
    case i32: return *reinterpret_cast<const int32_t*>(p);
    case i64: return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case boolean: return *reinterpret_cast<const bool*>(p) ? 1.0 : 0.0;
  }
  return 0;
}

int64_t read_int(const char* p, Dtype d) {
  switch (d) {
    case i32: return *reinterpret_cast<const int32_t*>(p);
    case i64: return *reinterpret_cast<const int64_t*>(p);
    case boolean: return *reinterpret_cast<const bool*>(p) ? 1 : 0;
    default: return static_cast<int64_t>(read_double(p, d));
  }
}

// How every element of one tensor is written: one style and one width for all, so columns line
// up.
class ElementFormatter {
 public:
  ElementFormatter(Dtype dtype, const std::vector<double>& shown) : dtype_(dtype) {
    if (is_floating(dtype)) {
      double lo = INFINITY, hi = 0;
      for (double v : shown) {
        if (!std::isfinite(v) || v == 0) continue;
        lo = std::min(lo, std::abs(v));
        hi = std::max(hi, std::abs(v));
      }
      // PyTorch's rule: switch to scientific notation when fixed point would hide digits.
      if (hi > 0) sci_ = hi / lo > 1000.0 || hi > 1.0e8 || lo < 1.0e-4;
    }
    for (double v : shown) width_ = std::max(width_, raw_format(v).size());
  }

  size_t width() const { return width_; }
  std::string format(double v) const {
    std::string s = raw_format(v);
    return std::string(width_ - std::min(width_, s.size()), ' ') + s;
  }
  std::string format_int(int64_t v) const {  // i64 beyond 2^53 keeps its digits
    std::string s = fmt::format("{}", v);
    return std::string(width_ - std::min(width_, s.size()), ' ') + s;
  }

 private:
  std::string raw_format(double v) const {
    if (dtype_ == boolean) return v != 0 ? "True" : "False";
    if (!is_floating(dtype_)) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return sci_ ? fmt::format("{:.4e}", v) : fmt::format("{:.4f}", v);
  }
  Dtype dtype_;
  bool sci_ = false;
  size_t width_ = 0;
};

class Printer {
 public:
  explicit Printer(const Tensor& t) : t_(t), base_(static_cast<const char*>(t.data_ptr())) {
    summarize_ = t.numel() > kSummarizeThreshold;
    std::vector<double> shown;
    collect(0, 0, shown);
    fmt_.emplace(t.dtype(), shown);
  }

  std::string body(size_t indent) const {
    if (t_.dim() == 0) return element(0);
    return nested(0, 0, indent);
  }

 private:
  // Indices shown along a dim of size n; -1 marks the "..." gap.
  std::vector<int64_t> shown_indices(int64_t n) const {
    std::vector<int64_t> idx;
    if (summarize_ && n > 2 * kEdgeItems) {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }

  const char* at(int64_t elem_offset) const {
    return base_ + elem_offset * static_cast<int64_t>(t_.element_size());
  }

  void collect(int64_t d, int64_t off, std::vector<double>& out) const {
    if (d == t_.dim()) {
      out.push_back(read_double(at(off), t_.dtype()));
      return;
    }
    for (int64_t i : shown_indices(t_.shape()[d]))
      if (i >= 0) collect(d + 1, off + i * t_.strides()[d], out);
  }

  std::string element(int64_t off) const {
    if (t_.dtype() == i64 || t_.dtype() == i32) return fmt_->format_int(read_int(at(off), t_.dtype()));
    return fmt_->format(read_double(at(off), t_.dtype()));
  }

  std::string nested(int64_t d, int64_t off, size_t indent) const {
    const int64_t nd = t_.dim();
    const auto idx = shown_indices(t_.shape()[d]);
    const int64_t stride = t_.strides()[d];
    std::string out = "[";
    if (d == nd - 1) {
      // One line holds as many elements as fit in the line width after the indent.
      const size_t per_line = std::max<size_t>(1, (kLineWidth - std::min(kLineWidth, indent)) / (fmt_->width() + 2));
      for (size_t k = 0; k < idx.size(); ++k) {
        // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) about
        // `"," + std::string(...)`, which inserts at the front of a temporary.
        if (k > 0 && k % per_line == 0) {
          out += ",\n";
          out.append(indent + 1, ' ');
        } else if (k > 0) {
          out += ", ";
        }
        out += idx[k] < 0 ? " ..." : element(off + idx[k] * stride);
      }
    } else {
      std::string sep = ",";
      sep.append(static_cast<size_t>(nd - d - 1), '\n');
      sep.append(indent + 1, ' ');
      for (size_t k = 0; k < idx.size(); ++k) {
        if (k > 0) out += sep;
        out += idx[k] < 0 ? "..." : nested(d + 1, off + idx[k] * stride, indent + 1);
      }
    }
    return out + "]";
  }

  const Tensor& t_;
  const char* base_;
  bool summarize_ = false;
  std::optional<ElementFormatter> fmt_;
};

}  // namespace

void set_str_suffix_provider(StrSuffixProvider provider) { suffix_provider.store(provider); }

std::string format_tensor(const Tensor& t, const std::vector<std::string>& extra_suffixes) {
  if (!t.defined()) return "tensor(undefined)";
  const std::string prefix = "tensor(";
  const size_t indent = prefix.size();
  Tensor c = detail::to_device(t, kCPU);
  std::vector<std::string> suffixes;
  std::string s = prefix;
  if (c.numel() == 0) {
    s += "[]";
    if (c.dim() != 1) suffixes.push_back(fmt::format("size={}", c.shape()));
  } else {
    s += Printer(c).body(indent);
  }
  if (!t.is_cpu()) suffixes.push_back(fmt::format("device={}", t.device()));
  if (t.dtype() != f32 && t.dtype() != i64 && t.dtype() != boolean) suffixes.push_back(fmt::format("dtype={}", t.dtype()));
  suffixes.insert(suffixes.end(), extra_suffixes.begin(), extra_suffixes.end());
  // Each suffix goes on the last line unless that would pass the line width (PyTorch's rule,
  // including its way of measuring the last line).
  size_t nl = s.rfind('\n');
  size_t last_line = nl == std::string::npos ? s.size() + 2 : s.size() - nl + 1;
  for (const auto& suffix : suffixes) {
    if (last_line + suffix.size() + 2 > kLineWidth) {
      s += ",\n" + std::string(indent, ' ') + suffix;
      last_line = indent + suffix.size();
    } else {
      s += ", " + suffix;
      last_line += suffix.size() + 2;
    }
  }
  return s + ")";
}

std::string Tensor::str() const {
  std::vector<std::string> extra;
  if (StrSuffixProvider p = suffix_provider.load(); p && defined()) extra = p(*this);
  return format_tensor(*this, extra);
}

namespace {
// Calls f(pa, pb) for each pair of elements of a and b broadcast to `shape` (CPU copies).
template <class F>
void zip_elements(const Tensor& a, const Tensor& b, const Shape& shape, F&& f) {
  for_each_run<2>(shape, {&a, &b}, [&](const StridedRun<2>& r) {
    const char* pa = r.ptr[0];
    const char* pb = r.ptr[1];
    for (int64_t i = 0; i < r.n; ++i, pa += r.stride[0], pb += r.stride[1]) f(pa, pb);
  });
}
}  // namespace

bool equal(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), "[equal] undefined tensor");
  if (!(a.shape() == b.shape())) return false;
  Tensor ca = detail::to_device(a, kCPU), cb = detail::to_device(b, kCPU);
  const Dtype da = a.dtype(), db = b.dtype();
  bool same = true;
  // Integers are compared as integers: doubles would merge i64 values beyond 2^53.
  if (!is_floating(da) && !is_floating(db)) {
    zip_elements(ca, cb, a.shape(), [&](const char* x, const char* y) { same &= read_int(x, da) == read_int(y, db); });
  } else {
    zip_elements(ca, cb, a.shape(), [&](const char* x, const char* y) { same &= read_double(x, da) == read_double(y, db); });
  }
  return same;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  TANDEM_CHECK(a.defined() && b.defined(), "[allclose] undefined tensor");
  TANDEM_CHECK(rtol >= 0 && atol >= 0, "[allclose] rtol and atol must be non-negative, got rtol={} atol={}", rtol, atol);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "allclose");
  Tensor ca = detail::to_device(a, kCPU), cb = detail::to_device(b, kCPU);
  const Dtype da = a.dtype(), db = b.dtype();
  bool close = true;
  zip_elements(ca, cb, shape, [&](const char* px, const char* py) {
    double x = read_double(px, da), y = read_double(py, db);
    // Equal values (infinities included) are close; NaN is close to nothing.
    close &= x == y || (std::isfinite(x) && std::isfinite(y) && std::abs(x - y) <= atol + rtol * std::abs(y));
  });
  return close;
}

bool Tensor::equal(const Tensor& o) const { return tandem::equal(*this, o); }
bool Tensor::allclose(const Tensor& o, double rtol, double atol) const { return tandem::allclose(*this, o, rtol, atol); }

}  // namespace tandem
