// Random numbers and factory functions on CUDA: the same seed and shape give the CPU's numbers
// (uniforms and randint bit for bit; normals, whose Box-Muller transform goes through the device's
// log/cos/sin, within 2 ulps in f32/f16/bf16 and almost all bit for bit, and to the last ulps of
// libm in f64),
// the generator offset advances alike on both devices so later draws stay in step, in-place
// fills of non-contiguous views, multinomial's samples (the CPU's, exactly, and its row errors
// raised at the next sync), and zeros/ones/full/arange/linspace/eye computed on the device with
// the CPU's values.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using test_util::require_close;

namespace {

using cuda_test::bits;
using cuda_test::host_values;
using cuda_test::kGPU;
using cuda_test::require_bit_equal;

// The number of elements whose bits differ (contiguous copies, same dtype).
int64_t mismatches(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.device() == kGPU);
  REQUIRE(cpu.is_cpu());
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const auto a = bits(gpu), b = bits(cpu);
  const size_t isz = gpu.element_size();
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); i += isz) n += std::memcmp(&a[i], &b[i], isz) != 0;
  return n;
}

// How far apart two floating values of `size` bytes (2, 4 or 8) are, in units in the last place
// of their dtype: neighbouring representable values are 1 apart, +0 and -0 are 0 apart.
uint64_t ulp_distance(const unsigned char* a, const unsigned char* b, size_t size) {
  uint64_t x = 0, y = 0;
  std::memcpy(&x, a, size);  // little-endian host: the low `size` bytes
  std::memcpy(&y, b, size);
  const uint64_t sign = uint64_t{1} << (8 * size - 1);
  const uint64_t mx = x & (sign - 1), my = y & (sign - 1);
  if ((x & sign) == (y & sign)) return mx > my ? mx - my : my - mx;
  return mx + my;
}

// Normals in f32/f16/bf16 on the GPU against the CPU. The Box-Muller transform runs in double
// through the device's log/cos/sin, which may differ from glibc's by an ulp or two; rounded to
// the dtype, such a difference can (rarely) land on the neighbouring value. So: every element
// within 2 ulps of its dtype, and all but a few bit for bit (a transform computed differently, a
// wrong word or a wrong rounding, changes far more than one element in 10^4).
void require_normals_match(const Tensor& gpu, const Tensor& cpu) {
  REQUIRE(gpu.dtype() != f64);
  const int64_t differ = mismatches(gpu, cpu);
  const auto a = bits(gpu), b = bits(cpu);
  const size_t isz = gpu.element_size();
  uint64_t worst = 0;
  for (size_t i = 0; i < a.size(); i += isz) worst = std::max(worst, ulp_distance(&a[i], &b[i], isz));
  INFO(differ << " of " << gpu.numel() << " elements differ from the CPU's, by at most " << worst << " ulp");
  REQUIRE(worst <= 2);
  REQUIRE(differ <= 1 + gpu.numel() / 10000);
}

}  // namespace

TEST_CASE("cuda rand/randn/randint: the CPU's numbers for the same seed and shape", "[cuda][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (const Shape& shape : {Shape{1}, Shape{3}, Shape{5, 7}, Shape{1000, 1001}, Shape{2, 3, 4, 5}}) {
    INFO("shape " << shape_str(shape));
    for (Dtype dt : {f32, f64, f16, bf16}) {
      INFO(dt);
      manual_seed(42);
      Tensor c = rand(shape, dt);
      manual_seed(42);
      Tensor g = rand(shape, TensorOptions(dt, kGPU));
      require_bit_equal(g, c);

      manual_seed(43);
      c = randn(shape, dt);
      manual_seed(43);
      g = randn(shape, TensorOptions(dt, kGPU));
      if (dt == f64) {
        require_close(host_values(g), host_values(c), 1e-14);  // device libm: last-ulp differences
      } else {
        require_normals_match(g, c);
      }
    }
    for (Dtype dt : {i64, i32, f32, f64, f16, bf16, boolean}) {
      INFO(dt);
      const int64_t lo = dt == boolean ? 0 : -7, hi = dt == boolean ? 2 : 1000;
      manual_seed(44);
      Tensor c = randint(lo, hi, shape, dt);
      manual_seed(44);
      Tensor g = randint(lo, hi, shape, TensorOptions(dt, kGPU));
      require_bit_equal(g, c);
    }
    // A range of 2^40 takes two words per element.
    manual_seed(45);
    Tensor c = randint(-(int64_t{1} << 39), int64_t{1} << 39, shape);
    manual_seed(45);
    Tensor g = randint(-(int64_t{1} << 39), int64_t{1} << 39, shape, TensorOptions(i64, kGPU));
    require_bit_equal(g, c);
  }
}

TEST_CASE("cuda random: the generator offset advances alike, so mixed-device draws stay in step", "[cuda][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(7);
  Tensor c1 = rand({1001});
  const PhiloxState after_cpu = get_rng_state();
  Tensor c2 = randn({37}, f64);
  Tensor c3 = randint(0, 10, {13});
  Tensor c4 = rand({5}, bf16);

  manual_seed(7);
  Tensor g1 = rand({1001}, TensorOptions(f32, kGPU));
  const PhiloxState after_gpu = get_rng_state();
  REQUIRE(after_gpu.seed == after_cpu.seed);
  REQUIRE(after_gpu.offset == after_cpu.offset);
  Tensor x2 = randn({37}, f64);                                // CPU
  Tensor g3 = randint(0, 10, {13}, TensorOptions(i64, kGPU));  // CUDA
  Tensor x4 = rand({5}, bf16);                                 // CPU
  require_bit_equal(g1, c1);
  require_close(host_values(x2), host_values(c2), 0);
  require_bit_equal(g3, c3);
  REQUIRE(bits(x4) == bits(c4));
}

TEST_CASE("cuda uniform_/normal_ fill non-contiguous views in logical order", "[cuda][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : {f32, f64, f16, bf16}) {
    INFO(dt);
    Tensor c = zeros({6, 9}, dt), g = zeros({6, 9}, TensorOptions(dt, kGPU));
    Tensor cv = c.transpose(0, 1).slice(0, 1, 8, 2), gv = g.transpose(0, 1).slice(0, 1, 8, 2);
    REQUIRE_FALSE(gv.is_contiguous());
    manual_seed(99);
    uniform_(cv, -2, 3);
    manual_seed(99);
    uniform_(gv, -2, 3);
    require_bit_equal(g, c);  // the elements outside the view stay 0 on both

    manual_seed(100);
    normal_(cv, 0.5, 2);
    manual_seed(100);
    normal_(gv, 0.5, 2);
    if (dt == f64) {
      require_close(host_values(g), host_values(c), 1e-14);
    } else {
      require_normals_match(g, c);  // the elements outside the view stay 0 on both
    }
  }
  Tensor e = zeros({2, 1}, TensorOptions(f32, kGPU)).expand({2, 3});
  REQUIRE_THROWS_WITH(uniform_(e), Contains("[uniform_]") && Contains("same memory location"));
}

TEST_CASE("cuda random: moments and ranges of large draws", "[cuda][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(5);
  std::vector<double> u = host_values(rand({1 << 20}, TensorOptions(f32, kGPU)));
  std::vector<double> z = host_values(randn({1 << 20}, TensorOptions(f32, kGPU)));
  double su = 0, sz = 0, szz = 0, umin = 1, umax = 0;
  for (double v : u) su += v, umin = std::min(umin, v), umax = std::max(umax, v);
  for (double v : z) sz += v, szz += v * v;
  const double n = static_cast<double>(u.size());
  REQUIRE(std::abs(su / n - 0.5) < 2e-3);
  REQUIRE(umin >= 0);
  REQUIRE(umax < 1);
  REQUIRE(std::abs(sz / n) < 5e-3);
  REQUIRE(std::abs(szz / n - 1) < 5e-3);
  for (Dtype dt : {f16, bf16}) {
    std::vector<double> h = host_values(rand({1 << 16}, TensorOptions(dt, kGPU)));
    for (double v : h) REQUIRE((v >= 0 && v < 1));
  }
}

TEST_CASE("cuda random: requires_grad and argument errors as on the CPU", "[cuda][random]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor r = rand({3}, TensorOptions(f32, kGPU).with_requires_grad());
  REQUIRE(r.requires_grad());
  REQUIRE(r.device() == kGPU);
  REQUIRE_THROWS_WITH(randint(5, 5, {2}, TensorOptions(i64, kGPU)), Contains("[randint] high (5)"));
  REQUIRE_THROWS_WITH(rand({2}, TensorOptions(i64, kGPU)), Contains("[rand] expected a floating dtype"));
}

// ---------------------------------------------------------------- multinomial

TEST_CASE("cuda multinomial: the CPU's samples for the same seed", "[cuda][random][multinomial]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(50);
  // Rows of one chunk, of many (50257 categories: 197 chunks of 256), weights that do not sum to
  // 1, zeros among them; every floating dtype; with and without replacement.
  const Tensor mask = from_vector<double>({1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1});  // 10 non-zero categories
  const Tensor small = rand({5, 13}, f64) * mask;
  const Tensor vocab = softmax(randn({3, 50257}, f64) * 3, 1);
  for (const Tensor& probs : {small, vocab, small[2], vocab[0]}) {
    for (Dtype dt : {f64, f32, f16, bf16}) {
      const Tensor p = probs.to(dt);
      for (bool replacement : {true, false}) {
        for (int64_t samples : {1, 4, replacement ? 300 : 8}) {
          INFO(shape_str(p.shape()) << " " << dt << " replacement " << replacement << " samples " << samples);
          manual_seed(51);
          const Tensor c = multinomial(p, samples, replacement);
          const PhiloxState after_cpu = get_rng_state();
          manual_seed(51);
          const Tensor g = multinomial(p.to(kGPU), samples, replacement);
          REQUIRE(get_rng_state().offset == after_cpu.offset);
          REQUIRE(g.dtype() == i64);
          require_bit_equal(g, c);
        }
      }
    }
  }
  // Strided and expanded probabilities, as on the CPU.
  const Tensor t = rand({40, 6}, f64);
  manual_seed(52);
  const Tensor c = multinomial(t.t(), 20, false);
  manual_seed(52);
  require_bit_equal(multinomial(t.to(kGPU).t(), 20, false), c);
  const Tensor e = from_vector<double>({0, 1, 2, 3}, {1, 4}).expand({2000, 4});
  manual_seed(53);
  const Tensor ce = multinomial(e, 3, false);
  manual_seed(53);
  require_bit_equal(multinomial(e.to(kGPU), 3, false), ce);
  REQUIRE(multinomial(zeros({0, 3}, TensorOptions(f32, kGPU)), 2).shape() == Shape{0, 2});
}

TEST_CASE("cuda multinomial: a row that is no distribution is raised at the next sync, with the CPU's text",
          "[cuda][random][multinomial]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor bad_entry = from_vector<double>({1, 2, 3, nan, 0, 0}, {3, 2});
  const Tensor zero_row = from_vector<double>({1, 2, 0, 0, 1, 1}, {3, 2});
  const Tensor too_few = from_vector<double>({1, 1, 0, 1, 0, 0}, {2, 3});
  const char* tail = "; detected on cuda:0 at the next synchronisation (a copy to the host), after the op had returned";
  const std::vector<std::pair<Tensor, std::string>> cases = {
      {bad_entry, "[multinomial] row 1 of the probabilities (shape [3, 2]) has a negative, infinite or NaN entry"},
      {zero_row, "[multinomial] row 1 of the probabilities (shape [3, 2]) sums to 0"},
      {too_few, "[multinomial] row 0 of the probabilities (shape [2, 3]) has 2 non-zero categories, fewer than the 3 "
                "samples to draw without replacement"}};
  for (const auto& [probs, message] : cases) {
    INFO(message);
    REQUIRE_THROWS_WITH(multinomial(probs, probs.size(1)), Contains(message));  // the CPU throws at once
    Tensor g = multinomial(probs.to(kGPU), probs.size(1));                        // the device records it
    REQUIRE_THROWS_WITH(g.to(kCPU), Contains(message) && Contains(tail));
    REQUIRE_NOTHROW(cuda::synchronize(0));  // reported once
  }
  REQUIRE_THROWS_WITH(multinomial(ones({2, 3}, TensorOptions(f32, kGPU)), 4),
                      Contains("[multinomial] cannot draw 4 samples without replacement from 3 categories"));
}

// ---------------------------------------------------------------- factory functions

TEST_CASE("cuda zeros/ones/full/scalar_tensor: every dtype, the CPU's values", "[cuda][creation]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO(dt);
    require_bit_equal(zeros({3, 5}, TensorOptions(dt, kGPU)), zeros({3, 5}, dt));
    require_bit_equal(ones({1000}, TensorOptions(dt, kGPU)), ones({1000}, dt));
    require_bit_equal(full({4, 4}, 2.7, TensorOptions(dt, kGPU)), full({4, 4}, 2.7, dt));
    require_bit_equal(full({7}, -0.0, TensorOptions(dt, kGPU)), full({7}, -0.0, dt));
    require_bit_equal(scalar_tensor(-3.25, TensorOptions(dt, kGPU)), scalar_tensor(-3.25, dt));
    REQUIRE(zeros({0, 3}, TensorOptions(dt, kGPU)).numel() == 0);
  }
  Tensor z = zeros({2}, TensorOptions(f32, kGPU).with_requires_grad());
  REQUIRE(z.requires_grad());
  REQUIRE_THROWS_WITH(zeros({2}, TensorOptions(i64, kGPU).with_requires_grad()),
                      Contains("[zeros] only floating tensors can require grad"));
  Tensor g = randn({3, 2}).to(kGPU);
  require_bit_equal(zeros_like(g), zeros({3, 2}));
  require_bit_equal(ones_like(g), ones({3, 2}));
  require_bit_equal(full_like(g, 4), full({3, 2}, 4));
}

TEST_CASE("cuda arange, linspace and eye: the CPU's values bit for bit", "[cuda][creation]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    INFO(dt);
    require_bit_equal(arange(0, 1000, 1, TensorOptions(dt, kGPU)), arange(0, 1000, 1, dt));
    require_bit_equal(arange(-5, 17, 3, TensorOptions(dt, kGPU)), arange(-5, 17, 3, dt));
    require_bit_equal(arange(10, -10, -7, TensorOptions(dt, kGPU)), arange(10, -10, -7, dt));
    require_bit_equal(arange(0.1, 7.3, 0.37, TensorOptions(dt, kGPU)), arange(0.1, 7.3, 0.37, dt));
    require_bit_equal(arange(3.0, -1.0, -0.1, TensorOptions(dt, kGPU)), arange(3.0, -1.0, -0.1, dt));
    require_bit_equal(linspace(-1.3, 2.9, 101, TensorOptions(dt, kGPU)), linspace(-1.3, 2.9, 101, dt));
    require_bit_equal(linspace(0, 1, 2, TensorOptions(dt, kGPU)), linspace(0, 1, 2, dt));
    require_bit_equal(linspace(5, 9, 1, TensorOptions(dt, kGPU)), linspace(5, 9, 1, dt));
    REQUIRE(linspace(5, 9, 0, TensorOptions(dt, kGPU)).numel() == 0);
  }
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO(dt);
    require_bit_equal(eye(7, TensorOptions(dt, kGPU)), eye(7, dt));
    require_bit_equal(eye(1, TensorOptions(dt, kGPU)), eye(1, dt));
    REQUIRE(eye(0, TensorOptions(dt, kGPU)).shape() == Shape{0, 0});
  }
  // Big enough for several blocks and the grid-stride loop.
  require_bit_equal(arange(0.0, 3e6, 1.5, TensorOptions(f32, kGPU)), arange(0.0, 3e6, 1.5, f32));
  require_bit_equal(arange(int64_t{1} << 33, (int64_t{1} << 33) + 100000, TensorOptions(i64, kGPU)),
                    arange(int64_t{1} << 33, (int64_t{1} << 33) + 100000, i64));
  require_bit_equal(eye(1500, TensorOptions(f32, kGPU)), eye(1500, f32));
}
