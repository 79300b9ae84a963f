// The backend seam: a build without CUDA refuses CUDA tensors with a clear error, at creation.
#include <catch2/catch.hpp>

#include "tandem.h"
#ifdef TANDEM_WITH_CUDA
#include "cuda/runtime.h"
#endif

using namespace tandem;

TEST_CASE("CUDA tensors in a build without CUDA are a clear error", "[backend]") {
#ifdef TANDEM_WITH_CUDA
  // A CUDA build always has the backend; without a usable device, CUDA tensors are a clear error.
  REQUIRE(has_backend(DeviceType::cuda));
  if (cuda::is_available()) {
    WARN("SKIP: this machine has a CUDA device (test_cuda_runtime covers it)");
    return;
  }
  REQUIRE(cuda::device_count() == 0);
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(0)), Catch::StartsWith("[zeros] no CUDA device") &&
                                                       Catch::Contains(cuda::unavailable_reason()));
  REQUIRE_THROWS_WITH(ones({2}).to(Device::cuda(1)), Catch::StartsWith("[to] no CUDA device"));
  REQUIRE_THROWS_WITH(randn({2}, TensorOptions(f32, Device::cuda())), Catch::Contains("no CUDA device"));
#else
  REQUIRE_FALSE(has_backend(DeviceType::cuda));
  REQUIRE_THROWS_WITH(zeros({2, 3}, Device::cuda(0)), Catch::Contains("tandem was built without CUDA") &&
                                                            Catch::StartsWith("[zeros]") &&
                                                            Catch::Contains("cuda:0"));
  REQUIRE_THROWS_WITH(ones({2}).to(Device::cuda(1)), Catch::Contains("tandem was built without CUDA"));
  REQUIRE_THROWS_WITH(randn({2}, TensorOptions(f32, Device::cuda())), Catch::Contains("built without CUDA"));
#endif
}

TEST_CASE("CPU storage is 64-byte aligned and the thread count is settable", "[backend]") {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = empty({n});
    REQUIRE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0);
  }
  int before = get_num_threads();
  REQUIRE(before >= 1);
  set_num_threads(1);
  REQUIRE(get_num_threads() == 1);
  set_num_threads(before);
  REQUIRE_THROWS_WITH(set_num_threads(0), Catch::Contains("[set_num_threads]"));
}

TEST_CASE("sizes that overflow 64 bits are errors, not undersized buffers", "[backend]") {
  REQUIRE_THROWS_WITH(zeros({int64_t{1} << 62}), Catch::Contains("does not fit in 64 bits"));
  REQUIRE_THROWS_WITH(zeros({int64_t{1} << 32, int64_t{1} << 32}), Catch::Contains("too large"));
  REQUIRE_THROWS_WITH(zeros({1, 1}).expand({int64_t{1} << 32, int64_t{1} << 32}), Catch::Contains("too large"));
  // No elements, but the other dimensions' strides overflow (UBSan's signed-overflow report before).
  REQUIRE_THROWS_WITH(zeros({0, int64_t{1} << 40, int64_t{1} << 40}), Catch::Contains("strides do not fit in 64 bits"));
  REQUIRE_THROWS_WITH(zeros({0}).view({int64_t{1} << 32, int64_t{1} << 32}), Catch::Contains("overflow"));
  REQUIRE_THROWS_WITH(zeros({4}).narrow(0, 1, INT64_MAX), Catch::Contains("[narrow]"));
  REQUIRE(zeros({4}).slice(0, 0, 4, INT64_MAX).shape() == Shape{1});
  REQUIRE_THROWS_WITH(scalar_tensor(3).size(0), Catch::Contains("[size] a 0-dim tensor"));
}
