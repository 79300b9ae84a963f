// DataLoader: batches of a Dataset, this process's shard of each epoch in the order of
// DistributedSampler (seeded shuffle per epoch, the same on every rank; padded or trimmed to
// equal shards as in PyTorch), prepared ahead on a background thread.
//
//   data::DataLoader loader(data::FashionMNIST(data::Split::train),
//                           {.batch_size = 64, .num_replicas = pg->size(), .rank = pg->rank()});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (const TensorList& batch : loader) train_step(batch[0], batch[1]);
//   }
#pragma once

#include <concepts>
#include <cstdint>
#include <iterator>
#include <memory>

#include "data/dataset.h"
#include "data/sampler.h"

namespace tandem::data {

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  // Drop this rank's last batch when it is short (DataLoader's drop_last).
  bool drop_last = false;
  // Batches prepared ahead on a background thread (the queue's bound). 0: each batch is made on
  // the calling thread when it is asked for, and no thread is started. The thread hides a batch's
  // cost when the step leaves a core free (a GPU step; see tools/bench_data); when every core is
  // busy and the thread has not even started the batch asked for, the calling thread makes it
  // itself rather than wait for the thread to be scheduled.
  int prefetch = 2;
  // This process's shard (DistributedSampler's num_replicas and rank); 1 and 0 read everything.
  int num_replicas = 1;
  int rank = 0;
  // DistributedSampler's drop_last: trim the epoch to a multiple of num_replicas instead of
  // padding the shards with repeated examples.
  bool shard_drop_last = false;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options = {});
  template <std::derived_from<Dataset> D>
  DataLoader(D dataset, LoaderOptions options = {})  // NOLINT: a data set by value is copied in once
      : DataLoader(std::make_shared<const D>(std::move(dataset)), options) {}
  // Stops the prefetch thread (it finishes the batch it is making) and joins it.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The epoch the next begin() reads (the shuffle's seed is seed + epoch); as in PyTorch, without
  // a call every epoch repeats the same order.
  void set_epoch(int64_t epoch) { sampler_.set_epoch(epoch); }
  int64_t epoch() const { return sampler_.epoch(); }
  // Per epoch, on this rank.
  int64_t num_samples() const { return sampler_.num_samples(); }
  int64_t num_batches() const;
  const Dataset& dataset() const { return *dataset_; }
  const LoaderOptions& options() const { return options_; }

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = TensorList;
    using difference_type = std::ptrdiff_t;
    using pointer = const TensorList*;
    using reference = const TensorList&;
    const TensorList& operator*() const { return batch_; }
    const TensorList* operator->() const { return &batch_; }
    // Takes the next batch; an exception the data set threw making it is rethrown here.
    Iterator& operator++();
    bool operator==(std::default_sentinel_t) const { return done_; }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader);
    DataLoader* loader_;
    TensorList batch_;
    bool done_ = false;
  };

  // Starts an epoch (stopping one still running) and takes its first batch. One pass at a time:
  // a second begin() ends the first pass's epoch.
  Iterator begin() { return begin_at(0); }
  // The same from batch `first` of the epoch (in [0, num_batches()]): a run resumed mid-epoch
  // goes on with the batches it had not trained on, without making the ones before.
  Iterator begin_at(int64_t first);
  std::default_sentinel_t end() const { return {}; }

 private:
  struct Epoch;
  bool next(TensorList& batch);

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  DistributedSampler sampler_;
  std::unique_ptr<Epoch> running_;
};

}  // namespace tandem::data
