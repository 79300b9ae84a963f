// The backend seam: CUDA tensors without a CUDA backend are a clear error, at creation; in a CUDA
// build, core loads the CUDA backend library at the first CUDA device asked for, and not before.
// This file links libtandem only (not Tandem::cuda), as a CPU program does; every test case runs in
// a process of its own (catch_discover_tests), so "not loaded yet" is a fresh process's state.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "core/backend.h"
#include "core/detail/sanitizers.h"
#include "tandem.h"

using namespace tandem;

namespace {

// Whether a shared library whose file name contains `name` is mapped into this process.
bool library_loaded(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

// Core decides once per process whether it has a CUDA backend. A case that must see a fresh
// process's state, run after another case of this process asked for CUDA (the whole file run as one
// program rather than a case per process under CTest), reruns itself in a new process.
// Runs one case of this program in a new process (TANDEM_TEST_FRESH set, `env` before it) and
// requires it to pass.
void run_case_in_new_process(const std::string& test_name, const std::string& env = "") {
  char exe[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  const std::string command =
      "TANDEM_TEST_FRESH=1 " + env + " '" + std::string(exe, static_cast<size_t>(n)) + "' '" + test_name + "' > /dev/null";
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
}

bool rerun_in_fresh_process(const std::string& test_name) {
  // In the rerun itself (TANDEM_TEST_FRESH), CUDA mapped at the start is what the case must catch.
  if (std::getenv("TANDEM_TEST_FRESH") != nullptr) return false;
  if (!library_loaded("libtandem_cuda") && !library_loaded("libcudart")) return false;
  run_case_in_new_process(test_name);
  return true;
}

}  // namespace

// A CUDA build of shared libraries loads the backend on demand; a static one has nothing to load, so
// a program that does not link Tandem::cuda (this one) has no CUDA there.
#if defined(TANDEM_WITH_CUDA) && !defined(TANDEM_STATIC_LIBS)
#define TANDEM_CUDA_LOADABLE 1
#endif

TEST_CASE("CUDA tensors without a usable CUDA backend are a clear error", "[backend]") {
#if defined(TANDEM_CUDA_LOADABLE)
  // A CUDA build always has the backend; without a usable device, CUDA tensors are a clear error.
  REQUIRE(has_backend(DeviceType::cuda));
  REQUIRE(backend_unavailable_reason(DeviceType::cuda).empty());
  if (backend_for(Device::cuda(0), "test").device_count() > 0) {
    WARN("SKIP: this machine has a CUDA device (test_cuda_runtime covers it)");
    return;
  }
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(0)), Catch::StartsWith("[zeros] no CUDA device"));
  REQUIRE_THROWS_WITH(ones({2}).to(Device::cuda(1)), Catch::StartsWith("[to] no CUDA device"));
  REQUIRE_THROWS_WITH(randn({2}, TensorOptions(f32, Device::cuda())), Catch::Contains("no CUDA device"));
#elif defined(TANDEM_WITH_CUDA)
  REQUIRE_FALSE(has_backend(DeviceType::cuda));
  REQUIRE_THROWS_WITH(zeros({2, 3}, Device::cuda(0)), Catch::StartsWith("[zeros] this Tandem is built as static "
                                                                          "libraries: a program that uses CUDA links "
                                                                          "Tandem::cuda"));
#else
  REQUIRE_FALSE(has_backend(DeviceType::cuda));
  REQUIRE(backend_unavailable_reason(DeviceType::cuda) == "tandem was built without CUDA");
  REQUIRE_THROWS_WITH(zeros({2, 3}, Device::cuda(0)), Catch::Contains("tandem was built without CUDA") &&
                                                            Catch::StartsWith("[zeros]") &&
                                                            Catch::Contains("cuda:0"));
  REQUIRE_THROWS_WITH(ones({2}).to(Device::cuda(1)), Catch::Contains("tandem was built without CUDA"));
  REQUIRE_THROWS_WITH(randn({2}, TensorOptions(f32, Device::cuda())), Catch::Contains("built without CUDA"));
#endif
}

TEST_CASE("a CPU program does not load CUDA until it asks for a CUDA device", "[backend]") {
  if (rerun_in_fresh_process("a CPU program does not load CUDA until it asks for a CUDA device")) return;
  // CPU work of every layer, the dist layer included: nothing of CUDA is mapped.
  Tensor w = randn({8, 8}, f64).requires_grad_();
  matmul(w, w).sum().backward();
  dist::run_threads(2, [](dist::ProcessGroup& g) { g.allreduce(ones({4}))->wait(); });
  REQUIRE(w.grad().defined());
  REQUIRE_FALSE(library_loaded("libtandem_cuda"));
  REQUIRE_FALSE(library_loaded("libcudart"));
  REQUIRE_FALSE(library_loaded("libcublas"));
  REQUIRE_FALSE(library_loaded("libnccl"));
  // The first CUDA device asked for loads the backend library where one was built.
  (void)has_backend(DeviceType::cuda);
#ifdef TANDEM_CUDA_LOADABLE
  REQUIRE(library_loaded("libtandem_cuda"));
  REQUIRE(library_loaded("libcudart"));
#else
  REQUIRE_FALSE(library_loaded("libtandem_cuda"));
#endif
}

#ifdef TANDEM_CUDA_LOADABLE
TEST_CASE("a CUDA backend library that cannot be loaded is a clear error naming it", "[backend]") {
  if (rerun_in_fresh_process("a CUDA backend library that cannot be loaded is a clear error naming it")) return;
  // TANDEM_CUDA_LIBRARY points core at another file; it is read once, at the first CUDA device.
  REQUIRE(setenv("TANDEM_CUDA_LIBRARY", "/nonexistent/libtandem_cuda.so", 1) == 0);
  REQUIRE_FALSE(has_backend(DeviceType::cuda));
  REQUIRE_THAT(backend_unavailable_reason(DeviceType::cuda),
               Catch::Contains("could not be loaded") && Catch::Contains("/nonexistent/libtandem_cuda.so"));
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(0)), Catch::StartsWith("[zeros] the CUDA backend library could not be "
                                                                       "loaded") &&
                                                       Catch::Contains("cuda:0"));
  REQUIRE_FALSE(library_loaded("libcudart"));
  // CPU work goes on.
  REQUIRE(ones({3}).sum().item<double>() == 3.0);
}
#endif

// Nothing applied TANDEM_NUM_THREADS (or the cores-over-ranks default) to OpenBLAS unless the
// program called set_num_threads: OpenBLAS kept its own default, every core, in each rank. Checked
// in a fresh process (the count is settled once per process) with TANDEM_NUM_THREADS=1; on a
// one-core machine OpenBLAS's default is 1 too and this cannot tell.
TEST_CASE("the intra-op thread count reaches OpenBLAS before its first GEMM", "[backend]") {
  using GetThreads = int (*)();
  auto openblas_threads = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (openblas_threads == nullptr) {
    WARN("SKIP: the BLAS is not OpenBLAS");
    return;
  }
  if (std::getenv("TANDEM_TEST_FRESH") == nullptr) {
    run_case_in_new_process("the intra-op thread count reaches OpenBLAS before its first GEMM", "TANDEM_NUM_THREADS=1");
    return;
  }
  Tensor c = matmul(ones({128, 128}), ones({128, 128}));
  REQUIRE(c.sum().item<float>() == 128.0f * 128 * 128);
  REQUIRE(openblas_threads() == 1);
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

TEST_CASE("large CPU blocks are reused after a free, aligned and holding what is written", "[backend]") {
#if TANDEM_ASAN
  WARN("SKIP: the block cache is off under AddressSanitizer (every free must reach it)");
  return;
#endif
  // Sizes on both sides of the cache's 128 KiB threshold, and one that rounds up to a page.
  for (int64_t n : {int64_t{32767}, int64_t{32768}, int64_t{32769}, int64_t{1} << 20}) {
    void* first = nullptr;
    {
      Tensor t = full({n}, 3.0f);
      first = t.data_ptr();
    }
    Tensor z = zeros({n});
    REQUIRE(reinterpret_cast<uintptr_t>(z.data_ptr()) % 64 == 0);
    if (n * 4 >= (int64_t{128} << 10)) REQUIRE(z.data_ptr() == first);
    REQUIRE(sum(z).item<float>() == 0.0f);
    Tensor o = ones({n});
    REQUIRE(o.data_ptr() != z.data_ptr());
    REQUIRE(sum(o).item<float>() == static_cast<float>(n));
  }
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
