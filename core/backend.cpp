// The backend registry: the CPU backend built in, the CUDA backend library loaded on first use.
#include "core/backend.h"
#include "core/kernel_tables.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <dlfcn.h>
#include <fmt/format.h>

#include "core/tensor.h"

// Weak: null unless the program linked the CUDA backend library (see core/backend.h).
extern "C" __attribute__((weak)) void tandem_cuda_backend_install();

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


// Loading the CUDA backend. TANDEM_CUDA_LIBRARY_FILE (set by the build when it builds
// libtandem_cuda as a shared library) names the file to look for next to libtandem; a static build
// with CUDA has TANDEM_CUDA_STATIC instead: there the program must link Tandem::cuda itself.
std::once_flag cuda_once;
std::string cuda_missing = "the CUDA backend has not been loaded yet";

// Where libtandem (or, statically linked, the program) lives: the plugin is looked for beside it.
std::string this_library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&this_library_folder), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

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

void require_cpu(const Tensor& t, const char* op) {
  TANDEM_CHECK(t.defined(), "[{}] undefined tensor", op);
  if (t.is_cpu()) [[likely]] return;
  backend_for(t.device(), op);
  fail("[{}] has no kernel for tensors on {} (tensor of shape {})", op, t.device(), t.shape());
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
