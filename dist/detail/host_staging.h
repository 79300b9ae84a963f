// Device tensors through host memory, for the backends whose transport moves host memory only
// (mpi, threads): the caller's device work is waited for when it issues the operation, and the
// thread that runs it works on host copies. The nccl backend orders streams with events instead.
// Internal to dist (not installed).
#pragma once

#include <utility>
#include <vector>

#include "dist/detail/queued_group.h"

namespace tandem::dist {

// On the issuing thread: everything the caller queued on op's device tensors has finished, so
// another thread (whose current stream is not the caller's) may copy them. Blocks the caller.
void sync_device_tensors(const Op& op);

// On the thread that runs op: replaces op's device tensors with host copies of them (pinned where
// the device backend has it). finish() copies the host tensors back into the device tensors and
// puts those back into op, so the op's result is them; after a failure nothing is copied back.
class HostStaging {
 public:
  explicit HostStaging(Op& op);
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  void finish();

 private:
  std::vector<std::pair<Tensor*, Tensor>> staged_;  // (op's slot, now the host copy; the device tensor)
};

}  // namespace tandem::dist
