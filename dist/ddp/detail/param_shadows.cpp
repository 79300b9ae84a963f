#include "dist/ddp/detail/param_shadows.h"

#include "autograd/backward_seam.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/backend.h"

namespace tandem::dist {

namespace {

// Points t's impl, which every handle to it shares, at data's storage, strides and dtype (same
// shape); autograd metadata stays with the impl.
// The parameter switches between copies of the same values (master, shadow): no version bump, so
// what a forward saved from the shadow stays valid for its backward (TensorImpl::rebind).
void point_at(const Tensor& t, const Tensor& data) {
  t.impl()->rebind(*data.impl(), /*bump_version=*/false);
}

SideStreamFactory& side_stream_factory() {
  static SideStreamFactory factory;
  return factory;
}

}  // namespace

void set_side_stream_factory_for_tests(SideStreamFactory factory) { side_stream_factory() = std::move(factory); }

ParamShadows::ParamShadows(TensorList params, Dtype dtype, bool keep_bucket_views)
    : dtype_(dtype), keep_bucket_views_(keep_bucket_views) {
  TANDEM_CHECK(dtype == f16 || dtype == bf16, "[ddp] mixed precision computes in f16 or bf16, not {}", dtype);
  for (Tensor& p : params) {
    TANDEM_CHECK(is_floating(p.dtype()), "[ddp] mixed precision: parameter of shape {} is {}, not floating point",
                 p.shape(), p.dtype());
    Entry e;
    e.master = p.detach();  // its own impl: keeps pointing at the master's storage during the swap
    e.shadow = empty(p.shape(), TensorOptions(dtype, p.device()));
    e.param = std::move(p);
    entries_.push_back(std::move(e));
  }
  for (const Entry& e : entries_) {
    if (!e.param.requires_grad()) continue;
    // The first gradient of a backward that ran on the shadows queues the way back.
    hooks_.push_back(register_post_accumulate_grad_hook(e.param, [this](const Tensor&) {
      if (!adoption_pending_) queue_finish();
    }));
  }
}

ParamShadows::~ParamShadows() { release(); }  // never leave the user's parameters pointing at our shadows

void ParamShadows::release() {
  hooks_.clear();
  finish_queued_ = false;
  if (active_) cast_out();
}

void ParamShadows::queue_finish() {
  adoption_pending_ = false;
  if (!active_ || finish_queued_) return;
  finish_queued_ = true;
  autograd::queue_callback([this] { finish_backward(); });
}


void cast_in_place(const Tensor& t, Dtype dtype) {
  NoGradGuard no_grad;
  point_at(t, t.to(dtype).contiguous());
}

bool ParamShadows::overlap_casts(std::vector<std::vector<size_t>> batches) {
  if (entries_.empty()) return false;
  const Device device = entries_.front().master.device();
  const SideStreamFactory& factory = side_stream_factory();
  std::unique_ptr<SideStream> side = factory ? factory(device) : backend_for(device, "ddp").make_side_stream(device);
  if (!side) return false;
  std::vector<bool> batched(entries_.size());
  for (const auto& batch : batches)
    for (size_t i : batch) {
      TANDEM_CHECK(i < entries_.size() && !batched[i], "[ddp] mixed precision: cast batch entry {} is out of range "
                   "or in two batches ({} parameters)", i, entries_.size());
      batched[i] = true;
    }
  unbatched_.clear();
  for (size_t i = 0; i < entries_.size(); ++i)
    if (!batched[i]) unbatched_.push_back(i);
  batches_ = std::move(batches);
  markers_.assign(batches_.size(), 0);
  side_ = std::move(side);
  return true;
}

void ParamShadows::wait_for_batch(size_t batch) {
  if (!active_ || !side_) return;  // the module runs outside a DDP forward: its parameters are masters
  side_->make_current_wait(markers_.at(batch));
}

void ParamShadows::cast_in() {
  // A way back queued by a backward that then threw never ran (autograd drops a failed
  // backward's callbacks): take it now, so this forward starts from the masters.
  if (active_ && finish_queued_) {
    finish_queued_ = false;
    cast_out();
  }
  // Several forwards before one backward (static_graph) share the shadows: the masters cannot
  // have changed in between, and a refresh would bump the version the first forward saved.
  if (active_) return;
  NoGradGuard no_grad;
  if (side_) {
    // The side stream starts after the last optimizer update the current stream has queued, and
    // after the previous backward's last read of the shadows.
    side_->reset_markers();
    side_->follow_current();
    for (size_t b = 0; b < batches_.size(); ++b)
      markers_[b] = side_->run([this, b] {
        NoGradGuard inner;  // the run may be deferred into a grad-mode forward
        for (size_t i : batches_[b]) entries_[i].shadow.copy_(entries_[i].master);
      });
    for (size_t i : unbatched_) entries_[i].shadow.copy_(entries_[i].master);
  } else {
    for (Entry& e : entries_) e.shadow.copy_(e.master);
  }
  for (Entry& e : entries_) {
    e.stashed = e.param.grad();
    if (e.stashed.defined()) e.param.set_grad(Tensor());
    e.reduced = Tensor();
    point_at(e.param, e.shadow);
  }
  active_ = true;
}

void ParamShadows::cast_out() {
  if (!active_) return;
  NoGradGuard no_grad;
  for (Entry& e : entries_) {
    if (e.finished) {  // already back, with its reduced gradient (and stepped)
      e.finished = false;
      continue;
    }
    Tensor low = e.param.grad();  // this backward's, in the shadow's dtype (or none)
    point_at(e.param, e.master);
    Tensor grad;
    if (e.reduced.defined()) {
      grad = master_grad(e, e.reduced);
    } else if (low.defined()) {
      grad = e.stashed.defined() ? e.stashed.add_(low) : low.to(e.master.dtype());
    } else {
      grad = e.stashed;
    }
    e.param.set_grad(grad);
    e.stashed = Tensor();
    e.reduced = Tensor();
  }
  active_ = false;
}

// The master's new .grad from an averaged slot.
Tensor ParamShadows::master_grad(Entry& e, const Tensor& reduced) const {
  if (keep_bucket_views_ && reduced.dtype() == e.master.dtype()) return reduced;  // .grad is the slot
  if (e.stashed.defined() && e.stashed.data_ptr() != reduced.data_ptr()) {
    e.stashed.copy_(reduced);  // the master's .grad keeps its identity
    return e.stashed;
  }
  Tensor grad = reduced.to(e.master.dtype());
  return grad.data_ptr() == reduced.data_ptr() ? grad.clone() : grad;  // never alias a bucket
}

void ParamShadows::finish_param(size_t i, const Tensor& reduced) {
  NoGradGuard no_grad;
  Entry& e = entries_.at(i);
  point_at(e.param, e.master);
  e.param.set_grad(master_grad(e, reduced));
  e.stashed = Tensor();
  e.reduced = Tensor();
  e.finished = true;
}

Tensor ParamShadows::gradient_to_reduce(size_t i, const Tensor& low_precision_grad) const {
  const Entry& e = entries_.at(i);
  if (!e.stashed.defined()) return low_precision_grad;
  NoGradGuard no_grad;
  return low_precision_grad.defined() ? e.stashed + low_precision_grad : e.stashed;
}

void ParamShadows::set_reduced(size_t i, const Tensor& reduced) {
  Entry& e = entries_.at(i);
  if (active_) {
    e.reduced = reduced;  // taken at the way back (cast_out)
    return;
  }
  // No forward-backward pair is open: a joined rank shadowing the others' reduction under a Join.
  // Its master's .grad becomes the average now, as a training rank's does at its way back, so an
  // optimizer stepping this rank's share (ZeRO) reads what the others read.
  NoGradGuard no_grad;
  e.stashed = e.param.grad();  // a .grad the user zeroed in place keeps its identity
  e.param.set_grad(master_grad(e, reduced));
  e.stashed = Tensor();
}

void ParamShadows::finish_backward() {
  if (pending_ && pending_()) {
    autograd::queue_callback([this] { finish_backward(); });  // after the one still to come
    return;
  }
  finish_queued_ = false;
  cast_out();
}

}  // namespace tandem::dist
