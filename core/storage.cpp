#include "core/storage.h"

#include "core/backend.h"

namespace tandem {

Storage::Storage(size_t nbytes, Device device, const char* op)
    : nbytes_(nbytes), device_(device) {
  Backend& backend = backend_for(device, op);
  // Here, where the op is known, so a missing GPU reads "[zeros] no CUDA device: ...".
  backend.require_device(device, op);
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
