// The flight recorder: what each rank's process groups did last, for the hang that names its
// culprit. Every process group keeps a ring of its last TANDEM_FLIGHT_RECORDER_ENTRIES (default
// 2000) operations: sequence number, op, reduce op, dtype, element count, group, the caller's tag
// (DDP names its buckets), issue/start/end times and how each ended. With
// TANDEM_FLIGHT_RECORDER=<dir>, every rank writes them as JSON to <dir>/tandem_flight_rank<R>.json
// when a collective times out or a group breaks, when a peer that timed out asks it to, on
// SIGUSR1, and at exit; tools/flight/flight_report reads the files of all ranks and says where
// they went apart. As PyTorch's NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE and
// torch.distributed.flight_recorder), for every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::dist {

// Collectives issued on this thread while it lives are recorded with this tag (cut to 47
// bytes): "ddp bucket 3", "loss average". Tags nest; the innermost names the operation.
class CollectiveTag {
 public:
  explicit CollectiveTag(std::string_view name, int64_t index = -1);
  ~CollectiveTag();
  CollectiveTag(const CollectiveTag&) = delete;
  CollectiveTag& operator=(const CollectiveTag&) = delete;

 private:
  char previous_[48];
};
// The calling thread's tag ("" when none).
std::string_view current_collective_tag();

// TANDEM_FLIGHT_RECORDER: the directory the dumps go to ("" when dumps are off).
std::string flight_recorder_dir();
// TANDEM_FLIGHT_RECORDER_ENTRIES: operations each new group keeps (default 2000; 0: none, only the
// positions that timeout errors report).
size_t flight_recorder_capacity();

// This process's recorders (every live group's and the last few destroyed groups') as the JSON
// document the dumps hold; `reason` says why it was taken.
std::string flight_recorder_json(std::string_view reason = "requested");
// Writes flight_recorder_json(reason) to `path`, or with an empty path to
// <flight_recorder_dir()>/tandem_flight_rank<R>.json (R: the MPI world rank, else 0); returns the
// path written. Throws "[flight_recorder] ..." when there is no directory or the write fails.
std::string dump_flight_recorder(std::string_view reason, const std::string& path = "");

}  // namespace tandem::dist
