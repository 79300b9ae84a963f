// Philox known answers, the (seed, offset, index) layout, determinism, distributions, errors; and
// multinomial: draws pinned to rand's uniforms, reproducibility, its distributions, its errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "core/philox.h"
#include "core/random.h"
#include "tandem.h"

using namespace tandem;

namespace {
struct Moments {
  double mean, var;
};
Moments moments(const Tensor& t) {
  auto v = t.to_vector<double>();
  double s = 0, s2 = 0;
  for (double x : v) s += x;
  double mean = s / v.size();
  for (double x : v) s2 += (x - mean) * (x - mean);
  return {mean, s2 / (v.size() - 1)};
}
void require_block(detail::PhiloxCounter c, detail::PhiloxKey k, std::array<uint32_t, 4> expected) {
  detail::PhiloxCounter r = detail::philox4x32_10(c, k);
  for (int i = 0; i < 4; ++i) {
    INFO("word " << i);
    REQUIRE(r.w[i] == expected[i]);
  }
}
}  // namespace

TEST_CASE("Philox-4x32-10 matches the Random123 known-answer vectors", "[random]") {
  require_block({{0, 0, 0, 0}}, {{0, 0}}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  require_block({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
                {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  require_block({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
                {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("rand values are pinned to Philox blocks of (seed, offset + i / 4)", "[random]") {
  manual_seed(0);
  Tensor r = rand({5});
  auto v = r.to_vector<float>();
  // Block 0 under key 0 is the first known-answer vector.
  const uint32_t b0[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
  for (int i = 0; i < 4; ++i) REQUIRE(v[i] == static_cast<float>(b0[i] >> 8) * 0x1.0p-24f);
  REQUIRE(v[4] == detail::uniform_f32(detail::philox_block(0, 1).w[0]));
  REQUIRE(get_rng_state().offset == 2);  // ceil(5 / 4) blocks consumed

  manual_seed(0);
  double d0 = rand({1}, f64).item<double>();
  uint64_t bits = (static_cast<uint64_t>(0xe169c58du) << 32 | 0x6627e8d5u) >> 11;
  REQUIRE(d0 == static_cast<double>(bits) * 0x1.0p-53);
  REQUIRE(get_rng_state().offset == 1);
}

TEST_CASE("manual_seed makes every random op reproducible", "[random]") {
  for (Dtype dt : {f32, f64, f16, bf16}) {
    INFO(dtype_name(dt));
    manual_seed(1234);
    Tensor a = rand({3, 7}, dt), b = randn({11}, dt);
    manual_seed(1234);
    Tensor c = rand({3, 7}, dt), d = randn({11}, dt);
    REQUIRE(equal(a, c));
    REQUIRE(equal(b, d));
    REQUIRE_FALSE(equal(a, rand({3, 7}, dt)));  // the stream moved on
  }
  manual_seed(9);
  Tensor i1 = randint(0, 100, {50});
  manual_seed(9);
  REQUIRE(equal(i1, randint(0, 100, {50})));
}

TEST_CASE("element i depends only on seed, offset and i", "[random]") {
  manual_seed(77);
  auto flat = rand({12}).to_vector<float>();
  manual_seed(77);
  REQUIRE(rand({3, 4}).to_vector<float>() == flat);
  manual_seed(77);
  auto first = rand({6}).to_vector<float>();
  REQUIRE(std::vector<float>(flat.begin(), flat.begin() + 6) == first);

  // A strided destination is filled in logical order, like a contiguous one of its shape.
  manual_seed(5);
  Tensor t = zeros({4, 6}).t();
  REQUIRE_FALSE(t.is_contiguous());
  {
    NoGradGuard ng;
    t.uniform_();
  }
  manual_seed(5);
  REQUIRE(equal(t, rand({6, 4})));
  manual_seed(5);
  Tensor n = zeros({4, 6}).t();
  n.normal_(2, 3);
  manual_seed(5);
  auto z = randn({6, 4}).to_vector<float>();
  auto nv = n.to_vector<float>();
  for (size_t i = 0; i < z.size(); ++i) REQUIRE(nv[i] == Approx(2.0f + 3.0f * z[i]).epsilon(1e-6));
}

TEST_CASE("different seeds give different streams", "[random]") {
  manual_seed(1);
  Tensor a = rand({64});
  manual_seed(2);
  Tensor b = rand({64});
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  int same = 0;
  for (size_t i = 0; i < va.size(); ++i) same += va[i] == vb[i];
  REQUIRE(same < 2);
}

TEST_CASE("the generator is per thread", "[random]") {
  manual_seed(3);
  auto expected = rand({8}).to_vector<float>();
  manual_seed(3);
  std::vector<float> other;
  std::thread th([&] {
    manual_seed(99);
    other = rand({8}).to_vector<float>();
  });
  th.join();
  REQUIRE(rand({8}).to_vector<float>() == expected);  // the other thread did not move ours
  REQUIRE(other != expected);
}

TEST_CASE("uniform and normal moments over 1e6 samples", "[random]") {
  manual_seed(2024);
  for (Dtype dt : {f32, f64}) {
    INFO(dtype_name(dt));
    Tensor u = rand({1000000}, dt);
    auto vu = u.to_vector<double>();
    REQUIRE(*std::min_element(vu.begin(), vu.end()) >= 0.0);
    REQUIRE(*std::max_element(vu.begin(), vu.end()) < 1.0);
    Moments mu = moments(u);
    REQUIRE(mu.mean == Approx(0.5).margin(2e-3));
    REQUIRE(mu.var == Approx(1.0 / 12).margin(1e-3));

    Tensor n = randn({1000000}, dt);
    Moments mn = moments(n);
    REQUIRE(mn.mean == Approx(0.0).margin(5e-3));
    REQUIRE(std::sqrt(mn.var) == Approx(1.0).margin(5e-3));
    auto vn = n.to_vector<double>();
    double tail = 0;
    for (double x : vn) tail += std::abs(x) > 2.0;
    REQUIRE(tail / vn.size() == Approx(0.0455).margin(2e-3));  // P(|z| > 2)
  }
  Tensor x = zeros({1000000}, f64);
  x.uniform_(-2, 6);
  Moments m = moments(x);
  REQUIRE(m.mean == Approx(2.0).margin(0.02));
  REQUIRE(m.var == Approx(64.0 / 12).margin(0.05));
  x.normal_(10, 0.5);
  m = moments(x);
  REQUIRE(m.mean == Approx(10.0).margin(3e-3));
  REQUIRE(std::sqrt(m.var) == Approx(0.5).margin(3e-3));
}

TEST_CASE("2-byte floats: rand stays below 1 and randn is sane", "[random]") {
  manual_seed(11);
  for (Dtype dt : {f16, bf16}) {
    INFO(dtype_name(dt));
    auto v = rand({100000}, dt).to_vector<double>();
    REQUIRE(*std::max_element(v.begin(), v.end()) < 1.0);
    REQUIRE(*std::min_element(v.begin(), v.end()) >= 0.0);
    Moments m = moments(randn({100000}, dt));
    REQUIRE(m.mean == Approx(0.0).margin(0.02));
    REQUIRE(std::sqrt(m.var) == Approx(1.0).margin(0.02));
  }
}

TEST_CASE("randint stays in [low, high) and covers it", "[random]") {
  manual_seed(8);
  Tensor r = randint(-3, 5, {20000});
  REQUIRE(r.dtype() == i64);
  auto v = r.to_vector<int64_t>();
  std::vector<int> hits(8, 0);
  for (int64_t x : v) {
    REQUIRE(x >= -3);
    REQUIRE(x < 5);
    ++hits[x + 3];
  }
  for (int h : hits) REQUIRE(h > 2000);  // each of 8 values expects 2500

  auto v32 = randint(0, 10, {1000}, i32).to_vector<int32_t>();
  for (int32_t x : v32) REQUIRE((x >= 0 && x < 10));

  // A range beyond 32 bits draws 64-bit words.
  const int64_t big = int64_t{1} << 40;
  auto vb = randint(0, big, {1000}).to_vector<int64_t>();
  int above32 = 0;
  for (int64_t x : vb) {
    REQUIRE((x >= 0 && x < big));
    above32 += x > (int64_t{1} << 32);
  }
  REQUIRE(above32 > 900);

  auto vf = randint(2, 4, {100}, f32).to_vector<float>();
  for (float x : vf) REQUIRE((x == 2.0f || x == 3.0f));
}

TEST_CASE("random ops reject bad arguments", "[random]") {
  REQUIRE_THROWS_WITH(rand({2}, i64), Catch::Contains("[rand]") && Catch::Contains("floating"));
  REQUIRE_THROWS_WITH(randn({2}, i32), Catch::Contains("[randn]") && Catch::Contains("i32"));
  REQUIRE_THROWS_WITH(randint(5, 5, {2}), Catch::Contains("[randint] high (5) must be greater than low (5)"));
  REQUIRE_THROWS_WITH(randint(0, int64_t{1} << 33, {2}, i32), Catch::Contains("[randint]") && Catch::Contains("i32"));
  Tensor z = zeros({3});
  REQUIRE_THROWS_WITH(z.uniform_(2, 1), Catch::Contains("[uniform_]"));
  REQUIRE_THROWS_WITH(z.normal_(0, -1), Catch::Contains("[normal_]") && Catch::Contains("std"));
  REQUIRE_THROWS_WITH(zeros({3}, i64).uniform_(), Catch::Contains("[uniform_]") && Catch::Contains("i64"));
  Tensor e = zeros({1, 3}).expand({4, 3});
  REQUIRE_THROWS_WITH(e.normal_(), Catch::Contains("[normal_]") && Catch::Contains("same memory location"));
  REQUIRE_THROWS_WITH(rand({2}, Device::cuda()), Catch::Contains("[rand]") && Catch::Contains("CUDA"));
}

TEST_CASE("in-place random fills respect autograd and bump the version", "[random]") {
  Tensor w = zeros({4}, f64);
  w.requires_grad_();
  REQUIRE_THROWS_WITH(w.uniform_(), Catch::Contains("[uniform_]") && Catch::Contains("leaf"));
  REQUIRE_THROWS_WITH(w.normal_(), Catch::Contains("[normal_]"));
  uint64_t v0 = w.version();
  {
    NoGradGuard ng;
    w.uniform_(-1, 1);
  }
  REQUIRE(w.version() == v0 + 1);
  for (double x : w.to_vector<double>()) REQUIRE((x >= -1 && x < 1));
  Tensor r = rand({3}, TensorOptions(f64).with_requires_grad());
  REQUIRE(r.requires_grad());
  REQUIRE(r.is_leaf());
}

// ---------------------------------------------------------------- multinomial

namespace {

// Small-integer weights: every partial sum is exact in f64, so the chunked sums of the scheme
// (core/random.h) equal these plain left-to-right ones, and the draws can be recomputed here.
std::vector<double> integer_weights(int64_t n, int64_t hi, uint64_t seed) {
  manual_seed(seed);
  return randint(0, hi, {n}).to(f64).to_vector<double>();
}

// The first category whose cumulative weight exceeds u * total (or reaches the total).
int64_t inverse_cdf(const std::vector<double>& w, double u) {
  double total = 0;
  for (double x : w) total += x;
  const double target = u * total;
  double cdf = 0;
  for (size_t j = 0; j < w.size(); ++j) {
    cdf += w[j];
    if (cdf > target || (target >= total && cdf >= total)) return static_cast<int64_t>(j);
  }
  return -1;
}

// Draws of rows of integer weights by the documented scheme, with the uniforms of rand(f64).
std::vector<int64_t> expected_draws(std::vector<std::vector<double>> rows, int64_t samples, bool replacement,
                                    const std::vector<double>& u) {
  std::vector<int64_t> out;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t j = inverse_cdf(rows[r], u[r * samples + s]);
      out.push_back(j);
      if (!replacement) rows[r][j] = 0;
    }
  }
  return out;
}

// |count - N p| within 5 standard deviations of a binomial count.
void require_count_near(int64_t count, int64_t draws, double p) {
  const double mean = static_cast<double>(draws) * p;
  const double sigma = std::sqrt(mean * (1 - p));
  INFO("count " << count << " of " << draws << ", expected " << mean << " +- " << sigma);
  REQUIRE(std::abs(static_cast<double>(count) - mean) <= 5 * sigma);
}

}  // namespace

TEST_CASE("multinomial draws are pinned to rand's f64 uniforms", "[random][multinomial]") {
  // Rows of 7 and 3000 categories (the second sums in 47 chunks of 64), many weights 0.
  for (int64_t n : {int64_t{7}, int64_t{3000}}) {
    INFO("categories " << n);
    std::vector<std::vector<double>> rows = {integer_weights(n, 4, 1), integer_weights(n, 9, 2),
                                             integer_weights(n, 2, 3)};
    std::vector<double> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    const Tensor probs = from_vector<double>(flat, {3, n});
    for (bool replacement : {true, false}) {
      const int64_t samples = 3;
      manual_seed(21);
      const std::vector<double> u = rand({3 * samples}, f64).to_vector<double>();
      const PhiloxState after_rand = get_rng_state();
      manual_seed(21);
      const Tensor m = multinomial(probs, samples, replacement);
      REQUIRE(m.dtype() == i64);
      REQUIRE(m.shape() == Shape{3, samples});
      REQUIRE(get_rng_state().offset == after_rand.offset);  // two words per sample, as rand(f64)
      REQUIRE(m.to_vector<int64_t>() == expected_draws(rows, samples, replacement, u));
    }
  }
  // Without replacement over many draws: every draw recomputes one chunk and the offsets after it.
  std::vector<double> w = integer_weights(3000, 3, 4);
  manual_seed(22);
  const std::vector<double> u = rand({400}, f64).to_vector<double>();
  manual_seed(22);
  const Tensor m = multinomial(from_vector<double>(w).to(f32), 400, false);
  REQUIRE(m.shape() == Shape{400});
  REQUIRE(m.to_vector<int64_t>() == expected_draws({w}, 400, false, u));
}

TEST_CASE("multinomial is reproducible and independent of dtype, strides and replacement for one sample",
          "[random][multinomial]") {
  manual_seed(5);
  const Tensor p = rand({6, 40}, f64);
  manual_seed(30);
  const Tensor a = multinomial(p, 10, true);
  const Tensor b = multinomial(p, 10, true);
  manual_seed(30);
  REQUIRE(multinomial(p, 10, true).equal(a));
  REQUIRE_FALSE(b.equal(a));  // the stream moved on
  manual_seed(30);
  REQUIRE(p.multinomial(10, true).equal(a));

  // The weights are read as f64: values exact in every dtype give the same draws.
  const Tensor q = randint(0, 20, {6, 40}).to(f64);
  for (bool replacement : {true, false}) {
    manual_seed(31);
    const Tensor want = multinomial(q, 5, replacement);
    for (Dtype dt : {f32, f16, bf16}) {
      manual_seed(31);
      REQUIRE(multinomial(q.to(dt), 5, replacement).equal(want));
    }
    manual_seed(31);
    const Tensor qt = q.t().contiguous().t();  // the same values, column-major
    REQUIRE_FALSE(qt.is_contiguous());
    REQUIRE(multinomial(qt, 5, replacement).equal(want));
    manual_seed(31);
    Tensor rows = multinomial(q[2], 5, replacement);  // a 1-D row: [num_samples]
    REQUIRE(rows.shape() == Shape{5});
  }
  // One sample per row takes the same uniform with and without replacement.
  manual_seed(32);
  const Tensor with = multinomial(q, 1, true);
  manual_seed(32);
  REQUIRE(multinomial(q, 1, false).equal(with));

  REQUIRE(multinomial(zeros({0, 3}), 2).shape() == Shape{0, 2});
}

TEST_CASE("multinomial with replacement follows the weights (200k draws, 5 sigma)", "[random][multinomial]") {
  manual_seed(40);
  const std::vector<double> weights = {1, 2, 0, 3, 4};  // need not sum to 1
  const Tensor probs = from_vector<double>(weights, {1, 5}).expand({4, 5});
  const std::vector<int64_t> draws = multinomial(probs, 50000, true).to_vector<int64_t>();
  std::vector<int64_t> counts(5, 0);
  for (int64_t j : draws) ++counts.at(j);
  REQUIRE(counts[2] == 0);  // a weight of 0 is never drawn
  for (int j : {0, 1, 3, 4}) require_count_near(counts[j], 200000, weights[j] / 10);
}

TEST_CASE("multinomial without replacement: distinct draws, each from the weights left", "[random][multinomial]") {
  manual_seed(41);
  const int64_t rows = 100000;
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const std::vector<int64_t> draws =
      multinomial(from_vector<double>(p, {1, 4}).expand({rows, 4}).to(f32), 2, false).to_vector<int64_t>();
  std::vector<int64_t> pairs(16, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = draws[2 * r], j = draws[2 * r + 1];
    REQUIRE(i != j);
    ++pairs.at(i * 4 + j);
  }
  // P(i then j) = p_i p_j / (1 - p_i).
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      if (i != j) require_count_near(pairs[i * 4 + j], rows, p[i] * p[j] / (1 - p[i]));

  // Categories of weight 0 are never drawn: all the non-zero ones, in some order.
  const Tensor w = from_vector<double>({0, 1, 0, 2, 3, 0}, {1, 6}).expand({500, 6});
  const std::vector<int64_t> all = multinomial(w, 3, false).to_vector<int64_t>();
  for (int64_t r = 0; r < 500; ++r) {
    std::vector<int64_t> got(all.begin() + 3 * r, all.begin() + 3 * r + 3);
    std::sort(got.begin(), got.end());
    REQUIRE(got == std::vector<int64_t>{1, 3, 4});
  }
}

TEST_CASE("multinomial rejects what is no distribution, naming the row", "[random][multinomial]") {
  using Catch::Contains;
  REQUIRE_THROWS_WITH(multinomial(Tensor(), 1), Contains("[multinomial] got an undefined tensor"));
  REQUIRE_THROWS_WITH(multinomial(from_vector<int64_t>({1, 2}), 1),
                      Contains("[multinomial] probabilities must be floating, got i64"));
  REQUIRE_THROWS_WITH(multinomial(ones({2, 2, 2}), 1), Contains("[multinomial] probabilities must be 1-D or 2-D") &&
                                                           Contains("[2, 2, 2]"));
  REQUIRE_THROWS_WITH(multinomial(scalar_tensor(1.0), 1), Contains("must be 1-D or 2-D"));
  REQUIRE_THROWS_WITH(multinomial(ones({3}), 0), Contains("[multinomial] num_samples must be positive, got 0"));
  REQUIRE_THROWS_WITH(multinomial(ones({2, 3}), 4),
                      Contains("[multinomial] cannot draw 4 samples without replacement from 3 categories"));
  REQUIRE_NOTHROW(multinomial(ones({2, 3}), 4, true));
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {-0.5, nan, inf, -inf}) {
    INFO(bad);
    REQUIRE_THROWS_WITH(multinomial(from_vector<double>({1, 2, 3, bad, 1, 1}, {3, 2}), 1, true),
                        Contains("[multinomial] row 1 of the probabilities (shape [3, 2]) has a negative, infinite or "
                                 "NaN entry"));
  }
  REQUIRE_THROWS_WITH(multinomial(from_vector<float>({1, 2, 0, 0}, {2, 2}), 1),
                      Contains("[multinomial] row 1 of the probabilities (shape [2, 2]) sums to 0"));
  REQUIRE_THROWS_WITH(multinomial(from_vector<double>({1e308, 1e308}), 1),
                      Contains("[multinomial] row 0 of the probabilities (shape [2]) sums to infinity"));
  REQUIRE_THROWS_WITH(multinomial(from_vector<double>({1, 0, 2, 0, 0, 5}, {2, 3}), 2),
                      Contains("[multinomial] row 1 of the probabilities (shape [2, 3]) has 1 non-zero categories, "
                               "fewer than the 2 samples to draw without replacement"));
  REQUIRE_NOTHROW(multinomial(from_vector<double>({1, 0, 2, 0, 0, 5}, {2, 3}), 2, true));
  REQUIRE_THROWS_WITH(multinomial(zeros({2, 0}), 1, true), Contains("row 0") && Contains("sums to 0"));
  // Not differentiable: an i64 result with no history.
  Tensor w = ones({3}, f64).requires_grad_();
  REQUIRE_FALSE(multinomial(w, 2).requires_grad());
}
