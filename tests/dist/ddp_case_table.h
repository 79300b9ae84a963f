// The DDP cases both backends run, in one table: test_ddp makes each row a TEST_CASE on the
// threads backend (every step at each of its world sizes, a fresh world of threads each), and
// test_ddp_mpi one on the mpi backend (every step once, on a fresh group of mpirun's ranks). A new
// case is a row here, its body in ddp_cases.h or a mode's ddp_*_cases.h; a case only one backend
// can run stays in that runner's file.
#pragma once

#include <functional>
#include <type_traits>
#include <vector>

#include "ddp_cases.h"
#include "ddp_checkpoint_cases.h"
#include "ddp_delayed_cases.h"
#include "ddp_gpt_cases.h"
#include "ddp_hardening_cases.h"
#include "ddp_in_backward_cases.h"
#include "ddp_join_cases.h"
#include "ddp_mixed_precision_cases.h"
#include "ddp_reducer_rules_cases.h"
#include "ddp_static_graph_cases.h"
#include "ddp_zero_cases.h"
#include "ddp_zero_join_cases.h"

namespace ddp_cases {

using GroupFn = std::function<void(ProcessGroupPtr)>;

// How long a rank waits for the others in one collective (the runners hold the seconds).
enum class Wait {
  normal,        // 60 s
  shorter,       // 20 s on threads, 60 s under mpirun
  breaks_group,  // the case breaks its group on purpose: 2 s on threads, 3 s under mpirun; on
                 // threads the run must also end within 30 s (a timeout, never a hang)
};

// A row's unit of work: `run` on every rank of a fresh group.
struct Step {
  GroupFn run;
  std::vector<int> thread_ranks;  // test_ddp's world sizes, in this order (test_ddp_mpi: mpirun's)
  Wait wait = Wait::normal;
};

// fn(g, args...): a case function with its arguments after the group bound.
template <class... Args>
GroupFn with_args(void (*fn)(ProcessGroupPtr, Args...), std::type_identity_t<Args>... args) {
  return [=](ProcessGroupPtr g) { fn(std::move(g), args...); };
}

// fn(g, false), then fn(g, true), on one group.
inline GroupFn both_ways(void (*fn)(ProcessGroupPtr, bool)) {
  return [fn](ProcessGroupPtr g) {
    fn(g, false);
    fn(g, true);
  };
}

// Every layout, optimizer and dtype at 1 and 2 ranks; the quick subset at more.
inline void equivalence_by_size(ProcessGroupPtr g) { all_equivalence(g, /*quick=*/g->size() > 2); }

inline void failed_backward_then_training(ProcessGroupPtr g) {
  check_after_failed_backward(g, false);
  check_after_failed_backward(g, true);
  mixed_precision_after_failed_backward(g, false);
  mixed_precision_after_failed_backward(g, true);
}

}  // namespace ddp_cases

// X(threads name, threads tags, mpi name, Step...): test_ddp_mpi tags every case [ddp_mpi].
// Expanded in a runner that has `using namespace ddp_cases`.
// clang-format off
#define TANDEM_DDP_CASES(X)                                                                                           \
  X("ddp threads: equivalence with one process (bucket view x unused x layouts, SGD and AdamW, f64 and f32)",         \
    "[ddp]", "ddp mpi: equivalence with one process",                                                                 \
    Step{equivalence_by_size, {1, 2, 3, 4}})                                                                          \
  X("ddp threads: no_sync accumulates locally and the next synced backward reduces the sum", "[ddp]",                 \
    "ddp mpi: no_sync",                                                                                               \
    Step{with_args(no_sync_accumulation, false), {2, 3}}, Step{with_args(no_sync_accumulation, true), {2, 3}})        \
  X("ddp threads: broadcast_buffers true and false", "[ddp]",                                                         \
    "ddp mpi: broadcast_buffers",                                                                                     \
    Step{buffers, {2, 3}})                                                                                            \
  X("ddp threads: with no_sync, buffers are broadcast only at the start of each accumulation window", "[ddp]",        \
    "ddp mpi: buffers with no_sync",                                                                                  \
    Step{buffers_with_no_sync, {2, 3}})                                                                               \
  X("ddp threads: a parameter without gradient on every rank is a clear error", "[ddp]",                              \
    "ddp mpi: unused parameter error",                                                                                \
    Step{unused_everywhere_is_an_error, {2, 1}})                                                                      \
  X("ddp threads: model mismatch, frozen module and unknown ignored names are construction errors", "[ddp]",          \
    "ddp mpi: construction errors",                                                                                   \
    Step{construction_errors, {2, 3}})                                                                                \
  X("ddp threads: ignored parameters stay local", "[ddp]",                                                            \
    "ddp mpi: ignored parameters",                                                                                    \
    Step{ignored_parameters, {2}})                                                                                    \
  X("ddp threads: bucket 0 is reduced while backward still runs, buckets launch in order", "[ddp]",                   \
    "ddp mpi: overlap and launch order",                                                                              \
    Step{overlap_order, {2}})                                                                                         \
  X("ddp threads: ranks with different gradient-ready orders agree on the rebuilt buckets", "[ddp]",                  \
    "ddp mpi: rebuilt buckets agree",                                                                                 \
    Step{rebuild_agreement, {2, 3}})                                                                                  \
  X("ddp threads: comm hooks (fp16, bf16, wrapper, custom) and their registration errors", "[ddp]",                   \
    "ddp mpi: comm hooks",                                                                                            \
    Step{comm_hooks, {2}})                                                                                            \
  X("ddp threads: a second DDP after a failed backward trains correctly", "[ddp]",                                    \
    "ddp mpi: second DDP after a failed backward",                                                                    \
    Step{with_args(hooks_after_failed_backward, false), {2}},                                                         \
    Step{with_args(hooks_after_failed_backward, true), {2}})                                                          \
  X("ddp threads: static_graph with one, two and three forwards before one backward", "[ddp][static_graph]",          \
    "ddp mpi: static_graph",                                                                                          \
    Step{static_graph_all, {1, 2, 3}})                                                                                \
  X("ddp threads: which backward is DDP's, grad mode off, another thread, used means the hook fired", "[ddp]",        \
    "ddp mpi: reducer rules",                                                                                         \
    Step{reducer_rules, {1, 2, 3}, Wait::shorter})                                                                    \
  X("ddp threads: a graph that changes under static_graph is an error there and a timeout elsewhere",                 \
    "[ddp][static_graph]", "ddp mpi: a graph that changes under static_graph",                                        \
    Step{with_args(static_graph_changes, true), {2}, Wait::breaks_group},                                             \
    Step{with_args(static_graph_changes, false), {2}, Wait::breaks_group})                                            \
  X("ddp threads: delayed-allreduce parameters train as one process, on a group of their own", "[ddp][delayed]",      \
    "ddp mpi: delayed-allreduce parameters",                                                                          \
    Step{delayed_allreduce_all, {1, 2, 3}}, Step{delayed_unused_on_some_ranks, {1, 2, 3}, Wait::shorter})             \
  X("ddp threads: optimizer in backward equals DDP + step()", "[ddp][in_backward]",                                   \
    "ddp mpi: optimizer in backward",                                                                                 \
    Step{in_backward_all, {1, 2, 3}}, Step{in_backward_hook_and_errors, {2}})                                         \
  X("ddp threads: mixed precision (bf16, f16) tracks f32 training", "[ddp][mixed_precision]",                         \
    "ddp mpi: mixed precision",                                                                                       \
    Step{mixed_precision_all, {1, 2}}, Step{mixed_precision_buffers_and_errors, {1, 2}},                              \
    Step{in_backward_mixed_precision_all, {1, 2}}, Step{delayed_with_mixed_precision_all, {1, 2}})                    \
  /* Ranks that must not silently diverge (ddp_hardening_cases.h). */                                                 \
  X("ddp threads: no_sync after a dropped forward still counts as used", "[ddp][hardening]",                          \
    "ddp mpi: no_sync after a dropped forward",                                                                       \
    Step{both_ways(no_sync_after_dropped_forward), {1, 2, 3}})                                                        \
  X("ddp threads: two forwards before one backward without static_graph", "[ddp][hardening]",                        \
    "ddp mpi: two forwards without static_graph",                                                                     \
    Step{two_forwards_without_static_graph, {1, 2, 3}})                                                               \
  X("ddp threads: the delayed allreduce follows DDP's backward", "[ddp][hardening][delayed]",                         \
    "ddp mpi: the delayed allreduce follows DDP's backward",                                                          \
    Step{delayed_follows_ddps_backward, {1, 2, 3}}, Step{delayed_after_dropped_forward, {1, 2, 3}})                   \
  X("ddp threads: mixed precision on a rank whose backward fires no hook", "[ddp][hardening][mixed_precision]",       \
    "ddp mpi: mixed precision on a rank whose backward fires no hook",                                                \
    Step{mixed_precision_rank_without_hooks, {1, 2, 3}})                                                              \
  X("ddp threads: delayed parameters unused everywhere are not stepped", "[ddp][hardening][delayed]",                 \
    "ddp mpi: delayed parameters unused everywhere",                                                                  \
    Step{both_ways(delayed_globally_unused), {1, 2, 3}})                                                              \
  X("ddp threads: a second DDP while the first lives", "[ddp][hardening]",                                            \
    "ddp mpi: a second DDP while the first lives",                                                                    \
    Step{second_ddp_all, {1, 2, 3}})                                                                                  \
  X("ddp threads: destroyed with a reduction in flight", "[ddp][hardening]",                                          \
    "ddp mpi: destroyed with a reduction in flight",                                                                  \
    Step{destroy_with_reduction_in_flight, {1, 2, 3}})                                                                \
  X("ddp threads: mixed precision keeps a delayed parameter gradient and casts the inputs of call",                   \
    "[ddp][hardening][mixed_precision]", "ddp mpi: mixed precision, delayed .grad and call's inputs",                 \
    Step{delayed_grad_kept_under_mixed_precision, {1, 2, 3}}, Step{call_casts_inputs, {1, 2, 3}})                     \
  X("ddp threads: check_reducer_finalized after a failed backward, and training after it", "[ddp][hardening]",        \
    "ddp mpi: check_reducer_finalized after a failed backward, and training after it",                                \
    Step{failed_backward_then_training, {1, 2, 3}})                                                                   \
  X("ddp threads: under mixed precision a side backward does not end DDP's iteration", "[ddp][hardening]",            \
    "ddp mpi: under mixed precision a side backward does not end DDP's iteration",                                    \
    Step{mixed_precision_side_backward, {1, 2, 3}})                                                                   \
  X("ddp threads: a delayed parameter that changes under static_graph", "[ddp][hardening][static_graph]",             \
    "ddp mpi: a delayed parameter that changes under static_graph",                                                   \
    Step{delayed_static_graph_changes, {1, 2}, Wait::breaks_group})                                                   \
  X("ddp threads: a tied weight (lm_head is wte) is one slot, reduced and stepped once, and trains as one process",   \
    "[ddp][tying]", "ddp mpi: tied weights",                                                                          \
    Step{tied_weights_all, {1, 2, 3}})                                                                                \
  /* Uneven inputs (ddp_join_cases.h). */                                                                             \
  X("ddp threads: Join with uneven inputs trains as one process, and every rank ends with its parameters",            \
    "[ddp][join]", "ddp mpi: Join with uneven inputs",                                                                \
    Step{join_uneven_inputs, {1, 2, 4}})                                                                              \
  X("ddp threads: under Join buffers come from the highest rank still training; early termination; misuse",         \
    "[ddp][join]", "ddp mpi: Join buffers, early termination and misuse",                                             \
    Step{join_buffers_follow_the_ranks_still_training, {2, 3}}, Step{join_throw_on_early_termination, {1, 2, 4}},     \
    Step{join_misuse, {1, 2}}, Step{join_batchnorm_buffers_both, {2, 4}})                                             \
  /* ZeRO stage 1 (ddp_zero_cases.h). */                                                                              \
  X("ddp threads: ZeroRedundancyOptimizer equals DDP + the plain optimizer; its state dict is the plain one's",       \
    "[ddp][zero]", "ddp mpi: ZeroRedundancyOptimizer",                                                                \
    Step{zero_equivalence_all, {1, 2, 3, 4}}, Step{zero_two_groups, {1, 2, 3}}, Step{zero_with_join, {1, 2, 4}},      \
    Step{zero_errors, {1, 2}}, Step{zero_mixed_precision, {1, 2, 4}})                                                 \
  X("ddp threads: ZeRO under a Join steps a joined rank's share as the others (mixed precision, clipping, schedule)", \
    "[ddp][zero][join]", "ddp mpi: ZeRO under a Join with mixed precision, clipping and a schedule",                 \
    Step{zero_join_mixed_precision_and_clipping, {1, 2, 4}}, Step{zero_join_clip_errors, {1, 2}},                   \
    Step{zero_join_resume, {2, 4}})                                                                                  \
  /* Checkpoints of a training run (ddp_checkpoint_cases.h). */                                                      \
  X("ddp threads: a checkpoint resumes bitwise at any rank count, ZeRO or not; a bad load restores nothing",         \
    "[ddp][checkpoint]", "ddp mpi: save_checkpoint / load_checkpoint",                                               \
    Step{checkpoint_resume_zero, {1, 2, 4}}, Step{checkpoint_plain_and_zero, {1, 2, 3}},                             \
    Step{checkpoint_from_one_process, {2, 3}}, Step{checkpoint_errors, {1, 2}})                                      \
  X("ddp threads: ZeroRedundancyOptimizer with overlap_with_ddp steps in backward and equals DDP + the plain one",    \
    "[ddp][zero]", "ddp mpi: ZeroRedundancyOptimizer overlap_with_ddp",                                               \
    Step{zero_overlap_all, {1, 2, 4}}, Step{zero_overlap_errors, {1, 2}})                                             \
  /* The modes on train's GPT, each alone and together (ddp_gpt_cases.h). */                                          \
  X("ddp threads: the GPT in every mode combination without mixed precision trains as one process in f64",            \
    "[ddp][gpt]", "ddp mpi: the GPT in every mode combination trains as one process",                                 \
    Step{gpt_modes_f64_all, {2, 3}})                                                                                  \
  X("ddp threads: the GPT under bf16 mixed precision, alone and with the other modes, tracks f32 training",           \
    "[ddp][gpt][mixed_precision]", "ddp mpi: the GPT under bf16 mixed precision",                                     \
    Step{gpt_mixed_precision_all, {1, 2}})
// clang-format on
