// The Reducer: DDP's gradient synchronisation. Parameters are grouped into buckets (flat buffers
// of one dtype and device); as backward makes each parameter's gradient final (its
// post-accumulate-grad hook), the gradient is copied into its bucket slot (or already lives there
// with gradient_as_bucket_view); a bucket whose slots are all ready is reduced asynchronously,
// strictly in bucket order, so communication overlaps the rest of backward. A callback queued at
// the end of backward waits for every bucket and writes the averages back into `.grad`.
//
// Which backward is DDP's: one that reaches the output of a synchronised forward (DDP hands the
// outputs over in prepare_for_backward; dist/ddp/detail/backward_watch.h adopts it before any node runs);
// gradient hooks fired by any other backward (another model sharing parameters) are not this
// iteration's. Several synchronised forwards may precede one backward unless
// find_unused_parameters is on without static_graph (then which parameters one forward left
// unused cannot be told from the others), as in PyTorch.
//
// "Used" means the parameter's gradient hook fired in this backward, or in a no_sync micro-batch's
// backward since the last reduction (whatever forwards came before them), as PyTorch marks its
// local used map before it asks whether it expects hooks. With find_unused_parameters
// the parameters the loss does not reach are marked ready when backward starts (the tape knows
// them: no graph search in forward), and reachable ones whose hook still did not fire are marked
// in the end-of-backward callback. With static_graph the first backward only records which
// parameters were used and reduces everything in its end-of-backward callback; later backwards
// mark the first iteration's unused parameters ready at once and reduce as usual.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "autograd/backward_seam.h"
#include "autograd/hooks.h"
#include "dist/ddp/detail/backward_watch.h"
#include "dist/ddp/comm_hooks.h"
#include "dist/ddp/detail/grad_buckets.h"
#include "dist/ddp/reducer_stats.h"
#include "dist/process_group.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

struct ReducerOptions {
  size_t first_bucket_bytes = size_t{1} << 20;
  size_t bucket_bytes = size_t{25} << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
  std::optional<Dtype> reduce_dtype;  // buckets of floating gradients in this dtype (mixed precision)
};

// How a reducer reads and writes gradients when they are not simply the parameters' .grad
// (mixed precision: low-precision gradients on shadows, f32 masters).
struct GradientTransforms {
  // What goes into parameter i's slot, given its .grad (possibly undefined).
  std::function<Tensor(size_t param, const Tensor& grad)> source;
  // Receives parameter i's averaged slot instead of writing it into .grad.
  std::function<void(size_t param, const Tensor& reduced)> sink;
  // Makes parameter i's .grad final from its averaged slot right away, before an optimizer in
  // backward steps it (may run on the communication thread).
  std::function<void(size_t param, const Tensor& reduced)> finish;
};

class Reducer {
 public:
  struct Param {
    std::string name;
    Tensor tensor;
  };

  Reducer(std::vector<Param> params, ProcessGroupPtr group, ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // At the start of every forward in grad mode (synchronised or not; a forward under NoGradGuard
  // calls nothing, so it performs no collective): throws when the previous synchronised
  // iteration did not finish its reduction, and performs the one bucket rebuild after the first
  // finished iteration.
  void prepare_for_forward(bool rebuild_now = true);
  // Under a Join (dist/join.h): what the announcement of the next iteration says, and the parts of
  // an iteration a rank that announced or shadowed it then runs.
  bool rebuild_pending() const { return rebuild_pending_; }
  void rebuild_if_pending() {
    if (rebuild_pending_) rebuild_buckets();
  }
  void rebuild_for_join() { rebuild_buckets(); }  // a joined rank: the rebuild the others run now
  bool awaiting_backward() const { return expect_hooks_; }  // a synchronised forward's backward has not run
  bool recording_static_graph() const { return static_first_iteration(); }
  // The divisor of the summed gradient from now on (the default reduction's); 0: the group size.
  void set_divisor(double divisor) { divisor_ = divisor; }
  // A joined rank's part of one synchronised iteration of the others: the used map (static
  // graph's first iteration: first; a dynamic find_unused_parameters: last) and every bucket's
  // reduction, in the order the others issue them, with zero gradients; the reduced averages are
  // written into .grad as on the others (under mixed precision, upcast into the f32 masters').
  void shadow_reduction(bool static_first_iteration);
  // After a synchronised forward with grad mode on: a backward that reaches one of `outputs`
  // reduces. Several calls before that backward add to the outputs (static_graph runs several
  // forwards before one backward). An empty list (a forward whose result holds no tensor DDP can
  // see) stands for the parameters themselves: then any backward that reaches them is adopted.
  void prepare_for_backward(const TensorList& outputs);
  // After a forward in grad mode under no_sync: the gradient hooks of backwards not adopted as a
  // synchronised iteration's count as usage until the next synchronised forward (also when an
  // earlier synchronised forward was never backwarded). Other backwards (another model sharing
  // parameters, between DDP's forward and its backward) do not.
  void note_local_forward() { local_window_ = true; }
  // Throws the unfinished-reduction error now, instead of at the next forward; after a backward
  // that threw, says so (the next forward drops that partial reduction and starts afresh).
  void check_finalized() const;

  // Before the first backward only; once.
  void register_comm_hook(CommHook hook);
  // Optimizer in backward: steps[p] (null for none) steps parameter p as soon as its bucket is
  // reduced, in a continuation of the bucket's Work (on the communication thread for the CPU
  // backends), reading the reduced gradient. With a dynamic find_unused_parameters the steps wait
  // for the used map (globally unused parameters are not stepped) and run at the end of backward.
  void set_in_backward_steps(std::vector<std::shared_ptr<optim::InBackwardStep>> steps);
  // Before the first backward only.
  void set_gradient_transforms(GradientTransforms transforms);
  // Called on the backward's thread when a backward is adopted as the iteration's (after this
  // reducer's end-of-backward callback is queued).
  void on_adopt(std::function<void()> fn) { on_adopt_ = std::move(fn); }
  // Detaches the reducer from autograd: no hook of it fires again, and every reduction still in
  // flight (with the in-backward steps chained to it) has finished when it returns.
  void remove_autograd_hooks();

  const std::vector<ReducerEvent>& events() const { return events_; }
  ReducerStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;

  void build_buckets(const std::vector<std::vector<size_t>>& layout);
  Tensor slot_view(size_t param) const { return buckets_.slot_view(param); }
  void adopt(const autograd::GraphTask& task, size_t forwards_reached);
  void on_grad_ready(size_t param);
  void mark_ready(size_t param, bool used_here);
  void launch_ready_buckets();
  WorkPtr reduce_bucket(size_t index);  // the bucket's collective (comm hook or allreduce)
  void launch_used_map();
  void finalize();
  void finalize_static_first_iteration();
  void check_static_graph() const;
  void wait_and_write_back();
  void write_back(size_t param);  // the reduced gradient of `param` into its .grad
  bool steps_with_bucket(size_t param) const;  // its in-backward step runs in its bucket's continuation
  bool drops_grad_after_copy(size_t param) const;
  void take_result(size_t bucket, const TensorList& result);
  void chain_in_backward_steps(size_t bucket);
  void reset_iteration();
  void wait_outstanding() noexcept;
  void rebuild_buckets();
  [[noreturn]] void throw_unfinished() const;
  bool static_first_iteration() const { return options_.static_graph && !static_recorded_; }
  // Outside a backward: one was adopted (it may have marked parameters ready, launched buckets)
  // but its end-of-backward callback never ran, so it threw.
  bool backward_failed() const { return expect_hooks_ && adopted_task_ != 0 && !finalize_ran_; }
  bool folds_division() const { return !comm_hook_ && group_->size() > 1; }
  double divisor() const { return divisor_ > 0 ? divisor_ : static_cast<double>(group_->size()); }
  void record_static_graph(const std::vector<bool>& used_here);  // after the first used map

  std::vector<Param> params_;
  ProcessGroupPtr group_;
  ReducerOptions options_;
  Device control_device_;
  CommHook comm_hook_;
  double divisor_ = 0;  // set_divisor

  GradBuckets buckets_;
  std::vector<HookHandle> hooks_;
  std::vector<std::shared_ptr<optim::InBackwardStep>> in_backward_;  // per parameter, may be null
  GradientTransforms transforms_;
  std::function<void()> on_adopt_;
  bool attached_ = true;
  std::unique_ptr<BackwardWatch> watch_;  // adopts the backward of the synchronised forwards

  // ---- iteration state (the thread that runs DDP's backward) ----
  bool expect_hooks_ = false;     // a synchronised forward ran; its backward reduces
  uint64_t adopted_task_ = 0;     // the backward being reduced (GraphTask::id), 0 before one is adopted
  bool hooks_fired_ = false;      // ... and a gradient hook of it fired: the reduction is pending
  bool finalize_ran_ = false;     // its end-of-backward callback ran (false: the backward threw)
  bool trained_ = false;          // any synchronised backward has started (comm hooks are fixed)
  bool local_window_ = false;     // a no_sync forward ran since the last synchronised one
  std::vector<bool> ready_;
  std::vector<int32_t> local_used_;  // accumulates over no_sync backwards until a reduction
  std::vector<Tensor> unused_stash_; // bucket-view grads of locally unused params, restored if globally unused
  size_t next_launch_ = 0;
  Tensor used_map_;                  // i32 [n], allreduced when find_unused_parameters
  WorkPtr used_work_;
  std::string failure_;              // why the last reduction failed (then every forward throws)
  std::vector<size_t> ready_order_;
  std::vector<size_t> first_ready_order_;  // kept for the rebuild
  bool rebuilt_ = false;
  bool rebuild_pending_ = false;
  // static_graph: what the first synchronised backward saw.
  bool static_recorded_ = false;
  std::vector<bool> static_unused_here_;      // this rank's hook did not fire
  std::vector<bool> static_unused_anywhere_;  // no rank's hook fired: .grad is left alone
  std::vector<size_t> graph_changed_;         // parameters whose hook fired against the record
  std::vector<ReducerEvent> events_;

  // ---- statistics ----
  int64_t iterations_ = 0;
  std::vector<int64_t> rebuilt_bucket_bytes_;
  std::vector<std::string> last_ready_names_;
  std::vector<std::string> last_unused_names_;
  Clock::time_point backward_start_{}, last_ready_{}, first_launch_{};
  std::shared_ptr<std::mutex> completion_mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<Clock::time_point> last_completion_ = std::make_shared<Clock::time_point>();
  double backward_compute_ms_ = 0, comm_ms_ = 0, comm_wait_ms_ = 0;
};

}  // namespace tandem::dist
