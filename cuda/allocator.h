// Device and pinned-host memory for the CUDA backend.
//
// Device memory: a stream-aware caching allocator, like PyTorch's. Requests are rounded (to
// 512 B up to 1 MiB, to 2 MiB above) and served from blocks cached per (device, stream): a
// freed block is reused only by allocations on the stream it was allocated on, so stream order
// alone makes reuse safe. A tensor used on another stream must be recorded there with
// record_stream; its block then returns to the cache only once an event recorded on that stream
// at free time has completed. A cudaMalloc that runs out of memory frees the cache and retries
// once, then throws "[alloc] CUDA out of memory allocating N bytes on cuda:0 (...)".
//
// Pinned host memory (cudaHostAlloc), cached the same way: a block handed to an async copy is
// reused only after an event recorded at that copy has completed, so freeing a staging tensor
// right after queueing its copy is safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/tensor.h"

namespace tandem::cuda {

struct MemoryStats {
  int64_t allocated_bytes = 0;       // in blocks handed out (their rounded sizes)
  int64_t requested_bytes = 0;       // asked for by the live allocations (before rounding)
  int64_t reserved_bytes = 0;        // held from cudaMalloc: allocated plus cached
  int64_t peak_allocated_bytes = 0;  // since start or reset_peak_memory_stats
  int64_t peak_reserved_bytes = 0;
  int64_t active_blocks = 0;         // live allocations
  int64_t cached_blocks = 0;         // free blocks held, including those waiting on events
  int64_t segments = 0;              // cudaMalloc'd blocks held
  int64_t num_allocs = 0;            // allocation requests served (non-empty ones)
  int64_t num_cache_hits = 0;        // ... of which came from the cache
  int64_t num_device_mallocs = 0;    // cudaMalloc (cudaHostAlloc) calls that succeeded
  int64_t num_device_frees = 0;      // cudaFree (cudaFreeHost) calls
  int64_t num_ooms = 0;              // out-of-memory errors thrown
};

// The size a request of `nbytes` occupies in the cache: a multiple of 512 B up to 1 MiB, of 2 MiB above.
size_t round_size(size_t nbytes);

// Raw device memory, ordered on `stream` (the current stream of `device` for tensors). A
// zero-byte request returns nullptr. device_free is a no-op on nullptr and unknown pointers.
void* device_allocate(size_t nbytes, int device, cudaStream_t stream);
void device_free(void* ptr) noexcept;

// Marks the memory of `t` as used on `stream`: when it is freed, its block is reused only after
// the work queued on `stream` by then has completed. A no-op for the block's own stream.
void record_stream(const Tensor& t, cudaStream_t stream);
// Returns every cached, unused block (device and pinned) to CUDA. Blocks still waiting on an
// event are waited for first. Allocations in use are untouched.
void empty_cache();
MemoryStats memory_stats(int device);
void reset_peak_memory_stats(int device);

// ---------------------------------------------------------------- pinned host memory

// A CPU tensor in pinned (page-locked) memory from the pinned cache; copies from and to it with
// copy_async stay asynchronous. Throws "[pinned_empty] no CUDA device: ..." without a GPU.
Tensor pinned_empty(const Shape& shape, Dtype dtype);
// True when t's memory is page-locked: from pinned_empty, or host memory CUDA allocated or registered.
bool is_pinned(const Tensor& t);
MemoryStats pinned_memory_stats();
// Marks pinned host memory at `ptr` (anywhere inside a pinned_empty block) as used by work just
// queued on `stream`: its block is not reused before that work completes. No-op for other memory.
void record_pinned_use(const void* ptr, cudaStream_t stream);

// ---------------------------------------------------------------- copies

// dst <- src for tensors of one dtype and shape, contiguous, at least one of them on CUDA, queued
// on the current stream of the CUDA side (of dst for a device-to-device copy). With pinned host
// memory (or device-to-device) it returns at once: synchronise that stream, or an event recorded
// after it, before reading a host result. With pageable host memory it completes before returning.
// A CUDA tensor used on a stream other than its allocation stream is recorded there (record_stream).
void copy_async(const Tensor& dst, const Tensor& src);
// The non-blocking form of src.to(device). CPU to CUDA: returns at once (a pageable source is
// first staged into pinned memory, so the caller may reuse it on return). CUDA to CPU: the result
// is pinned and valid once the current stream of src's device has been synchronised.
Tensor to_async(const Tensor& src, Device device);

}  // namespace tandem::cuda
