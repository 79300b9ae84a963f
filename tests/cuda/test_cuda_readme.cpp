// The README's GPU snippet, compiled in every CUDA build and run where a GPU is.
#include <catch2/catch.hpp>

#include "cuda/allocator.h"
#include "cuda_test_util.h"
#include "tandem.h"

using namespace tandem;

TEST_CASE("README GPU notes", "[cuda][readme]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  cuda::Stream side = cuda::Stream::create(0);          // declared first: it outlives the tensors it reads
  Tensor x = randn({4096, 4096}).to(Device::cuda(0));  // or TensorOptions(f32, Device::cuda())
  Tensor y = softmax(matmul(x, x.t()), -1);             // cuBLAS, then a row kernel, on the current stream
  cuda::Event y_ready;
  y_ready.record(cuda::current_stream(0));  // after the kernels that write y
  Tensor z_host;  // test only (not in the README): z read back to check the ordering
  {
    cuda::StreamGuard on(side);  // ops in this scope launch on `side`
    y_ready.wait(side.raw());    // `side` reads y only once it is written (no host sync)
    Tensor z = y * 2;
    cuda::record_stream(y, side.raw());  // y's memory is not reused before `side` is done
    z_host = z.to(kCPU);                 // test only: copies on `side`, then synchronises it
  }
  cuda::set_allow_tf32(true);             // f32 matmuls may use TF32 (off by default, as PyTorch)
  auto stats = cuda::memory_stats(0);     // allocated, reserved, peak bytes
  cuda::set_allow_tf32(false);
  REQUIRE(stats.peak_allocated_bytes >= 3 * 4096 * 4096 * 4);
  REQUIRE(y.device() == Device::cuda(0));
  // z was computed on `side` after the event: exactly 2 y (a race would read y before softmax wrote it).
  REQUIRE(z_host.equal(y.to(kCPU) * 2));
}
