// A ProcessGroup that hands everything to another group: a test derives from it and overrides
// only what it watches or changes (test_ddp's step-stream spy, test_cuda_nccl's OnDevice).
#pragma once

#include <utility>

#include "tandem.h"

namespace tandem::dist {

class ForwardingGroup : public ProcessGroup {
 public:
  explicit ForwardingGroup(ProcessGroupPtr inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  void set_timeout(Milliseconds t) override { inner_->set_timeout(t); }
  Milliseconds timeout() const override { return inner_->timeout(); }
  void set_debug_checks(bool on) override { inner_->set_debug_checks(on); }
  bool debug_checks() const override { return inner_->debug_checks(); }
  bool is_broken() const override { return inner_->is_broken(); }
  Device control_device(Device d) const override { return inner_->control_device(d); }
  bool supports_blocking_issue(Device d) const override { return inner_->supports_blocking_issue(d); }
  void run_on_step_stream(const std::function<TensorList()>& fn) override { inner_->run_on_step_stream(fn); }
  void join_step_stream() override { inner_->join_step_stream(); }
  WorkPtr allreduce(const Tensor& t, ReduceOp op) override { return inner_->allreduce(t, op); }
  WorkPtr allreduce_coalesced(const TensorList& ts, ReduceOp op) override { return inner_->allreduce_coalesced(ts, op); }
  WorkPtr broadcast(const Tensor& t, int root) override { return inner_->broadcast(t, root); }
  WorkPtr allgather(const TensorList& outs, const Tensor& in) override { return inner_->allgather(outs, in); }
  WorkPtr allgather_into(const Tensor& out, const Tensor& in) override { return inner_->allgather_into(out, in); }
  WorkPtr reduce_scatter(const Tensor& out, const TensorList& ins, ReduceOp op) override {
    return inner_->reduce_scatter(out, ins, op);
  }
  WorkPtr reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op) override {
    return inner_->reduce_scatter_tensor(out, in, op);
  }
  WorkPtr all_to_all(const Tensor& out, const Tensor& in, const AllToAllSplits& s) override {
    return inner_->all_to_all(out, in, s);
  }
  WorkPtr barrier() override { return inner_->barrier(); }
  WorkPtr send(const Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkPtr recv(const Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  ProcessGroupPtr new_group(const std::vector<int>& ranks) override { return inner_->new_group(ranks); }

 protected:
  ProcessGroupPtr inner_;
};

}  // namespace tandem::dist
