// The argument checks and fingerprints of the collectives, shared by every backend's issue path:
// a mistake gets the same message on every backend, and the fingerprints that debug checks
// compare across ranks are the same. Each check_<op> throws a "[op] ..." Error for bad arguments
// on group g and returns the op's fingerprint; device checks are the backend's own. Internal to
// dist (not installed).
#pragma once

#include <string>
#include <vector>

#include "dist/process_group.h"

namespace tandem::dist {

// (allreduce is the one issued per step in a loop: its fingerprint is formatted only when asked.)
std::string check_allreduce(const Tensor& tensor, ReduceOp reduce, bool fingerprint = true);
std::string check_allreduce_coalesced(const TensorList& tensors, ReduceOp reduce);
std::string check_broadcast(const ProcessGroup& g, const Tensor& tensor, int root);
std::string check_allgather(const ProcessGroup& g, const TensorList& outputs, const Tensor& input);
std::string check_allgather_into(const ProcessGroup& g, const Tensor& output, const Tensor& input);
std::string check_reduce_scatter(const ProcessGroup& g, const Tensor& output, const TensorList& inputs,
                                 ReduceOp reduce);
std::string check_reduce_scatter_tensor(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                                        ReduceOp reduce);
// Also resolves the splits (empty: equal) into rows per rank.
std::string check_all_to_all(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                             const AllToAllSplits& splits, std::vector<int64_t>& in_splits,
                             std::vector<int64_t>& out_splits);
// send and recv: `peer` (named peer_name, "dst" or "src") is another rank of g; p2p ops have no
// fingerprint.
void check_p2p(const ProcessGroup& g, const char* what, const char* peer_name, const Tensor& tensor, int peer,
               int tag);
// new_group: distinct ranks of g, at least one.
std::string check_new_group(const ProcessGroup& g, const std::vector<int>& ranks);
// "new_group [0, 2]": what check_new_group returns, for comparing another rank's list.
std::string new_group_fingerprint(const std::vector<int>& ranks);

// Rows per rank of an equal all_to_all split, validated.
std::vector<int64_t> equal_splits(int64_t rows, int size, const char* what);
// The bytes of one dim-0 row of t: the unit all_to_all moves.
size_t row_bytes(const Tensor& t);

// "0, 2, 3"
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace tandem::dist
