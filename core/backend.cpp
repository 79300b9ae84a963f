// The backend registry (the CPU backend built in, CUDA installed on first use) and the intra-op
// thread count.
#include "core/backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/tensor.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {

namespace {

class CpuBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::cpu; }
  int device_count() const override { return 1; }
  void* allocate(size_t nbytes, Device) override {
    TANDEM_CHECK(nbytes <= (size_t{1} << 62), "[alloc] cannot allocate {} bytes", nbytes);
    size_t rounded = (std::max<size_t>(nbytes, 1) + 63) & ~size_t{63};
    void* p = std::aligned_alloc(64, rounded);
    TANDEM_CHECK(p != nullptr, "[alloc] out of CPU memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t, Device) noexcept override { std::free(ptr); }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }
};

CpuBackend cpu_backend;
Backend* backends[2] = {&cpu_backend, nullptr};

int default_threads() {
  if (const char* env = std::getenv("TANDEM_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local = 1;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(env));
  return std::max(1, cores / local);
}

std::once_flag threads_once;
std::atomic<int> num_threads{0};

#ifdef TANDEM_WITH_CUDA
std::once_flag cuda_once;
#endif

}  // namespace

#ifdef TANDEM_WITH_CUDA
namespace cuda {
void install();  // cuda/install.cpp: registers the CUDA Backend and every kernel table
}
#endif

Backend& backend_for(Device device, const char* op) {
  Backend* b = backends[static_cast<int>(device.type)];
  if (b == nullptr) [[unlikely]] {
#ifdef TANDEM_WITH_CUDA
    // Installed on first use, so a CUDA build that never touches a GPU never initialises CUDA.
    if (device.type == DeviceType::cuda) {
      std::call_once(cuda_once, [] { cuda::install(); });
      b = backends[static_cast<int>(device.type)];
      if (b != nullptr) return *b;
    }
    fail("[{}] the CUDA backend is not available for {}", op, device);
#else
    fail("[{}] tandem was built without CUDA (device {} requested)", op, device);
#endif
  }
  return *b;
}

void require_cpu(const Tensor& t, const char* op) {
  TANDEM_CHECK(t.defined(), "[{}] undefined tensor", op);
  if (t.is_cpu()) [[likely]] return;
  backend_for(t.device(), op);
  fail("[{}] has no kernel for tensors on {} (tensor of shape {})", op, t.device(), t.shape());
}

Tensor Backend::host_staging(const Tensor& like) { return make_empty(like.shape(), like.dtype(), kCPU, "dist staging"); }

bool has_backend(DeviceType type) {
#ifdef TANDEM_WITH_CUDA
  if (type == DeviceType::cuda) std::call_once(cuda_once, [] { cuda::install(); });
#endif
  return backends[static_cast<int>(type)] != nullptr;
}
void register_backend(DeviceType type, Backend* backend) { backends[static_cast<int>(type)] = backend; }

int get_num_threads() {
  std::call_once(threads_once, [] {
    if (num_threads.load() == 0) set_num_threads(default_threads());
  });
  return num_threads.load();
}

void set_num_threads(int n) {
  TANDEM_CHECK(n >= 1, "[set_num_threads] thread count must be >= 1, got {}", n);
  num_threads.store(n);
  openblas_set_num_threads(n);
}

}  // namespace tandem
