// A refcounted buffer on one device, 64-byte aligned on the CPU, with the version counter that
// every view of it shares (in-place ops bump it; autograd checks it for saved tensors).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace tandem {

class Storage {
 public:
  Storage(size_t nbytes, Device device, const char* op = "empty");
  // Wraps memory the caller owns; `deleter` (may be empty) runs when the storage dies.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }
  // For code that swaps a tensor's storage: the new storage continues the old one's count.
  void set_version(uint64_t v) { version_.store(v, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  std::function<void(void*)> deleter_;
  bool owned_ = true;
  std::atomic<uint64_t> version_{0};
};

}  // namespace tandem
