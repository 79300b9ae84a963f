// The seam between core and device backends.
//
// core calls a Backend for memory and for the kernels of non-CPU devices; the CPU backend is
// built in. The CUDA backend is a library of its own, libtandem_cuda (cuda/ and the nccl process
// group, linked to CUDA, cuBLAS and NCCL), as PyTorch keeps libtorch_cuda beside libtorch_cpu:
// core loads it the first time a CUDA device is asked for, and it registers its Backend and kernel
// tables then. A program that never makes a CUDA tensor never loads CUDA. A build without CUDA
// throws "[op] tandem was built without CUDA" the moment a CUDA tensor would be created, so no
// CUDA tensor can exist there.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/device.h"

namespace tandem {

class Tensor;

// A second queue of device work beside the calling thread's current stream, so that work queued
// on it overlaps what the current stream runs (DDP's mixed precision casts the parameters on one
// while forward computes). Work is queued in batches, each closed by a marker the current stream
// can wait for on the device, without blocking the host.
class SideStream {
 public:
  virtual ~SideStream() = default;
  // Orders what follows on the side stream after everything the calling thread's current stream
  // has queued so far (the optimizer's last update of what the batches read).
  virtual void follow_current() = 0;
  // Runs fn with the side stream current, so the device work fn queues goes there, then closes
  // the batch: the returned marker is reached once that work has run.
  virtual size_t run(const std::function<void()>& fn) = 0;
  // The calling thread's current stream waits, on the device, until `marker` is reached.
  virtual void make_current_wait(size_t marker) = 0;
  // Forgets the markers (their numbers restart at 0); the next batch follows the last one.
  virtual void reset_markers() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) noexcept = 0;
  // Copies nbytes between two raw buffers, either of which may live on this backend's device.
  virtual void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) = 0;
  // Throws "[op] no CUDA device: ..." when `device` cannot be used (no such device, no driver),
  // so the error names the op that wanted it. Every CPU is usable.
  virtual void require_device(Device device, const char* op) {}
  // Blocks until the work this thread queued on `device` (its current stream) has finished, so
  // another thread may read what it produced (the mpi backend stages device tensors on its
  // communication thread). Nothing to wait for on the CPU.
  virtual void synchronize(Device device) {}
  // A host tensor shaped like `like` (a tensor on this backend's device) to stage it through, as
  // the mpi backend does: pinned memory where the device has it, so the copies are DMA.
  virtual Tensor host_staging(const Tensor& like);
  // A side stream on `device`, or nullptr where work runs in issue order anyway (the CPU, whose
  // kernels run synchronously on the calling thread): callers then run the work inline.
  virtual std::unique_ptr<SideStream> make_side_stream(Device device) { return nullptr; }
};

// The backend for `device`; `op` names the caller in the error when there is none. Asking for a
// CUDA device loads libtandem_cuda once (see below).
Backend& backend_for(Device device, const char* op);
// Whether `type` has a backend (loading libtandem_cuda for CUDA); never throws.
bool has_backend(DeviceType type);
// Why `type` has no backend ("" when it has one): built without it, or the library that holds it
// could not be loaded (the loader's words).
std::string backend_unavailable_reason(DeviceType type);
void register_backend(DeviceType type, Backend* backend);

// The CUDA backend library's entry point is `extern "C" void tandem_cuda_backend_install()`: C
// linkage, so that core can find it by name in a library it loads at run time (dlsym) without
// linking to it. It registers the CUDA Backend, every kernel table and the "nccl" dist backend.
// Core calls it once, at the first CUDA device asked for, from one of three places, in this order:
// the program itself (it linked Tandem::cuda, as a program that calls cuda:: functions does: core's
// weak reference then resolves to it), the file named by TANDEM_CUDA_LIBRARY, or libtandem_cuda
// next to libtandem in the same folder (the build tree and the install tree alike). It is declared
// only where it is defined and where core refers to it weakly, so no header makes it strong.

}  // namespace tandem
