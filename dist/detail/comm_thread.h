// Marks communication threads, so that a blocking wait issued on one (from a continuation) is
// reported instead of deadlocking. Internal to dist (not installed).
#pragma once

namespace tandem::dist {

bool on_comm_thread();
void set_on_comm_thread(bool on);

// True while an issuing thread runs an op itself under a BlockingIssueGuard: the thread has
// nothing else to do until it ends, so a backend may poll it more eagerly than it lets a
// communication thread poll while the caller computes (see threads_waiting_on_work).
bool caller_runs_op();
void set_caller_runs_op(bool on);

// How many threads of this process are blocked in Work::wait. While one is, its core is idle, so
// a communication thread polling a long transfer may keep spinning instead of sleeping (which
// would add up to a sleep's length to each step of the transfer).
int threads_waiting_on_work();

}  // namespace tandem::dist
