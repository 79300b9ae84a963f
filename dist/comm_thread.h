// Marks communication threads, so that a blocking wait issued on one (from a continuation) is
// reported instead of deadlocking.
#pragma once

namespace tandem::dist {

bool on_comm_thread();
void set_on_comm_thread(bool on);

}  // namespace tandem::dist
