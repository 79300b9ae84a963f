// core/half.h conversions (round to nearest even, NaN, Inf, subnormals, overflow) and the
// promote_types table. Expected bit patterns are derived by hand in the comments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/detail/elementwise.h"
#include "tandem.h"

using namespace tandem;
using tandem::detail::bf16_bits_to_float;
using tandem::detail::float_bits;
using tandem::detail::float_to_bf16_bits;
using tandem::detail::float_to_half_bits;
using tandem::detail::half_bits_to_float;

namespace {
// binary16 value from its fields, computed independently of half.h.
double half_reference(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double s = sign ? -1.0 : 1.0;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (exp == 0) return s * std::ldexp(mant, -24);
  return s * std::ldexp(1024 + mant, exp - 25);
}
bool is_half_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool is_bf16_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }
float p2(int e) { return std::ldexp(1.0f, e); }
}  // namespace

TEST_CASE("every half bit pattern converts to the right float and back", "[dtype][half]") {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    float f = half_bits_to_float(bits);
    double ref = half_reference(bits);
    INFO("half bits 0x" << std::hex << h);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::signbit(f) == bool(bits & 0x8000));
      // Back to half: still NaN, same sign and payload, quiet bit set.
      uint16_t back = float_to_half_bits(f);
      REQUIRE(is_half_nan(back));
      REQUIRE(back == (bits | 0x200));
    } else {
      REQUIRE(static_cast<double>(f) == ref);
      REQUIRE(std::signbit(f) == bool(bits & 0x8000));  // -0 stays -0
      REQUIRE(float_to_half_bits(f) == bits);
    }
  }
}

TEST_CASE("float to half rounds to nearest even, overflows and underflows correctly", "[dtype][half]") {
  struct Case {
    float f;
    uint16_t bits;
    const char* why;
  };
  const Case cases[] = {
      {1.0f, 0x3c00, "one"},
      {-2.0f, 0xc000, "minus two"},
      {0.0f, 0x0000, "zero"},
      {-0.0f, 0x8000, "negative zero keeps its sign"},
      {0.1f, 0x2e66, "0.1 = 1.6 * 2^-4: mantissa 614.4 rounds to 614 = 0x266, exponent 11"},
      {65504.0f, 0x7bff, "largest half"},
      {65519.0f, 0x7bff, "below the midpoint 65520 rounds down"},
      {65520.0f, 0x7c00, "midpoint between 65504 and 2^16 ties to even = 2^16, which overflows to inf"},
      {1e10f, 0x7c00, "far overflow is inf"},
      {-1e10f, 0xfc00, "far negative overflow is -inf"},
      {INFINITY, 0x7c00, "inf"},
      {-INFINITY, 0xfc00, "-inf"},
      {1.0f + p2(-11), 0x3c00, "1 + half an ulp ties to even (1.0)"},
      {1.0f + 3 * p2(-11), 0x3c02, "1 + 1.5 ulp ties to even (mantissa 2)"},
      {1.0f + p2(-11) + p2(-20), 0x3c01, "just above the midpoint rounds up"},
      {p2(-14), 0x0400, "smallest normal"},
      {p2(-24), 0x0001, "smallest subnormal 2^-24"},
      {p2(-25), 0x0000, "2^-25 is the midpoint between 0 and 2^-24: ties to even (0)"},
      {p2(-25) + p2(-40), 0x0001, "just above that midpoint rounds up to 2^-24"},
      {3 * p2(-25), 0x0002, "1.5 * 2^-24 ties to even: 2 * 2^-24 = 2^-23"},
      {p2(-14) - p2(-25), 0x0400, "1023.5 * 2^-24 ties to even 1024 * 2^-24: the subnormal rounds up into the normals"},
      {1023 * p2(-24), 0x03ff, "largest subnormal"},
      {-p2(-24), 0x8001, "negative smallest subnormal"},
      {1e-10f, 0x0000, "underflow to zero"},
      {-1e-10f, 0x8000, "negative underflow to -0"},
      {2049.0f, 0x6800, "2049 is the midpoint between 2048 and 2050 (ulp 2): ties to even 2048"},
      {2051.0f, 0x6802, "2051: midpoint between 2050 (odd mantissa) and 2052: ties to 2052"},
  };
  for (const auto& c : cases) {
    INFO(c.why << " (float " << c.f << ")");
    REQUIRE(float_to_half_bits(c.f) == c.bits);
    REQUIRE(Half(c.f).bits == c.bits);
  }
  REQUIRE(is_half_nan(float_to_half_bits(std::numeric_limits<float>::quiet_NaN())));
  REQUIRE(is_half_nan(float_to_half_bits(-std::numeric_limits<float>::quiet_NaN())));
  REQUIRE((float_to_half_bits(-std::numeric_limits<float>::quiet_NaN()) & 0x8000) != 0);
  // A float NaN whose payload lives only in the low 13 bits must not become inf.
  REQUIRE(is_half_nan(float_to_half_bits(tandem::detail::bits_float(0x7f800001u))));
}

TEST_CASE("float to half agrees with exact rounding on a sweep of floats", "[dtype][half]") {
  // Reference: the nearest half by exhaustive neighbour comparison (ties to the even pattern).
  for (uint32_t x = 0x33000000u; x < 0x477fe000u; x += 0x1111u) {  // 2^-25 .. 65504, positive
    float f = tandem::detail::bits_float(x);
    uint16_t got = float_to_half_bits(f);
    double v = f;
    double lo = half_reference(got), best = std::fabs(lo - v);
    INFO("float bits 0x" << std::hex << x);
    if (got > 0) REQUIRE(std::fabs(half_reference(got - 1) - v) >= best);
    if (got < 0x7c00) REQUIRE(std::fabs(half_reference(got + 1) - v) >= best);
    if (got < 0x7c00 && std::fabs(half_reference(got + 1) - v) == best) REQUIRE((got & 1) == 0);
    if (got > 0 && std::fabs(half_reference(got - 1) - v) == best) REQUIRE((got & 1) == 0);
  }
}

TEST_CASE("every bfloat16 bit pattern round-trips through float", "[dtype][bf16]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    float f = bf16_bits_to_float(bits);
    REQUIRE(float_bits(f) == (b << 16));
    uint16_t back = float_to_bf16_bits(f);
    INFO("bf16 bits 0x" << std::hex << b);
    if (is_bf16_nan(bits)) {
      REQUIRE(is_bf16_nan(back));
      REQUIRE(back == (bits | 0x40));
    } else {
      REQUIRE(back == bits);
    }
  }
}

TEST_CASE("float to bfloat16 rounds to nearest even", "[dtype][bf16]") {
  struct Case {
    float f;
    uint16_t bits;
    const char* why;
  };
  const Case cases[] = {
      {1.0f, 0x3f80, "one"},
      {-0.0f, 0x8000, "negative zero"},
      {1.0f + p2(-8), 0x3f80, "1 + half an ulp (ulp 2^-7) ties to even"},
      {1.0f + 3 * p2(-8), 0x3f82, "1 + 1.5 ulp ties to even"},
      {1.0f + p2(-8) + p2(-20), 0x3f81, "above the midpoint rounds up"},
      {std::numeric_limits<float>::max(), 0x7f80, "float max is above the midpoint past the largest bf16: inf"},
      {3.3895314e38f, 0x7f7f, "largest bf16"},
      {INFINITY, 0x7f80, "inf"},
      {-INFINITY, 0xff80, "-inf"},
      {p2(-133), 0x0001, "smallest bf16 subnormal"},
      {p2(-134), 0x0000, "half of it ties to even (0)"},
      {3 * p2(-134), 0x0002, "1.5 of it ties to even (2)"},
      {p2(-126), 0x0080, "smallest normal"},
  };
  for (const auto& c : cases) {
    INFO(c.why);
    REQUIRE(float_to_bf16_bits(c.f) == c.bits);
    REQUIRE(BFloat16(c.f).bits == c.bits);
  }
  REQUIRE(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7fc0);
  REQUIRE(is_bf16_nan(float_to_bf16_bits(tandem::detail::bits_float(0x7f800001u))));  // payload in low bits only
  REQUIRE(float_to_bf16_bits(tandem::detail::bits_float(0xff800001u)) == 0xffc0);
}

TEST_CASE("Half and BFloat16 compute through float", "[dtype]") {
  Half a = 1.5f, b = 2.25f;
  REQUIRE(static_cast<float>(Half(static_cast<float>(a) * static_cast<float>(b))) == 3.375f);
  BFloat16 c = 3.0f;
  REQUIRE(static_cast<float>(c) == 3.0f);
  REQUIRE(itemsize(f16) == 2);
  REQUIRE(itemsize(bf16) == 2);
}

TEST_CASE("promote_types follows PyTorch's table", "[dtype]") {
  // Rows/columns: f32 f64 f16 bf16 i32 i64 bool (the enum order).
  const Dtype all[] = {f32, f64, f16, bf16, i32, i64, boolean};
  const Dtype table[7][7] = {
      /* f32  */ {f32, f64, f32, f32, f32, f32, f32},
      /* f64  */ {f64, f64, f64, f64, f64, f64, f64},
      /* f16  */ {f32, f64, f16, f32, f16, f16, f16},
      /* bf16 */ {f32, f64, f32, bf16, bf16, bf16, bf16},
      /* i32  */ {f32, f64, f16, bf16, i32, i64, i32},
      /* i64  */ {f32, f64, f16, bf16, i64, i64, i64},
      /* bool */ {f32, f64, f16, bf16, i32, i64, boolean},
  };
  for (int i = 0; i < 7; ++i) {
    for (int j = 0; j < 7; ++j) {
      INFO(dtype_name(all[i]) << " with " << dtype_name(all[j]));
      REQUIRE(promote_types(all[i], all[j]) == table[i][j]);
    }
  }
}

TEST_CASE("tensor dtype conversions round like the scalar conversions", "[dtype]") {
  Tensor x = from_vector<float>({65520.0f, 1.0f + p2(-11), p2(-25), 3 * p2(-25), -0.0f});
  Tensor h = x.to(f16);
  REQUIRE(h.dtype() == f16);
  const Half* p = h.data_ptr<Half>();
  REQUIRE(p[0].bits == 0x7c00);
  REQUIRE(p[1].bits == 0x3c00);
  REQUIRE(p[2].bits == 0x0000);
  REQUIRE(p[3].bits == 0x0002);
  REQUIRE(p[4].bits == 0x8000);
  Tensor b = from_vector<float>({1.0f + 3 * p2(-8)}).to(bf16);
  REQUIRE(b.data_ptr<BFloat16>()[0].bits == 0x3f82);
  // And back: exact.
  REQUIRE(h.to(f32).to_vector<float>()[3] == p2(-23));
}

TEST_CASE("bf16 tensor loops give the scalar conversions' bits: casts, divided copies, in-place ops", "[dtype][bf16]") {
  // The CPU loops convert bf16 runs with SIMD clones (AVX-512 where the CPU has it) in blocks
  // of 256; every element must get the bits of the scalar BFloat16 conversions of core/half.h.
  // Floats with random bits (NaNs with payloads, subnormals, infinities) and rounding ties, an
  // odd length so the blocks end in a tail; every bf16 bit pattern the other way.
  std::vector<float> src;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 3001; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = static_cast<uint32_t>(state >> 32);
    if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;                   // a tie: to even
    if (i % 7 == 2) bits = (bits & 0x807fffffu);                             // subnormal
    if (i % 11 == 3) bits = (bits & 0x80000000u) | 0x7f800000u | (bits & 0x3fffffu);  // NaN or Inf
    src.push_back(tandem::detail::bits_float(bits));
  }
  const int64_t n = static_cast<int64_t>(src.size());
  Tensor x = from_vector<float>(src, {n});
  Tensor b = x.to(bf16);
  const BFloat16* bp = b.data_ptr<BFloat16>();
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i << " bits " << float_bits(src[i]));
    REQUIRE(bp[i].bits == float_to_bf16_bits(src[i]));
  }
  std::vector<BFloat16> every(65536);
  for (uint32_t i = 0; i < 65536; ++i) every[i] = BFloat16::from_bits(static_cast<uint16_t>(i));
  Tensor all = empty({65536}, bf16);
  std::copy(every.begin(), every.end(), all.data_ptr<BFloat16>());
  const std::vector<float> back = all.to(f32).to_vector<float>();
  for (uint32_t i = 0; i < 65536; ++i) {
    INFO("bf16 bits " << i);
    REQUIRE(float_bits(back[i]) == float_bits(bf16_bits_to_float(static_cast<uint16_t>(i))));
  }
  // DDP's divided copy into a bf16 bucket (a bf16 source and destination), a bf16 in-place add
  // and a bf16 result of an f32 op: each element computed in f32 and rounded once.
  Tensor slot = empty({n}, bf16);
  tandem::detail::copy_divided(slot, b, 3.0);
  std::vector<float> rotated = src;
  std::rotate(rotated.begin(), rotated.begin() + 1, rotated.end());
  Tensor c = from_vector<float>(rotated, {n}).to(bf16);
  Tensor sum = b.clone();
  sum.add_(c);
  const BFloat16* sp = slot.data_ptr<BFloat16>();
  const BFloat16* up = sum.data_ptr<BFloat16>();
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    const float v = bf16_bits_to_float(bp[i].bits), w = bf16_bits_to_float(c.data_ptr<BFloat16>()[i].bits);
    // Which NaN an addition of two NaNs returns is the hardware's and the compiler's choice
    // (operand order): a NaN result is checked as a NaN.
    auto same = [](uint16_t got, uint16_t want) {
      auto is_nan = [](uint16_t h) { return (h & 0x7fffu) > 0x7f80u; };
      return is_nan(want) ? is_nan(got) : got == want;
    };
    REQUIRE(same(sp[i].bits, float_to_bf16_bits(v / 3.0f)));
    REQUIRE(same(up[i].bits, float_to_bf16_bits(v + w)));
  }
}
