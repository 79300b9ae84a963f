// topk on CUDA against the CPU: the same values and indices bit for bit (the same keys, the same
// tie and NaN order), every numeric dtype, every dim, strided inputs, sorted and index order,
// rows as long as a GPT vocabulary, batches of many rows, empty and 0-dim inputs, and the
// gradient (scattered back to the selected elements).
#include <catch2/catch.hpp>

#include <limits>

#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;

namespace {

using cuda_test::kGPU;
using cuda_test::require_bit_equal;
using cuda_test::require_match;

void require_same_topk(const Tensor& cpu_input, const Tensor& gpu_input, int64_t k, int64_t dim, bool largest,
                       bool sorted) {
  INFO("shape " << shape_str(cpu_input.shape()) << " " << cpu_input.dtype() << " k " << k << " dim " << dim
                << " largest " << largest << " sorted " << sorted);
  auto [vc, ic] = topk(cpu_input, k, dim, largest, sorted);
  auto [vg, ig] = topk(gpu_input, k, dim, largest, sorted);
  require_bit_equal(vg, vc);
  require_bit_equal(ig, ic);
}

void require_same_topk(const Tensor& cpu_input, int64_t k, int64_t dim, bool largest, bool sorted) {
  require_same_topk(cpu_input, cpu_input.to(kGPU), k, dim, largest, sorted);
}

// Values of dtype with ties: integers from a small range, the 2-byte floats rounding normals.
Tensor values_with_ties(const Shape& shape, Dtype dt) {
  if (is_integral(dt)) return randint(-10, 10, shape, dt);
  return (randn(shape) * 3).to(dt);
}

}  // namespace

TEST_CASE("cuda topk: the CPU's values and indices for every dtype, dim, k and order", "[cuda][topk]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(61);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    for (const Shape& shape : {Shape{1}, Shape{9}, Shape{4, 33}, Shape{3, 5, 6}, Shape{2, 1, 7, 4}}) {
      const Tensor a = values_with_ties(shape, dt);
      const int64_t nd = static_cast<int64_t>(shape.size());
      for (int64_t dim = -nd; dim < nd; ++dim) {
        const int64_t n = shape[dim < 0 ? dim + nd : dim];
        for (int64_t k : {int64_t{0}, int64_t{1}, (n + 1) / 2, n})
          for (bool largest : {true, false})
            for (bool sorted : {true, false}) require_same_topk(a, k, dim, largest, sorted);
      }
    }
  }
}

TEST_CASE("cuda topk: NaN, infinities, -0 and ties in the CPU's order", "[cuda][topk]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor x = from_vector<double>({1, nan, -0.0, 3, -nan, 0.0, -inf, 3, inf, 0.0, 1, -2}, {2, 6});
  for (Dtype dt : {f64, f32, f16, bf16})
    for (int64_t k : {1, 3, 6})
      for (bool largest : {true, false})
        for (bool sorted : {true, false}) require_same_topk(x.to(dt), k, 1, largest, sorted);
  const Tensor same = full({3, 40}, 1.5);
  require_same_topk(same, 17, 1, true, true);
  require_same_topk(same, 17, 0, false, false);
}

TEST_CASE("cuda topk: long rows, many rows, strided inputs", "[cuda][topk]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(62);
  // A GPT sampler's logits: a few rows of a 50257-word vocabulary, the top 50 and all of them.
  const Tensor logits = randn({4, 50257});
  for (int64_t k : {int64_t{1}, int64_t{50}, int64_t{50257}}) {
    require_same_topk(logits, k, -1, true, true);
    require_same_topk(logits.to(bf16), k, -1, true, false);
  }
  // Many short rows, and a long dim that is not the last.
  const Tensor many = randint(0, 100, {3000, 64}).to(f32);
  require_same_topk(many, 10, 1, true, true);
  require_same_topk(many, 100, 0, false, false);
  // Non-contiguous views on both devices: the same result as the CPU's.
  const Tensor base = randn({12, 9, 7}, f64);
  const Tensor gbase = base.to(kGPU);
  require_same_topk(base.transpose(0, 2), gbase.transpose(0, 2), 4, 1, true, true);
  require_same_topk(base.slice(1, 1, 9, 3), gbase.slice(1, 1, 9, 3), 2, 1, false, false);
  require_same_topk(base.permute({2, 0, 1}), gbase.permute({2, 0, 1}), 5, 1, true, false);
  require_same_topk(base.select(2, 4).t(), gbase.select(2, 4).t(), 3, 0, false, true);
  const Tensor e = from_vector<double>({2, -1}, {2, 1}).expand({2, 50});
  require_same_topk(e, e.to(kGPU), 7, 1, true, true);
}

TEST_CASE("cuda topk: empty and 0-dim inputs, errors as on the CPU", "[cuda][topk]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  auto [v, i] = topk(zeros({0, 5}, TensorOptions(f32, kGPU)), 2);
  REQUIRE(v.shape() == Shape{0, 2});
  REQUIRE(v.device() == kGPU);
  REQUIRE(i.shape() == Shape{0, 2});
  std::tie(v, i) = topk(zeros({3, 0}, TensorOptions(f32, kGPU)), 0);
  REQUIRE(v.shape() == Shape{3, 0});
  const Tensor s = scalar_tensor(-2.5, f64);
  for (int64_t k : {0, 1}) require_same_topk(s, k, 0, true, true);
  REQUIRE_THROWS_WITH(topk(zeros({3, 4}, TensorOptions(f32, kGPU)), 5),
                      Contains("[topk] k (5) is out of range for dim -1 of size 4 (input shape [3, 4])"));
  REQUIRE_THROWS_WITH(topk(zeros({3}, TensorOptions(boolean, kGPU)), 1), Contains("[topk] expected a numeric dtype"));
}

TEST_CASE("cuda topk: the gradient goes to the selected elements, as on the CPU", "[cuda][topk][autograd]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(63);
  for (Dtype dt : {f64, f32, bf16})
    for (bool largest : {true, false})
      for (bool sorted : {true, false}) {
        INFO(dt << " largest " << largest << " sorted " << sorted);
        cuda_test::check_op([=](const TensorList& in) { return topk(in[0], 3, 1, largest, sorted).first; },
                            {randn({4, 10, 3}).to(dt)}, 0);
        cuda_test::check_op([=](const TensorList& in) { return topk(in[0].t(), 5, 0, largest, sorted).first * 2; },
                            {randn({6, 8}).to(dt)}, 0);
      }
  Tensor x = from_vector<float>({3, 1, 4, 1, 5}).to(kGPU);
  x.requires_grad_();
  topk(x, 2).first.sum().backward();
  require_match(x.grad(), from_vector<float>({0, 0, 1, 0, 1}), 0);
}
