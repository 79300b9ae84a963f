// Deferred device errors: a kernel that meets a bad index records it on the device instead of the
// op syncing the host to check, and the host raises it as a tandem::Error at the next point that
// synchronises anyway (a copy to or from the host, Stream/Event::synchronize, cuda::synchronize),
// saying that it was detected there, after the op had returned.
//
// Per device: a word in device memory that decides which error wins, and a record in mapped
// pinned host memory that the winning thread writes, so reading it at a sync point is a plain
// host memory read (no copy, no extra sync). Between two reports only the first op to fail is
// kept, as the CPU would have thrown at it (later failing ops are dropped, and so are ops launched
// before a report that fail after it); within that op the bad index at the lowest logical
// position wins, so the message names the same index as the CPU's. A reported error is cleared:
// launches from then on carry a new epoch that beats it. Kernels skip a bad element after
// recording it (nothing read or written outside a tensor): the device stays usable.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/detail/index.h"
#include "core/macros.h"

namespace tandem::cuda {

// An error's message parts, copied into kernel arguments (detail::IndexCheck without the heap).
struct ErrorSite {
  static constexpr int kMaxDims = 16;  // geom::kMaxDims: no kernel indexes more
  static constexpr int kOpChars = 32;
  char op[kOpChars] = {};
  int32_t kind = 0;  // detail::IndexCheck::Kind
  int32_t nd = 0;
  int64_t dim = 0, size = 0, ignore_index = 0;
  int64_t shape[kMaxDims] = {};
};

// Device memory (one per device): `key` orders the errors (see error_key), `written` is the key
// whose payload the record holds, `lock` serialises the writers of the record.
struct ErrorState {
  unsigned long long key;
  unsigned long long written;
  int lock;
};

// Mapped pinned host memory (one per device), written by kernels only. `version` is a seqlock:
// odd while a kernel writes, so the host never reads a torn record.
struct ErrorRecord {
  uint32_t version;
  uint32_t pad;
  unsigned long long key;
  ErrorSite site;
  int64_t value;
  int64_t position;
};

// A kernel argument: where a launch reports and what. `state` is null when it does not check.
struct ErrorSink {
  ErrorState* state = nullptr;
  ErrorRecord* record = nullptr;  // the device's view of the mapped record
  uint32_t epoch = 0;             // low 16 bits, never 0
  uint32_t ticket = 0;            // low 16 bits: which launch
  ErrorSite site;
};

// The sink of a launch on `device` for `check` (null: a sink that records nothing). The first
// call for a device sets up its state and record (no host sync).
ErrorSink error_sink(int device, const detail::IndexCheck* check);

// After a call that blocked the host on `device` (the caller has synchronised): counts it (see
// host_sync_count in cuda/runtime.h), then throws the error a kernel recorded on that device since
// the last report, if any; `where` names the sync point in the message ("a copy to the host").
void synchronized(int device, const char* where);
// Counts a host sync that must not throw (destructors).
void note_host_sync() noexcept;
// Throws the recorded error of `device`, if any, without counting a sync.
void raise_device_error(int device, const char* where);

// Key: epoch (16 bits) | ticket (16) | position (32, saturated). Nonzero (the epoch is never 0).
TANDEM_HOST_DEVICE inline unsigned long long error_key(uint32_t epoch, uint32_t ticket, int64_t position) {
  const unsigned long long pos =
      position < 0 ? 0ull : (position >= 0xffffffffll ? 0xffffffffull : static_cast<unsigned long long>(position));
  return (static_cast<unsigned long long>(epoch & 0xffffu) << 48) |
         (static_cast<unsigned long long>(ticket & 0xffffu) << 32) | pos;
}

// Whether error `mine` replaces `current`: a newer epoch always (a reported error is cleared); in
// the same epoch only an error of the same launch at a lower position (the first launch wins).
TANDEM_HOST_DEVICE inline bool error_beats(unsigned long long mine, unsigned long long current) {
  if (current == 0) return true;
  const uint32_t em = static_cast<uint32_t>(mine >> 48), ec = static_cast<uint32_t>(current >> 48);
  if (em != ec) return static_cast<int16_t>(static_cast<uint16_t>(em - ec)) > 0;
  if (((mine >> 32) & 0xffffu) != ((current >> 32) & 0xffffu)) return false;
  return (mine & 0xffffffffull) < (current & 0xffffffffull);
}

#if defined(__CUDACC__)
// Records the bad `value` at logical `position` of a launch's index tensor. Cheap when it does not
// win: one atomic read. Rare (only bad indices), so the winners may take a lock to write the record.
__device__ inline void report_error(const ErrorSink& sink, int64_t value, int64_t position) {
  if (sink.state == nullptr) return;
  const unsigned long long mine = error_key(sink.epoch, sink.ticket, position);
  unsigned long long cur = atomicAdd(&sink.state->key, 0ull);
  for (;;) {
    if (!error_beats(mine, cur)) return;
    const unsigned long long old = atomicCAS(&sink.state->key, cur, mine);
    if (old == cur) break;
    cur = old;
  }
  // Several threads may have lowered the key in turn: under the lock, the best one's payload stays.
  while (atomicCAS(&sink.state->lock, 0, 1) != 0) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(64);
#endif
  }
  __threadfence();
  volatile unsigned long long* written = &sink.state->written;
  if (error_beats(mine, *written)) {
    *written = mine;
    ErrorRecord* r = sink.record;
    volatile uint32_t* version = &r->version;
    const uint32_t v = *version;
    *version = v + 1;  // odd: being written
    __threadfence_system();
    r->key = mine;
    r->site = sink.site;
    r->value = value;
    r->position = position;
    __threadfence_system();
    *version = v + 2;
    __threadfence_system();
  }
  __threadfence();
  atomicExch(&sink.state->lock, 0);
}
#endif

}  // namespace tandem::cuda
