// The per-thread roles of comm_thread.h and the issue guards of process_group.h.
#include "dist/detail/comm_thread.h"

#include "dist/process_group.h"

namespace tandem::dist {

namespace {
thread_local bool tls_on_comm_thread = false;
thread_local bool tls_caller_runs_op = false;
thread_local int tls_async_issue_depth = 0;
thread_local int tls_blocking_issue_depth = 0;
}  // namespace

bool on_comm_thread() { return tls_on_comm_thread; }
void set_on_comm_thread(bool on) { tls_on_comm_thread = on; }
bool caller_runs_op() { return tls_caller_runs_op; }
void set_caller_runs_op(bool on) { tls_caller_runs_op = on; }

AsyncIssueGuard::AsyncIssueGuard() { ++tls_async_issue_depth; }
AsyncIssueGuard::~AsyncIssueGuard() { --tls_async_issue_depth; }
bool inline_issue_allowed() { return tls_async_issue_depth == 0; }

BlockingIssueGuard::BlockingIssueGuard() { ++tls_blocking_issue_depth; }
BlockingIssueGuard::~BlockingIssueGuard() { --tls_blocking_issue_depth; }
bool blocking_issue_requested() { return tls_blocking_issue_depth > 0 && tls_async_issue_depth == 0; }

}  // namespace tandem::dist
