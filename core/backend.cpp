// The backend registry: the CPU backend built in, the CUDA backend library loaded on first use.
#include "core/backend.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/sanitizers.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <dlfcn.h>
#include <fmt/format.h>

#include "core/tensor.h"

// Weak: null unless the program linked the CUDA backend library (see core/backend.h).
extern "C" __attribute__((weak)) void tandem_cuda_backend_install();

namespace tandem {

namespace {

// Freed large blocks kept for reuse, by size. A training step frees and allocates the same
// activations and gradients every step; without the cache glibc hands each block of more than
// 128 KiB back to the kernel (munmap, or a trim of the heap's top) and the next step faults its
// pages in again, zeroed: a quarter of the Fashion-MNIST CNN's step. At most kMaxHeld bytes are
// held; a block that would pass that empties the cache first, so a change of working set (another
// model, other shapes) replaces the old blocks instead of being refused. Off under AddressSanitizer,
// which must see every free to catch a use after it. Never destroyed: tensors held by other
// static objects are freed after this file's statics are gone.
class BlockCache {
 public:
  static constexpr size_t kMinCached = size_t{128} << 10;
#if TANDEM_ASAN
  static constexpr size_t kMaxHeld = 0;
#else
  static constexpr size_t kMaxHeld = size_t{512} << 20;
#endif

  // The size a block of nbytes is allocated with: 64-byte multiples, whole pages once cached, so
  // that nearby sizes share blocks.
  static size_t rounded(size_t nbytes) {
    const size_t r = (std::max<size_t>(nbytes, 1) + 63) & ~size_t{63};
    return r < kMinCached ? r : (r + 4095) & ~size_t{4095};
  }
  void* take(size_t size) {
    if (size < kMinCached) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= size;
    return p;
  }
  // False when the caller must free the block itself.
  bool give(void* p, size_t size) noexcept {
    if (size < kMinCached || size > kMaxHeld) return false;
    try {
      std::lock_guard<std::mutex> lock(mu_);
      if (held_ + size > kMaxHeld) release_locked();
      free_[size].push_back(p);
      held_ += size;
      return true;
    } catch (...) {  // the map could not grow
      return false;
    }
  }
 private:
  void release_locked() noexcept {
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) std::free(p);
    free_.clear();
    held_ = 0;
  }
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t held_ = 0;
};

class CpuBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::cpu; }
  int device_count() const override { return 1; }
  void* allocate(size_t nbytes, Device) override {
    TANDEM_CHECK(nbytes <= (size_t{1} << 62), "[alloc] cannot allocate {} bytes", nbytes);
    const size_t size = BlockCache::rounded(nbytes);
    if (void* p = cache().take(size)) return p;
    void* p = std::aligned_alloc(64, size);
    TANDEM_CHECK(p != nullptr, "[alloc] out of CPU memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, Device) noexcept override {
    if (ptr != nullptr && !cache().give(ptr, BlockCache::rounded(nbytes))) std::free(ptr);
  }
  void copy_bytes(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes) std::memcpy(dst, src, nbytes);
  }

 private:
  static BlockCache& cache() {
    static BlockCache* c = new BlockCache;
    return *c;
  }
};

CpuBackend cpu_backend;
Backend* backends[2] = {&cpu_backend, nullptr};


// Loading the CUDA backend. TANDEM_CUDA_LIBRARY_FILE (set by the build when it builds
// libtandem_cuda as a shared library) names the file to look for next to libtandem; a static build
// with CUDA has TANDEM_CUDA_STATIC instead: there the program must link Tandem::cuda itself.
std::once_flag cuda_once;
std::string cuda_missing = "the CUDA backend has not been loaded yet";

#if defined(TANDEM_CUDA_LIBRARY_FILE)
// Where libtandem (or, statically linked, the program) lives: the plugin is looked for beside it.
std::string this_library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_folder), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}
#endif

using InstallFn = void (*)();

// Finds the plugin's entry point: in the program (it linked Tandem::cuda), else in the library
// dlopen'ed from TANDEM_CUDA_LIBRARY or from libtandem's folder. The handle is never closed: the
// kernel tables and the Backend it registers live as long as the process. On failure, says why.
InstallFn find_cuda_install(std::string& why) {
  if (&tandem_cuda_backend_install != nullptr) return &tandem_cuda_backend_install;
#if defined(TANDEM_CUDA_LIBRARY_FILE)
  std::string file;
  if (const char* env = std::getenv("TANDEM_CUDA_LIBRARY"); env && *env) {
    file = env;
  } else {
    file = this_library_folder() + "/" + TANDEM_CUDA_LIBRARY_FILE;
  }
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    why = fmt::format("the CUDA backend library could not be loaded ({})", err ? err : file.c_str());
    return nullptr;
  }
  auto fn = reinterpret_cast<InstallFn>(dlsym(handle, "tandem_cuda_backend_install"));
  if (fn == nullptr) why = fmt::format("{} has no tandem_cuda_backend_install: not a Tandem CUDA backend", file);
  return fn;
#elif defined(TANDEM_CUDA_STATIC)
  why = "this Tandem is built as static libraries: a program that uses CUDA links Tandem::cuda";
  return nullptr;
#else
  why = "tandem was built without CUDA";
  return nullptr;
#endif
}

void load_cuda_backend() {
  std::call_once(cuda_once, [] {
    std::string why;
    InstallFn install = find_cuda_install(why);
    if (install == nullptr) {
      cuda_missing = why;
      return;
    }
    try {
      install();
      cuda_missing.clear();
    } catch (const std::exception& e) {
      cuda_missing = fmt::format("the CUDA backend failed to install: {}", e.what());
    }
  });
}

}  // namespace

Backend& backend_for(Device device, const char* op) {
  Backend* b = backends[static_cast<int>(device.type)];
  if (b == nullptr) [[unlikely]] {
    if (device.type == DeviceType::cuda) {
      load_cuda_backend();
      b = backends[static_cast<int>(device.type)];
      if (b != nullptr) return *b;
      fail("[{}] {} (device {} requested)", op, cuda_missing, device);
    }
    fail("[{}] no backend for device {}", op, device);
  }
  return *b;
}

Tensor Backend::host_staging(const Tensor& like) { return make_empty(like.shape(), like.dtype(), kCPU, "dist staging"); }

bool has_backend(DeviceType type) {
  if (type == DeviceType::cuda) load_cuda_backend();
  return backends[static_cast<int>(type)] != nullptr;
}

std::string backend_unavailable_reason(DeviceType type) {
  if (has_backend(type)) return "";
  return type == DeviceType::cuda ? cuda_missing : "no backend";
}
void register_backend(DeviceType type, Backend* backend) { backends[static_cast<int>(type)] = backend; }

}  // namespace tandem
