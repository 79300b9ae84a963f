// DistributedSampler: which dataset indices each rank reads, as torch.utils.data's
// DistributedSampler (part of the data layer, as in PyTorch: it needs nothing from dist; the
// caller passes the world size and rank). Every epoch the indices are shuffled with seed + epoch (identically on every
// rank), padded by repeating the first indices so every rank gets the same count (or, with
// drop_last, trimmed to a multiple of the world size), and dealt out round robin: rank r gets
// positions r, r + world, r + 2 world, ...
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::data {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options = {});

  // Reshuffles for `epoch` (call before each epoch, as in PyTorch; without it every epoch repeats).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // This rank's indices for the current epoch: num_samples() of them.
  std::vector<int64_t> indices() const;
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace tandem::data
