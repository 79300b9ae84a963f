// Devices, current streams, streams and events (cuda/runtime.h).
//
// The device count is read once and cached with its error, so asking never throws and a machine
// without a driver answers 0 with a reason. The current stream is per thread and per device; the
// default for a device is one non-blocking stream shared by every thread, created on first use,
// so Tandem's work never serialises against the legacy default stream of other libraries.
#include "cuda/runtime.h"

#include <array>
#include <atomic>
#include <mutex>

#include "cuda/detail/check.h"
#include "cuda/detail/device_error.h"

namespace tandem::cuda {

namespace {

constexpr int kMaxDevices = 64;

struct DeviceInfo {
  int count = 0;
  std::string reason;
};

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo i;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      i.reason = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
      return i;
    }
    if (n <= 0) {
      i.reason = "cudaGetDeviceCount found no CUDA-capable device";
      return i;
    }
    i.count = n > kMaxDevices ? kMaxDevices : n;
    return i;
  }();
  return info;
}

// Tandem's default stream per device: created once, shared by all threads, never destroyed
// (streams are process-lifetime objects, and destroying them at exit races the driver's teardown).
std::array<std::atomic<cudaStream_t>, kMaxDevices> default_streams{};
std::mutex default_stream_mutex;

cudaStream_t default_stream(int device) {
  cudaStream_t s = default_streams[device].load(std::memory_order_acquire);
  if (s != nullptr) [[likely]] return s;
  std::lock_guard<std::mutex> lock(default_stream_mutex);
  s = default_streams[device].load(std::memory_order_relaxed);
  if (s == nullptr) {
    DeviceGuard guard(device);
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    default_streams[device].store(s, std::memory_order_release);
  }
  return s;
}

struct CurrentStream {
  cudaStream_t stream = nullptr;
  bool set = false;
};
thread_local std::array<CurrentStream, kMaxDevices> current_streams{};

std::atomic<bool> tf32_enabled{false};

void check_index(int device, const char* op) {
  require_device(Device::cuda(device), op);
}

}  // namespace

int device_count() { return device_info().count; }
bool is_available() { return device_info().count > 0; }
std::string unavailable_reason() { return device_info().reason; }

void require_device(Device device, const char* op) {
  const DeviceInfo& info = device_info();
  if (info.count == 0) [[unlikely]]
    fail("[{}] no CUDA device: {} ({} requested)", op, info.reason, device);
  if (device.index < 0 || device.index >= info.count) [[unlikely]]
    fail("[{}] {} does not exist (this machine has {} CUDA device{})", op, device, info.count,
         info.count == 1 ? "" : "s");
}

int current_device() {
  require_device(Device::cuda(0), "current_device");
  int d = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  check_index(index, "set_device");
  TANDEM_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::DeviceGuard(int index) : previous_(current_device()) {
  if (index != previous_) set_device(index);
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

// ---------------------------------------------------------------- Stream

Stream Stream::create(int device, int priority) {
  check_index(device, "Stream::create");
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Lower numbers are higher priorities: greatest <= priority <= least.
  if (priority > least) priority = least;
  if (priority < greatest) priority = greatest;
  Stream s;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&s.raw_, cudaStreamNonBlocking, priority));
  s.device_ = device;
  s.owned_ = true;
  return s;
}

Stream Stream::borrow(cudaStream_t raw, int device) {
  Stream s;
  s.raw_ = raw;
  s.device_ = device;
  s.owned_ = false;
  return s;
}

namespace {
// Waits for the stream's work before destroying it: the caching allocator keys blocks by the
// stream handle, and a new stream may get the same handle while the old one's work still runs.
void destroy_stream(cudaStream_t s) noexcept {
  (void)cudaStreamSynchronize(s);
  note_host_sync();
  (void)cudaStreamDestroy(s);
  (void)cudaGetLastError();
}
}  // namespace

Stream::~Stream() {
  if (owned_ && raw_ != nullptr) destroy_stream(raw_);  // never throws from a destructor
}

Stream::Stream(Stream&& other) noexcept : raw_(other.raw_), device_(other.device_), owned_(other.owned_) {
  other.raw_ = nullptr;
  other.owned_ = false;
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (owned_ && raw_ != nullptr) destroy_stream(raw_);
    raw_ = other.raw_;
    device_ = other.device_;
    owned_ = other.owned_;
    other.raw_ = nullptr;
    other.owned_ = false;
  }
  return *this;
}

void Stream::synchronize() const {
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(raw_));
  synchronized(device_, "Stream::synchronize");
}

bool Stream::query() const {
  cudaError_t err = cudaStreamQuery(raw_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TANDEM_CUDA_CHECK(err);
  return true;
}

// ---------------------------------------------------------------- current stream

cudaStream_t current_stream(int device) {
  if (device < 0 || device >= device_info().count) [[unlikely]]
    check_index(device, "current_stream");
  const CurrentStream& c = current_streams[device];
  if (c.set) return c.stream;
  return default_stream(device);
}

void set_current_stream(cudaStream_t stream, int device) {
  check_index(device, "set_current_stream");
  current_streams[device] = {stream, true};
}

StreamGuard::StreamGuard(cudaStream_t stream, int device) : previous_(current_stream(device)), device_(device) {
  set_current_stream(stream, device);
}

StreamGuard::~StreamGuard() {
  // device_ was validated by the constructor, so this cannot throw.
  current_streams[device_] = {previous_, true};
}

// ---------------------------------------------------------------- Event

Event::Event(bool timing) : timing_(timing) {}

Event::~Event() {
  if (raw_ != nullptr) (void)cudaEventDestroy(raw_);
}

Event::Event(Event&& other) noexcept : raw_(other.raw_), device_(other.device_), timing_(other.timing_) {
  other.raw_ = nullptr;
  other.device_ = -1;
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (raw_ != nullptr) (void)cudaEventDestroy(raw_);
    raw_ = other.raw_;
    device_ = other.device_;
    timing_ = other.timing_;
    other.raw_ = nullptr;
    other.device_ = -1;
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  int device = stream_device(stream);
  if (raw_ == nullptr) {
    DeviceGuard guard(device);
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&raw_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = device;
  }
  TANDEM_CHECK(device == device_, "[Event::record] event was created on cuda:{}, stream is on cuda:{}", device_, device);
  TANDEM_CUDA_CHECK(cudaEventRecord(raw_, stream));
}

void Event::wait(cudaStream_t stream) const {
  if (raw_ == nullptr) return;
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, raw_, 0));
}

void Event::synchronize() const {
  if (raw_ == nullptr) return;
  TANDEM_CUDA_CHECK(cudaEventSynchronize(raw_));
  synchronized(device_, "Event::synchronize");
}

bool Event::query() const {
  if (raw_ == nullptr) return true;
  cudaError_t err = cudaEventQuery(raw_);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TANDEM_CUDA_CHECK(err);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  TANDEM_CHECK(raw_ != nullptr && end.raw_ != nullptr, "[Event::elapsed_ms] both events must have been recorded");
  TANDEM_CHECK(timing_ && end.timing_, "[Event::elapsed_ms] both events need timing (Event(true))");
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, raw_, end.raw_));
  return ms;
}

// ---------------------------------------------------------------- misc

bool allow_tf32() { return tf32_enabled.load(std::memory_order_relaxed); }
void set_allow_tf32(bool on) { tf32_enabled.store(on, std::memory_order_relaxed); }

void synchronize(int device) {
  check_index(device, "synchronize");
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  synchronized(device, "cuda::synchronize");
}

int stream_device(cudaStream_t stream) {
  require_device(Device::cuda(0), "stream_device");
  int d = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetDevice(stream, &d));
  return d;
}

}  // namespace tandem::cuda
