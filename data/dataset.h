// Data sets: what a DataLoader draws batches from.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace tandem::data {

// A data set of size() examples, read a batch at a time. get_batch returns one tensor per field
// (e.g. {images, labels}), each with indices.size() rows, row k holding example indices[k].
// A DataLoader calls it on its prefetch thread while the training thread works on earlier
// batches: it must not change state the caller shares, and it runs with grad mode off.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual TensorList get_batch(std::span<const int64_t> indices) const = 0;
};

// Examples are rows: example i is row i (along dim 0) of each tensor, as torch.utils.data's
// TensorDataset. The tensors live on the CPU, share their size(0), and are kept contiguous (a
// non-contiguous one is copied once here) and detached. They are not copied otherwise: writing
// into them while a loader reads them is a data race.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(TensorList tensors);
  int64_t size() const override { return size_; }
  // Fresh tensors (the rows copied out), so a batch never aliases the data set.
  TensorList get_batch(std::span<const int64_t> indices) const override;
  const TensorList& tensors() const { return tensors_; }

 private:
  TensorList tensors_;
  int64_t size_ = 0;
};

}  // namespace tandem::data
