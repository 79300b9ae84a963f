// GradBuckets: the flat gradient buffers DDP reduces, shared by the bucket Reducer and the
// delayed allreduce. Each bucket is one buffer of one dtype and device; each parameter owns a slot
// in exactly one of them (a view the shape of the parameter), and a bucket's reduction in flight is
// its Work. What goes into a slot, when a bucket is launched and how the result is written back
// differ between the two users, and stay with them; the layout, the views, moving a `.grad` into
// its slot and waiting for what is in flight are this one engine's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"

namespace tandem::dist {

// Splits `order` (parameter indices, in the order their gradients are expected to be ready) into
// buckets of one dtype and device each. A bucket closes as soon as its size reaches its cap (so it
// may exceed the cap by one tensor); the first bucket of each dtype/device uses `first_cap_bytes`.
// Buckets are returned in the order they will be ready: by the position of their first parameter.
// Caps of SIZE_MAX give one bucket per dtype and device.
std::vector<std::vector<size_t>> assign_buckets(const TensorList& params, const std::vector<size_t>& order,
                                                size_t first_cap_bytes, size_t cap_bytes);

class GradBuckets {
 public:
  struct Bucket {
    Tensor buffer;                 // flat
    std::vector<size_t> params;    // parameter indices, in slot order
    std::vector<int64_t> offsets;  // element offsets in buffer
    std::vector<int64_t> lengths;
    size_t pending = 0;            // slots not filled yet this iteration (reset_pending)
    WorkPtr work;                  // its reduction, while one is in flight
  };

  GradBuckets() = default;
  // One zeroed buffer per entry of `layout` (lists of indices into `params`, each of one dtype and
  // device); floating buckets are in `reduce_dtype` when one is given (mixed precision).
  GradBuckets(TensorList params, const std::vector<std::vector<size_t>>& layout, std::optional<Dtype> reduce_dtype);

  size_t size() const { return buckets_.size(); }
  Bucket& operator[](size_t bucket) { return buckets_[bucket]; }
  const Bucket& operator[](size_t bucket) const { return buckets_[bucket]; }
  std::vector<Bucket>::iterator begin() { return buckets_.begin(); }
  std::vector<Bucket>::iterator end() { return buckets_.end(); }
  std::vector<Bucket>::const_iterator begin() const { return buckets_.begin(); }
  std::vector<Bucket>::const_iterator end() const { return buckets_.end(); }

  const std::vector<std::vector<size_t>>& layout() const { return layout_; }
  size_t bucket_of(size_t param) const { return slots_[param].bucket; }
  // Parameter `param`'s slot: a view of its bucket's buffer in the parameter's shape.
  Tensor slot_view(size_t param) const;
  // `grad` is exactly `param`'s slot (the same memory, shape, dtype and device).
  bool is_slot(size_t param, const Tensor& grad) const;
  // A defined `.grad` that is not the slot is copied into it, and `.grad` becomes the slot (an
  // undefined one stays undefined until its gradient arrives).
  void move_grad_into_slot(size_t param);
  // Every bucket expects all its slots again.
  void reset_pending();
  // One slot of `param`'s bucket is filled; true when it was the bucket's last.
  bool fill(size_t param) { return --buckets_[slots_[param].bucket].pending == 0; }
  // Waits for every reduction still in flight (each writes into its buffer, which nothing may
  // reuse before it is done) and drops it; a failure is reported where the Work is waited for
  // properly, or is moot by now.
  void wait_outstanding() noexcept;

 private:
  struct Slot {
    size_t bucket = 0;
    size_t index = 0;  // position within the bucket
  };

  TensorList params_;
  std::vector<std::vector<size_t>> layout_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
};

}  // namespace tandem::dist
