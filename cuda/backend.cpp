// The tandem::Backend for DeviceType::cuda: memory through the caching allocator on the device's
// current stream, and the byte copies behind tensor.to(device).
//
// copy_bytes is the blocking path: a copy between host and device has completed when it returns
// (the host buffer is valid to read, or free to reuse), as in PyTorch's non_blocking=false. The
// non-blocking path is cuda::copy_async / cuda::to_async (cuda/allocator.h). Device-to-device
// copies stay asynchronous on the current stream either way.
#include <cstring>
#include <vector>

#include "core/backend.h"
#include "cuda/allocator.h"
#include "cuda/detail/check.h"
#include "cuda/detail/device_error.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

// Same device: one cudaMemcpyAsync on its current stream. Across devices: the copy runs on the
// source's current stream after the destination's current stream has reached this point, and the
// destination's stream waits for it, so work queued on either stream before and after is ordered.
void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device == src_device) {
    DeviceGuard guard(dst_device);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, current_stream(dst_device)));
    return;
  }
  cudaStream_t src_stream = current_stream(src_device);
  cudaStream_t dst_stream = current_stream(dst_device);
  Event dst_ready;
  dst_ready.record(dst_stream);
  dst_ready.wait(src_stream);
  {
    DeviceGuard guard(src_device);
    TANDEM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, src_stream));
  }
  Event done;
  done.record(src_stream);
  done.wait(dst_stream);
}

namespace {

// Markers are events recorded on the side stream; the destructor waits for the stream, so memory
// its batches wrote (DDP's shadows, freed with it) never returns to the allocator in use.
class CudaSideStream final : public SideStream {
 public:
  explicit CudaSideStream(int device) : stream_(Stream::create(device)) {}
  ~CudaSideStream() override {
    if (cudaSetDevice(stream_.device()) == cudaSuccess) (void)cudaStreamSynchronize(stream_.raw());  // never throws
    note_host_sync();
  }

  void follow_current() override {
    DeviceGuard guard(stream_.device());
    ready_.record(current_stream(stream_.device()));
    ready_.wait(stream_.raw());
  }

  size_t run(const std::function<void()>& fn) override {
    DeviceGuard device(stream_.device());
    {
      StreamGuard guard(stream_);
      fn();
    }
    if (used_ == markers_.size()) markers_.emplace_back();
    markers_[used_].record(stream_.raw());
    return used_++;
  }

  void make_current_wait(size_t marker) override {
    TANDEM_CHECK(marker < used_, "[cuda] side stream marker {} was never recorded ({} so far)", marker, used_);
    markers_[marker].wait(current_stream(stream_.device()));
  }

  void reset_markers() override { used_ = 0; }

 private:
  Stream stream_;
  Event ready_;
  std::vector<Event> markers_;  // reused across batches: re-recording an event is cheap
  size_t used_ = 0;
};

class CudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::cuda; }
  int device_count() const override { return cuda::device_count(); }

  void* allocate(size_t nbytes, Device device) override {
    require_device(device, "alloc");
    return device_allocate(nbytes, device.index, current_stream(device.index));
  }

  void deallocate(void* ptr, size_t, Device) noexcept override { device_free(ptr); }
  void require_device(Device device, const char* op) override { cuda::require_device(device, op); }
  Tensor host_staging(const Tensor& like) override { return pinned_empty(like.shape(), like.dtype()); }
  std::unique_ptr<SideStream> make_side_stream(Device device) override {
    require_device(device, "side stream");
    return std::make_unique<CudaSideStream>(static_cast<int>(device.index));
  }
  void synchronize(Device device) override {
    DeviceGuard guard(device);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(current_stream(device)));
    synchronized(static_cast<int>(device.index), "synchronize");
  }

  void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) override {
    if (nbytes == 0) return;
    if (dst_device.is_cuda() && src_device.is_cuda()) {
      require_device(dst_device, "to");
      require_device(src_device, "to");
      copy_device_to_device(dst, dst_device.index, src, src_device.index, nbytes);
      return;
    }
    if (dst_device.is_cpu() && src_device.is_cpu()) {
      std::memcpy(dst, src, nbytes);
      return;
    }
    const Device dev = dst_device.is_cuda() ? dst_device : src_device;
    require_device(dev, "to");
    DeviceGuard guard(dev);
    cudaStream_t stream = current_stream(dev);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes,
                                      dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream));
    // Blocking semantics, pinned or pageable host memory alike (see the top of the file).
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    // A kernel's deferred error surfaces here (.to(kCPU), item()), after the bytes have arrived.
    synchronized(static_cast<int>(dev.index), dst_device.is_cuda() ? "a copy from the host" : "a copy to the host");
  }
};

}  // namespace

void install_backend() {
  // Leaked: tensors that die during static destruction still call deallocate on it.
  static CudaBackend* backend = new CudaBackend;
  register_backend(DeviceType::cuda, backend);
}

}  // namespace tandem::cuda
