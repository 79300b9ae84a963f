#include "data/sampler.h"

#include <numeric>
#include <random>

#include "core/error.h"

namespace tandem::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, SamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  TANDEM_CHECK(dataset_size >= 0, "[DistributedSampler] dataset size must be >= 0, got {}", dataset_size);
  TANDEM_CHECK(num_replicas >= 1, "[DistributedSampler] num_replicas must be >= 1, got {}", num_replicas);
  TANDEM_CHECK(rank >= 0 && rank < num_replicas, "[DistributedSampler] rank {} is outside [0, {})", rank, num_replicas);
  if (options_.drop_last && dataset_size % num_replicas != 0) {
    num_samples_ = (dataset_size - num_replicas + num_replicas - 1) / num_replicas;  // ceil((n - r) / r)
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (dataset_size + num_replicas - 1) / num_replicas;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all(static_cast<size_t>(dataset_size_));
  std::iota(all.begin(), all.end(), int64_t{0});
  if (options_.shuffle && dataset_size_ > 1) {
    // Fisher-Yates over mt19937_64 with our own bounded draw: the same permutation on every
    // platform and standard library (std::shuffle's algorithm is unspecified).
    std::mt19937_64 gen(options_.seed + static_cast<uint64_t>(epoch_));
    for (size_t i = all.size() - 1; i > 0; --i) {
      const uint64_t bound = i + 1;
      const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
      uint64_t x;
      do x = gen();
      while (x >= limit);
      std::swap(all[i], all[static_cast<size_t>(x % bound)]);
    }
  }
  const size_t total = static_cast<size_t>(total_size());
  if (all.size() < total && !all.empty()) {
    const size_t original = all.size();
    while (all.size() < total) all.push_back(all[(all.size() - original) % original]);
  }
  all.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_)) mine.push_back(all[i]);
  return mine;
}

}  // namespace tandem::data
