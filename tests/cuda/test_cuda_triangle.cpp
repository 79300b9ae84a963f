// The triangle family on CUDA against the same ops on the CPU: tril and triu for every dtype
// (bit for bit: the kernel only copies or zeroes), batched and non-square shapes, diagonals past
// either corner, contiguous and strided inputs, empty tensors, gradients through autograd, and
// the errors.
#include <catch2/catch.hpp>

#include <limits>

#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;

namespace {

using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_bit_equal;

void require_both_bit_equal(const Tensor& cpu, int64_t diagonal) {
  INFO(cpu.dtype() << ", shape " << fmt::format("{}", cpu.shape()) << ", diagonal " << diagonal);
  const Tensor gpu = cpu.to(kGPU);
  require_bit_equal(tril(gpu, diagonal), tril(cpu, diagonal));
  require_bit_equal(triu(gpu, diagonal), triu(cpu, diagonal));
}

}  // namespace

TEST_CASE("cuda tril and triu: every dtype and diagonal, batched and non-square, bit for bit", "[cuda][triangle]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(31);
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    for (const Shape& shape : {Shape{5, 5}, Shape{3, 7}, Shape{7, 3}, Shape{2, 3, 4, 5}, Shape{1, 1}, Shape{64, 130}}) {
      Tensor a = random(shape, dt);
      for (int64_t k : {small, int64_t{-8}, int64_t{-2}, int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{3}, int64_t{8},
                        big})
        require_both_bit_equal(a, k);
    }
  }
}

TEST_CASE("cuda tril and triu: strided inputs and empty tensors", "[cuda][triangle]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(32);
  for (Dtype dt : {f32, f16, i64, boolean}) {
    Tensor base = random({6, 8, 5}, dt);
    // Made non-contiguous on the device, so the strided kernel reads the device's own geometry.
    const Tensor g = base.to(kGPU);
    for (int64_t k : {-2, 0, 1}) {
      INFO(dt << ", diagonal " << k);
      require_bit_equal(tril(g.transpose(1, 2), k), tril(base.transpose(1, 2), k));
      require_bit_equal(triu(g.slice(1, 0, 8, 3), k), triu(base.slice(1, 0, 8, 3), k));
      require_bit_equal(tril(g.permute({2, 0, 1}), k), tril(base.permute({2, 0, 1}), k));
      require_bit_equal(triu(g.narrow(0, 1, 1).expand({4, 8, 5}), k), triu(base.narrow(0, 1, 1).expand({4, 8, 5}), k));
    }
  }
  for (const Shape& shape : {Shape{0, 4}, Shape{4, 0}, Shape{2, 0, 3}}) {
    Tensor e = tril(zeros(shape).to(kGPU), 1);
    REQUIRE(e.device() == kGPU);
    REQUIRE(e.shape() == shape);
  }
}

TEST_CASE("cuda tril and triu: gradients match the CPU's", "[cuda][triangle][grad]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(33);
  for (Dtype dt : {f32, f64, bf16}) {
    for (int64_t k : {-1, 0, 2}) {
      INFO(dt << ", diagonal " << k);
      cuda_test::check_op([k](const TensorList& in) { return tril(in[0], k); }, {random({3, 4, 5}, dt)}, 0);
      cuda_test::check_op([k](const TensorList& in) { return triu(in[0].transpose(0, 1), k); }, {random({4, 6}, dt)}, 0);
    }
  }
}

TEST_CASE("cuda tril and triu: the CPU's errors", "[cuda][triangle]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  REQUIRE_THROWS_WITH(tril(zeros({5}).to(kGPU)),
                      "[tril] input must have at least 2 dims (a matrix or a batch of matrices), got shape [5]");
  REQUIRE_THROWS_WITH(triu(zeros({}).to(kGPU)),
                      "[triu] input must have at least 2 dims (a matrix or a batch of matrices), got shape []");
}
