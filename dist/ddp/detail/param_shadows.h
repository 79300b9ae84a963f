// ParamShadows: how DDP's native mixed precision (dist/ddp/mixed_precision.h) keeps f32 masters
// and low-precision shadows. Internal: DDP drives it.
//
// The swap changes the storage, strides and dtype inside the parameter's TensorImpl, which every
// handle to it shares; autograd metadata (hooks, .grad) stays with the impl. The master's
// gradient is set aside during the pair (the low-precision backward accumulates into a .grad of
// the shadow's dtype) and comes back with this backward's contribution added: reduced across
// ranks after a synchronised backward, accumulated locally after a no_sync one.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "autograd/hooks.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "dist/ddp/mixed_precision.h"

namespace tandem::dist {

// Tests only: while set, ParamShadows::overlap_casts takes its side stream from `factory` on every
// device, the CPU included (a fake that defers the casts until they are waited for shows that each
// module waits before it reads). Unset (nullptr): the device backend's side stream, none on the CPU.
using SideStreamFactory = std::function<std::unique_ptr<SideStream>(Device)>;
void set_side_stream_factory_for_tests(SideStreamFactory factory);

class ParamShadows {
 public:
  // `params`: the parameters to cast (managed ones first, in the reducer's order, then frozen
  // ones, which are cast and restored too but get no gradient).
  // With keep_bucket_views (gradient_as_bucket_view and a reduce dtype equal to the masters'),
  // the master's .grad becomes the reduced bucket slot itself; otherwise a copy.
  ParamShadows(TensorList params, Dtype dtype, bool keep_bucket_views);
  ~ParamShadows();
  ParamShadows(const ParamShadows&) = delete;
  ParamShadows& operator=(const ParamShadows&) = delete;

  // Before a forward: shadows filled from the masters, parameters pointed at them, masters'
  // gradients set aside. Called again while active (several forwards before one backward) it
  // does nothing.
  void cast_in();
  // After a forward under NoGradGuard, or when a forward was never backwarded: back to the
  // masters, their gradients as they were (plus whatever a backward left, see finish_backward).
  void cast_out();
  bool active() const { return active_; }

  // Where the parameters' device has a side stream (CUDA), cast_in queues the casts there, one
  // batch of entry indices after another (the modules' own parameters, in the order forward
  // reaches them), and wait_for_batch(b) makes the current stream wait, on the device, for batch
  // b: called by each module's pre-forward hook, so the first layers compute while the later ones
  // are still being cast. Entries in no batch are cast on the current stream. Returns false (and
  // changes nothing) where there is no side stream: cast_in then casts every entry in place.
  bool overlap_casts(std::vector<std::vector<size_t>> batches);
  void wait_for_batch(size_t batch);

  // What the reducer copies into parameter i's bucket slot: the set-aside master gradient plus
  // this backward's low-precision one (gradient accumulation across no_sync happens in f32).
  Tensor gradient_to_reduce(size_t i, const Tensor& low_precision_grad) const;
  // The reducer's averaged gradient for parameter i (in reduce_dtype): it replaces the master's,
  // at the way back, or at once when no forward-backward pair is open (a joined rank's shadow of
  // the others' reduction under a Join).
  void set_reduced(size_t i, const Tensor& reduced);
  // Parameter i alone back to its master, its .grad the upcast `reduced`: what an optimizer in
  // backward needs before it steps i. Runs on the communication thread while backward goes on;
  // the parameter's gradient is final, so no node reads it any more.
  void finish_param(size_t i, const Tensor& reduced);
  // Queued once per backward by the parameters' hooks, and by DDP when it adopts a backward (on a
  // rank whose backward fires no parameter's hook, the way back must still be taken): back to
  // the masters; each master's .grad is the reduced gradient (synchronised backward) or the
  // set-aside one plus this backward's.
  void queue_finish();
  void finish_backward();
  // After a synchronised forward the way back is DDP's to queue when it adopts the backward (a
  // backward of another model through these parameters must not take it mid-iteration); after a
  // no_sync forward the first parameter hook queues it.
  void set_adoption_pending(bool pending) { adoption_pending_ = pending; }
  // DDP lets go of the parameters (remove_autograd_hooks): no hook of it fires again, and the
  // parameters are their masters again, also after a backward that threw.
  void release();
  // While `pending()` says so (another reduction of this backward has not handed its results
  // over yet), the end of backward waits for it: the callback queues itself again.
  void finish_after(std::function<bool()> pending) { pending_ = std::move(pending); }

 private:
  struct Entry {
    Tensor param;    // the user's handle (its impl is swapped)
    Tensor master;   // a second impl aliasing the master's storage
    Tensor shadow;   // in the low-precision dtype
    Tensor stashed;  // the master's .grad during the pair
    Tensor reduced;  // set by the reducer after a synchronised backward
    bool finished = false;  // finish_param ran this iteration (read after the reducer's wait)
  };
  Tensor master_grad(Entry& e, const Tensor& reduced) const;

  std::vector<Entry> entries_;
  Dtype dtype_;
  bool keep_bucket_views_ = false;
  bool active_ = false;
  bool finish_queued_ = false;
  bool adoption_pending_ = false;
  std::vector<HookHandle> hooks_;
  std::function<bool()> pending_;
  std::vector<std::vector<size_t>> batches_;  // overlap_casts: entry indices per batch
  std::vector<size_t> unbatched_;             // cast on the current stream
  std::vector<size_t> markers_;               // per batch, this iteration's side-stream marker
  std::unique_ptr<SideStream> side_;          // declared after entries_: drained before the shadows go
};

}  // namespace tandem::dist
