// libFuzzer target: sequences of tensor ops chosen by the input bytes.
//
// The bytes are a small program: each step reads an opcode byte, then the bytes its arguments
// need (a reader past the end yields zeros). Ops work on a stack of at most kSlots live tensors
// (created here, some requiring grad) and push their results; arguments are often invalid on
// purpose (dims out of range, mismatched shapes, wrong dtypes, indices out of bounds, huge or
// negative sizes). Every call must end in a result or a tandem::Error: only tandem::Error is
// caught, so anything else escaping (std::out_of_range, std::bad_alloc, ...) terminates the run
// and is a finding, as is a crash or a sanitizer report. At the end the newest floating tensor
// that requires grad is summed and backpropagated, and every leaf's gradient must have the
// leaf's shape and dtype.
//
// Sizes are bounded so an input runs in well under a millisecond: created tensors have at most
// kMaxNumel elements, results above it are dropped, and ops whose output could grow past that
// (broadcasting, matmul, index_select, embedding) are skipped when it would. Creation ops also
// get huge and negative shapes directly, where the library must throw: negative sizes, element
// counts or byte counts that overflow, and allocations above 1 GiB (which fail under the ASan
// options of fuzz_common.h). The fuzzer computes the right answer itself and traps when the
// library accepts a shape it should refuse; shapes between kMaxNumel elements and 1 GiB, which
// would really be allocated, are skipped.
//
// The opcodes are Program::one's case labels; tools/fuzz/make_seeds.py writes seed programs in
// this encoding. FUZZ_TRACE=1 in the environment prints each step's op and outcome.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "fuzz_ops_common.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem_fuzz;

namespace {

constexpr int64_t kMaxNumel = 4096;
constexpr size_t kSlots = 8;
constexpr int kMaxSteps = 48;

// A finding the sanitizers cannot see: the library accepted what it must refuse, or returned a
// result that breaks its own contract.
#define FUZZ_EXPECT(cond)                                                 \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "fuzz_ops: expectation failed: %s (%s:%d)\n", #cond, \
              __FILE__, __LINE__);                                        \
      std::abort();                                                       \
    }                                                                     \
  } while (0)

class Program {
 public:
  explicit Program(Bytes& in) : in_(in) {}

  void run() {
    for (int step = 0; step < kMaxSteps && !in_.empty(); ++step) {
      uint8_t op = in_.u8();
      size_t pushed = pushes_;
      try {
        if (no_grad_next_) {
          no_grad_next_ = false;
          NoGradGuard guard;
          one(op);
        } else {
          one(op);
        }
        if (trace) {
          fprintf(stderr, "step %d: op %d ok", step, op % 52);
          if (pushes_ != pushed) fprintf(stderr, ", pushed %s", describe(last_).c_str());
          fprintf(stderr, "\n");
        }
      } catch (const Error& e) {
        // The library refused the call: fine.
        if (trace) fprintf(stderr, "step %d: op %d error: %s\n", step, op % 52, e.what());
      }
    }
    finish();
  }

  // FUZZ_TRACE=1 in the environment: each step's op and outcome on stderr (to read an input).
  static inline const bool trace = std::getenv("FUZZ_TRACE") != nullptr;

 private:
  // ---- the stack ----
  static std::string describe(const Tensor& t) {
    return fmt::format("{} {}{}", t.dtype(), t.shape(), t.requires_grad() ? " requires_grad" : "");
  }
  void push(const Tensor& t) {
    if (!t.defined() || t.numel() > kMaxNumel) return;
    ++pushes_;
    last_ = t;
    if (stack_.size() < kSlots) {
      stack_.push_back(t);
    } else {
      stack_[in_.pick(kSlots)] = t;
    }
  }
  Tensor pick() {
    if (stack_.empty()) push(randn({2, 3}));
    return stack_[in_.pick(static_cast<int64_t>(stack_.size()))];
  }
  Tensor pick_or_index() {
    if (in_.u8() < 170) return make_index();
    return pick();
  }

  // A leaf from the bytes: bounded shape, any dtype, floating ones maybe requiring grad.
  Tensor make_leaf(Shape shape, Dtype dtype) {
    std::optional<int64_t> numel = true_numel(shape);
    if (!numel || *numel > kMaxNumel) return pick();
    Tensor t;
    switch (in_.pick(4)) {
      case 0: t = zeros(shape, dtype); break;
      case 1: t = full(shape, in_.any_scalar(), dtype); break;
      case 2: t = is_floating(dtype) ? randn(shape, dtype) : randint(-3, 4, shape, dtype); break;
      default: t = ones(shape, dtype); break;
    }
    if (is_floating(dtype) && in_.flag()) {
      t.requires_grad_(true);
      leaves_.push_back(t);
    }
    return t;
  }
  // An index tensor: i64 mostly, i32 or a wrong dtype sometimes; values small, negative or far out.
  Tensor make_index() {
    Shape shape;
    int64_t n = in_.pick(7);
    if (in_.u8() < 40) {
      shape = {in_.pick(3) + 1, n};
    } else if (in_.u8() < 20) {
      shape = {};
      n = 1;
    } else {
      shape = {n};
    }
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::vector<int64_t> values(static_cast<size_t>(count));
    for (auto& v : values) v = in_.u8() < 200 ? in_.pick(6) : in_.index();
    Tensor t = from_vector(values, shape);
    switch (in_.pick(8)) {
      case 0: return t.to(i32);
      case 1: return t.to(f32);
      case 2: return t.to(boolean);
      default: return t;
    }
  }
  Tensor make_mask(const Shape& shape) {
    Tensor m = randn(shape).gt(0.0);
    if (in_.u8() < 20) return m.to(in_.dtype());
    return m;
  }

  // A creation op with an arbitrary shape: checks the library's answer against the true one.
  void wild_creation() {
    Shape shape;
    int64_t n = in_.pick(4) + 1;
    for (int64_t i = 0; i < n; ++i) shape.push_back(in_.u8() < 128 ? in_.small_size() : in_.wild_size());
    Dtype dtype = in_.dtype();
    std::optional<int64_t> numel = true_numel(shape);
    bool must_fail = !numel;
    if (numel && *numel > kMaxNumel) {
      int64_t bytes;
      if (!__builtin_mul_overflow(*numel, static_cast<int64_t>(itemsize(dtype)), &bytes) && bytes <= kFuzzAllocLimit)
        return;  // would really be allocated
      must_fail = true;  // too many bytes, or more than the allocator hands out
    }
    uint8_t which = in_.pick(6);
    Tensor t;  // an Error is always a right answer; accepting a shape is checked below
    switch (which) {
      case 0:
        t = empty(shape, dtype);
        t.zero_();  // empty() leaves the bytes as they were: not something to compute on
        break;
      case 1: t = zeros(shape, dtype); break;
      case 2: t = full(shape, in_.any_scalar(), dtype); break;
      case 3: t = randn(shape, dtype); break;
      case 4: t = rand(shape, dtype); break;
      default: t = randint(0, 5, shape, dtype); break;
    }
    FUZZ_EXPECT(!must_fail);
    FUZZ_EXPECT(t.shape() == shape && t.numel() == *numel);
    push(t);
  }

  void arange_op() {
    double start = in_.scalar(), end = in_.scalar(), step = in_.scalar();
    if (in_.flag()) {  // bounded: a count of at most kMaxNumel
      start = static_cast<double>(in_.index() % 50);
      end = start + static_cast<double>(in_.pick(64)) - 8;
      step = in_.flag() ? 1.0 : (in_.flag() ? -0.5 : 3.0);
    }
    double count = std::ceil((end - start) / step);
    if (std::isfinite(count) && count > kMaxNumel && count * 8 <= 2.0 * kFuzzAllocLimit) return;  // would allocate
    Tensor t;
    switch (in_.pick(4)) {
      case 0: t = arange(Scalar(end)); break;
      case 1: t = arange(start, end, step); break;
      case 2: {
        Dtype dtype = in_.dtype();
        t = arange(Scalar(start), Scalar(end), Scalar(step), TensorOptions(dtype));
        break;
      }
      default:
        t = arange(Scalar(static_cast<int64_t>(std::isfinite(start) && std::fabs(start) < 1e9 ? start : 0)),
                   Scalar(static_cast<int64_t>(std::isfinite(end) && std::fabs(end) < 1e9 ? end : 5)));
        break;
    }
    push(t);
  }

  void one(uint8_t opcode) {
    switch (opcode % 52) {
      // ---- creation ----
      case 0:
      case 1: {
        Shape shape = in_.small_shape();
        Dtype dtype = opcode % 52 == 0 ? in_.dtype() : in_.floating_dtype();
        push(make_leaf(shape, dtype));
        break;
      }
      case 2: wild_creation(); break;
      case 3: arange_op(); break;
      case 4: {
        int64_t n = in_.pick(9);
        if (in_.u8() >= 200) {
          bool negate = in_.flag();
          n = in_.wild_size();
          if (negate && n != kI64Min) n = -n;
        }
        bool is_eye = in_.flag();
        Dtype dtype = in_.dtype();
        if (n > kMaxNumel) {  // huge: only where the allocation must fail (or n * n overflows)
          double bytes = static_cast<double>(n) * static_cast<double>(is_eye ? n : 1) * itemsize(dtype);
          if (bytes <= kFuzzAllocLimit) return;
        }
        if (is_eye) {
          push(eye(n, dtype));
        } else {
          double start = in_.scalar(), end = in_.scalar();
          push(linspace(start, end, n, dtype));
        }
        FUZZ_EXPECT(n <= kMaxNumel);
        break;
      }
      case 5: {
        Scalar value = in_.any_scalar();
        push(scalar_tensor(value, in_.dtype()));
        break;
      }

      // ---- views ----
      case 6: {
        Tensor a = pick();
        Shape s = in_.view_shape();
        push(in_.flag() ? reshape(a, s) : view(a, s));
        break;
      }
      case 7: {
        Tensor a = pick();
        Shape d;
        if (in_.flag()) {  // a permutation, maybe with one entry spoiled
          for (int64_t i = 0; i < a.dim(); ++i) d.push_back(i);
          for (int64_t i = a.dim() - 1; i > 0; --i) std::swap(d[i], d[in_.pick(i + 1)]);
          if (!d.empty() && in_.u8() < 40) {
            int64_t at = in_.pick(d.size());
            d[at] = in_.dim(a.dim());
          }
        } else {
          d = in_.dims(a.dim());
        }
        push(permute(a, d));
        break;
      }
      case 8: {
        Tensor a = pick();
        int64_t d0 = in_.dim(a.dim()), d1 = in_.dim(a.dim());
        push(transpose(a, d0, d1));
        break;
      }
      case 9: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim()), start = in_.index(), length = in_.index();
        push(narrow(a, d, start, length));
        break;
      }
      case 10: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        int64_t start = in_.index(), end = in_.index();
        int64_t step = in_.u8() < 200 ? in_.pick(3) + 1 : in_.index();
        push(slice(a, d, start, end, step));
        break;
      }
      case 11: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim()), index = in_.index();
        push(select(a, d, index));
        break;
      }
      case 12: {
        Tensor a = pick();
        Shape s;
        int64_t extra = in_.pick(3);
        for (int64_t i = 0; i < extra; ++i) s.push_back(in_.u8() < 220 ? in_.small_size() : in_.wild_size());
        for (int64_t d : a.shape()) {
          uint8_t v = in_.u8();
          s.push_back(v < 100 ? d : v < 150 ? -1 : v < 230 ? in_.small_size() : in_.wild_size());
        }
        Tensor e = expand(a, s);  // a view: no allocation whatever its size
        push(e);
        break;
      }
      case 13: {
        Tensor a = pick();
        if (in_.flag()) {
          push(squeeze(a));
        } else {
          push(squeeze(a, in_.dim(a.dim())));
        }
        break;
      }
      case 14: {
        Tensor a = pick();
        push(unsqueeze(a, in_.dim(a.dim())));
        break;
      }
      case 15: {
        Tensor a = pick();
        int64_t start = in_.dim(a.dim()), end = in_.dim(a.dim());
        push(flatten(a, start, end));
        break;
      }

      // ---- elementwise ----
      case 16: {
        Tensor a = pick();
        Tensor b = pick();
        if (broadcast_numel({&a.shape(), &b.shape()}) > kMaxNumel) return;
        switch (in_.pick(7)) {
          case 0: push(add(a, b, in_.any_scalar())); break;
          case 1: push(sub(a, b)); break;
          case 2: push(mul(a, b)); break;
          case 3: push(div(a, b)); break;
          case 4: push(pow(a, b)); break;
          case 5: push(maximum(a, b)); break;
          default: push(minimum(a, b)); break;
        }
        break;
      }
      case 17: {
        Tensor a = pick();
        Scalar s = in_.any_scalar();
        switch (in_.pick(6)) {
          case 0: push(add(a, s)); break;
          case 1: push(sub(a, s)); break;
          case 2: push(mul(a, s)); break;
          case 3: push(div(a, s)); break;
          case 4: push(pow(a, s)); break;
          default: push(rsub(a, s)); break;
        }
        break;
      }
      case 18: {
        Tensor a = pick();
        switch (in_.pick(12)) {
          case 0: push(exp(a)); break;
          case 1: push(log(a)); break;
          case 2: push(tanh(a)); break;
          case 3: push(relu(a)); break;
          case 4: push(neg(a)); break;
          case 5: push(abs(a)); break;
          case 6: push(sqrt(a)); break;
          case 7: push(rsqrt(a)); break;
          case 8: push(sigmoid(a)); break;
          case 9: push(gelu(a, in_.flag())); break;
          case 10: push(silu(a)); break;
          default: push(logical_not(a)); break;
        }
        break;
      }
      case 19: {
        Tensor a = pick();
        Tensor b = pick();
        Tensor cond = in_.u8() < 200 ? make_mask(in_.flag() ? a.shape() : b.shape()) : pick();
        if (broadcast_numel({&a.shape(), &b.shape(), &cond.shape()}) > kMaxNumel) return;
        switch (in_.pick(3)) {
          case 0: push(where(cond, a, b)); break;
          case 1: push(where(cond, a, in_.any_scalar())); break;
          default: {
            Scalar x = in_.any_scalar(), y = in_.any_scalar();
            push(where(cond, x, y));
            break;
          }
        }
        break;
      }
      case 20: {
        Tensor a = pick();
        if (in_.flag()) {
          std::optional<double> lo, hi;
          if (in_.flag()) lo = in_.scalar();
          if (in_.flag()) hi = in_.scalar();
          push(clamp(a, lo, hi));
        } else {
          std::optional<Tensor> lo, hi;
          if (in_.flag()) lo = pick();
          if (in_.flag()) hi = pick();
          Shape none;
          if (broadcast_numel({&a.shape(), lo ? &lo->shape() : &none, hi ? &hi->shape() : &none}) > kMaxNumel)
            return;
          push(clamp(a, lo, hi));
        }
        break;
      }
      case 21: {
        Tensor a = pick();
        push(to_dtype(a, in_.dtype()));
        break;
      }
      case 22: {
        Tensor a = pick();
        Tensor b = pick();
        if (broadcast_numel({&a.shape(), &b.shape()}) > kMaxNumel) return;
        switch (in_.pick(6)) {
          case 0: push(eq(a, b)); break;
          case 1: push(lt(a, b)); break;
          case 2: push(ge(a, in_.any_scalar())); break;
          case 3: push(logical_and(a, b)); break;
          case 4: push(isnan(a)); break;
          default: push(a.dtype() == boolean && b.dtype() == boolean ? (a ^ b) : (a | b)); break;
        }
        break;
      }

      // ---- reductions ----
      case 23: {
        Tensor a = pick();
        if (in_.flag()) {
          push(in_.flag() ? sum(a) : mean(a));
        } else {
          Shape d = in_.dims(a.dim());
          bool keep = in_.flag();
          push(in_.flag() ? sum(a, d, keep) : mean(a, d, keep));
        }
        break;
      }
      case 24: {
        Tensor a = pick();
        if (in_.flag()) {
          push(in_.flag() ? max(a) : min(a));
        } else {
          int64_t d = in_.dim(a.dim());
          bool keep = in_.flag();
          auto [values, indices] = in_.flag() ? max(a, d, keep) : min(a, d, keep);
          FUZZ_EXPECT(values.shape() == indices.shape() && indices.dtype() == i64);
          push(values);
          push(indices);
        }
        break;
      }
      case 25: {
        Tensor a = pick();
        Shape d = in_.dims(a.dim());
        bool keep = in_.flag();
        push(in_.flag() ? amax(a, d, keep) : amin(a, d, keep));
        break;
      }
      case 26: {
        Tensor a = pick();
        if (in_.u8() < 40) {
          push(in_.flag() ? var(a) : tandem::std(a));
        } else {
          Shape d = in_.dims(a.dim());
          int64_t correction = in_.u8() < 200 ? in_.pick(3) : in_.index();
          bool keep = in_.flag();
          push(in_.flag() ? var(a, d, correction, keep) : tandem::std(a, d, correction, keep));
        }
        break;
      }
      case 27: {
        Tensor a = pick();
        Shape d = in_.dims(a.dim());
        bool keep = in_.flag();
        push(logsumexp(a, d, keep));
        break;
      }
      case 28: {
        Tensor a = pick();
        if (in_.flag()) {
          push(in_.flag() ? argmax(a) : argmin(a));
        } else {
          int64_t d = in_.dim(a.dim());
          bool keep = in_.flag();
          push(in_.flag() ? argmax(a, d, keep) : argmin(a, d, keep));
        }
        break;
      }
      case 29: push(norm(pick())); break;

      // ---- linear algebra ----
      case 30: {
        Tensor a = pick();
        Tensor b = pick();
        if (!matmul_small(a, b)) return;
        switch (in_.pick(3)) {
          case 0: push(matmul(a, b)); break;
          case 1: push(mm(a, b)); break;
          default: push(bmm(a, b)); break;
        }
        break;
      }
      case 31: {
        Tensor x = pick();
        Tensor w = pick();
        Tensor b = in_.flag() ? pick() : Tensor();
        if (!matmul_small(x, w)) return;
        push(linear(x, w, b));
        break;
      }
      case 32: {
        Tensor bias = pick();
        Tensor a = pick();
        Tensor b = pick();
        if (!matmul_small(a, b) || bias.numel() > kMaxNumel) return;
        push(addmm(bias, a, b));
        break;
      }

      // ---- nn functional ----
      case 33: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        bool log = in_.flag();
        push(log ? log_softmax(a, d) : softmax(a, d));
        break;
      }
      case 34: {
        Tensor x = pick();
        Shape ns;
        if (in_.flag()) {  // the trailing dims, as it should be
          int64_t k = std::min<int64_t>(in_.pick(3), x.dim());
          for (int64_t i = x.dim() - k; i < x.dim(); ++i) ns.push_back(x.size(i));
        } else {
          ns = in_.view_shape();
        }
        Tensor w, b;
        if (in_.flag()) w = in_.flag() ? pick() : make_leaf(ns, x.dtype());
        if (in_.flag()) b = in_.flag() ? pick() : make_leaf(ns, x.dtype());
        double eps = in_.u8() < 220 ? 1e-5 : in_.scalar();
        push(layer_norm(x, ns, w, b, eps));
        break;
      }
      case 35: {
        Tensor x = pick();
        double p = in_.u8() < 200 ? 0.5 : in_.scalar();
        bool training = in_.flag();
        push(dropout(x, p, training));
        break;
      }

      // ---- indexing and joining ----
      case 36: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        Tensor index = pick_or_index();
        int64_t rows = a.dim() == 0 ? 1 : a.size(std::clamp<int64_t>(d < 0 ? d + a.dim() : d, 0, a.dim() - 1));
        if (rows > 0 && sat_mul(a.numel() / rows, index.numel()) > kMaxNumel) return;
        push(index_select(a, d, index));
        break;
      }
      case 37: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        push(gather(a, d, pick_or_index()));
        break;
      }
      case 38: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        Tensor index = pick_or_index();
        Tensor src = in_.flag() ? pick() : make_leaf(index.shape(), a.dtype());
        push(scatter_add(a, d, index, src));
        break;
      }
      case 39: {
        Tensor a = pick();
        Tensor mask = in_.u8() < 200 ? make_mask(a.shape()) : pick();
        if (broadcast_numel({&a.shape(), &mask.shape()}) > kMaxNumel) return;
        Scalar value = in_.any_scalar();
        push(masked_fill(a, mask, value));
        break;
      }
      case 40: {
        TensorList list;
        int64_t n = in_.pick(4);
        for (int64_t i = 0; i < n; ++i) list.push_back(pick());
        int64_t d = in_.dim(list.empty() ? 1 : list[0].dim());
        bool use_cat = in_.flag();
        push(use_cat ? cat(list, d) : stack(list, d));
        break;
      }
      case 41: {
        Tensor a = pick();
        int64_t d = in_.dim(a.dim());
        TensorList parts;
        switch (in_.pick(3)) {
          case 0: parts = split(a, in_.u8() < 200 ? in_.pick(4) + 1 : in_.index(), d); break;
          case 1: {
            std::vector<int64_t> sizes;
            int64_t n = in_.pick(4);
            for (int64_t i = 0; i < n; ++i) sizes.push_back(in_.u8() < 200 ? in_.pick(4) : in_.index());
            parts = split(a, sizes, d);
            break;
          }
          default: parts = chunk(a, in_.u8() < 200 ? in_.pick(4) + 1 : in_.index(), d); break;
        }
        if (parts.size() > 64) return;
        for (const Tensor& p : parts) {
          if (in_.flag()) push(p);
        }
        break;
      }
      case 42: {
        Tensor w = pick();
        Tensor index = pick_or_index();
        if (w.dim() == 2 && sat_mul(w.size(1), index.numel()) > kMaxNumel) return;
        push(embedding(w, index));
        break;
      }

      // ---- in place ----
      case 43: {
        Tensor self = pick();
        Tensor other = pick();
        switch (in_.pick(8)) {
          case 0: add_(self, other, in_.any_scalar()); break;
          case 1: sub_(self, other); break;
          case 2: mul_(self, other); break;
          case 3: div_(self, other); break;
          case 4: add_(self, in_.any_scalar()); break;
          case 5: sub_(self, in_.any_scalar()); break;
          case 6: mul_(self, in_.any_scalar()); break;
          default: div_(self, in_.any_scalar()); break;
        }
        break;
      }
      case 44: {
        Tensor self = pick();
        switch (in_.pick(6)) {
          case 0: zero_(self); break;
          case 1: fill_(self, in_.any_scalar()); break;
          case 2: copy_(self, pick()); break;
          case 3: {
            std::optional<double> lo, hi;
            if (in_.flag()) lo = in_.scalar();
            if (in_.flag()) hi = in_.scalar();
            clamp_(self, lo, hi);
            break;
          }
          case 4: {
            double lo = in_.scalar(), hi = in_.scalar();
            uniform_(self, lo, hi);
            break;
          }
          default: {
            double mean = in_.scalar(), sd = in_.scalar();
            normal_(self, mean, sd);
            break;
          }
        }
        break;
      }
      case 45: {
        Tensor self = pick();
        Tensor a = pick();
        Tensor b = pick();
        switch (in_.pick(3)) {
          case 0: addcmul_(self, a, b, in_.any_scalar()); break;
          case 1: addcdiv_(self, a, b, in_.any_scalar()); break;
          default: lerp_(self, a, in_.any_scalar()); break;
        }
        break;
      }
      case 46: {
        // An in-place op on a fresh non-leaf (the case autograd must get right), then its use.
        Tensor a = pick();
        Tensor y = mul(a, 2.0);
        switch (in_.pick(4)) {
          case 0: y.add_(1.0); break;
          case 1: y.mul_(a); break;
          case 2: y.clamp_(0.0, std::nullopt); break;
          default: y.select(0, in_.index()).fill_(3.0); break;
        }
        push(y);
        break;
      }

      // ---- autograd and misc ----
      case 47: {
        Tensor a = pick();
        switch (in_.pick(6)) {
          case 0: push(contiguous(a)); break;
          case 1: push(clone(a)); break;
          case 2: push(a.detach()); break;
          case 3: {
            Tensor l = a.detach().clone();
            l.requires_grad_(true);  // refused for non-floating dtypes
            leaves_.push_back(l);
            push(l);
            break;
          }
          case 4: {
            std::string s = a.str();
            FUZZ_EXPECT(!s.empty());
            break;
          }
          default: a.retain_grad(); break;
        }
        break;
      }
      case 48: {
        // A backward in the middle: sometimes twice through a freed graph (must be an Error).
        Tensor a = pick();
        Tensor s = sum(a);
        bool retain = in_.flag();
        s.backward(Tensor(), retain);
        if (in_.flag()) s.backward();
        break;
      }
      case 49: no_grad_next_ = true; break;
      case 50: {
        Tensor a = pick();
        if (in_.flag()) {
          push(a.to(in_.dtype()));
        } else {
          Tensor g = a.grad();
          if (g.defined()) push(g);
        }
        break;
      }
      default: {
        // Whole-tensor comparisons.
        Tensor a = pick();
        Tensor b = pick();
        if (broadcast_numel({&a.shape(), &b.shape()}) > kMaxNumel) return;
        (void)(in_.flag() ? equal(a, b) : allclose(a, b));
        break;
      }
    }
  }

  // Whether matmul(a, b)'s output (and work) stays small; mismatched shapes pass, to get errors.
  bool matmul_small(const Tensor& a, const Tensor& b) {
    if (a.dim() == 0 || b.dim() == 0) return true;
    // Sizes may be huge where a tensor is empty ([0, 2^62]): products saturate.
    int64_t m = a.dim() >= 2 ? a.size(-2) : 1, k = a.size(-1);
    int64_t n = b.dim() >= 2 ? b.size(-1) : 1;
    int64_t batch_a = sat_mul(m, k) == 0 ? 1 : a.numel() / sat_mul(m, k);
    int64_t kb = b.dim() >= 2 ? b.size(-2) : b.size(0);
    int64_t batch_b = sat_mul(kb, n) == 0 ? 1 : b.numel() / sat_mul(kb, n);
    int64_t out = sat_mul(sat_mul(std::max(batch_a, batch_b), m), n);
    return out <= kMaxNumel && sat_mul(out, std::max<int64_t>(k, 1)) <= 16 * kMaxNumel;
  }

  void finish() {
    // The newest floating tensor that requires grad: sum it and backpropagate.
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (it->is_floating_point() && it->requires_grad()) {
        try {
          sum(*it).backward();
          if (trace) fprintf(stderr, "final backward of %s ok\n", describe(*it).c_str());
        } catch (const Error& e) {
          if (trace) fprintf(stderr, "final backward of %s error: %s\n", describe(*it).c_str(), e.what());
        }
        break;
      }
    }
    for (const Tensor& leaf : leaves_) {
      Tensor g = leaf.grad();
      if (!g.defined()) continue;
      FUZZ_EXPECT(g.shape() == leaf.shape());
      FUZZ_EXPECT(g.dtype() == leaf.dtype());
    }
  }

  Bytes& in_;
  std::vector<Tensor> stack_;
  std::vector<Tensor> leaves_;
  bool no_grad_next_ = false;
  size_t pushes_ = 0;
  Tensor last_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  manual_seed(in.u8());
  Program(in).run();
  return 0;
}
