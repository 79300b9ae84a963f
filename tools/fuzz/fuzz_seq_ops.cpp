// libFuzzer target: the ops a sequence model needs, driven by the input bytes: tril/triu, topk,
// multinomial, scaled_dot_product_attention and nn::utils::clip_grad_norm_, alone and in the
// chains a GPT uses them in (a causal attention block, then clipping; top-k sampling).
//
// The bytes are a small program, as in fuzz_ops (and read by the same Bytes, fuzz_ops_common.h):
// each step reads an opcode byte (Program::one's case labels, opcode % kOps), then the bytes its
// arguments need (a reader past the end yields zeros). Ops work on a stack of at most kSlots live
// tensors and push their results. Inputs are adversarial: empty dims, empty tensors with huge
// sizes (up to INT64_MAX), size-1 dims with strides that are not theirs, transposed, strided,
// permuted and expanded (stride 0) views, every dtype (integers and bool to get errors), dims, k
// and diagonals out of range (INT64 extremes included), masks that are bool or float, hold -inf
// or NaN, broadcast or do not fit, dropout_p and scale at their edges (0, negative, huge, NaN),
// causal attention with L != S, and leaves that require grad, then backward.
//
// Findings, beyond crashes and sanitizer reports (only tandem::Error is caught: anything else
// escaping terminates the run):
//   - an Error whose message does not start with "[op] " for the op called ("[alloc] " and
//     "[shape] ", which any op may pass on, aside); other steps' errors must at least have the
//     "[name] " form of core/error.h;
//   - a call the op's documented contract accepts that throws, or one it refuses that returns
//     (the fuzzer decides which from the arguments; calls that would allocate or compute more
//     than a small bound are skipped instead, and a result that cannot exist, such as a contiguous
//     tensor whose strides overflow, may be either);
//   - a result that breaks the contract: shapes and dtypes; tril/triu keeping exactly their
//     triangle and zeroing the rest, and their gradient being that mask; topk selecting exactly
//     the documented elements in the documented order (NaN above every number, ties to the lower
//     index), values equal to the input there, gradient 1 at the selected elements; multinomial
//     indices in range, of positive weight, distinct without replacement; attention outputs that
//     are 0 for fully masked rows, finite (with finite gradients) when the inputs are finite and
//     bounded, and within rounding of a float64 reference without dropout; clip_grad_norm_ returning the
//     total norm and scaling the gradients by max_norm / (total + 1e-6) exactly when that is < 1.
// At the end, as in fuzz_ops, the newest floating tensor that requires grad is summed and
// backpropagated, and every leaf's gradient must have the leaf's shape and dtype.
//
// Opcodes: 0 a floating tensor, 1 any dtype, 2 an empty one with huge sizes, 3 tril/triu, 4 topk,
// 5 multinomial, 6 attention on a new problem, 7 attention on stack tensors, 8 clip_grad_norm_,
// 9 backward, 10 an elementwise op or cast, 11 a view, 12 top-k sampling, 13 an attention block
// then clipping, 14 no grad for the next step, 15 set_grad.
//
// Work per input is bounded (kMaxNumel elements per tensor, kMaxAttentionWork for one attention).
// tools/fuzz/make_seeds.py writes seed programs in this encoding (corpus/seq_ops/); changing what
// an opcode reads changes what the committed seeds mean. FUZZ_TRACE=1 in the environment prints
// each step's call and outcome.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "fuzz_common.h"
#include "fuzz_ops_common.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem_fuzz;

namespace {

constexpr int64_t kMaxNumel = 4096;
constexpr size_t kSlots = 8;
constexpr int kMaxSteps = 32;
constexpr int kOps = 16;
// Rows x keys x (head dims + 1) of one attention call; and of the fuzzer's float64 reference.
constexpr int64_t kMaxAttentionWork = int64_t{1} << 18;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The call being checked, printed with a finding.
std::string g_call;

// A finding the sanitizers cannot see: the library accepted what it must refuse, refused what it
// must accept, or returned a result that breaks its own contract.
#define FUZZ_EXPECT(cond)                                                                             \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      fprintf(stderr, "fuzz_seq_ops: expectation failed: %s (%s:%d)\n  in: %s\n", #cond, __FILE__, \
              __LINE__, g_call.c_str());                                                              \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (0)

const bool trace = std::getenv("FUZZ_TRACE") != nullptr;

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{} {} strides {}{}{}", t.dtype(), t.shape(), t.strides(),
                     t.storage_offset() ? fmt::format(" offset {}", t.storage_offset()) : std::string(),
                     t.requires_grad() ? " requires_grad" : "");
}

// Whether `m` starts with "[tag] ".
bool has_tag(const std::string& m, std::string_view tag) {
  return m.size() >= tag.size() + 3 && m[0] == '[' && m.compare(1, tag.size(), tag) == 0 && m[tag.size() + 1] == ']' &&
         m[tag.size() + 2] == ' ';
}

// "[name] ...": the form of every tandem::Error (core/error.h).
bool well_formed(const std::string& m) {
  if (m.empty() || m[0] != '[') return false;
  size_t i = 1;
  while (i < m.size() && (std::isalnum(static_cast<unsigned char>(m[i])) || m[i] == '_')) ++i;
  return i > 1 && i + 1 < m.size() && m[i] == ']' && m[i + 1] == ' ';
}

[[noreturn]] void bad_message(const char* what, const std::string& m) {
  fprintf(stderr, "fuzz_seq_ops: expectation failed: %s: %s\n  in: %s\n", what, m.c_str(), g_call.c_str());
  std::abort();
}

// Runs one call of the op `op`: true when it returned, false when it threw a tandem::Error, whose
// message must name the op (or alloc / shape, which any op may pass on); with !strict, any
// "[name] " will do.
template <class F>
bool attempt(const char* op, F&& f, bool strict = true) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    const std::string m = e.what();
    if (trace) fprintf(stderr, "  %s: error: %s\n", op, m.c_str());
    if (strict ? !has_tag(m, op) && !has_tag(m, "alloc") && !has_tag(m, "shape") : !well_formed(m))
      bad_message(fmt::format("an error of {} that does not start with [{}]", op, op).c_str(), m);
    return false;
  }
}

// A tensor's elements in logical order: as doubles (every dtype), and exactly for integer and bool
// dtypes (an int64 beyond 2^53 has no double of its own).
struct Values {
  std::vector<double> f;
  std::vector<int64_t> i;
  bool integral = false;

  bool same(size_t a, const Values& o, size_t b) const {  // equal values, NaN equal to NaN
    if (integral && o.integral) return i[a] == o.i[b];
    return f[a] == o.f[b] || (std::isnan(f[a]) && std::isnan(o.f[b]));
  }
  bool is_zero(size_t a) const { return integral ? i[a] == 0 : f[a] == 0; }
  // Whether element a ranks before element b in topk's order (core/detail/topk.h): by value,
  // NaN above every number, -0 equal to +0; largest first or smallest first. Ties are left to
  // the caller's stable sort (the lower index first).
  bool ranks_before(size_t a, size_t b, bool largest) const {
    if (integral) return largest ? i[a] > i[b] : i[a] < i[b];
    const bool na = std::isnan(f[a]), nb = std::isnan(f[b]);
    if (na || nb) return largest ? (na && !nb) : (!na && nb);
    return largest ? f[a] > f[b] : f[a] < f[b];
  }
};

Values read(const Tensor& t) {
  Values v;
  v.integral = !t.is_floating_point();
  if (v.integral) {
    v.i = t.to_vector<int64_t>();
    v.f.assign(v.i.begin(), v.i.end());
  } else {
    v.f = t.to_vector<double>();
  }
  return v;
}

// Largest |x| and whether every x is finite.
void stats(const std::vector<double>& x, double& max_abs, bool& finite) {
  max_abs = 0;
  finite = true;
  for (double e : x) {
    if (!std::isfinite(e)) finite = false;
    else max_abs = std::max(max_abs, std::fabs(e));
  }
}

double dtype_max(Dtype d) {
  switch (d) {
    case f16: return 65504.0;
    case bf16: return 3.38e38;
    case f32: return 3.40e38;
    default: return 1.79e308;
  }
}
// Unit roundoff of a floating dtype, and a bound on its subnormal spacing.
double dtype_eps(Dtype d) {
  switch (d) {
    case f16: return 0x1p-11;
    case bf16: return 0x1p-8;
    case f32: return 0x1p-24;
    default: return 0x1p-53;
  }
}
// Below the smallest normal number of a floating dtype (where flushing subnormals errs).
double dtype_tiny(Dtype d) { return d == f16 ? 6.2e-5 : d == f64 ? 1e-300 : 1.2e-38; }

int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? kI64Max : kI64Min) : r;
}

// Whether a new contiguous tensor of `shape` can exist: its strides (the products of the later
// sizes, a size 0 counting as 1) fit in int64 (contiguous_strides in core/shape.cpp refuses
// the others with "[shape] ...", even where the element count is 0).
bool contiguous_fits(const Shape& shape) {
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 1;)
    if (__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc)) return false;
  return true;
}

bool has_huge_dim(const Tensor& t) {
  if (!t.defined()) return false;
  for (int64_t d : t.shape())
    if (d > kMaxNumel) return true;
  return false;
}

class Program {
 public:
  explicit Program(Bytes& in) : in_(in) {}

  void run() {
    for (int step = 0; step < kMaxSteps && !in_.empty(); ++step) {
      const uint8_t op = in_.u8();
      const size_t pushed = pushes_;
      g_call = fmt::format("step {} (op {})", step, op % kOps);
      try {
        if (no_grad_next_) {
          no_grad_next_ = false;
          NoGradGuard guard;
          one(op);
        } else {
          one(op);
        }
        if (trace) {
          fprintf(stderr, "step %d: op %d ok: %s", step, op % kOps, g_call.c_str());
          if (pushes_ != pushed) fprintf(stderr, ", pushed %s", describe(last_).c_str());
          fprintf(stderr, "\n");
        }
      } catch (const Error& e) {
        // A refusal outside the op under test (building its inputs, a backward): fine, in the form
        // every tandem::Error has.
        const std::string m = e.what();
        if (trace) fprintf(stderr, "step %d: op %d error: %s (%s)\n", step, op % kOps, m.c_str(), g_call.c_str());
        if (!well_formed(m)) bad_message("an error message without its [name] prefix", m);
      }
    }
    finish();
  }

 private:
  // ---- the stack ----
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
    if (stack_.empty()) push(randn({3, 4}));
    return stack_[in_.pick(static_cast<int64_t>(stack_.size()))];
  }

  // ---- arguments ----
  // A size: mostly 1..5, sometimes 0, 8, or past one 64-wide attention tile.
  int64_t size() {
    static constexpr int64_t table[] = {1, 2, 3, 4, 2, 3, 0, 5, 1, 8, 65, 4, 1, 2, 3, 130};
    return table[in_.pick(std::size(table))];
  }
  // A size valid only on an empty tensor.
  int64_t huge() {
    static constexpr int64_t table[] = {int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 62, kI64Max,
                                        3037000500,       int64_t{1} << 20, 4097,             kI64Max - 1};
    return table[in_.pick(std::size(table))];
  }
  int64_t any_size() { return in_.u8() < 232 ? size() : huge(); }
  int64_t ndim() {
    static constexpr int64_t table[] = {2, 2, 3, 2, 4, 3, 1, 0, 5, 2};
    return table[in_.pick(std::size(table))];
  }
  Shape shape_of(int64_t nd) {
    Shape s;
    for (int64_t i = 0; i < nd; ++i) s.push_back(any_size());
    return s;
  }
  // A count (topk's k, multinomial's num_samples) for a dim of size n: mostly in [0, n + 1], else
  // far out of range.
  int64_t count_arg(int64_t n) {
    const uint8_t v = in_.u8();
    if (v < 224) {
      if (n >= 0 && n <= 64) return v % (n + 2);
      switch (v % 5) {
        case 0: return 0;
        case 1: return 1;
        case 2: return n;
        case 3: return sat_add(n, 1);
        default: return std::min<int64_t>(n, v);
      }
    }
    static constexpr int64_t table[] = {-1, kI64Min, kI64Max, int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 62,
                                        -(int64_t{1} << 31), 4097};
    return table[v % std::size(table)];
  }
  int64_t diagonal_arg() {
    const uint8_t v = in_.u8();
    if (v < 208) return static_cast<int64_t>(v % 17) - 8;
    static constexpr int64_t table[] = {kI64Max,           kI64Min,           kI64Max - 1,       kI64Min + 1,
                                        int64_t{1} << 31, -(int64_t{1} << 31), int64_t{1} << 62, -(int64_t{1} << 62)};
    return table[v % std::size(table)];
  }
  double dropout_arg() {
    static constexpr double table[] = {0,    0,   0,    0,   0.5,  0.1,  1e-300,       0.999999,
                                       1 - 0x1p-53, 1.0, -0.0, -0.5, NAN, INFINITY, 0.9999999999, 0.25};
    return table[in_.pick(std::size(table))];
  }
  std::optional<double> scale_arg() {
    const uint8_t v = in_.u8();
    if (v < 160) return std::nullopt;  // 1 / sqrt(E)
    static constexpr double table[] = {1,   0,        -1,        0.125,  1e30, -1e30, 1e300, NAN,
                                       INFINITY, -INFINITY, 1e-300, 2.5, 8,    -0.0,  1e-3,  100};
    return table[v % std::size(table)];
  }
  double max_norm_arg() {
    static constexpr double table[] = {1, 0.5, 0, 1e-30, 1e30, 100, INFINITY, -1, NAN, -0.0, 1e-6, 2};
    return table[in_.pick(std::size(table))];
  }
  double norm_type_arg() {
    static constexpr double table[] = {2, 2, 1, INFINITY, 3, 0.5, 0, -1, NAN, -INFINITY, 1e30, 2.5};
    return table[in_.pick(std::size(table))];
  }

  // ---- tensors ----
  Tensor random_values(const Shape& shape, Dtype dtype) {
    return is_floating(dtype) ? randn(shape, dtype) : randint(-3, 4, shape, dtype);
  }
  // Values for a new tensor: zeros, one value, ones, random, or random with a value (NaN, inf,
  // 1e30, ...) sprinkled in.
  Tensor values(const Shape& shape, Dtype dtype) {
    switch (in_.pick(6)) {
      case 0: return zeros(shape, dtype);
      case 1: return full(shape, in_.any_scalar(), dtype);
      case 2: return ones(shape, dtype);
      case 3: {
        const Scalar s = in_.any_scalar();
        return masked_fill(random_values(shape, dtype), rand(shape).lt(0.3), s);
      }
      default: return random_values(shape, dtype);
    }
  }

  // A tensor of `shape` and `dtype` laid out as the bytes choose: contiguous, transposed, every
  // other element of a wider base, expanded from size-1 dims (stride 0), narrowed at an offset
  // (size-1 dims keep a stride that is not theirs), or permuted. The base is a new tensor holding
  // `make_values(base shape)`, a leaf that requires grad when `grad` and the dtype is floating;
  // the result is the base or a view of it. An empty shape with huge sizes is an expanded view of
  // a small empty base; a shape of too many elements (or negative sizes) is cut down to sizes <= 2.
  template <class V>
  Tensor make_with(Shape shape, Dtype dtype, bool grad, V&& make_values) {
    std::optional<int64_t> n = true_numel(shape);
    if (n && *n == 0) {
      bool huge_dims = false;
      for (int64_t d : shape) huge_dims |= d > kMaxNumel;
      if (huge_dims) return make_huge_empty(shape, dtype, grad);
    }
    if (!n || *n > kMaxNumel)
      for (int64_t& d : shape) d = std::clamp<int64_t>(d, 0, 2);
    const int64_t nd = static_cast<int64_t>(shape.size());
    const int64_t layout = in_.pick(8);
    Shape base_shape = shape;
    int64_t at = 0, offset = 0;
    switch (layout) {
      case 3:  // transposed
        if (nd >= 2) std::swap(base_shape[nd - 1], base_shape[nd - 2]);
        break;
      case 4:  // every other element
        if (nd >= 1) base_shape[nd - 1] = 2 * shape[nd - 1] + 1;
        break;
      case 5:  // expanded
        for (int64_t d = 0; d < nd; ++d)
          if (in_.flag()) base_shape[d] = 1;
        break;
      case 6:  // narrowed
        if (nd >= 1) {
          at = in_.pick(nd);
          offset = 1 + in_.pick(2);
          base_shape[at] = shape[at] + offset + in_.pick(2);
        }
        break;
      case 7:  // permuted
        std::reverse(base_shape.begin(), base_shape.end());
        break;
      default: break;
    }
    Tensor base = make_values(base_shape);
    if (grad && is_floating(dtype)) {
      base.requires_grad_(true);
      leaves_.push_back(base);
    }
    last_base_ = base;
    switch (layout) {
      case 3: return nd >= 2 ? transpose(base, -1, -2) : base;
      case 4: return nd >= 1 ? slice(base, -1, 1, 1 + 2 * shape[nd - 1], 2) : base;
      case 5: return expand(base, shape);
      case 6: return nd >= 1 ? narrow(base, at, offset, shape[at]) : base;
      case 7: {
        Shape dims;
        for (int64_t d = nd - 1; d >= 0; --d) dims.push_back(d);
        return permute(base, dims);
      }
      default: return base;
    }
  }
  Tensor make(const Shape& shape, Dtype dtype, bool grad) {
    return make_with(shape, dtype, grad, [&](const Shape& s) { return values(s, dtype); });
  }
  // An empty tensor with huge sizes: zeros where the sizes are small, expanded to the huge ones.
  Tensor make_huge_empty(const Shape& shape, Dtype dtype, bool grad) {
    Shape base_shape = shape;
    for (int64_t& d : base_shape)
      if (d > kMaxNumel) d = 1;
    Tensor base = zeros(base_shape, dtype);
    if (grad && is_floating(dtype)) {
      base.requires_grad_(true);
      leaves_.push_back(base);
    }
    last_base_ = base;
    return expand(base, shape);  // may be refused ("[shape]") when the sizes multiply past int64 before the 0
  }
  // A tensor for the ops under test: on the stack, or new (and then, for floating dtypes, maybe a
  // view of a leaf that requires grad).
  Tensor operand(bool fresh) {
    if (!fresh) return pick();
    const int64_t nd = ndim();
    const Shape shape = shape_of(nd);
    const Dtype dtype = in_.u8() < 160 ? in_.floating_dtype() : in_.dtype();
    const bool grad = in_.flag();
    return make(shape, dtype, grad);
  }

  // ---- the ops ----
  void one(uint8_t opcode) {
    switch (opcode % kOps) {
      case 0:
      case 1: {
        const int64_t nd = ndim();
        const Shape shape = shape_of(nd);
        const Dtype dtype = opcode % kOps == 0 ? in_.floating_dtype() : in_.dtype();
        const bool grad = in_.flag();
        push(make(shape, dtype, grad));
        break;
      }
      case 2: {
        // An empty tensor with huge sizes: one dim 0 (the first, half the time), others huge or small.
        const int64_t nd = in_.pick(4) + 1;
        const int64_t zero_at = in_.flag() ? 0 : in_.pick(nd);
        Shape shape;
        for (int64_t d = 0; d < nd; ++d) shape.push_back(d == zero_at ? 0 : in_.flag() ? huge() : size());
        const Dtype dtype = in_.dtype();
        const bool grad = in_.flag();
        push(make_huge_empty(shape, dtype, grad));
        break;
      }
      case 3: triangle(); break;
      case 4: topk_op(); break;
      case 5: multinomial_op(); break;
      case 6: attention_fresh(); break;
      case 7: {
        // Attention on whatever the stack holds: mostly refused, which is checked too.
        Tensor q = pick();
        Tensor k = pick();
        Tensor v = pick();
        Tensor mask = in_.u8() < 100 ? pick() : Tensor();
        const bool causal = in_.flag();
        const double p = dropout_arg();
        const std::optional<double> scale = scale_arg();
        const bool backward = in_.flag();
        attention(q, k, v, mask, p, causal, scale, backward, false);
        break;
      }
      case 8: clip_op(); break;
      case 9: {
        // A backward in the middle (gives the leaves gradients to clip); sometimes a second one
        // through a freed graph, which must be refused.
        Tensor a = pick();
        const bool retain = in_.flag();
        const bool twice = in_.flag();
        g_call = fmt::format("sum({}).backward(retain_graph={}){}", describe(a), retain, twice ? " twice" : "");
        Tensor s = sum(a);
        s.backward(Tensor(), retain);
        if (twice) s.backward();
        break;
      }
      case 10: {
        // Inputs that are results of other ops (probabilities for multinomial, other dtypes).
        Tensor a = pick();
        switch (in_.pick(10)) {
          case 0: push(softmax(a, in_.dim(a.dim()))); break;
          case 1: push(log_softmax(a, in_.dim(a.dim()))); break;
          case 2: push(abs(a)); break;
          case 3: push(neg(a)); break;
          case 4: push(exp(a)); break;
          case 5: push(mul(a, in_.any_scalar())); break;
          case 6: push(relu(a)); break;
          case 7: push(to_dtype(a, in_.dtype())); break;
          case 8: push(contiguous(a)); break;
          default: push(clone(a)); break;
        }
        break;
      }
      case 11: {
        // Views of results: transposed, narrowed to one element (a size-1 dim keeping its
        // stride), strided, expanded, unsqueezed, selected, flattened.
        Tensor a = pick();
        switch (in_.pick(8)) {
          case 0: {
            const int64_t d0 = in_.dim(a.dim());
            const int64_t d1 = in_.dim(a.dim());
            push(transpose(a, d0, d1));
            break;
          }
          case 1: {
            Shape dims;
            for (int64_t d = a.dim() - 1; d >= 0; --d) dims.push_back(d);
            push(permute(a, dims));
            break;
          }
          case 2: {
            const int64_t d = in_.dim(a.dim());
            const int64_t start = in_.index();
            push(narrow(a, d, start, 1));
            break;
          }
          case 3: {
            const int64_t d = in_.dim(a.dim());
            const int64_t step = in_.pick(3) + 1;
            push(slice(a, d, 0, kI64Max, step));
            break;
          }
          case 4: {
            Shape s;
            s.push_back(in_.u8() < 200 ? in_.small_size() : huge());
            for (int64_t d : a.shape())
              s.push_back(d == 1 && in_.flag() ? (in_.u8() < 200 ? in_.small_size() : huge()) : d);
            push(expand(a, s));
            break;
          }
          case 5: push(unsqueeze(a, in_.dim(a.dim()))); break;
          case 6: {
            const int64_t d = in_.dim(a.dim());
            const int64_t index = in_.index();
            push(select(a, d, index));
            break;
          }
          default: push(flatten(a)); break;
        }
        break;
      }
      case 12: sample_op(); break;
      case 13: attention_block(); break;
      case 14: no_grad_next_ = true; break;
      default: {
        // Gradients set by hand (for clip_grad_norm_): any layout and values, none, or a wrong shape.
        Tensor a = pick();
        switch (in_.pick(4)) {
          case 0: a.set_grad(Tensor()); break;
          case 1: a.set_grad(zeros({a.numel() + 1}, a.dtype())); break;  // refused: another shape
          default: a.set_grad(make(a.shape(), a.dtype(), false)); break;
        }
        break;
      }
    }
  }

  // ---- tril / triu ----
  void triangle() {
    const bool fresh = in_.flag();
    Tensor x = operand(fresh);
    const int64_t diagonal = diagonal_arg();
    const bool lower = in_.flag();
    const bool grad_check = fresh && in_.flag();
    const char* op = lower ? "tril" : "triu";
    g_call = fmt::format("{}({}, diagonal={})", op, describe(x), diagonal);
    if (grad_check && x.requires_grad()) x.retain_grad();
    Tensor out;
    const bool ok = attempt(op, [&] { out = lower ? tril(x, diagonal) : triu(x, diagonal); });
    // The contract (autograd/ops.h): at least 2 dims, any dtype, any diagonal; the result is a new
    // contiguous tensor of x's shape.
    const bool valid = x.dim() >= 2;
    if (!ok) {
      FUZZ_EXPECT(!valid || !contiguous_fits(x.shape()));
      return;
    }
    FUZZ_EXPECT(valid);
    FUZZ_EXPECT(out.shape() == x.shape() && out.dtype() == x.dtype());
    FUZZ_EXPECT(out.requires_grad() == (autograd::grad_mode_enabled() && x.requires_grad()));
    if (x.numel() > 0) {
      const Values xv = read(x), ov = read(out);
      const int64_t rows = x.size(-2), cols = x.size(-1);
      const int64_t mats = x.numel() / (rows * cols);
      for (int64_t m = 0; m < mats; ++m)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            const size_t e = static_cast<size_t>((m * rows + i) * cols + j);
            const bool keep = lower ? j - i <= diagonal : j - i >= diagonal;
            if (keep) FUZZ_EXPECT(ov.same(e, xv, e));
            else FUZZ_EXPECT(ov.is_zero(e));
          }
    }
    if (grad_check && out.requires_grad()) {
      sum(out).backward();
      const Tensor g = x.grad();
      FUZZ_EXPECT(g.defined() || x.numel() == 0);  // an empty gradient may be left undefined
      if (g.defined()) FUZZ_EXPECT(g.shape() == x.shape() && g.dtype() == x.dtype());
      if (x.numel() > 0) {
        const Values gv = read(g);
        const int64_t rows = x.size(-2), cols = x.size(-1);
        for (size_t e = 0; e < gv.f.size(); ++e) {
          const int64_t i = static_cast<int64_t>(e) / cols % rows, j = static_cast<int64_t>(e) % cols;
          const bool keep = lower ? j - i <= diagonal : j - i >= diagonal;
          FUZZ_EXPECT(gv.f[e] == (keep ? 1.0 : 0.0));
        }
      }
    }
    push(out);
  }

  // ---- topk ----
  void topk_op() {
    const bool fresh = in_.flag();
    Tensor x = operand(fresh);
    const int64_t nd = x.dim();
    const int64_t dim = in_.dim(nd);
    const int64_t span = std::max<int64_t>(nd, 1);
    const bool dim_ok = dim >= -span && dim < span;
    const int64_t d = dim_ok && nd > 0 ? (dim < 0 ? dim + nd : dim) : 0;
    const int64_t n = nd == 0 || !dim_ok ? 1 : x.size(d);
    const int64_t k = count_arg(n);
    const bool largest = in_.flag();
    const bool sorted = in_.flag();
    const bool grad_check = fresh && in_.flag();
    g_call = fmt::format("topk({}, k={}, dim={}, largest={}, sorted={})", describe(x), k, dim, largest, sorted);
    if (grad_check && x.requires_grad()) x.retain_grad();
    Tensor values, indices;
    const bool ok = attempt("topk", [&] { std::tie(values, indices) = topk(x, k, dim, largest, sorted); });
    // The contract (core/detail/topk.h): a numeric dtype, dim in range, 0 <= k <= n (a 0-dim
    // input: dim 0 or -1, k 0 or 1). The results are new contiguous tensors, never larger than the
    // input.
    const bool valid = x.dtype() != boolean && dim_ok && k >= 0 && k <= n;
    Shape shape = x.shape();
    if (nd > 0 && valid) shape[d] = k;
    if (!ok) {
      FUZZ_EXPECT(!valid || !contiguous_fits(shape));
      return;
    }
    FUZZ_EXPECT(valid);
    FUZZ_EXPECT(values.shape() == shape && indices.shape() == shape);
    FUZZ_EXPECT(values.dtype() == x.dtype() && indices.dtype() == i64);
    FUZZ_EXPECT(values.requires_grad() == (autograd::grad_mode_enabled() && x.requires_grad()));
    FUZZ_EXPECT(!indices.requires_grad());
    if (x.numel() > 0) {
      const Values xv = read(x), vv = read(values);
      const std::vector<int64_t> iv = indices.to_vector<int64_t>();
      // Rows along d: outer x n x inner in x, outer x kk x inner in the results.
      const int64_t kk = nd == 0 ? 1 : k;
      int64_t outer = 1, inner = 1;
      for (int64_t a = 0; a < d && nd > 0; ++a) outer *= x.size(a);
      for (int64_t a = d + 1; a < nd; ++a) inner *= x.size(a);
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
          auto at = [&](int64_t j) { return static_cast<size_t>((o * n + j) * inner + in); };
          for (int64_t j = 0; j < n; ++j) order[j] = j;
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t a, int64_t b) { return xv.ranks_before(at(a), at(b), largest); });
          if (!sorted) std::sort(order.begin(), order.begin() + kk);
          for (int64_t t = 0; t < kk; ++t) {
            const size_t r = static_cast<size_t>((o * kk + t) * inner + in);
            FUZZ_EXPECT(iv[r] == order[t]);
            FUZZ_EXPECT(vv.same(r, xv, at(order[t])));
          }
        }
      if (grad_check && values.requires_grad()) {
        sum(values).backward();
        const Tensor g = x.grad();
        if (!g.defined()) FUZZ_EXPECT(kk == 0);  // no values: the gradient may be left undefined
        FUZZ_EXPECT(!g.defined() || (g.shape() == x.shape() && g.dtype() == x.dtype()));
        std::vector<double> expected(static_cast<size_t>(x.numel()), 0.0);
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t in = 0; in < inner; ++in)
            for (int64_t t = 0; t < kk; ++t) {
              const int64_t j = iv[static_cast<size_t>((o * kk + t) * inner + in)];
              expected[static_cast<size_t>((o * n + j) * inner + in)] += 1.0;
            }
        if (g.defined()) FUZZ_EXPECT(g.to_vector<double>() == expected);
      }
    }
    push(values);
    push(indices);
  }

  // ---- multinomial ----
  Tensor make_probs() {
    static constexpr int64_t ndims[] = {1, 2, 2, 1, 0, 3};
    static constexpr int64_t widths[] = {1, 2, 3, 4, 5, 8, 0, 33, 64, 100, 1000, 4096};
    const int64_t nd = ndims[in_.pick(std::size(ndims))];
    Shape shape;
    for (int64_t i = 0; i + 1 < nd; ++i) shape.push_back(in_.u8() < 240 ? size() : huge());
    if (nd > 0) shape.push_back(widths[in_.pick(std::size(widths))]);
    const Dtype dtype = in_.u8() < 220 ? in_.floating_dtype() : in_.dtype();
    const int64_t kind = in_.pick(6);
    const bool grad = in_.flag();
    return make_with(shape, dtype, grad, [&](const Shape& s) -> Tensor {
      if (!is_floating(dtype)) return values(s, dtype);
      switch (kind) {
        case 0: return abs(randn(s, dtype));
        case 1: return rand(s, dtype);
        case 2: return rand(s).lt(0.3).to(dtype);  // rows of zeros sometimes
        case 3: return s.empty() ? rand(s, dtype) : softmax(mul(randn(s, dtype), 4.0), -1);
        default: return values(s, dtype);  // negative, NaN, inf, ...
      }
    });
  }

  void multinomial_op() {
    Tensor probs = in_.u8() < 64 ? pick() : make_probs();
    const int64_t nd = probs.dim();
    const int64_t n = nd >= 1 ? probs.size(-1) : 1;
    const int64_t ns = count_arg(n);
    const bool replacement = in_.flag();
    g_call = fmt::format("multinomial({}, num_samples={}, replacement={})", describe(probs), ns, replacement);
    // The contract (autograd/ops.h): floating, 1-D or 2-D, num_samples > 0 (at most n without
    // replacement); then each row: finite non-negative weights with a positive sum, and at least
    // num_samples of them non-zero without replacement.
    const bool valid_args = probs.is_floating_point() && (nd == 1 || nd == 2) && ns > 0 && (replacement || ns <= n);
    const int64_t rows = nd == 2 ? probs.size(0) : 1;
    const int64_t count = valid_args ? sat_mul(rows, ns) : 0;
    const bool too_big = sat_mul(count, 8) > kFuzzAllocLimit;
    if (valid_args && !too_big && count > (int64_t{1} << 16)) return;  // would really allocate and draw
    bool rows_ok = true, weights_huge = false;
    Values pv;
    if (valid_args && count > 0 && !too_big) {
      pv = read(probs);  // rows x n <= count x n: small (n is 0 when rows is large)
      for (int64_t r = 0; r < rows && n > 0; ++r) {
        double total = 0;
        int64_t nonzero = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double w = pv.f[static_cast<size_t>(r * n + j)];
          if (!(w >= 0 && w <= std::numeric_limits<double>::max())) rows_ok = false;
          weights_huge |= w > 1e300;
          nonzero += w > 0;
          total += w;
        }
        if (!(total > 0) || !std::isfinite(total) || (!replacement && nonzero < ns)) rows_ok = false;
      }
      if (n == 0) rows_ok = false;  // every row sums to 0
    }
    // (Weights past 1e300 may sum to infinity in one order and not in another: no verdict on the rows then.)
    const bool must_fail = !valid_args || (count > 0 && (too_big || (!rows_ok && !weights_huge)));
    const bool must_succeed = valid_args && (count == 0 || (!too_big && rows_ok && !weights_huge));
    Tensor out;
    const bool ok = attempt("multinomial", [&] { out = multinomial(probs, ns, replacement); });
    if (!ok) {
      FUZZ_EXPECT(!must_succeed);
      return;
    }
    FUZZ_EXPECT(!must_fail);
    FUZZ_EXPECT(out.dtype() == i64 && !out.requires_grad());
    FUZZ_EXPECT(out.shape() == (nd == 2 ? Shape{rows, ns} : Shape{ns}));
    if (count > 0) {
      const std::vector<int64_t> drawn = out.to_vector<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int64_t> row(drawn.begin() + r * ns, drawn.begin() + (r + 1) * ns);
        for (int64_t j : row) {
          FUZZ_EXPECT(j >= 0 && j < n);
          FUZZ_EXPECT(pv.f[static_cast<size_t>(r * n + j)] > 0);  // a weight of 0 is never drawn
        }
        if (!replacement) {
          std::sort(row.begin(), row.end());
          FUZZ_EXPECT(std::adjacent_find(row.begin(), row.end()) == row.end());
        }
      }
    }
    push(out);
  }

  // ---- scaled_dot_product_attention ----
  // A size for attention problems: small, 0, past a 64-wide tile, or (rarely) huge.
  int64_t attn_size() {
    static constexpr int64_t table[] = {1, 2, 3, 4, 5, 8, 0, 1, 2, 3, 4, 64, 65, 1, 2, 16};
    const uint8_t v = in_.u8();
    if (v >= 244) return huge();
    return table[v % std::size(table)];
  }

  // An attn_mask for scores [lead..., L, S] of dtype `dt`: none (half the time), or bool / float
  // / another dtype, of the full shape, a broadcast one, a wrong one, or tril's.
  Tensor make_mask(const Shape& lead, int64_t L, int64_t S, Dtype dt) {
    if (in_.u8() < 128) return Tensor();
    const int64_t form = in_.pick(11);
    const int64_t which_dtype = in_.pick(8);
    const Dtype other = dt == f64 ? f32 : f64;
    const Dtype mdt = which_dtype < 4 ? boolean : which_dtype < 6 ? dt : which_dtype == 6 ? other : i64;
    const int64_t kind = in_.pick(5);
    const bool grad = in_.flag();
    Shape scores = lead;
    scores.push_back(L);
    scores.push_back(S);
    if (form == 10) {
      // tril's lower triangle as the mask (true / 0 kept, false / -inf masked): a causal mask by hand.
      const int64_t diagonal = diagonal_arg();
      g_call = fmt::format("tril(ones([{}, {}]), {}) as an attn_mask", L, S, diagonal);
      if (sat_mul(L, S) > kMaxNumel) return Tensor();
      Tensor keep = tril(ones({L, S}, boolean), diagonal);
      if (mdt == boolean) return keep;
      Tensor m = masked_fill(zeros({L, S}, mdt), logical_not(keep), -kInf);
      if (grad && is_floating(mdt)) {
        m.requires_grad_(true);
        leaves_.push_back(m);
      }
      return m;
    }
    Shape shape;
    switch (form) {
      case 0: shape = scores; break;
      case 1: shape = {L, S}; break;
      case 2: shape = {1, S}; break;
      case 3: shape = {L, 1}; break;
      case 4: shape = {S}; break;
      case 5: break;  // 0-dim
      case 6:
        for (size_t i = 0; i < lead.size(); ++i) shape.push_back(1);
        shape.push_back(L);
        shape.push_back(S);
        break;
      case 7: shape = {sat_add(L, 1), S}; break;  // wrong
      case 8: shape = {S, L}; break;               // wrong unless L == S
      default:                                     // one dim too many
        shape = scores;
        shape.insert(0, 1);
        break;
    }
    return make_with(shape, mdt, grad, [&](const Shape& s) -> Tensor {
      if (mdt == boolean) {
        switch (kind) {
          case 0: return ones(s, boolean);
          case 1: return zeros(s, boolean);  // every row fully masked
          case 2: return rand(s).lt(0.5);
          default: return rand(s).lt(0.15);  // some rows fully masked
        }
      }
      if (!is_floating(mdt)) return values(s, mdt);
      switch (kind) {
        case 0: return zeros(s, mdt);
        case 1: return randn(s, mdt);
        case 2: return masked_fill(randn(s, mdt), rand(s).lt(0.3), -kInf);
        case 3: return full(s, -kInf, mdt);
        default: return values(s, mdt);  // NaN, +inf, 1e30, ...
      }
    });
  }

  void attention_fresh() {
    const Dtype dt = in_.u8() < 230 ? in_.floating_dtype() : in_.dtype();
    static constexpr int64_t ndims[] = {4, 3, 2, 4, 3, 5, 1, 4};
    const int64_t nd = ndims[in_.pick(std::size(ndims))];
    Shape lead;
    for (int64_t i = 0; i + 2 < nd; ++i) {
      static constexpr int64_t sizes[] = {1, 2, 1, 3, 0, 2, 1, 4};
      const uint8_t v = in_.u8();
      lead.push_back(v >= 248 ? huge() : sizes[v % std::size(sizes)]);
    }
    const int64_t L = attn_size();
    const int64_t S = attn_size();
    const int64_t E = attn_size();
    const int64_t Ev = attn_size();
    auto with = [&](int64_t rows, int64_t cols) {
      Shape s = lead;
      if (nd >= 2) s.push_back(rows);
      if (nd >= 1) s.push_back(cols);
      return s;
    };
    Shape qs = with(L, E), ks = with(S, E), vs = with(S, Ev);
    Dtype kdt = dt, vdt = dt;
    // Now and then one thing wrong: a size, a dim, a dtype.
    const uint8_t wrong = in_.u8();
    if (wrong >= 200 && !qs.empty()) {
      switch (wrong % 8) {
        case 0: ks.back() = sat_add(ks.back(), 1); break;               // E differs
        case 1: if (vs.size() >= 2) vs[vs.size() - 2] = sat_add(S, 1); break;  // S differs
        case 2: ks[0] = sat_add(ks[0], 1); break;                       // a batch dim differs
        case 3: ks.erase(0); break;                                     // fewer dims
        case 4: vdt = dt == f32 ? f64 : f32; break;
        case 5: kdt = dt == f64 ? i64 : f64; break;
        case 6: qs.insert(0, 1); break;                                 // more dims
        default: vs.back() = 0; break;                                  // Ev = 0 (valid)
      }
    }
    const bool gq = in_.flag();
    const bool gk = in_.flag();
    const bool gv = in_.flag();
    Tensor q = make(qs, dt, gq);
    Tensor k = make(ks, kdt, gk);
    Tensor v = make(vs, vdt, gv);
    Tensor mask = make_mask(lead, L, S, dt);
    const bool causal = in_.flag();
    const double p = dropout_arg();
    const std::optional<double> scale = scale_arg();
    const bool backward = in_.flag();
    push(attention(q, k, v, mask, p, causal, scale, backward, true));
  }

  // Calls scaled_dot_product_attention and checks what it must do: refuse exactly what the
  // contract (make_attention_problem in core/cpu/attention.cpp) refuses, and return a result
  // that check_attention accepts. `fresh`: q, k, v and mask are new tensors here (their retained
  // gradients hold this call's alone).
  Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double p, bool causal,
                   std::optional<double> scale, bool backward, bool fresh) {
    g_call = fmt::format("scaled_dot_product_attention(q {}, k {}, v {}, mask {}, dropout_p={}, is_causal={}, "
                         "scale={})",
                         describe(q), describe(k), describe(v), describe(mask), p, causal,
                         scale ? fmt::format("{}", *scale) : std::string("default"));
    const int64_t nd = q.dim();
    const bool shapes = nd >= 2 && k.dim() == nd && v.dim() == nd;
    bool valid = shapes && is_floating(q.dtype()) && k.dtype() == q.dtype() && v.dtype() == q.dtype();
    int64_t L = 0, S = 0, E = 0, Ev = 0, Bn = 0;
    if (shapes) {
      for (int64_t d = 0; d + 2 < nd; ++d) valid &= k.size(d) == q.size(d) && v.size(d) == q.size(d);
      valid &= k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2);
      L = q.size(-2);
      E = q.size(-1);
      S = k.size(-2);
      Ev = v.size(-1);
      Shape lead = q.shape();
      lead.resize(lead.size() - 2);
      Bn = true_numel(lead).value_or(kI64Max);
    }
    valid &= p >= 0.0 && p < 1.0;
    valid &= !scale || std::isfinite(*scale);
    if (mask.defined()) {
      valid &= !causal && (mask.dtype() == boolean || mask.dtype() == q.dtype()) && shapes && mask.dim() <= nd;
      for (int64_t d = 1; valid && d <= mask.dim(); ++d) {
        const int64_t want = d == 1 ? S : q.size(nd - d);  // the scores [..., L, S], from the end
        valid &= mask.size(-d) == want || mask.size(-d) == 1;
      }
    }
    const bool huge = has_huge_dim(q) || has_huge_dim(k) || has_huge_dim(v) || has_huge_dim(mask);
    // Bounds on what the call allocates and computes. out [B, H, L, Ev] and lse [B, H, L].
    const int64_t rows = sat_mul(Bn, L);
    const int64_t out_numel = sat_mul(rows, Ev);
    // Past 1 GiB an allocation fails (cheaply): the output must, and lse may (it need not exist).
    const bool out_too_big = sat_mul(out_numel, static_cast<int64_t>(itemsize(q.dtype()))) > kFuzzAllocLimit;
    const bool lse_too_big = sat_mul(rows, q.dtype() == f64 ? 8 : 4) > kFuzzAllocLimit;
    if (valid) {
      const bool degenerate = rows == 0 || S == 0 || Ev == 0;
      if (!out_too_big) {
        if (out_numel > 4 * kMaxNumel || (rows > (int64_t{1} << 18) && !lse_too_big)) return Tensor();
        if (!degenerate && sat_mul(sat_mul(rows, S), sat_add(sat_add(E, Ev), 1)) > kMaxAttentionWork) return Tensor();
      }
    }
    const bool must_fail = !valid || out_too_big;
    const bool must_succeed = valid && !huge && !out_too_big && !lse_too_big;
    // Retained before the call, so the gradients seen below are this backward's.
    const bool want_grads = backward && autograd::grad_mode_enabled();
    if (want_grads)
      for (const Tensor* t : {&q, &k, &v, &mask})
        if (t->defined() && t->requires_grad()) t->retain_grad();
    Tensor out;
    const bool ok = attempt("scaled_dot_product_attention",
                            [&] { out = scaled_dot_product_attention(q, k, v, mask, p, causal, scale); });
    if (!ok) {
      FUZZ_EXPECT(!must_succeed);
      return Tensor();
    }
    FUZZ_EXPECT(!must_fail);
    Shape shape = q.shape();
    shape.back() = Ev;
    FUZZ_EXPECT(out.shape() == shape && out.dtype() == q.dtype());
    const bool any_grad = q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                          (mask.defined() && mask.requires_grad());
    FUZZ_EXPECT(out.requires_grad() == (autograd::grad_mode_enabled() && any_grad));
    const int64_t work = sat_mul(sat_mul(rows, S), sat_add(sat_add(E, Ev), 1));
    const bool checkable = !huge && rows <= (int64_t{1} << 16) && work <= kMaxAttentionWork;
    double grad_bound = kInf;
    if (checkable) grad_bound = check_attention(q, k, v, mask, p, causal, scale, out, Bn, L, S, E, Ev);
    if (want_grads && out.requires_grad()) {
      sum(out).backward();
      for (const Tensor* t : {&q, &k, &v, &mask}) {
        if (!t->defined() || !t->requires_grad()) continue;
        const Tensor g = t->grad();
        FUZZ_EXPECT(g.defined() || out.numel() == 0);  // from an empty output it may be left undefined
        if (!g.defined()) continue;
        FUZZ_EXPECT(g.shape() == t->shape() && g.dtype() == t->dtype());
        if (fresh && g.numel() <= (int64_t{1} << 16) && grad_bound <= dtype_max(g.dtype()) / 2) {
          bool finite;
          double max_abs;
          stats(g.to_vector<double>(), max_abs, finite);
          FUZZ_EXPECT(finite);
        }
      }
    }
    return out;
  }

  // The values of a returned attention: 0 in fully masked rows (finite v), finite for finite and
  // bounded inputs, within the values' range times the dropout factor, and the float64 reference
  // softmax(q kᵀ · scale + mask) v without dropout. Returns a bound on the gradients' magnitudes
  // when their finiteness follows, else infinity.
  double check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double p, bool causal,
                         std::optional<double> scale, const Tensor& out, int64_t Bn, int64_t L, int64_t S, int64_t E,
                         int64_t Ev) {
    NoGradGuard no_grad;
    const Values qv = read(q), kv = read(k), vv = read(v), ov = read(out);
    const bool mask_bool = mask.defined() && mask.dtype() == boolean;
    std::vector<double> mv;
    if (mask.defined()) {
      Shape scores = q.shape();
      scores.back() = S;
      mv = expand(mask, scores).to_vector<double>();
    }
    double qmax, kmax, vmax, mmax = 0;
    bool qf, kf, vf, mf = true;
    stats(qv.f, qmax, qf);
    stats(kv.f, kmax, kf);
    stats(vv.f, vmax, vf);
    if (mask.defined() && !mask_bool)
      for (double m : mv) {
        if (std::isnan(m) || m == kInf) mf = false;
        else if (m != -kInf) mmax = std::max(mmax, std::fabs(m));
      }
    const Dtype dt = q.dtype();
    const double sc = scale ? *scale : (E > 0 ? 1.0 / std::sqrt(static_cast<double>(E)) : 1.0);
    const bool acc64 = dt == f64;
    const double limit = acc64 ? 1e300 : 1e30;  // far inside the accumulation dtype's range
    const float pf = static_cast<float>(p);
    const double factor = p > 0 && pf < 1.0f ? 1.0 / (1.0 - std::max(p, static_cast<double>(pf))) : 1.0;
    const double smax = std::fabs(sc) * static_cast<double>(E) * qmax * kmax + mmax;
    const double out_bound = vmax * factor;
    const bool bounded = qf && kf && vf && mf && std::fabs(sc) <= limit && std::fabs(sc) * qmax <= limit &&
                         smax <= limit && out_bound * static_cast<double>(S + 1) <= limit &&
                         out_bound <= dtype_max(dt) / 2;
    const double eps_acc = acc64 ? 0x1p-52 : 0x1p-23, eps_out = dtype_eps(dt), tiny = dtype_tiny(dt);
    const double tol = vmax * (eps_acc * 64 * static_cast<double>(S + E + 1) * (1 + smax) + 2 * eps_out) + tiny;
    std::vector<double> s(static_cast<size_t>(S));
    std::vector<char> use(static_cast<size_t>(S));
    for (int64_t b = 0; b < Bn; ++b)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t r = b * L + i;
        bool any = false;
        for (int64_t j = 0; j < S; ++j) {
          double bias = 0;
          bool masked = causal && j > i;
          if (mask.defined()) {
            const double m = mv[static_cast<size_t>(r * S + j)];
            if (mask_bool) masked |= m == 0;
            else if (m == -kInf) masked = true;
            else bias = m;
          }
          use[j] = !masked;
          any |= !masked;
          if (masked) continue;
          // The scale folded into q, as the op's contract has it (core/detail/attention.h): with a
          // tiny or zero scale and huge q and k, q·k alone overflows (scale · inf, or -0 · inf =
          // NaN) where the scores themselves are small (the finding of scale=-0 with q = k = 1e300).
          double dot = 0;
          for (int64_t e = 0; e < E; ++e)
            dot += (sc * qv.f[static_cast<size_t>(r * E + e)]) * kv.f[static_cast<size_t>((b * S + j) * E + e)];
          s[j] = dot + bias;
        }
        for (int64_t e = 0; e < Ev; ++e) {
          const double o = ov.f[static_cast<size_t>(r * Ev + e)];
          if (!any && vf) FUZZ_EXPECT(o == 0);  // every key masked: 0
          if (bounded) FUZZ_EXPECT(std::isfinite(o));
          if (bounded && p > 0) FUZZ_EXPECT(std::fabs(o) <= out_bound * (1 + 1e-2) + tiny);
        }
        if (!any || !bounded || p != 0 || smax > 1e4) continue;
        // The float64 reference for this row: s becomes the softmax's weights.
        double mx = -kInf;
        for (int64_t j = 0; j < S; ++j)
          if (use[j]) mx = std::max(mx, s[j]);
        double l = 0;
        for (int64_t j = 0; j < S; ++j) {
          s[j] = use[j] ? std::exp(s[j] - mx) : 0.0;
          l += s[j];
        }
        for (int64_t e = 0; e < Ev; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += s[j] * vv.f[static_cast<size_t>((b * S + j) * Ev + e)];
          const double o = ov.f[static_cast<size_t>(r * Ev + e)];
          FUZZ_EXPECT(std::fabs(o - acc / l) <= tol);
        }
      }
    if (!bounded) return kInf;
    // Gradients of sum(out): dv <= L·factor; the scores' gradient dS <= 2·Ev·vmax·factor; dq <=
    // |scale|·S·dS·kmax, dk <= |scale|·L·dS·qmax; the mask's sums dS over its broadcast dims.
    const double ds = 2 * static_cast<double>(Ev) * out_bound;
    const double g = std::max({static_cast<double>(L) * factor, std::fabs(sc) * static_cast<double>(S) * ds * kmax,
                               std::fabs(sc) * static_cast<double>(L) * ds * qmax, ds});
    const double bound = g * static_cast<double>(Bn * L * S + S + L + 1);
    return bound <= limit ? bound : kInf;
  }

  // ---- clip_grad_norm_ ----
  void clip_op() {
    const int64_t n = in_.pick(5);
    TensorList params;
    for (int64_t i = 0; i < n; ++i) {
      switch (in_.pick(8)) {
        case 0:
        case 1:
        case 2: {
          // A new parameter; its gradient from a backward, set by hand (any layout and values), or none.
          const Shape shape = in_.small_shape(3);
          const Dtype dtype = in_.floating_dtype();
          Tensor p = values(shape, dtype);
          p.requires_grad_(true);
          leaves_.push_back(p);
          switch (in_.pick(4)) {
            case 0: sum(mul(p, p)).backward(); break;
            case 1: p.set_grad(make(shape, dtype, false)); break;
            case 2: break;
            default: p.set_grad(zeros(shape, dtype)); break;
          }
          params.push_back(p);
          break;
        }
        case 3:
          if (!leaves_.empty()) {
            params.push_back(leaves_[in_.pick(static_cast<int64_t>(leaves_.size()))]);
            break;
          }
          [[fallthrough]];
        case 4: params.push_back(Tensor()); break;  // refused
        case 5: params.push_back(pick()); break;
        case 6:
          if (!params.empty()) {
            params.push_back(params.back());  // twice in the list: counted and scaled twice
            break;
          }
          [[fallthrough]];
        default: {
          Tensor p = zeros({0, 3});  // an empty gradient adds nothing
          p.requires_grad_(true);
          p.set_grad(zeros({0, 3}));
          params.push_back(p);
          break;
        }
      }
    }
    const double max_norm = max_norm_arg();
    const double norm_type = norm_type_arg();
    const bool error_if_nonfinite = in_.flag();
    const int64_t form = in_.pick(3);
    clip(params, form, max_norm, norm_type, error_if_nonfinite);
  }

  // Calls clip_grad_norm_ (form 0: a list, 1: one tensor when there is one, 2: named) and checks
  // it against nn/utils.h: refusals, the total norm (computed here in float64), the scaling.
  void clip(const TensorList& params, int64_t form, double max_norm, double norm_type, bool error_if_nonfinite) {
    std::string list;
    for (const Tensor& t : params) list += (list.empty() ? "" : ", ") + describe(t);
    g_call = fmt::format("clip_grad_norm_([{}], max_norm={}, norm_type={}, error_if_nonfinite={})", list, max_norm,
                         norm_type, error_if_nonfinite);
    bool valid = norm_type > 0 && max_norm >= 0;
    TensorList grads;
    std::vector<Values> before;
    bool any_nan = false, any_inf = false, shared = false, integral = false, expanded = false;
    double max_abs = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].defined()) {
        valid = false;
        continue;
      }
      Tensor g = params[i].grad();
      if (!g.defined()) continue;
      for (size_t j = 0; j < i; ++j) shared |= params[j].defined() && params[j].is_same(params[i]);
      for (const Tensor& h : grads) shared |= h.storage().get() == g.storage().get();
      for (int64_t d = 0; d < g.dim(); ++d) expanded |= g.stride(d) == 0 && g.size(d) > 1;  // overlapping elements
      shared |= expanded;
      integral |= !g.is_floating_point();  // set by hand: scaling it in place may be refused
      grads.push_back(g);
      before.push_back(read(g));
      for (double x : before.back().f) {
        any_nan |= std::isnan(x);
        any_inf |= std::isinf(x);
        if (std::isfinite(x)) max_abs = std::max(max_abs, std::fabs(x));
      }
    }
    // The total in float64 where float32 computes it faithfully too: no squares or cubes that
    // overflow float32 (tiny ones that underflow are within the absolute tolerance).
    double expected = 0;
    bool reliable = false;
    const bool nonfinite = any_nan || any_inf;
    if (valid && !nonfinite) {
      double acc = 0;
      for (const Values& v : before)
        for (double x : v.f) {
          const double a = std::fabs(x);
          if (norm_type == kInf) acc = std::max(acc, a);
          else if (norm_type == 1) acc += a;
          else if (norm_type == 2) acc += a * a;
          else acc += std::pow(a, norm_type);
        }
      if (norm_type == kInf || norm_type == 1) expected = acc;
      else if (norm_type == 2) expected = std::sqrt(acc);
      else expected = std::pow(acc, 1.0 / norm_type);
      const bool plain = norm_type == 1 || norm_type == 2 || norm_type == kInf;
      const bool other = norm_type == 0.5 || norm_type == 2.5 || norm_type == 3;
      reliable = (plain && max_abs <= 1e15) || (other && max_abs <= 1e9);
    }
    // Whether the outcome is known here.
    const bool known = grads.empty() || ((nonfinite || reliable) && !integral);
    // nn/utils.h refuses, before scaling anything, an integral or an expanded (stride-0) gradient.
    const bool refused = integral || expanded;
    const bool must_fail = !valid || refused || (!grads.empty() && nonfinite && error_if_nonfinite);
    const bool must_succeed = valid && !refused && known && !(nonfinite && error_if_nonfinite && !grads.empty());
    double total = 0;
    // An integer gradient (set by hand) is no gradient to clip: scaling it in place may be refused by
    // mul_ itself.
    const bool ok = attempt("clip_grad_norm_", [&] {
      if (form == 1 && params.size() == 1) {
        total = nn::utils::clip_grad_norm_(params[0], max_norm, norm_type, error_if_nonfinite);
      } else if (form == 2) {
        nn::TensorDict named;
        for (size_t i = 0; i < params.size(); ++i) named.insert(fmt::format("p{}", i), params[i]);
        total = nn::utils::clip_grad_norm_(named, max_norm, norm_type, error_if_nonfinite);
      } else {
        total = nn::utils::clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite);
      }
    }, !integral);
    if (!ok) {
      FUZZ_EXPECT(!must_succeed);
      // A refusal leaves every gradient as it was (all or none are scaled).
      if (!shared)
        for (size_t i = 0; i < grads.size(); ++i) {
          const Values after = read(grads[i]);
          for (size_t e = 0; e < after.f.size() || e < after.i.size(); ++e) FUZZ_EXPECT(after.same(e, before[i], e));
        }
      return;
    }
    FUZZ_EXPECT(!must_fail);
    FUZZ_EXPECT(!(total < 0));
    if (grads.empty()) FUZZ_EXPECT(total == 0);
    if (!grads.empty() && nonfinite) FUZZ_EXPECT(!std::isfinite(total));
    if (!grads.empty() && reliable) FUZZ_EXPECT(std::fabs(total - expected) <= 2e-3 * expected + 1e-10);
    // Scaled in place by coef = max_norm / (total + 1e-6) when !(coef >= 1), else untouched.
    const double coef = max_norm / (total + 1e-6);
    size_t at = 0;
    for (const Tensor& p : params) {
      if (!p.defined() || !p.grad().defined()) continue;
      const Tensor g = p.grad();
      FUZZ_EXPECT(g.is_same(grads[at]));
      const Values& old = before[at++];
      const Values now = read(g);
      const Dtype dt = g.dtype();
      for (size_t e = 0; e < now.f.size(); ++e) {
        if (coef >= 1) {
          FUZZ_EXPECT(now.same(e, old, e));
        } else if (!shared && !integral) {
          // The library multiplies in the gradient's compute type: the coefficient is rounded to
          // f32 first for f32/f16/bf16 gradients (as PyTorch's f32 clip_coef is), which below f32's
          // normal range (max_norm 1e-30 and a large total) keeps only a few significant bits.
          const double c = dt == f64 ? coef : static_cast<double>(static_cast<float>(coef));
          const double want = old.f[e] * c;
          if (std::isnan(want)) FUZZ_EXPECT(std::isnan(now.f[e]));
          else FUZZ_EXPECT(std::fabs(now.f[e] - want) <= 4 * dtype_eps(dt) * std::fabs(want) + dtype_tiny(dt));
        }
      }
    }
  }

  // ---- a sequence model's uses ----
  // Top-k sampling as a GPT's generate() does it: logits / temperature -> topk -> softmax ->
  // multinomial -> the chosen token ids.
  void sample_op() {
    static constexpr int64_t vocab[] = {1, 2, 5, 8, 33, 100, 1000, 3};
    static constexpr double temperatures[] = {1, 0.7, 2, 1e-3, 0, -1, INFINITY, NAN};
    const int64_t rows = in_.pick(4);
    const int64_t V = vocab[in_.pick(std::size(vocab))];
    const Dtype dt = in_.floating_dtype();
    const bool grad = in_.flag();
    Tensor logits = make(rows == 0 ? Shape{V} : Shape{rows, V}, dt, grad);
    const double temperature = temperatures[in_.pick(std::size(temperatures))];
    const int64_t k = count_arg(V);
    const int64_t ns = in_.pick(3) + 1;
    const bool replacement = in_.flag();
    g_call = fmt::format("sample(logits {}, temperature={}, top_k={}, num_samples={}, replacement={})",
                         describe(logits), temperature, k, ns, replacement);
    auto [top, index] = topk(div(logits, temperature), k, -1);
    Tensor probs = softmax(top, -1);
    Tensor drawn = multinomial(probs, ns, replacement);
    Tensor tokens = gather(index, -1, drawn);
    FUZZ_EXPECT(tokens.dtype() == i64 && tokens.shape() == drawn.shape());
    for (int64_t t : tokens.to_vector<int64_t>()) FUZZ_EXPECT(t >= 0 && t < V);
    push(top);
    push(tokens);
  }

  // A GPT's causal self-attention block: x [B, T, C] @ w [C, 3C] split into q, k, v, each viewed
  // as [B, H, T, D] heads (transposed, strided views), causal attention, backward, then clipping
  // the gradients of x and w.
  void attention_block() {
    static constexpr int64_t lengths[] = {1, 2, 3, 4, 5, 8, 65, 0};
    static constexpr int64_t head_dims[] = {1, 2, 4, 0};
    const int64_t B = in_.pick(2) + 1;
    const int64_t T = lengths[in_.pick(std::size(lengths))];
    const int64_t H = in_.pick(2) + 1;
    const int64_t D = head_dims[in_.pick(std::size(head_dims))];
    const int64_t C = H * D;
    const Dtype dt = in_.floating_dtype();
    Tensor x = make({B, T, C}, dt, true);
    Tensor x_leaf = last_base_;
    Tensor w = make({C, 3 * C}, dt, true);
    Tensor w_leaf = last_base_;
    const double p = dropout_arg();
    const std::optional<double> scale = scale_arg();
    const double max_norm = max_norm_arg();
    g_call = fmt::format("attention block(x {}, w {})", describe(x), describe(w));
    TensorList qkv = split(matmul(x, w), C, -1);
    if (qkv.size() != 3) return;  // C = 0: split of an empty dim gives one empty piece, as in PyTorch
    auto heads = [&](const Tensor& t) { return transpose(view(t, {B, T, H, D}), 1, 2); };
    Tensor out = attention(heads(qkv.at(0)), heads(qkv.at(1)), heads(qkv.at(2)), Tensor(), p, true, scale, true, true);
    if (!out.defined()) return;
    push(out);
    TensorList params;
    for (const Tensor& t : {x_leaf, w_leaf})
      if (t.requires_grad() && t.is_leaf()) params.push_back(t);
    clip(params, 0, max_norm, 2.0, false);
  }

  void finish() {
    g_call = "the final backward";
    // The newest floating tensor that requires grad: sum it and backpropagate.
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (it->is_floating_point() && it->requires_grad()) {
        try {
          sum(*it).backward();
          if (trace) fprintf(stderr, "final backward of %s ok\n", describe(*it).c_str());
        } catch (const Error& e) {
          if (trace) fprintf(stderr, "final backward of %s error: %s\n", describe(*it).c_str(), e.what());
          if (!well_formed(e.what())) bad_message("an error message without its [name] prefix", e.what());
        }
        break;
      }
    }
    for (const Tensor& leaf : leaves_) {
      Tensor g = leaf.grad();
      if (!g.defined()) continue;
      g_call = fmt::format("the gradient of leaf {}", describe(leaf));
      FUZZ_EXPECT(g.shape() == leaf.shape());
      FUZZ_EXPECT(g.dtype() == leaf.dtype());
    }
  }

  Bytes& in_;
  std::vector<Tensor> stack_;
  std::vector<Tensor> leaves_;
  Tensor last_base_;  // the base make_with created last
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
