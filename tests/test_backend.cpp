// The backend seam: a build without CUDA refuses CUDA tensors with a clear error, at creation.
#include <catch2/catch.hpp>

#include "tandem.h"

using namespace tandem;

TEST_CASE("CUDA tensors in a build without CUDA are a clear error", "[backend]") {
#ifdef TANDEM_WITH_CUDA
  WARN("SKIP: this build has the CUDA backend");
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
