// CUDA elementwise ops against the CPU: every op of core/detail/elementwise.h on fresh random inputs, in
// every dtype it has, over contiguous, broadcast, strided, misaligned and many-dim operands, the
// in-place forms, casts between every dtype pair, the raw backward kernels, autograd through
// composed ops, and the mixed-device errors. Without a usable device every case skips.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/detail/elementwise.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using detail::Binary;
using detail::Unary;

namespace {

using cuda_test::kGPU;
const Dtype kAll[] = {f32, f64, f16, bf16, i32, i64, boolean};
const Dtype kFloats[] = {f32, f64, f16, bf16};

// Fresh inputs every run; the seed is printed with any failure.
uint64_t fresh_seed() {
  static const uint64_t seed = std::random_device{}();
  manual_seed(seed);
  return seed;
}

// The same tensor on the CPU and on the GPU (views are applied to both, so the GPU operand has
// the CPU one's strides and offset).
struct Pair {
  Tensor c, g;
};
Pair both(const Tensor& cpu) { return {cpu, cpu.to(kGPU)}; }
Pair view(const Pair& p, const std::function<Tensor(const Tensor&)>& f) { return {f(p.c), f(p.g)}; }

// Uniform in [lo, hi) as dtype d (integers truncated, bool: x > 0), made on the CPU.
Tensor rnd_cpu(const Shape& s, Dtype d, double lo = -3, double hi = 3) {
  NoGradGuard ng;
  Tensor t = rand(s, f64) * (hi - lo) + lo;
  if (d == boolean) return t > 0;
  if (is_integral(d)) return t.to(i64).to(d);
  return t.to(d);
}
Pair rnd(const Shape& s, Dtype d, double lo = -3, double hi = 3) { return both(rnd_cpu(s, d, lo, hi)); }

constexpr cuda_test::Tolerances tol_for{};  // the defaults: f32 1e-5, f16 1e-3, bf16 1e-2
using cuda_test::require_match;
void require_match(const Tensor& got, const Tensor& want) { require_match(got, want, tol_for(want.dtype())); }

// Operand layouts of (a, b) against a of shape [6, 5, 7] (or as named).
const char* const kLayoutNames[] = {"contiguous", "broadcast [5,1]", "0-dim", "permuted", "misaligned slice",
                                    "single-element tail", "stepped slice", "8 dims permuted"};
constexpr int kLayouts = 8;
std::pair<Pair, Pair> layout(int which, Dtype d, double lo = -3, double hi = 3) {
  switch (which) {
    case 0: return {rnd({6, 5, 7}, d, lo, hi), rnd({6, 5, 7}, d, lo, hi)};
    case 1: return {rnd({6, 5, 7}, d, lo, hi), rnd({5, 1}, d, lo, hi)};
    case 2: return {rnd({6, 5, 7}, d, lo, hi), rnd({}, d, lo, hi)};
    case 3:
      return {view(rnd({7, 5, 6}, d, lo, hi), [](const Tensor& t) { return t.permute({2, 1, 0}); }),
              rnd({6, 5, 7}, d, lo, hi)};
    case 4:  // offset 1: not 16-byte aligned, the unvectorised flat path
      return {view(rnd({4101}, d, lo, hi), [](const Tensor& t) { return t.slice(0, 1, 4101); }),
              view(rnd({4100}, d, lo, hi), [](const Tensor& t) { return t.slice(0, 0, 4100); })};
    case 5:  // vectorised with a tail, b a one-element tensor
      return {rnd({4099}, d, lo, hi), rnd({1}, d, lo, hi)};
    case 6:
      return {view(rnd({6, 10, 7}, d, lo, hi), [](const Tensor& t) { return t.slice(1, 0, 10, 2); }),
              rnd({7}, d, lo, hi)};
    default:
      return {view(rnd({2, 3, 2, 3, 2, 3, 2, 3}, d, lo, hi),
                   [](const Tensor& t) { return t.permute({7, 6, 5, 4, 3, 2, 1, 0}); }),
              view(rnd({3, 2, 3, 2, 3, 2, 3, 2}, d, lo, hi), [](const Tensor& t) { return t.slice(0, 0, 3); })};
  }
}

bool binary_valid(Binary op, Dtype d) {
  if (d == boolean && (op == Binary::sub || op == Binary::pow)) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------- binary

TEST_CASE("cuda binary ops match the CPU in every dtype and layout", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  const Binary ops[] = {Binary::add, Binary::sub, Binary::mul, Binary::div, Binary::maximum, Binary::minimum,
                        Binary::pow, Binary::eq, Binary::ne, Binary::lt, Binary::le, Binary::gt, Binary::ge,
                        Binary::logical_and, Binary::logical_or, Binary::logical_xor};
  for (Dtype d : kAll) {
    for (int L = 0; L < kLayouts; ++L) {
      auto [a, b] = layout(L, d);
      // int pow: small exponents
      if (is_integral(d)) b = view(b, [](const Tensor& t) { return detail::clamp(t, 0, 3); });
      for (Binary op : ops) {
        if (!binary_valid(op, d)) continue;
        INFO(detail::op_name(op) << " " << d << ", " << kLayoutNames[L]);
        const Scalar alpha = d == boolean ? Scalar(true) : is_floating(d) ? Scalar(0.5) : Scalar(2);
        const Scalar al = op == Binary::add || op == Binary::sub ? alpha : Scalar(1);
        require_match(detail::binary(op, a.g, b.g, al), detail::binary(op, a.c, b.c, al));
        const Scalar s = d == boolean ? Scalar(true) : is_floating(d) ? Scalar(1.5) : Scalar(2);
        require_match(detail::binary(op, a.g, s), detail::binary(op, a.c, s));
        require_match(detail::binary(op, s, a.g), detail::binary(op, s, a.c));
      }
    }
  }
}

TEST_CASE("cuda binary ops promote types as the CPU does", "[cuda][elementwise][promotion]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype da : kAll) {
    for (Dtype db : kAll) {
      Pair a = rnd({4, 6}, da), b = rnd({6}, db), z = rnd({}, db);
      INFO(da << " with " << db);
      for (Binary op : {Binary::add, Binary::mul, Binary::div, Binary::maximum, Binary::lt, Binary::logical_xor}) {
        require_match(detail::binary(op, a.g, b.g), detail::binary(op, a.c, b.c));
        require_match(detail::binary(op, a.g, z.g), detail::binary(op, a.c, z.c));  // 0-dim operand
      }
    }
    // Scalars: an int tensor with a floating scalar gives f32; bool with int gives i64.
    Pair a = rnd({9}, da);
    require_match(detail::binary(Binary::mul, a.g, Scalar(2.5)), detail::binary(Binary::mul, a.c, Scalar(2.5)));
    require_match(detail::binary(Binary::add, a.g, Scalar(3)), detail::binary(Binary::add, a.c, Scalar(3)));
    require_match(detail::binary(Binary::div, Scalar(1), a.g), detail::binary(Binary::div, Scalar(1), a.c));
  }
}

TEST_CASE("cuda public arithmetic ops and operators", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype d : kFloats) {
    Pair a = rnd({3, 8}, d), b = rnd({8}, d, 0.5, 2);
    require_match(add(a.g, b.g, 0.25), add(a.c, b.c, 0.25));
    require_match(sub(a.g, b.g, 2), sub(a.c, b.c, 2));
    require_match(a.g * b.g, a.c * b.c);
    require_match(a.g / b.g, a.c / b.c);
    require_match(3 - a.g, 3 - a.c);
    require_match(2 / b.g, 2 / b.c);
    require_match(maximum(a.g, b.g), maximum(a.c, b.c));
    require_match(minimum(a.g, b.g), minimum(a.c, b.c));
    require_match(pow(b.g, a.g), pow(b.c, a.c));
    require_match(a.g >= b.g, a.c >= b.c);
    require_match(a.g == 0.5, a.c == 0.5);
  }
}

// ---------------------------------------------------------------- unary, pow, clamp, where

TEST_CASE("cuda unary ops match the CPU in every dtype and layout", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  const Unary ops[] = {Unary::neg,     Unary::abs,  Unary::exp,  Unary::log,       Unary::sqrt,
                       Unary::rsqrt,   Unary::tanh, Unary::sigmoid, Unary::relu,   Unary::gelu,
                       Unary::gelu_tanh, Unary::silu, Unary::logical_not, Unary::isnan, Unary::isinf};
  for (Dtype d : kAll) {
    for (int L = 0; L < kLayouts; ++L) {
      auto [a, b] = layout(L, d, -4, 4);
      for (Unary op : ops) {
        const bool numeric = op == Unary::neg || op == Unary::abs || op == Unary::relu;
        if (numeric && d == boolean) continue;
        INFO(detail::op_name(op) << " " << d << ", " << kLayoutNames[L]);
        // log/sqrt/rsqrt of negatives give NaN on both; integer inputs promote to f32.
        require_match(detail::unary(op, a.g), detail::unary(op, a.c));
      }
    }
  }
  // Special values: NaN, infinities, signed zeros, huge arguments.
  for (Dtype d : kFloats) {
    Pair s = both(from_vector<double>({NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 88.0, -88.0}).to(d));
    for (Unary op : ops) {
      INFO(detail::op_name(op) << " " << d << " special values");
      require_match(detail::unary(op, s.g), detail::unary(op, s.c));
    }
  }
}

TEST_CASE("cuda pow with scalar exponents, clamp and where match the CPU", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype d : kAll) {
    for (int L = 0; L < kLayouts; ++L) {
      auto [a, b] = layout(L, d);
      INFO(d << ", " << kLayoutNames[L]);
      if (d != boolean) {
        for (double e : {0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, 2.5, -2.0, 7.0}) {
          if (is_integral(d) && e < 0) continue;
          INFO("exponent " << e);
          require_match(detail::pow_scalar(a.g, e), detail::pow_scalar(a.c, e));
        }
        using B = std::optional<double>;
        for (auto [lo, hi] : {std::pair<B, B>{-1.0, 1.0}, {std::nullopt, 0.0}, {0.0, std::nullopt}, {2.0, -2.0},
                              {-0.5, 1.5}}) {
          require_match(detail::clamp(a.g, lo, hi), detail::clamp(a.c, lo, hi));
        }
      }
      Pair cond = view(b, [](const Tensor& t) { return detail::binary(Binary::gt, t, Scalar(0)); });
      require_match(detail::where(cond.g, a.g, b.g), detail::where(cond.c, a.c, b.c));
    }
  }
  // where with mixed dtypes and a broadcast condition
  Pair cond = rnd({5, 1}, boolean), x = rnd({5, 4}, f16), y = rnd({4}, f32);
  require_match(where(cond.g, x.g, y.g), where(cond.c, x.c, y.c));
}

// ---------------------------------------------------------------- casts, copies, fill

TEST_CASE("cuda casts between every dtype pair match the CPU", "[cuda][elementwise][cast]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype from : kAll) {
    for (Dtype to : kAll) {
      INFO(from << " -> " << to);
      // In range for every destination (floating -> integer outside it is undefined in C++).
      Pair a = rnd({5, 67}, from, -100, 100);
      require_match(a.g.to(to), a.c.to(to));
      Pair t = view(a, [](const Tensor& x) { return x.t(); });
      require_match(t.g.to(to), t.c.to(to));  // strided source
      // copy_ into a strided destination, the source broadcast
      Pair dst = view(rnd({67, 5}, to), [](const Tensor& x) { return x.t(); });
      Pair row = view(a, [](const Tensor& x) { return x.select(0, 1); });
      detail::copy(dst.g, row.g);
      detail::copy(dst.c, row.c);
      require_match(dst.g, dst.c);
    }
  }
  // Special floating values into the 2-byte floats: rounding, overflow to inf, NaN, subnormals.
  Pair s = both(from_vector<double>({NAN, INFINITY, -INFINITY, 65504.0, 65520.0, 1e-8, -1e-40, 3.0e38, 1.0 + 1.0 / 1024}));
  for (Dtype to : {f16, bf16, f32}) require_match(s.g.to(to), s.c.to(to));
  // contiguous() and clone() of views go through the device copy
  Pair v = view(rnd({8, 9, 10}, bf16), [](const Tensor& x) { return x.permute({2, 0, 1}).slice(1, 1, 8, 3); });
  require_match(v.g.contiguous(), v.c.contiguous());
  require_match(v.g.clone(), v.c.clone());
}

// Device kernels convert with the hardware instructions (core/half.h); they must give the host
// routines' bits: round to nearest even on ties, subnormals kept, overflow past the largest
// finite value to Inf, NaN's sign and payload as the host keeps them.
namespace {

// A CPU tensor of `dtype` holding the given raw bit patterns (4-byte or 2-byte).
template <class U>
Tensor from_bits(const std::vector<U>& bits, Dtype dtype) {
  Tensor t = empty({static_cast<int64_t>(bits.size())}, dtype);
  REQUIRE(t.element_size() == sizeof(U));
  std::memcpy(t.data_ptr(), bits.data(), bits.size() * sizeof(U));
  return t;
}

template <class U>
std::vector<U> bits_of(const Tensor& t) {
  Tensor c = (t.is_cpu() ? t : t.to(kCPU)).contiguous();
  REQUIRE(c.element_size() == sizeof(U));
  std::vector<U> out(static_cast<size_t>(c.numel()));
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(U));
  return out;
}

// got == want element by element, naming the first input whose result differs.
template <class In, class Out>
void require_same_bits(const std::vector<In>& input, const std::vector<Out>& got, const std::vector<Out>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    INFO("input 0x" << std::hex << uint64_t(input[i]) << ": cuda 0x" << uint64_t(got[i]) << ", cpu 0x"
                    << uint64_t(want[i]));
    REQUIRE(got[i] == want[i]);
  }
}

}  // namespace

TEST_CASE("cuda f16/bf16 conversions give the CPU's bits", "[cuda][elementwise][cast]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  // f32 inputs by their bits: zeros, ties of both formats, subnormals of both, the largest finite
  // values and the first ones that overflow, infinities, NaNs (quiet, signalling, signed, payloads).
  std::vector<uint32_t> in = {
      0x00000000, 0x80000000, 0x3f800000, 0xbf800000,  // +-0, +-1
      0x3f801000, 0x3f803000, 0x3f802000, 0x3f801001,  // f16 at 1: ties (to even: down, up), exact, over a tie
      0x3f808000, 0x3f818000, 0x3f808001, 0xbf818000,  // bf16 at 1: ties (down, up), over a tie, a negative tie
      0x33000000, 0x33400000, 0x33c00000, 0xb3c00000,  // 2^-25 (f16 tie to 0), 1.5 * 2^-25, 1.5 * 2^-24
      0x387fc000, 0x387fe000, 0x38800000, 0x38000000,  // around the smallest normal f16 (2^-14)
      0x00000001, 0x00008000, 0x00018000, 0x80018000,  // f32 subnormals: bf16 ties to 0 and to 2
      0x007fffff, 0x00800000, 0x007f8000, 0x007fc000,  // largest f32 subnormal, smallest normal
      0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000,  // 65504, just under 65520, 65520 (-> Inf)
      0x47800000, 0x4f000000, 0x7f7f7fff, 0x7f7f8000,  // 65536, 2^31, bf16: largest finite, tie -> Inf
      0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,  // f32 max (overflows both), +-Inf
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001,  // quiet and signalling NaNs, both signs
      0x7fa5a5a5, 0x7fffffff, 0x7f802000, 0x7fc00001,  // NaN payloads
  };
  uint32_t x = 12345;  // and 100000 patterns from a fixed LCG, every exponent
  for (int i = 0; i < 100000; ++i) in.push_back(x = x * 1664525u + 1013904223u);
  Tensor cpu = from_bits(in, f32);
  Tensor gpu = cpu.to(kGPU);
  for (Dtype to : {f16, bf16}) {
    INFO("f32 -> " << to);
    require_same_bits(in, bits_of<uint16_t>(gpu.to(to)), bits_of<uint16_t>(cpu.to(to)));
  }
  // Every 2-byte pattern to f32, and back to the 2-byte type.
  std::vector<uint16_t> all(1 << 16);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
  for (Dtype from : {f16, bf16}) {
    INFO(from << " -> f32");
    Tensor c = from_bits(all, from), g = c.to(kGPU);
    require_same_bits(all, bits_of<uint32_t>(g.to(f32)), bits_of<uint32_t>(c.to(f32)));
    require_same_bits(all, bits_of<uint16_t>(g.to(f32).to(from)), bits_of<uint16_t>(c.to(f32).to(from)));
  }
  // Arithmetic in f16/bf16 loads and stores through the same conversions: sums of the random
  // patterns round as on the CPU. A NaN sum only has to be NaN (which NaN an add returns is the
  // arithmetic's choice, not the conversion's: the GPU gives the canonical one).
  const int64_t half_n = 50000;
  Tensor lhs = cpu.slice(0, 48, 48 + half_n), rhs = cpu.slice(0, 48 + half_n, 48 + 2 * half_n);
  for (Dtype d : {f16, bf16}) {
    INFO("add in " << d);
    Tensor cl = lhs.to(d), cr = rhs.to(d);
    const std::vector<uint16_t> got = bits_of<uint16_t>(add(cl.to(kGPU), cr.to(kGPU)));
    const std::vector<uint16_t> want = bits_of<uint16_t>(add(cl, cr));
    const uint16_t exp_mask = d == f16 ? 0x7c00 : 0x7f80;
    auto is_nan = [&](uint16_t b) { return (b & exp_mask) == exp_mask && (b & ~exp_mask & 0x7fff) != 0; };
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[i] || (is_nan(got[i]) && is_nan(want[i]))) continue;
      INFO("element " << i << ": cuda 0x" << std::hex << got[i] << ", cpu 0x" << want[i]);
      REQUIRE(got[i] == want[i]);
    }
  }
}

TEST_CASE("cuda copy_ across devices converts and broadcasts", "[cuda][elementwise][cast]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  Tensor src = rnd_cpu({4, 6}, f64);
  Tensor dst = empty({4, 6}, TensorOptions(f32, kGPU));
  dst.copy_(src);  // cpu f64 -> cuda f32
  require_match(dst, src.to(f32));
  Tensor back = zeros({6, 4}, f16).t();  // strided CPU destination from a CUDA source
  back.copy_(dst);
  test_util::require_close(back.contiguous().to_vector<double>(), src.to(f32).to(f16).to_vector<double>(), 0);
  Tensor bc = empty({3, 4, 6}, TensorOptions(bf16, kGPU));
  bc.copy_(src);  // broadcast from the CPU
  require_match(bc, src.to(bf16).expand({3, 4, 6}).contiguous());
}

TEST_CASE("cuda fill_ matches the CPU, contiguous and strided", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype d : kAll) {
    for (double v : {0.0, -1.0, 2.75, 1e10}) {
      INFO(d << " fill " << v);
      if (is_integral(d) && v == 1e10 && d == i32) continue;  // out of range for i32
      Pair t = both(zeros({1003}, d));
      fill_(t.g, v);
      fill_(t.c, v);
      require_match(t.g, t.c);
      Pair s = view(both(zeros({9, 11}, d)), [](const Tensor& x) { return x.slice(1, 1, 11, 3); });
      fill_(s.g, v);
      fill_(s.c, v);
      require_match(s.g, s.c);
    }
  }
}

// ---------------------------------------------------------------- in place

TEST_CASE("cuda in-place ops match the CPU", "[cuda][elementwise][inplace]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype d : kAll) {
    if (d == boolean) continue;
    // self a strided view, other broadcast
    auto make = [&] { return view(rnd({7, 5, 6}, d), [](const Tensor& t) { return t.permute({2, 1, 0}); }); };
    Pair other = rnd({5, 1}, d, 1, 3);
    Pair s1 = make();
    detail::binary_(Binary::add, s1.g, other.g, 2, "add_");
    detail::binary_(Binary::add, s1.c, other.c, 2, "add_");
    require_match(s1.g, s1.c);
    detail::binary_(Binary::mul, s1.g, Scalar(3), "mul_");
    detail::binary_(Binary::mul, s1.c, Scalar(3), "mul_");
    require_match(s1.g, s1.c);
    detail::clamp_(s1.g, -2, 5);
    detail::clamp_(s1.c, -2, 5);
    require_match(s1.g, s1.c);
    if (is_floating(d)) {
      // computed in f32 and cast back into a 2-byte self, as on the CPU
      Pair wide = rnd({6, 5, 7}, f32);
      detail::binary_(Binary::div, s1.g, wide.g, 1, "div_");
      detail::binary_(Binary::div, s1.c, wide.c, 1, "div_");
      require_match(s1.g, s1.c);
      Pair t1 = rnd({6, 5, 7}, d), t2 = rnd({5, 7}, d, 0.5, 2), end = rnd({7}, d);
      detail::addcmul_(s1.g, t1.g, t2.g, 0.5);
      detail::addcmul_(s1.c, t1.c, t2.c, 0.5);
      require_match(s1.g, s1.c);
      detail::addcdiv_(s1.g, t1.g, t2.g, -0.25);
      detail::addcdiv_(s1.c, t1.c, t2.c, -0.25);
      require_match(s1.g, s1.c);
      for (double w : {0.3, 0.75}) {
        detail::lerp_(s1.g, end.g, w);
        detail::lerp_(s1.c, end.c, w);
        require_match(s1.g, s1.c);
      }
    }
    // an operand that partially overlaps self is read before it is written
    Pair base = rnd({12}, d);
    Pair lo = view(base, [](const Tensor& t) { return t.slice(0, 0, 8); });
    Pair hi = view(base, [](const Tensor& t) { return t.slice(0, 4, 12); });
    detail::binary_(Binary::add, hi.g, lo.g, 1, "add_");
    detail::binary_(Binary::add, hi.c, lo.c, 1, "add_");
    require_match(base.g, base.c);
  }
  // Errors as on the CPU.
  Tensor i = empty({3}, TensorOptions(i32, kGPU)), f = empty({3}, TensorOptions(f32, kGPU));
  REQUIRE_THROWS_WITH(detail::binary_(Binary::add, i, f, 1, "add_"), Contains("can't be cast"));
  Tensor e = f.expand({2, 3});
  REQUIRE_THROWS_WITH(detail::fill(e, 1), Contains("share memory"));
}

// ---------------------------------------------------------------- backward kernels

TEST_CASE("cuda raw backward kernels match the CPU", "[cuda][elementwise][grad]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  using G = detail::Grad3;
  for (Dtype d : kFloats) {
    for (int L = 0; L < kLayouts; ++L) {
      auto [a, b] = layout(L, d);
      INFO(d << ", " << kLayoutNames[L]);
      Pair g = rnd(detail::binary(Binary::add, a.c, b.c).shape(), d);
      Pair pos = view(a, [](const Tensor& t) {
        return detail::binary(Binary::add, detail::unary(Unary::abs, t), Scalar(0.1));
      });
      for (Unary op : {Unary::abs, Unary::sqrt, Unary::rsqrt, Unary::tanh, Unary::sigmoid, Unary::relu, Unary::gelu,
                       Unary::gelu_tanh, Unary::silu}) {
        INFO(detail::op_name(op));
        require_match(detail::unary_grad(op, g.g, pos.g), detail::unary_grad(op, g.c, pos.c));
        require_match(detail::unary_grad(op, g.g, a.g), detail::unary_grad(op, g.c, a.c));
      }
      require_match(detail::clamp_grad(g.g, a.g, -0.5, 0.5), detail::clamp_grad(g.c, a.c, -0.5, 0.5));
      require_match(detail::clamp_grad(g.g, a.g, std::nullopt, 0.0), detail::clamp_grad(g.c, a.c, std::nullopt, 0.0));
      for (double e : {0.0, 2.5, -1.5})
        require_match(detail::pow_scalar_grad(g.g, pos.g, e), detail::pow_scalar_grad(g.c, pos.c, e));
      require_match(detail::pow_grad_base(g.g, pos.g, b.g), detail::pow_grad_base(g.c, pos.c, b.c));
      require_match(detail::pow_grad_exponent(g.g, pos.g, b.g), detail::pow_grad_exponent(g.c, pos.c, b.c));
      require_match(detail::div_grad_other(g.g, a.g, b.g), detail::div_grad_other(g.c, a.c, b.c));
      // ties: a against a rounded copy of itself
      Pair tie = view(a, [](const Tensor& t) { return detail::clamp(t, -1, 1); });
      for (bool is_max : {true, false}) {
        for (bool first : {true, false}) {
          require_match(detail::extreme_grad(g.g, a.g, b.g, is_max, first),
                        detail::extreme_grad(g.c, a.c, b.c, is_max, first));
          require_match(detail::extreme_grad(g.g, a.g, tie.g, is_max, first),
                        detail::extreme_grad(g.c, a.c, tie.c, is_max, first));
        }
      }
      Pair cond = view(b, [](const Tensor& t) { return detail::binary(Binary::lt, t, Scalar(0)); });
      for (bool take : {true, false})
        require_match(detail::where_grad(cond.g, g.g, take), detail::where_grad(cond.c, g.c, take));
    }
  }
}

// ---------------------------------------------------------------- autograd

namespace {
// A composition of most differentiable elementwise ops.
Tensor composed(const Tensor& a, const Tensor& b, const Tensor& c) {
  Tensor y = sigmoid(a * b + c) * tanh(a) - gelu(b) / (abs(a) + 1);
  y = y + pow(clamp(b, -0.5, 0.5), 2) + maximum(a, c) - minimum(b, c) * 0.5;
  y = y + where(a > 0, exp(b * 0.5), log(abs(a) + 1)) + silu(c) + gelu(a, true) + relu(b - a);
  y = y + pow(abs(a) + 0.5, b) + sqrt(abs(c) + 1) + rsqrt(abs(b) + 1) + 2 / (c * c + 1) + neg(a).pow(3);
  return y;
}
void check_composed_grads(Dtype d, const Shape& c_shape, double tol) {
  Tensor ac = rnd_cpu({4, 5}, d), bc = rnd_cpu({4, 5}, d), cc = rnd_cpu(c_shape, d);
  Tensor gc = rnd_cpu({4, 5}, d);
  TensorList cpu{test_util::leaf(ac.clone()), test_util::leaf(bc.clone()), test_util::leaf(cc.clone())};
  TensorList gpu{test_util::leaf(ac.to(kGPU)), test_util::leaf(bc.to(kGPU)), test_util::leaf(cc.to(kGPU))};
  Tensor yc = composed(cpu[0], cpu[1], cpu[2]);
  Tensor yg = composed(gpu[0], gpu[1], gpu[2]);
  require_match(yg, yc.detach(), tol);
  yc.backward(gc);
  yg.backward(gc.to(kGPU));
  for (int i = 0; i < 3; ++i) {
    INFO("input " << i);
    REQUIRE(gpu[i].grad().defined());
    REQUIRE(gpu[i].grad().device() == kGPU);
    require_match(gpu[i].grad(), cpu[i].grad(), tol);
  }
}
}  // namespace

TEST_CASE("cuda autograd through composed elementwise ops matches the CPU", "[cuda][elementwise][autograd]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  SECTION("same shapes") {
    check_composed_grads(f64, {4, 5}, 1e-10);
    check_composed_grads(f32, {4, 5}, 1e-4);
  }
  SECTION("broadcast input (its gradient is summed on the device)") {
    check_composed_grads(f64, {5}, 1e-10);
    check_composed_grads(f32, {5}, 1e-4);
  }
  SECTION("through casts and a device round trip") {
    Tensor xc = test_util::leaf(rnd_cpu({8}, f32)), xg = test_util::leaf(xc.detach().to(kGPU));
    Tensor yc = (xc.to(bf16) * 2).to(f32).exp();
    Tensor yg = (xg.to(bf16) * 2).to(f32).exp().to(kCPU);  // the last op moves back to the CPU
    Tensor g = rnd_cpu({8}, f32);
    yc.backward(g);
    yg.backward(g);
    require_match(xg.grad(), xc.grad(), 1e-2);
  }
}

// ---------------------------------------------------------------- big, many-dim and errors

TEST_CASE("cuda elementwise on large and many-dim tensors", "[cuda][elementwise]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  INFO("seed " << fresh_seed());
  for (Dtype d : {f32, f16, bf16}) {
    // vectorised with a tail, and its misaligned twin
    Pair a = rnd({(1 << 22) + 3}, d), b = rnd({(1 << 22) + 3}, d);
    require_match(a.g + b.g, a.c + b.c);
    Pair a1 = view(a, [](const Tensor& t) { return t.slice(0, 1, (1 << 22) + 2); });  // offset 1: misaligned
    Pair b1 = view(b, [](const Tensor& t) { return t.slice(0, 2, (1 << 22) + 3).contiguous(); });
    require_match(a1.g * b1.g, a1.c * b1.c);
  }
  // 12 unmergeable dims are indexed; 13 are a clear error.
  Pair base12 = rnd(Shape(12, 3), f32);
  Pair v12 = view(base12, [](const Tensor& t) {
    Tensor v = t;
    for (int d = 0; d < 12; ++d) v = v.slice(d, 0, 2);
    return v;
  });
  require_match(detail::unary(Unary::exp, v12.g), detail::unary(Unary::exp, v12.c));
  Tensor base13 = empty(Shape(13, 3), TensorOptions(f32, kGPU));
  Tensor v13 = base13;
  for (int d = 0; d < 13; ++d) v13 = v13.slice(d, 0, 2);
  REQUIRE_THROWS_WITH(detail::unary(Unary::neg, v13), Contains("[neg] CUDA kernels index at most 12 dims"));
}

TEST_CASE("cuda elementwise with more than 2^31 elements (64-bit indexing)", "[cuda][elementwise][large]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const int64_t half = (int64_t{1} << 30) + 3;
  Tensor t = empty({2, half}, TensorOptions(boolean, kGPU));
  fill_(t.select(0, 0), true);
  fill_(t.select(0, 1), false);
  Tensor out = logical_not(t.t());  // strided, 2^31 + 6 elements
  REQUIRE(out.shape() == Shape{half, 2});
  Tensor host = out.to(kCPU);
  const bool* p = host.data_ptr<bool>();
  for (int64_t i : {int64_t{0}, int64_t{1} << 20, (int64_t{1} << 30) - 1, half - 2, half - 1}) {
    INFO("row " << i);
    REQUIRE(p[2 * i] == false);
    REQUIRE(p[2 * i + 1] == true);
  }
}

TEST_CASE("cuda elementwise mixed-device errors and CPU 0-dim operands", "[cuda][elementwise][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor g = empty({3}, TensorOptions(f32, kGPU)), c = zeros({3});
  fill_(g, 1.5);
  REQUIRE_THROWS_WITH(add(g, c), Contains("[add] tensors are on different devices: a on cuda:0, b on cpu"));
  REQUIRE_THROWS_WITH(mul(c, g), Contains("[mul] tensors are on different devices: a on cpu, b on cuda:0"));
  REQUIRE_THROWS_WITH(where(c > 0, g, g), Contains("[where] tensors are on different devices: condition on cpu"));
  REQUIRE_THROWS_WITH(g.add_(c), Contains("tensors are on different devices: self on cuda:0, other on cpu"));
  Tensor g2 = g.clone();
  REQUIRE_THROWS_WITH(addcmul_(g2, g, c), Contains("[addcmul_] tensors are on different devices"));
  REQUIRE_THROWS_WITH(lerp_(g2, c, 0.5), Contains("[lerp_] tensors are on different devices"));
  // A 0-dim CPU tensor joins a CUDA op as PyTorch allows, with 0-dim promotion rules.
  Tensor h = g.to(f16);
  Tensor s = scalar_tensor(2.5, f64);
  Tensor r = mul(h, s);
  REQUIRE(r.device() == kGPU);
  REQUIRE(r.dtype() == f16);
  require_match(r, mul(h.to(kCPU), s));
  require_match(sub(s, g), sub(s, g.to(kCPU)));
  require_match(where(g > 1, s, g), where(g.to(kCPU) > 1, s, g.to(kCPU)));
  g2.add_(s);
  require_match(g2, full({3}, 4.0));
}
