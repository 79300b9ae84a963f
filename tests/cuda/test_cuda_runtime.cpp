// The CUDA runtime layer: devices, streams, events, the caching and pinned allocators, and
// host/device copies. Tests that need a GPU skip without one and say so; the ones about a
// machine without a GPU run everywhere.
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include <cuda.h>  // the driver API's types only: its functions are reached through the runtime

#include "core/backend.h"
#include "cuda/allocator.h"
#include "cuda/detail/check.h"
#include "cuda/runtime.h"
#include "cuda_test_util.h"
#include "tandem.h"

using namespace tandem;
namespace tc = tandem::cuda;

namespace {

using cuda_test::kGPU;

TensorOptions on_gpu(Dtype d = f32) { return TensorOptions(d, kGPU); }

// Blocks a stream from the host until opened (or 20 s pass, so a failed test cannot hang):
// work queued behind it on that stream is certainly not done while the gate is shut.
struct Gate {
  std::atomic<bool> open{false};
  explicit Gate(cudaStream_t s) { TANDEM_CUDA_CHECK(cudaLaunchHostFunc(s, &Gate::wait, this)); }
  ~Gate() { release(); }
  void release() { open.store(true); }
  static void CUDART_CB wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    auto t0 = std::chrono::steady_clock::now();
    while (!g->open.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::yield();
  }
};

void* ptr_of(const Tensor& t) { return t.storage()->data(); }

// A driver API function by name, through the runtime (the tests do not link libcuda); nullptr
// when the driver does not offer it.
void* driver_function(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

// Whether this process holds the primary context of `device` (cuDevicePrimaryCtxGetState); asking
// creates none. nullopt when the driver cannot be asked.
std::optional<bool> primary_context_active(int device) {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using GetState = CUresult (*)(CUdevice, unsigned int*, int*);
  static auto* device_get = reinterpret_cast<DeviceGet>(driver_function("cuDeviceGet"));
  static auto* get_state = reinterpret_cast<GetState>(driver_function("cuDevicePrimaryCtxGetState"));
  if (device_get == nullptr || get_state == nullptr) return std::nullopt;
  CUdevice dev{};
  unsigned int flags = 0;
  int active = 0;
  if (device_get(&dev, device) != CUDA_SUCCESS || get_state(dev, &flags, &active) != CUDA_SUCCESS)
    return std::nullopt;
  return active != 0;
}

Tensor random_of(Dtype d, const Shape& shape) {
  if (d == boolean) return randint(0, 2, shape).to(boolean);
  if (d == i32 || d == i64) return randint(-1000, 1000, shape, d);
  return randn(shape).to(d);
}

}  // namespace

// ---------------------------------------------------------------- everywhere

TEST_CASE("cuda: device count never throws; without a device everything says why", "[cuda]") {
  REQUIRE(has_backend(DeviceType::cuda));
  int n = tc::device_count();
  REQUIRE(n >= 0);
  REQUIRE(tc::is_available() == (n > 0));
  REQUIRE(tc::device_count() == n);  // cached
  if (n > 0) {
    REQUIRE(tc::unavailable_reason().empty());
    WARN("SKIP: this machine has " << n << " CUDA device(s); the no-device path is not exercised");
    return;
  }
  REQUIRE_FALSE(tc::unavailable_reason().empty());
  REQUIRE_THROWS_WITH(zeros({2}, kGPU), Catch::StartsWith("[zeros] no CUDA device") &&
                                            Catch::Contains(tc::unavailable_reason()));
  REQUIRE_THROWS_WITH(ones({2}).to(kGPU), Catch::StartsWith("[to] no CUDA device"));
  REQUIRE_THROWS_WITH(empty({2}, kGPU), Catch::StartsWith("[empty] no CUDA device"));
  REQUIRE_THROWS_WITH(tc::require_device(Device::cuda(1), "myop"), Catch::StartsWith("[myop] no CUDA device"));
  REQUIRE_THROWS_WITH(tc::pinned_empty({4}, f32), Catch::StartsWith("[pinned_empty] no CUDA device"));
  REQUIRE_THROWS_WITH(tc::memory_stats(0), Catch::StartsWith("[memory_stats] no CUDA device"));
  REQUIRE_THROWS_WITH(tc::current_stream(0), Catch::Contains("no CUDA device"));
  REQUIRE_THROWS_WITH(tc::Stream::create(0), Catch::Contains("no CUDA device"));
  REQUIRE_NOTHROW(tc::empty_cache());
  REQUIRE_FALSE(tc::is_pinned(ones({2})));
  tc::Event e;  // constructing an event needs no GPU
  REQUIRE(e.query());
  REQUIRE_NOTHROW(e.synchronize());
}

TEST_CASE("cuda: allocator sizes round to 512 B up to 1 MiB and to 2 MiB above", "[cuda]") {
  REQUIRE(tc::round_size(1) == 512);
  REQUIRE(tc::round_size(512) == 512);
  REQUIRE(tc::round_size(513) == 1024);
  REQUIRE(tc::round_size(1000) == 1024);
  REQUIRE(tc::round_size(size_t{1} << 20) == size_t{1} << 20);
  REQUIRE(tc::round_size((size_t{1} << 20) + 1) == size_t{2} << 20);
  REQUIRE(tc::round_size(size_t{3} << 20) == size_t{4} << 20);
  REQUIRE(tc::round_size(size_t{4} << 20) == size_t{4} << 20);
}

TEST_CASE("cuda: check macros turn CUDA errors into tandem::Error with call, file and line", "[cuda]") {
  REQUIRE_THROWS_WITH(TANDEM_CUDA_CHECK(cudaErrorInvalidValue),
                      Catch::StartsWith("[cuda] cudaErrorInvalidValue failed at ") &&
                          Catch::Contains("test_cuda_runtime.cpp:") && Catch::Contains("(cudaErrorInvalidValue)"));
  REQUIRE_THROWS_WITH(TANDEM_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE),
                      Catch::StartsWith("[cuda] CUBLAS_STATUS_INVALID_VALUE failed at ") &&
                          Catch::Contains("(CUBLAS_STATUS_INVALID_VALUE)"));
  REQUIRE_NOTHROW(TANDEM_CUDA_CHECK(cudaSuccess));
}

// ---------------------------------------------------------------- devices, streams, events

TEST_CASE("cuda: a missing device index is a clear error", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const int n = tc::device_count();
  const std::string has = fmt::format("(this machine has {} CUDA device", n);
  REQUIRE_THROWS_WITH(zeros({2}, Device::cuda(7)),
                      Catch::StartsWith("[zeros] cuda:7 does not exist") && Catch::Contains(has));
  REQUIRE_THROWS_WITH(ones({2}).to(Device::cuda(7)), Catch::StartsWith("[to] cuda:7 does not exist"));
  REQUIRE_THROWS_WITH(tc::set_device(n), Catch::Contains(fmt::format("cuda:{} does not exist", n)));
  REQUIRE_THROWS_WITH(tc::current_stream(n), Catch::Contains("does not exist"));
  REQUIRE_THROWS_WITH(tc::memory_stats(-1), Catch::Contains("cuda:-1 does not exist"));
}

TEST_CASE("cuda: DeviceGuard sets and restores the current device", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::set_device(0);
  {
    tc::DeviceGuard g(0);
    REQUIRE(tc::current_device() == 0);
  }
  REQUIRE(tc::current_device() == 0);
  if (tc::device_count() > 1) {
    {
      tc::DeviceGuard g(Device::cuda(1));
      REQUIRE(tc::current_device() == 1);
    }
    REQUIRE(tc::current_device() == 0);
  }
}

TEST_CASE("cuda: the default stream is one non-blocking stream per device, shared by threads", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  cudaStream_t s = tc::current_stream(0);
  REQUIRE(s != nullptr);
  unsigned flags = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetFlags(s, &flags));
  REQUIRE((flags & cudaStreamNonBlocking) != 0);
  REQUIRE(tc::current_stream(kGPU) == s);
  cudaStream_t other = nullptr;
  std::thread([&] { other = tc::current_stream(0); }).join();
  REQUIRE(other == s);
  REQUIRE(tc::stream_device(s) == 0);
}

TEST_CASE("cuda: StreamGuard sets the current stream for this thread only, and restores it", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  cudaStream_t def = tc::current_stream(0);
  tc::Stream s = tc::Stream::create(0);
  REQUIRE(s.raw() != nullptr);
  REQUIRE(s.device() == 0);
  {
    tc::StreamGuard g(s);
    REQUIRE(tc::current_stream(0) == s.raw());
    cudaStream_t seen = nullptr;
    std::thread([&] { seen = tc::current_stream(0); }).join();
    REQUIRE(seen == def);
    {
      tc::Stream inner = tc::Stream::create(0, -1);
      tc::StreamGuard g2(inner);
      REQUIRE(tc::current_stream(0) == inner.raw());
    }
    REQUIRE(tc::current_stream(0) == s.raw());
  }
  REQUIRE(tc::current_stream(0) == def);
  // Ops allocate on the current stream: a tensor made under the guard is usable after it.
  Tensor t;
  {
    tc::StreamGuard g(s);
    t = ones({1000}, on_gpu());
  }
  s.synchronize();
  REQUIRE(t.to(kCPU).equal(ones({1000})));
}

TEST_CASE("cuda: Stream and Event wrappers: move, query, synchronize, timing", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::Stream a = tc::Stream::create(0);
  cudaStream_t raw = a.raw();
  tc::Stream b = std::move(a);
  REQUIRE(b.raw() == raw);
  REQUIRE(a.raw() == nullptr);
  tc::Stream borrowed = tc::Stream::borrow(raw, 0);
  REQUIRE(borrowed.raw() == raw);

  tc::Event unrecorded;
  REQUIRE_FALSE(unrecorded.recorded());
  REQUIRE(unrecorded.query());
  unrecorded.wait(b.raw());  // a no-op

  Tensor src = randn({1 << 22}).to(kGPU);  // 16 MiB
  Tensor dst = empty({1 << 22}, on_gpu());
  tc::Event start(true), stop(true);
  {
    tc::StreamGuard g(b);
    start.record(b.raw());
    for (int i = 0; i < 4; ++i)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, b.raw()));
    stop.record(b.raw());
  }
  stop.synchronize();
  REQUIRE(stop.query());
  REQUIRE(b.query());
  REQUIRE(start.elapsed_ms(stop) >= 0.0f);
  tc::Event untimed;
  untimed.record(b.raw());
  untimed.synchronize();
  REQUIRE_THROWS_WITH(untimed.elapsed_ms(stop), Catch::Contains("timing"));
  tc::Event moved = std::move(stop);
  REQUIRE(moved.recorded());
  REQUIRE_FALSE(stop.recorded());

  // An event orders one stream after another without a host sync.
  tc::Stream c = tc::Stream::create(0);
  {
    Gate gate(b.raw());
    tc::Event e;
    e.record(b.raw());
    e.wait(c.raw());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE_FALSE(c.query());
    gate.release();
    c.synchronize();
    REQUIRE(e.query());
  }
  tc::synchronize(0);
}

TEST_CASE("cuda: TF32 for matmul is off by default and can be turned on", "[cuda]") {
  REQUIRE_FALSE(tc::allow_tf32());
  tc::set_allow_tf32(true);
  REQUIRE(tc::allow_tf32());
  tc::set_allow_tf32(false);
  REQUIRE_FALSE(tc::allow_tf32());
}

// ---------------------------------------------------------------- caching allocator

TEST_CASE("cuda: allocator statistics are exact after known allocations", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::synchronize(0);
  tc::empty_cache();
  tc::reset_peak_memory_stats(0);
  const tc::MemoryStats base = tc::memory_stats(0);
  REQUIRE(base.reserved_bytes == base.allocated_bytes);  // nothing cached after empty_cache
  REQUIRE(base.peak_allocated_bytes == base.allocated_bytes);

  Tensor a = empty({250}, on_gpu());  // 1000 B -> 1 KiB block
  tc::MemoryStats s = tc::memory_stats(0);
  REQUIRE(s.allocated_bytes == base.allocated_bytes + 1024);
  REQUIRE(s.requested_bytes == base.requested_bytes + 1000);
  REQUIRE(s.reserved_bytes == base.reserved_bytes + 1024);
  REQUIRE(s.active_blocks == base.active_blocks + 1);
  REQUIRE(s.segments == base.segments + 1);

  Tensor b = empty({3 << 18}, on_gpu());  // 3 MiB -> 4 MiB block
  s = tc::memory_stats(0);
  const int64_t both = base.allocated_bytes + 1024 + (4 << 20);
  REQUIRE(s.allocated_bytes == both);
  REQUIRE(s.reserved_bytes == base.reserved_bytes + 1024 + (4 << 20));
  REQUIRE(s.peak_allocated_bytes == both);

  b = Tensor();
  s = tc::memory_stats(0);
  REQUIRE(s.allocated_bytes == base.allocated_bytes + 1024);
  REQUIRE(s.reserved_bytes == base.reserved_bytes + 1024 + (4 << 20));  // cached, not returned
  REQUIRE(s.peak_allocated_bytes == both);
  REQUIRE(s.cached_blocks == base.cached_blocks + 1);

  tc::reset_peak_memory_stats(0);
  REQUIRE(tc::memory_stats(0).peak_allocated_bytes == base.allocated_bytes + 1024);

  tc::empty_cache();
  s = tc::memory_stats(0);
  REQUIRE(s.reserved_bytes == base.reserved_bytes + 1024);
  REQUIRE(s.cached_blocks == base.cached_blocks);
  a = Tensor();
  tc::empty_cache();
  s = tc::memory_stats(0);
  REQUIRE(s.allocated_bytes == base.allocated_bytes);
  REQUIRE(s.reserved_bytes == base.reserved_bytes);

  Tensor none = empty({0}, on_gpu());  // zero bytes: no block at all
  REQUIRE(tc::memory_stats(0).active_blocks == base.active_blocks);
  REQUIRE(none.to(kCPU).numel() == 0);
}

TEST_CASE("cuda: a freed block is reused on its own stream, not on another", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::synchronize(0);
  tc::empty_cache();
  void* p = nullptr;
  {
    Tensor t = empty({250}, on_gpu());
    p = ptr_of(t);
  }
  const int64_t hits = tc::memory_stats(0).num_cache_hits;
  {
    Tensor t = empty({240}, on_gpu());  // rounds to the same 1 KiB
    REQUIRE(ptr_of(t) == p);
    REQUIRE(tc::memory_stats(0).num_cache_hits == hits + 1);
  }
  tc::Stream s = tc::Stream::create(0);
  {
    tc::StreamGuard g(s);
    Tensor u = empty({250}, on_gpu());
    REQUIRE(ptr_of(u) != p);
  }
  Tensor v = empty({250}, on_gpu());
  REQUIRE(ptr_of(v) == p);
  // A much larger block is not spent on a small request.
  void* big = nullptr;
  {
    Tensor t = empty({16 << 20}, on_gpu());  // 64 MiB
    big = ptr_of(t);
  }
  Tensor small = empty({1 << 20}, on_gpu());  // 4 MiB
  REQUIRE(ptr_of(small) != big);
}

TEST_CASE("cuda: record_stream delays reuse until the other stream's work is done", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::synchronize(0);
  tc::empty_cache();
  tc::Stream side = tc::Stream::create(0);
  void* p = nullptr;
  Tensor u;  // alive to the end, so w below can only get p's block
  {
    Gate gate(side.raw());
    {
      Tensor t = empty({1 << 18}, on_gpu());  // 1 MiB, allocated on the current stream
      p = ptr_of(t);
      tc::record_stream(t, side.raw());  // t is used on `side`, which is blocked by the gate
      tc::record_stream(t, tc::current_stream(0));  // its own stream: a no-op
    }
    u = empty({1 << 18}, on_gpu());
    REQUIRE(ptr_of(u) != p);  // the side stream may still read p
    gate.release();
    side.synchronize();
  }
  Tensor w = empty({1 << 18}, on_gpu());
  REQUIRE(ptr_of(w) == p);
  REQUIRE_THROWS_WITH(tc::record_stream(ones({2}), side.raw()), Catch::StartsWith("[record_stream]"));
  if (tc::device_count() > 1) {
    tc::Stream other = tc::Stream::create(1);
    REQUIRE_THROWS_WITH(tc::record_stream(w, other.raw()), Catch::Contains("stream is on cuda:1"));
  }
}

TEST_CASE("cuda: empty_cache waits for recorded streams, then returns every cached block", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::synchronize(0);
  tc::empty_cache();
  const tc::MemoryStats base = tc::memory_stats(0);
  tc::Stream side = tc::Stream::create(0);
  {
    Tensor a = empty({1 << 20}, on_gpu());
    Tensor b = empty({1 << 10}, on_gpu());
    tc::record_stream(b, side.raw());
  }
  REQUIRE(tc::memory_stats(0).reserved_bytes == base.reserved_bytes + (4 << 20) + 4096);
  tc::empty_cache();
  tc::MemoryStats s = tc::memory_stats(0);
  REQUIRE(s.reserved_bytes == base.reserved_bytes);
  REQUIRE(s.segments == base.segments);
  REQUIRE(s.num_device_frees == base.num_device_frees + 2);
}

// A process that uses one GPU must not create a context (some 500 MB, and an error in
// exclusive-process mode) on the others of the node. ctest runs each case in a process of its
// own, where no device has a context yet; run with the other cases, the devices earlier cases
// used are left out of the check.
TEST_CASE("cuda: empty_cache touches only the devices that hold cached blocks", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const int n = tc::device_count();
  std::vector<int> idle;  // devices without a context in this process so far
  for (int d = 0; d < n; ++d) {
    const std::optional<bool> active = primary_context_active(d);
    if (!active) {
      WARN("SKIP: cuDevicePrimaryCtxGetState cannot be reached through the runtime");
      return;
    }
    if (!*active) idle.push_back(d);
  }
  if (idle.empty()) WARN("SKIP (in part): every device already has a context in this process (run this case alone)");
  auto require_still_idle = [&](int except) {
    for (int d : idle) {
      if (d == except) continue;
      INFO("cuda:" << d << " had no context before");
      REQUIRE(primary_context_active(d) == std::optional<bool>(false));
    }
  };
  // Nothing cached on an idle device: empty_cache leaves every one of them alone.
  tc::empty_cache();
  require_still_idle(-1);
  // Blocks cached on cuda:0 only: they are returned, and no other device is made current.
  {
    Tensor a = empty({1 << 20}, on_gpu());
    Tensor b = empty({1 << 10}, on_gpu());
  }
  REQUIRE(tc::memory_stats(0).cached_blocks >= 2);
  tc::empty_cache();
  REQUIRE(tc::memory_stats(0).cached_blocks == 0);
  REQUIRE(primary_context_active(0) == std::optional<bool>(true));
  require_still_idle(0);
  if (n < 2) WARN("SKIP (in part): one CUDA device; devices other than cuda:0 not checked");
}

TEST_CASE("cuda: out of memory frees the cache, retries, then throws a clear error", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  const int64_t ooms = tc::memory_stats(0).num_ooms;
  {
    Tensor cached = empty({1 << 20}, on_gpu());
  }
  REQUIRE(tc::memory_stats(0).cached_blocks > 0);
  REQUIRE_THROWS_WITH(empty({int64_t{1} << 43}, on_gpu()),  // 32 TiB
                      Catch::StartsWith("[alloc] CUDA out of memory allocating 35184372088832 bytes on cuda:0") &&
                          Catch::Contains("allocated") && Catch::Contains("reserved"));
  tc::MemoryStats s = tc::memory_stats(0);
  REQUIRE(s.num_ooms == ooms + 1);
  REQUIRE(s.cached_blocks == 0);  // the retry released the cache
  Tensor after = ones({16}, on_gpu());  // the allocator still works
  REQUIRE(after.to(kCPU).equal(ones({16})));
}

TEST_CASE("cuda: the allocator is thread-safe", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::synchronize(0);
  const tc::MemoryStats base = tc::memory_stats(0);
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k] {
      try {
        cudaStream_t def = tc::current_stream(0);
        tc::Stream s = tc::Stream::create(0);
        tc::StreamGuard g(s);
        for (int i = 0; i < 200; ++i) {
          Tensor a = empty({(i % 7 + 1) * 1000 + k}, on_gpu());
          Tensor b = empty({(i % 3 + 1) << 19}, on_gpu());
          if (i % 5 == 0) tc::record_stream(a, def);  // used on another stream too
        }
        s.synchronize();
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(errors == 0);
  tc::MemoryStats s = tc::memory_stats(0);
  REQUIRE(s.allocated_bytes == base.allocated_bytes);
  REQUIRE(s.active_blocks == base.active_blocks);
  REQUIRE(s.num_allocs == base.num_allocs + 8 * 400);
}

// ---------------------------------------------------------------- copies

TEST_CASE("cuda: CPU <-> CUDA round trips are exact for every dtype, contiguous or not", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(11);
  for (Dtype d : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO("dtype " << d);
    Tensor h = random_of(d, {37, 53});
    Tensor g = h.to(kGPU);
    REQUIRE(g.is_cuda());
    REQUIRE(g.dtype() == d);
    REQUIRE(g.shape() == h.shape());
    Tensor back = g.to(kCPU);
    REQUIRE(back.is_cpu());
    REQUIRE(back.equal(h));
    REQUIRE(std::memcmp(back.data_ptr(), h.data_ptr(), h.nbytes()) == 0);

    // Non-contiguous sources on either side are made contiguous on their own device first.
    Tensor ht = h.transpose(0, 1).slice(0, 1, 50, 3);
    REQUIRE_FALSE(ht.is_contiguous());
    Tensor gt = ht.to(kGPU);
    REQUIRE(gt.is_contiguous());
    REQUIRE(gt.to(kCPU).equal(ht));
    Tensor view_on_gpu = g.transpose(0, 1).slice(0, 1, 50, 3);
    REQUIRE_FALSE(view_on_gpu.is_contiguous());
    REQUIRE(view_on_gpu.to(kCPU).equal(ht));
    Tensor expanded = h.slice(0, 0, 1).expand({4, 53});
    REQUIRE(expanded.to(kGPU).to(kCPU).equal(expanded));

    // Device to device on one device: same tensor back; a clone through the CPU is a new one.
    REQUIRE(g.to(kGPU).is_same(g));
  }
  Tensor scalar = scalar_tensor(2.5).to(kGPU);
  REQUIRE(scalar.to(kCPU).item<float>() == 2.5f);
  Tensor empty_t = empty({0, 3}).to(kGPU);
  REQUIRE(empty_t.to(kCPU).shape() == Shape{0, 3});
}

TEST_CASE("cuda: copies between two devices are ordered and exact", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  if (tc::device_count() < 2) {
    WARN("SKIP: needs two CUDA devices, this machine has " << tc::device_count());
    return;
  }
  Tensor h = randn({1000, 33});
  Tensor g1 = h.to(Device::cuda(1));
  REQUIRE(g1.device() == Device::cuda(1));
  Tensor g0 = g1.to(kGPU);
  REQUIRE(g0.to(kCPU).equal(h));
  REQUIRE(g1.transpose(0, 1).to(kGPU).to(kCPU).equal(h.transpose(0, 1)));
}

TEST_CASE("cuda: pinned host memory: async copies on the current stream, cached blocks", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(12);
  const int64_t n = 1 << 20;
  Tensor src = randn({n});
  Tensor pin = tc::pinned_empty({n}, f32);
  REQUIRE(pin.is_cpu());
  REQUIRE(tc::is_pinned(pin));
  REQUIRE(tc::is_pinned(pin.slice(0, 10, 20)));
  REQUIRE_FALSE(tc::is_pinned(src));
  std::memcpy(pin.data_ptr(), src.data_ptr(), src.nbytes());

  Tensor dev = empty({n}, on_gpu());
  tc::copy_async(dev, pin);
  Tensor back = tc::pinned_empty({n}, f32);
  tc::copy_async(back, dev);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(tc::current_stream(0)));
  REQUIRE(back.equal(src));

  // to_async: from pageable memory it is staged through pinned memory; to the CPU it is pinned.
  Tensor dev2 = tc::to_async(src, kGPU);
  REQUIRE(dev2.is_cuda());
  Tensor host2 = tc::to_async(dev2, kCPU);
  REQUIRE(tc::is_pinned(host2));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(tc::current_stream(0)));
  REQUIRE(host2.equal(src));
  REQUIRE(tc::to_async(src.view({1024, 1024}).t(), kGPU).to(kCPU).equal(src.view({1024, 1024}).t()));

  // Pageable host memory still works with copy_async (synchronously).
  Tensor pageable = empty({n});
  tc::copy_async(pageable, dev);
  REQUIRE(pageable.equal(src));

  REQUIRE_THROWS_WITH(tc::copy_async(empty({n}, f64), dev), Catch::StartsWith("[copy_async] dtypes differ"));
  REQUIRE_THROWS_WITH(tc::copy_async(empty({n - 1}), dev), Catch::StartsWith("[copy_async] shapes differ"));
  REQUIRE_THROWS_WITH(tc::copy_async(empty({n}), src), Catch::Contains("neither tensor is on CUDA"));
  REQUIRE_THROWS_WITH(tc::copy_async(empty({1024, 1024}, on_gpu()), pin.view({1024, 1024}).t()),
                      Catch::Contains("contiguous"));
}

TEST_CASE("cuda: a pinned block is reused only after the copy that used it has completed", "[cuda]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  tc::empty_cache();
  tc::Stream s = tc::Stream::create(0);
  Tensor dev = empty({1 << 16}, on_gpu());
  void* p = nullptr;
  {
    tc::StreamGuard guard(s);
    Gate gate(s.raw());
    {
      Tensor pin = tc::pinned_empty({1 << 16}, f32);
      p = ptr_of(pin);
      tc::copy_async(dev, pin);  // queued behind the gate
    }
    Tensor again = tc::pinned_empty({1 << 16}, f32);
    REQUIRE(ptr_of(again) != p);
    gate.release();
    s.synchronize();
  }
  const int64_t hits = tc::pinned_memory_stats().num_cache_hits;
  Tensor third = tc::pinned_empty({1 << 16}, f32);
  REQUIRE(tc::pinned_memory_stats().num_cache_hits == hits + 1);
  (void)third;
  tc::MemoryStats ps = tc::pinned_memory_stats();
  REQUIRE(ps.allocated_bytes >= 1 << 18);
  REQUIRE(ps.reserved_bytes >= ps.allocated_bytes);
}
