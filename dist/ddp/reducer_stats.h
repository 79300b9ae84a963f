// What DDP's gradient reduction did: the event log of an iteration and its timings and layout
// (DistributedDataParallel::stats() and reducer_events(); the reducer itself is internal,
// dist/ddp/detail/reducer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::dist {

// What the reducer did, in order, in the current (or last) iteration: the overlap test reads it.
struct ReducerEvent {
  enum Kind { backward_started, grad_ready, bucket_launched, bucket_reduced, used_map_reduced, finalized } kind;
  int64_t index = -1;  // parameter index (grad_ready) or bucket index
};

// Per-iteration timings (milliseconds, wall clock) and layout facts, as PyTorch's DDP logging data.
struct ReducerStats {
  int64_t iterations = 0;                       // synchronised backwards finalised
  std::vector<int64_t> bucket_bytes;            // current layout, launch order
  std::vector<std::vector<std::string>> bucket_parameters;  // names per bucket
  std::vector<int64_t> rebuilt_bucket_bytes;    // empty until the one rebuild happened
  std::vector<std::string> grad_ready_order;    // names, last synchronised backward
  std::vector<std::string> unused_parameters;   // last synchronised backward (find_unused only)
  double backward_compute_ms = 0;  // backward start -> last gradient ready
  double comm_ms = 0;              // first bucket launched -> every bucket reduced
  double comm_wait_ms = 0;         // time finalize spent waiting: the communication not hidden
  double overlap_ms = 0;           // comm_ms - comm_wait_ms, clamped at 0
};

}  // namespace tandem::dist
