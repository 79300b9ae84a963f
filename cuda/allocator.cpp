// The caching device allocator and the pinned host allocator (cuda/allocator.h).
//
// Blocks are never split: each cached block is one cudaMalloc, rounded so that tensors of
// similar sizes share blocks. A free block sits in the pool of the stream it was allocated on;
// one recorded on other streams first waits in `pending` for an event per such stream. One mutex
// guards everything; allocation is a set lookup, and cudaMalloc is only called on a miss.
//
// Both allocators are leaked singletons: tensors that die during static destruction still find
// them, and nothing calls into a CUDA runtime that is being torn down.
#include "cuda/allocator.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/detail/copy.h"  // contiguous_copy, to_device
#include "cuda/detail/check.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

// cuda/backend.cpp: device-to-device bytes ordered on both devices' current streams.
void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, size_t nbytes);

namespace {

constexpr size_t kSmallRound = 512;
constexpr size_t kSmallMax = size_t{1} << 20;
constexpr size_t kLargeRound = size_t{2} << 20;
constexpr int kMaxDevices = 64;

// The largest cached block a request of `size` (already rounded) may take: small requests up to
// twice their size, large ones an eighth more, so a big block is not spent on a small tensor.
size_t reuse_limit(size_t size) {
  return size <= kSmallMax ? std::min(2 * size, kSmallMax) : size + size / 8;
}

std::string format_bytes(int64_t n) {
  double v = static_cast<double>(n);
  if (v >= double(1 << 30)) return fmt::format("{:.2f} GiB", v / double(1 << 30));
  if (v >= double(1 << 20)) return fmt::format("{:.2f} MiB", v / double(1 << 20));
  if (v >= 1024) return fmt::format("{:.2f} KiB", v / 1024);
  return fmt::format("{} B", n);
}

void bump_peaks(MemoryStats& s) {
  s.peak_allocated_bytes = std::max(s.peak_allocated_bytes, s.allocated_bytes);
  s.peak_reserved_bytes = std::max(s.peak_reserved_bytes, s.reserved_bytes);
}

// Event pools, one per device (an event must be recorded on a stream of its own device).
class EventPool {
 public:
  cudaEvent_t get(int device) {
    auto& pool = free_[device];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    DeviceGuard guard(device);
    cudaEvent_t e = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(int device, cudaEvent_t e) { free_[device].push_back(e); }

 private:
  std::array<std::vector<cudaEvent_t>, kMaxDevices> free_;
};

// 1 when complete, 0 when not yet; throws on an error.
bool event_done(cudaEvent_t e) {
  cudaError_t err = cudaEventQuery(e);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  TANDEM_CUDA_CHECK(err);
  return true;
}

// ================================================================ device allocator

struct Block {
  void* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  bool allocated = false;
  int pending_events = 0;
  std::vector<cudaStream_t> uses;  // other streams recorded by record_stream
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    auto sa = reinterpret_cast<uintptr_t>(a->stream), sb = reinterpret_cast<uintptr_t>(b->stream);
    if (sa != sb) return sa < sb;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct DeviceCache {
  std::set<Block*, BlockLess> free_blocks;
  std::vector<std::pair<cudaEvent_t, Block*>> pending;
  MemoryStats stats;
};

class DeviceAllocator {
 public:
  void* allocate(size_t nbytes, int device, cudaStream_t stream) {
    if (nbytes == 0) return nullptr;
    require_device(Device::cuda(device), "alloc");
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    DeviceCache& c = caches_[device];
    process_events(c, device);
    Block* b = take_free(c, stream, size);
    if (b != nullptr) {
      ++c.stats.num_cache_hits;
    } else {
      void* p = cuda_malloc(c, device, size, nbytes);
      b = new Block;
      b->ptr = p;
      b->size = size;
      b->device = device;
      b->stream = stream;
      c.stats.reserved_bytes += static_cast<int64_t>(size);
      ++c.stats.segments;
    }
    b->allocated = true;
    b->requested = nbytes;
    live_[b->ptr] = b;
    c.stats.allocated_bytes += static_cast<int64_t>(b->size);
    c.stats.requested_bytes += static_cast<int64_t>(nbytes);
    ++c.stats.active_blocks;
    ++c.stats.num_allocs;
    bump_peaks(c.stats);
    return b->ptr;
  }

  void free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    Block* b = it->second;
    live_.erase(it);
    DeviceCache& c = caches_[b->device];
    b->allocated = false;
    c.stats.allocated_bytes -= static_cast<int64_t>(b->size);
    c.stats.requested_bytes -= static_cast<int64_t>(b->requested);
    --c.stats.active_blocks;
    ++c.stats.cached_blocks;
    if (!b->uses.empty()) {
      try {
        for (cudaStream_t s : b->uses) {
          cudaEvent_t e = events_.get(b->device);
          c.pending.emplace_back(e, b);
          ++b->pending_events;
          TANDEM_CUDA_CHECK(cudaEventRecord(e, s));
        }
      } catch (...) {
        // Could not order the reuse (a destroyed stream, say): wait for the device instead, so
        // the block is certainly idle; its recorded events have then completed too.
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
        for (auto& [e, pb] : c.pending)
          if (pb == b) pb = nullptr;  // forget the block; the events return to the pool later
        b->pending_events = 0;
      }
      b->uses.clear();
    }
    if (b->pending_events == 0) c.free_blocks.insert(b);
  }

  void record_stream(void* ptr, int device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours (wrapped external memory): nothing to order
    Block* b = it->second;
    if (stream == b->stream) return;
    if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
  }

  // Touches only the devices that hold cached blocks (or blocks waiting on events): making every
  // device current would create a context (some 500 MB) on each GPU of the node from every
  // process that calls this, and fails on a GPU in exclusive-process mode that another owns.
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (int d = 0; d < device_count(); ++d) {
      DeviceCache& c = caches_[d];
      if (c.free_blocks.empty() && c.pending.empty()) continue;
      release_cached(c, d);
    }
  }

  MemoryStats stats(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    return caches_[device].stats;
  }

  void reset_peaks(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryStats& s = caches_[device].stats;
    s.peak_allocated_bytes = s.allocated_bytes;
    s.peak_reserved_bytes = s.reserved_bytes;
  }

 private:
  Block* take_free(DeviceCache& c, cudaStream_t stream, size_t size) {
    Block key;
    key.stream = stream;
    key.size = size;
    key.ptr = nullptr;
    auto it = c.free_blocks.lower_bound(&key);
    if (it == c.free_blocks.end()) return nullptr;
    Block* b = *it;
    if (b->stream != stream || b->size > reuse_limit(size)) return nullptr;
    c.free_blocks.erase(it);
    --c.stats.cached_blocks;
    return b;
  }

  // Moves blocks whose cross-stream events have all completed into their pools. `wait` blocks
  // on every event instead of asking.
  void process_events(DeviceCache& c, int device, bool wait = false) {
    size_t keep = 0;
    for (size_t i = 0; i < c.pending.size(); ++i) {
      auto [e, b] = c.pending[i];
      bool done = wait ? (TANDEM_CUDA_CHECK(cudaEventSynchronize(e)), true) : event_done(e);
      if (!done) {
        c.pending[keep++] = c.pending[i];
        continue;
      }
      events_.put(device, e);
      if (b != nullptr && --b->pending_events == 0 && !b->allocated) c.free_blocks.insert(b);
    }
    c.pending.resize(keep);
  }

  void release_cached(DeviceCache& c, int device) {
    process_events(c, device, /*wait=*/true);  // event calls need no current device
    if (c.free_blocks.empty()) return;         // nothing to free: leave the current device alone
    DeviceGuard guard(device);
    for (Block* b : c.free_blocks) {
      TANDEM_CUDA_CHECK(cudaFree(b->ptr));
      c.stats.reserved_bytes -= static_cast<int64_t>(b->size);
      --c.stats.segments;
      --c.stats.cached_blocks;
      ++c.stats.num_device_frees;
      delete b;
    }
    c.free_blocks.clear();
  }

  void* cuda_malloc(DeviceCache& c, int device, size_t size, size_t requested) {
    DeviceGuard guard(device);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(c, device);  // every cached block of this device, then one more try
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      ++c.stats.num_ooms;
      size_t free_b = 0, total_b = 0;
      std::string device_free;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        device_free = fmt::format("; {} free of {} on the device", format_bytes(int64_t(free_b)),
                                  format_bytes(int64_t(total_b)));
      (void)cudaGetLastError();
      fail("[alloc] CUDA out of memory allocating {} bytes on cuda:{} (allocated {}, reserved {}{})", requested, device,
           format_bytes(c.stats.allocated_bytes), format_bytes(c.stats.reserved_bytes), device_free);
    }
    TANDEM_CUDA_CHECK(err);
    ++c.stats.num_device_mallocs;
    return p;
  }

  std::mutex mu_;
  std::array<DeviceCache, kMaxDevices> caches_;
  std::unordered_map<void*, Block*> live_;
  EventPool events_;
};

DeviceAllocator& device_allocator() {
  static DeviceAllocator* a = new DeviceAllocator;  // leaked: see the top of the file
  return *a;
}

// ================================================================ pinned host allocator

struct PinnedBlock {
  void* ptr = nullptr;
  size_t size = 0;
  size_t requested = 0;
  bool allocated = false;
  std::vector<std::pair<cudaEvent_t, int>> events;  // uses by queued copies, with their device
};

class PinnedAllocator {
 public:
  void* allocate(size_t nbytes) {
    if (nbytes == 0) return nullptr;
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    PinnedBlock* b = take_free(size);
    if (b != nullptr) {
      ++stats_.num_cache_hits;
    } else {
      void* p = nullptr;
      cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        release_cached(/*wait=*/true);
        err = cudaHostAlloc(&p, size, cudaHostAllocPortable);
      }
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        ++stats_.num_ooms;
        fail("[pinned_empty] out of pinned host memory allocating {} bytes (allocated {}, reserved {})", nbytes,
             format_bytes(stats_.allocated_bytes), format_bytes(stats_.reserved_bytes));
      }
      TANDEM_CUDA_CHECK(err);
      ++stats_.num_device_mallocs;
      b = new PinnedBlock;
      b->ptr = p;
      b->size = size;
      blocks_[reinterpret_cast<uintptr_t>(p)] = b;
      stats_.reserved_bytes += static_cast<int64_t>(size);
      ++stats_.segments;
    }
    b->allocated = true;
    b->requested = nbytes;
    stats_.allocated_bytes += static_cast<int64_t>(b->size);
    stats_.requested_bytes += static_cast<int64_t>(nbytes);
    ++stats_.active_blocks;
    ++stats_.num_allocs;
    bump_peaks(stats_);
    return b->ptr;
  }

  void free(void* ptr) noexcept {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == blocks_.end() || !it->second->allocated) return;
    PinnedBlock* b = it->second;
    b->allocated = false;
    stats_.allocated_bytes -= static_cast<int64_t>(b->size);
    stats_.requested_bytes -= static_cast<int64_t>(b->requested);
    --stats_.active_blocks;
    ++stats_.cached_blocks;
    free_.emplace(b->size, b);
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    return find(ptr) != nullptr;
  }

  void record_use(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    PinnedBlock* b = find(ptr);
    if (b == nullptr) return;
    int device = stream_device(stream);
    cudaEvent_t e = events_.get(device);
    b->events.emplace_back(e, device);
    TANDEM_CUDA_CHECK(cudaEventRecord(e, stream));
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached(/*wait=*/true);
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  PinnedBlock* find(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return nullptr;
    --it;
    PinnedBlock* b = it->second;
    return p < it->first + b->size ? b : nullptr;
  }

  // Drops the block's completed events; true when none is left.
  bool idle(PinnedBlock* b, bool wait) {
    size_t keep = 0;
    for (auto& [e, device] : b->events) {
      bool done = wait ? (TANDEM_CUDA_CHECK(cudaEventSynchronize(e)), true) : event_done(e);
      if (done)
        events_.put(device, e);
      else
        b->events[keep++] = {e, device};
    }
    b->events.resize(keep);
    return keep == 0;
  }

  PinnedBlock* take_free(size_t size) {
    for (auto it = free_.lower_bound(size); it != free_.end() && it->first <= reuse_limit(size); ++it) {
      PinnedBlock* b = it->second;
      if (!idle(b, false)) continue;
      free_.erase(it);
      --stats_.cached_blocks;
      return b;
    }
    return nullptr;
  }

  void release_cached(bool wait) {
    for (auto it = free_.begin(); it != free_.end();) {
      PinnedBlock* b = it->second;
      if (!idle(b, wait)) {
        ++it;
        continue;
      }
      TANDEM_CUDA_CHECK(cudaFreeHost(b->ptr));
      blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));
      stats_.reserved_bytes -= static_cast<int64_t>(b->size);
      --stats_.segments;
      --stats_.cached_blocks;
      ++stats_.num_device_frees;
      delete b;
      it = free_.erase(it);
    }
  }

  std::mutex mu_;
  std::map<uintptr_t, PinnedBlock*> blocks_;  // every block held, by address
  std::multimap<size_t, PinnedBlock*> free_;
  MemoryStats stats_;
  EventPool events_;
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator* a = new PinnedAllocator;  // leaked: see the top of the file
  return *a;
}

void check_device_index(int device, const char* op) { require_device(Device::cuda(device), op); }

}  // namespace

size_t round_size(size_t nbytes) {
  if (nbytes <= kSmallMax) return std::max(kSmallRound, (nbytes + kSmallRound - 1) / kSmallRound * kSmallRound);
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* device_allocate(size_t nbytes, int device, cudaStream_t stream) {
  return device_allocator().allocate(nbytes, device, stream);
}

void device_free(void* ptr) noexcept { device_allocator().free(ptr); }

void record_stream(const Tensor& t, cudaStream_t stream) {
  TANDEM_CHECK(t.defined(), "[record_stream] undefined tensor");
  TANDEM_CHECK(t.is_cuda(), "[record_stream] tensor is on {}, not on a CUDA device", t.device());
  void* ptr = t.storage()->data();
  if (ptr == nullptr) return;
  int device = t.device().index;
  int sd = stream_device(stream);
  TANDEM_CHECK(sd == device, "[record_stream] stream is on cuda:{}, tensor on cuda:{}", sd, device);
  device_allocator().record_stream(ptr, device, stream);
}

void empty_cache() {
  if (!is_available()) return;
  device_allocator().empty_cache();
  pinned_allocator().empty_cache();
}

MemoryStats memory_stats(int device) {
  check_device_index(device, "memory_stats");
  return device_allocator().stats(device);
}

void reset_peak_memory_stats(int device) {
  check_device_index(device, "reset_peak_memory_stats");
  device_allocator().reset_peaks(device);
}

// ---------------------------------------------------------------- pinned

Tensor pinned_empty(const Shape& shape, Dtype dtype) {
  TANDEM_CHECK(is_available(), "[pinned_empty] no CUDA device: {}", unavailable_reason());
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "[pinned_empty] negative dimension in shape {}", shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->numel = numel_of(shape);
  impl->dtype = dtype;
  int64_t nbytes = checked_mul(impl->numel, static_cast<int64_t>(itemsize(dtype)), "pinned_empty");
  void* p = pinned_allocator().allocate(static_cast<size_t>(nbytes));
  impl->storage = std::make_shared<Storage>(p, static_cast<size_t>(nbytes), kCPU,
                                            [](void* q) { pinned_allocator().free(q); });
  return Tensor(std::move(impl));
}

bool is_pinned(const Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !is_available()) return false;
  const void* p = t.storage()->data();
  if (p == nullptr) return false;
  if (pinned_allocator().contains(p)) return true;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

MemoryStats pinned_memory_stats() { return pinned_allocator().stats(); }

void record_pinned_use(const void* ptr, cudaStream_t stream) { pinned_allocator().record_use(ptr, stream); }

// ---------------------------------------------------------------- copies

void copy_async(const Tensor& dst, const Tensor& src) {
  TANDEM_CHECK(dst.defined() && src.defined(), "[copy_async] undefined tensor");
  TANDEM_CHECK(dst.dtype() == src.dtype(), "[copy_async] dtypes differ: dst is {}, src is {}", dst.dtype(),
               src.dtype());
  TANDEM_CHECK(dst.shape() == src.shape(), "[copy_async] shapes differ: dst is {}, src is {}", dst.shape(),
               src.shape());
  TANDEM_CHECK(dst.is_contiguous() && src.is_contiguous(),
               "[copy_async] both tensors must be contiguous (dst {} strides {}, src {} strides {})", dst.shape(),
               dst.strides(), src.shape(), src.strides());
  TANDEM_CHECK(dst.is_cuda() || src.is_cuda(), "[copy_async] neither tensor is on CUDA (dst on {}, src on {})",
               dst.device(), src.device());
  if (dst.is_cuda()) require_device(dst.device(), "copy_async");
  if (src.is_cuda()) require_device(src.device(), "copy_async");
  const size_t n = dst.nbytes();
  if (n == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    cudaStream_t s = current_stream(dst.device());
    record_stream(dst, s);
    if (dst.device() == src.device()) record_stream(src, s);
    copy_device_to_device(dst.data_ptr(), dst.device().index, src.data_ptr(), src.device().index, n);
    return;
  }
  const Tensor& dev = dst.is_cuda() ? dst : src;
  const Tensor& host = dst.is_cuda() ? src : dst;
  const int d = dev.device().index;
  DeviceGuard guard(d);
  cudaStream_t s = current_stream(d);
  record_stream(dev, s);
  const bool pinned = is_pinned(host);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), n,
                                    dst.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
  if (pinned) {
    record_pinned_use(host.data_ptr(), s);
  } else {
    // Pageable host memory: the copy is only safe once it has completed.
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

Tensor to_async(const Tensor& src, Device device) {
  TANDEM_CHECK(src.defined(), "[to_async] undefined tensor");
  if (src.device() == device) return src;
  if (device.is_cuda() && src.is_cuda()) return detail::to_device(src, device);  // device to device is async already
  if (device.is_cuda()) {
    require_device(device, "to_async");
    Tensor host = src.is_contiguous() ? src : detail::contiguous_copy(src, "to_async");
    if (!is_pinned(host)) {
      // Staged through pinned memory: the staging block is not reused before the copy is done.
      Tensor staging = pinned_empty(host.shape(), host.dtype());
      if (host.nbytes() > 0) std::memcpy(staging.data_ptr(), host.data_ptr(), host.nbytes());
      host = staging;
    }
    Tensor out = make_empty(src.shape(), src.dtype(), device, "to_async");
    copy_async(out, host);
    return out;
  }
  TANDEM_CHECK(device.is_cpu(), "[to_async] unsupported device {}", device);
  Tensor dev = src.is_contiguous() ? src : detail::contiguous_copy(src, "to_async");
  Tensor out = pinned_empty(src.shape(), src.dtype());
  copy_async(out, dev);
  return out;
}

}  // namespace tandem::cuda
