#include "core/storage.h"

#include "core/backend.h"

namespace tandem {

#ifdef TANDEM_WITH_CUDA
namespace cuda {
void require_device(Device device, const char* op);  // cuda/runtime.cpp: "[op] no CUDA device: ..."
}
#endif

Storage::Storage(size_t nbytes, Device device, const char* op)
    : nbytes_(nbytes), device_(device) {
  Backend& backend = backend_for(device, op);
#ifdef TANDEM_WITH_CUDA
  // Here, where the op is known, so a missing GPU reads "[zeros] no CUDA device: ...".
  if (device.is_cuda()) cuda::require_device(device, op);
#endif
  data_ = backend.allocate(nbytes, device);
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)), owned_(false) {}

Storage::~Storage() {
  if (owned_) {
    backend_for(device_, "free").deallocate(data_, nbytes_, device_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace tandem
