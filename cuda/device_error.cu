// Deferred device errors (cuda/detail/device_error.h) and the count of host syncs (cuda/runtime.h).
#include "cuda/detail/device_error.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "cuda/detail/check.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

namespace {

constexpr int kMaxDevices = 64;  // as cuda/runtime.cpp

// One per device (a module global exists once per device context): zero at load, so setting a
// device up needs no cudaMalloc or memset, and no sync.
__device__ ErrorState g_error_state = {0ull, 0ull, 0};

struct Slot {
  std::once_flag once;
  std::atomic<bool> ready{false};
  ErrorState* state = nullptr;   // device memory
  ErrorRecord* host = nullptr;   // the mapped record, host view
  ErrorRecord* mapped = nullptr; // the same, device view
  std::atomic<uint32_t> epoch{1};
  std::atomic<uint32_t> ticket{0};
};
Slot slots[kMaxDevices];

std::once_flag records_once;
ErrorRecord* records = nullptr;  // kMaxDevices records, pinned, mapped, portable; never freed

std::atomic<uint64_t> host_syncs{0};

uint32_t next_epoch(uint32_t e) {
  ++e;
  if ((e & 0xffffu) == 0) ++e;  // keys are nonzero: the epoch's 16 bits never are
  return e;
}

Slot& set_up(int device) {
  require_device(Device::cuda(device), "device error record");
  std::call_once(records_once, [] {
    void* p = nullptr;
    TANDEM_CUDA_CHECK(
        cudaHostAlloc(&p, sizeof(ErrorRecord) * kMaxDevices, cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(p, 0, sizeof(ErrorRecord) * kMaxDevices);
    records = static_cast<ErrorRecord*>(p);
  });
  Slot& s = slots[device];
  std::call_once(s.once, [&] {
    DeviceGuard guard(device);
    void* state = nullptr;
    TANDEM_CUDA_CHECK(cudaGetSymbolAddress(&state, g_error_state));
    void* mapped = nullptr;  // the allocation's base as this device sees it (the same address under UVA)
    TANDEM_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, records, 0));
    s.state = static_cast<ErrorState*>(state);
    s.host = records + device;
    s.mapped = static_cast<ErrorRecord*>(mapped) + device;
    s.ready.store(true, std::memory_order_release);
  });
  return s;
}

uint32_t load_version(const ErrorRecord* r) { return *reinterpret_cast<const volatile uint32_t*>(&r->version); }

// A consistent copy of the record (its seqlock), or false when none was ever written or a kernel
// is writing it right now (then the next sync point reports it).
bool read_record(const ErrorRecord* r, ErrorRecord& out) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint32_t v1 = load_version(r);
    if (v1 == 0) return false;
    if (v1 & 1u) continue;
    std::atomic_thread_fence(std::memory_order_acquire);
    std::memcpy(&out, r, sizeof out);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (load_version(r) == v1) return true;
  }
  return false;
}

}  // namespace

ErrorSink error_sink(int device, const detail::IndexCheck* check) {
  ErrorSink sink;
  if (check == nullptr) return sink;
  Slot& s = set_up(device);
  sink.state = s.state;
  sink.record = s.mapped;
  sink.epoch = s.epoch.load(std::memory_order_relaxed);
  sink.ticket = s.ticket.fetch_add(1, std::memory_order_relaxed) + 1;
  ErrorSite& site = sink.site;
  std::strncpy(site.op, check->op, ErrorSite::kOpChars - 1);
  site.kind = static_cast<int32_t>(check->kind);
  site.nd = static_cast<int32_t>(std::min<size_t>(check->input.size(), ErrorSite::kMaxDims));
  for (int d = 0; d < site.nd; ++d) site.shape[d] = check->input[static_cast<size_t>(d)];
  site.dim = check->dim;
  site.size = check->size;
  site.ignore_index = check->ignore_index;
  return sink;
}

void raise_device_error(int device, const char* where) {
  if (device < 0 || device >= kMaxDevices) return;
  Slot& s = slots[device];
  if (!s.ready.load(std::memory_order_acquire)) return;  // no launch on it ever checked
  if (load_version(s.host) == 0) [[likely]] return;      // no error ever recorded
  uint32_t epoch = s.epoch.load(std::memory_order_acquire);
  ErrorRecord r;
  if (!read_record(s.host, r)) return;
  if (static_cast<uint32_t>(r.key >> 48) != (epoch & 0xffffu)) return;  // reported already
  // One thread reports it; launches from now on carry the next epoch, whose errors beat this one.
  if (!s.epoch.compare_exchange_strong(epoch, next_epoch(epoch), std::memory_order_acq_rel)) return;
  detail::IndexCheck check;
  r.site.op[ErrorSite::kOpChars - 1] = '\0';
  check.op = r.site.op;
  check.kind = static_cast<detail::IndexCheck::Kind>(r.site.kind);
  check.dim = r.site.dim;
  check.size = r.site.size;
  check.ignore_index = r.site.ignore_index;
  for (int d = 0; d < r.site.nd && d < ErrorSite::kMaxDims; ++d) check.input.push_back(r.site.shape[d]);
  fail("{}; detected on cuda:{} at the next synchronisation ({}), after the op had returned",
       detail::index_error_message(check, r.value, r.position), device, where);
}

void note_host_sync() noexcept { host_syncs.fetch_add(1, std::memory_order_relaxed); }

void synchronized(int device, const char* where) {
  note_host_sync();
  raise_device_error(device, where);
}

uint64_t host_sync_count() { return host_syncs.load(std::memory_order_relaxed); }

}  // namespace tandem::cuda
