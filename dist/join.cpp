#include "dist/join.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "dist/flight_recorder.h"

namespace tandem::dist {

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  TANDEM_CHECK(!joinables_.empty(), "[Join] needs at least one joinable (a DistributedDataParallel)");
  for (size_t i = 0; i < joinables_.size(); ++i) {
    Joinable* j = joinables_[i];
    TANDEM_CHECK(j != nullptr, "[Join] joinable {} is null", i);
    const auto earlier = std::find(joinables_.begin(), joinables_.begin() + static_cast<std::ptrdiff_t>(i), j);
    TANDEM_CHECK(earlier == joinables_.begin() + static_cast<std::ptrdiff_t>(i),
                 "[Join] joinable {} is listed twice (also as joinable {})", i, earlier - joinables_.begin());
    TANDEM_CHECK(j->join_ == nullptr, "[Join] joinable {} is already attached to another Join that is still open", i);
    ProcessGroup& g = j->join_group();
    if (group_ == nullptr) group_ = &g;
    TANDEM_CHECK(&g == group_,
                 "[Join] every joinable must communicate over the same group: joinable 0 uses a group of {} ranks, "
                 "joinable {} another one of {}",
                 group_->size(), i, g.size());
  }
  for (size_t i = 1; i < joinables_.size(); ++i)
    TANDEM_CHECK(!joinables_[i]->join_announces(),
                 "[Join] joinable {} announces the iterations (a DistributedDataParallel): list it first, since the "
                 "other joinables' collectives (an optimizer's step) follow its own within an iteration",
                 i);
  for (Joinable* j : joinables_) j->join_attached();
  for (Joinable* j : joinables_) j->join_ = this;
}

Join::~Join() noexcept(false) {
  if (joined_ || std::uncaught_exceptions() > uncaught_at_start_) {
    detach();
    return;
  }
  join();  // detaches, also when it throws
}

void Join::detach() noexcept {
  for (Joinable* j : joinables_)
    if (j->join_ == this) j->join_ = nullptr;
}

JoinIteration Join::exchange(uint32_t mine) {
  const int world = group_->size();
  std::vector<int64_t> entries(static_cast<size_t>(world), 0);
  entries[static_cast<size_t>(group_->rank())] = mine;
  Tensor t = from_vector<int64_t>(entries, {world}).to(group_->control_device(joinables_.front()->join_device()));
  {
    NoGradGuard no_grad;
    CollectiveTag tag(kJoinAnnouncementTag);
    group_->allreduce(t, ReduceOp::sum)->wait();
  }
  const std::vector<int64_t> got = t.to(kCPU).to_vector<int64_t>();
  JoinIteration it;
  it.index = iterations_++;
  it.world_size = world;
  for (int r = 0; r < world; ++r) {
    const int64_t f = got[static_cast<size_t>(r)];
    TANDEM_CHECK(f >= 0 && f <= static_cast<int64_t>(UINT32_MAX),
                 "[Join] rank {}'s announcement of iteration {} is corrupt ({}): the ranks are not running the same "
                 "collectives. {}",
                 r, it.index, f, kJoinShadowRule);
    if (f == 0) continue;
    it.active.push_back(r);
  }
  if (it.active.empty()) return it;
  it.flags = static_cast<uint32_t>(got[static_cast<size_t>(it.active.front())]);
  for (int r : it.active) {
    const auto f = static_cast<uint32_t>(got[static_cast<size_t>(r)]);
    TANDEM_CHECK(f == it.flags,
                 "[Join] the ranks still training disagree about iteration {}: rank {} announced flags {:#x}, rank {} "
                 "{:#x} (e.g. one runs under no_sync while the other synchronises, or one broadcasts buffers); every "
                 "rank must run the same kind of iteration",
                 it.index, it.active.front(), it.flags, r, f);
  }
  last_authority_ = it.authority();
  if (options_.throw_on_early_termination && static_cast<int>(it.active.size()) < world) {
    std::vector<int> done;
    for (int r = 0; r < world; ++r)
      if (!std::binary_search(it.active.begin(), it.active.end(), r)) done.push_back(r);
    fail("[Join] rank(s) {} exhausted their inputs at iteration {} (throw_on_early_termination): every rank raises "
         "at this iteration",
         fmt::join(done, ", "), it.index);
  }
  return it;
}

JoinIteration Join::announce(uint32_t flags) {
  TANDEM_CHECK(!joined_, "[Join] rank {} has joined (join() was called) but still runs iterations",
               group_->rank());
  return exchange(flags | kActive);
}

void Join::join() {
  TANDEM_CHECK(!joined_, "[Join] join() was already called on rank {}", group_->rank());
  joined_ = true;
  struct Detach {
    Join* j;
    ~Detach() { j->detach(); }
  } detach_at_end{this};
  while (true) {
    const JoinIteration it = exchange(0);
    if (it.active.empty()) break;
    for (Joinable* j : joinables_) j->join_shadow(it);
  }
  for (Joinable* j : joinables_) j->join_finish(last_authority_);
}

}  // namespace tandem::dist
