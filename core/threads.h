// The intra-op thread count: how many threads Tandem's CPU kernels and OpenBLAS use per process.
#pragma once

namespace tandem {

// Intra-op threads (our kernels and OpenBLAS). Defaults to TANDEM_NUM_THREADS, else the cores
// divided by the ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE), so several ranks on one node
// do not oversubscribe it.
int get_num_threads();
void set_num_threads(int n);

}  // namespace tandem
