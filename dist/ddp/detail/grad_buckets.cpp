#include "dist/ddp/detail/grad_buckets.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace tandem::dist {

std::vector<std::vector<size_t>> assign_buckets(const TensorList& params, const std::vector<size_t>& order,
                                                size_t first_cap_bytes, size_t cap_bytes) {
  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  struct Open {
    std::vector<size_t> params;
    size_t bytes = 0;
    size_t closed = 0;  // buckets of this key already closed
  };
  std::map<Key, Open> open;
  std::vector<std::vector<size_t>> done;
  for (size_t p : order) {
    TANDEM_CHECK(p < params.size(), "[ddp] bucket order names parameter {} of {}", p, params.size());
    const Tensor& t = params[p];
    Key key{static_cast<int>(t.dtype()), static_cast<int>(t.device().type), t.device().index};
    Open& b = open[key];
    b.params.push_back(p);
    b.bytes += t.nbytes();
    size_t cap = b.closed == 0 ? first_cap_bytes : cap_bytes;
    if (b.bytes >= cap) {
      done.push_back(std::move(b.params));
      b.params.clear();
      b.bytes = 0;
      ++b.closed;
    }
  }
  for (auto& [key, b] : open)
    if (!b.params.empty()) done.push_back(std::move(b.params));
  // Ready order: by where each bucket's first parameter sits in `order`.
  std::vector<size_t> position(params.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  std::stable_sort(done.begin(), done.end(), [&](const auto& a, const auto& b) {
    return position[a.front()] < position[b.front()];
  });
  return done;
}

GradBuckets::GradBuckets(TensorList params, const std::vector<std::vector<size_t>>& layout,
                         std::optional<Dtype> reduce_dtype)
    : params_(std::move(params)), layout_(layout), slots_(params_.size()) {
  NoGradGuard no_grad;
  buckets_.reserve(layout.size());
  for (size_t b = 0; b < layout.size(); ++b) {
    TANDEM_CHECK(!layout[b].empty(), "[ddp] bucket {} of the layout holds no parameter", b);
    Bucket bucket;
    int64_t total = 0;
    for (size_t p : layout[b]) {
      TANDEM_CHECK(p < params_.size(), "[ddp] bucket {} names parameter {} of {}", b, p, params_.size());
      slots_[p] = Slot{b, bucket.params.size()};
      bucket.params.push_back(p);
      bucket.offsets.push_back(total);
      bucket.lengths.push_back(params_[p].numel());
      total += params_[p].numel();
    }
    const Tensor& first = params_[layout[b].front()];
    const Dtype dtype = reduce_dtype && is_floating(first.dtype()) ? *reduce_dtype : first.dtype();
    bucket.buffer = zeros({total}, TensorOptions(dtype, first.device()));
    bucket.pending = bucket.params.size();
    buckets_.push_back(std::move(bucket));
  }
}

Tensor GradBuckets::slot_view(size_t param) const {
  const Slot& s = slots_[param];
  const Bucket& b = buckets_[s.bucket];
  return b.buffer.narrow(0, b.offsets[s.index], b.lengths[s.index]).view(params_[param].shape());
}

bool GradBuckets::is_slot(size_t param, const Tensor& grad) const {
  if (!grad.defined()) return false;
  const Tensor slot = slot_view(param);
  return grad.data_ptr() == slot.data_ptr() && grad.shape() == slot.shape() && grad.dtype() == slot.dtype() &&
         grad.device() == slot.device();
}

void GradBuckets::move_grad_into_slot(size_t param) {
  NoGradGuard no_grad;
  const Tensor& p = params_[param];
  Tensor g = p.grad();
  if (!g.defined() || is_slot(param, g)) return;
  Tensor slot = slot_view(param);
  slot.copy_(g);
  p.set_grad(slot);
}

void GradBuckets::reset_pending() {
  for (Bucket& b : buckets_) b.pending = b.params.size();
}

void GradBuckets::wait_outstanding() noexcept {
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (...) {
    }
    b.work.reset();
  }
}

}  // namespace tandem::dist
