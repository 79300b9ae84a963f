// The CUDA runtime as Tandem uses it: devices, the current stream per device, streams and events.
// Every op on a CUDA tensor launches on the current stream of the tensor's device; a library or
// user that wants other ordering sets another stream current (StreamGuard) and records tensors
// used across streams with record_stream (cuda/allocator.h).
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "core/device.h"

namespace tandem::cuda {

// Registers the CUDA Backend and every op family's kernel table with core (cuda/install.cpp).
// Called once by the CUDA backend library's entry point (tandem_cuda_backend_install, in
// dist/nccl/install.cpp), when core first asks for a CUDA device; it touches no device itself.
void install();

// 0 when there is no driver or no device (never throws); the reason is kept for messages.
int device_count();
bool is_available();
// Why CUDA is unusable here ("cudaGetDeviceCount: no CUDA-capable device is detected"), or "".
std::string unavailable_reason();
// Throws "[op] no CUDA device: ..." or "[op] cuda:3 does not exist (this machine has 2 CUDA devices)".
void require_device(Device device, const char* op);

int current_device();
void set_device(int index);

// Makes a device current for its scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  explicit DeviceGuard(Device device) : DeviceGuard(static_cast<int>(device.index)) {}
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// An owning stream (non-blocking with respect to the legacy default stream), or a borrowed view
// of an existing one. Cheap to copy as a handle when borrowed.
class Stream {
 public:
  // A new stream on `device`; priority 0 is normal, negative is higher.
  static Stream create(int device, int priority = 0);
  // Borrows a raw handle (not destroyed by this object).
  static Stream borrow(cudaStream_t raw, int device);
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t raw() const { return raw_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work on it has finished

 private:
  cudaStream_t raw_ = nullptr;
  int device_ = 0;
  bool owned_ = false;
};

// The stream ops on `device` launch on: the per-thread current stream, by default the device's
// default stream for Tandem (one non-blocking stream per device, created on first use).
cudaStream_t current_stream(int device);
inline cudaStream_t current_stream(Device device) { return current_stream(static_cast<int>(device.index)); }
void set_current_stream(cudaStream_t stream, int device);

// Makes `stream` current on its device for this thread in its scope, restoring the previous one.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream) : StreamGuard(stream.raw(), stream.device()) {}
  StreamGuard(cudaStream_t stream, int device);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
  int device_;
};

// An owning event (timing disabled unless asked for). The CUDA event is created at the first
// record(), on the recording stream's device, so constructing one needs no GPU; before it is
// recorded, wait() is a no-op, query() is true and synchronize() returns at once.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void wait(cudaStream_t stream) const;  // `stream` waits for the event; no host sync
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;  // both recorded, timing on
  cudaEvent_t raw() const { return raw_; }
  bool recorded() const { return raw_ != nullptr; }

 private:
  cudaEvent_t raw_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
};

// TF32 for f32 matmuls: off by default, as in PyTorch (torch.backends.cuda.matmul.allow_tf32).
bool allow_tf32();
void set_allow_tf32(bool on);

// Blocks until all work on the device has finished.
void synchronize(int device);

// Sync points and deferred errors. Ops never sync the host to check their inputs on the device:
// a kernel that meets a bad index (index_select, gather, embedding, scatter_add, nll_loss and
// cross_entropy targets) skips it and records it, and the next call here that waits for the
// device (Stream::synchronize, Event::synchronize, synchronize, a copy between host and device
// such as .to(kCPU) or item()) throws it as a tandem::Error: "[gather] index 7 is out of range
// for dim 0 of size 3 (input [3, 4]); detected on cuda:0 at the next synchronisation (...)".
// Then it is cleared; the device stays usable.
//
// How many times Tandem has blocked the host on a device since the process started (stream,
// event and device synchronizes, blocking copies between host and device): a cheap counter for
// tests and profiling that a step does not sync where it should not.
uint64_t host_sync_count();

// The device a raw stream belongs to (cudaStreamGetDevice).
int stream_device(cudaStream_t stream);

}  // namespace tandem::cuda
