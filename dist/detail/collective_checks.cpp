#include "dist/detail/collective_checks.h"

#include <fmt/format.h>

#include <set>

namespace tandem::dist {

namespace {

void check_tensor(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.defined(), "[{}] {} is an undefined tensor", op, what);
  TANDEM_CHECK(t.is_contiguous(), "[{}] {} must be contiguous (shape {}, strides {})", op, what, t.shape(), t.strides());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* what_a, const char* what_b) {
  TANDEM_CHECK(a.dtype() == b.dtype(), "[{}] {} is {} but {} is {}", op, what_a, a.dtype(), what_b, b.dtype());
  TANDEM_CHECK(a.device() == b.device(), "[{}] {} is on {} but {} is on {}", op, what_a, a.device(), what_b, b.device());
}

void check_reduce(ReduceOp r, Dtype d, const char* op) {
  TANDEM_CHECK(r != ReduceOp::avg || is_floating(d), "[{}] avg needs a floating dtype, got {} (use sum)", op, d);
}

Shape row_shape(const Tensor& t) {
  Shape s;
  for (int64_t i = 1; i < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}

}  // namespace

std::string join_ranks(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ", ")); }

size_t row_bytes(const Tensor& t) {
  size_t row = t.element_size();
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return row;
}

std::vector<int64_t> equal_splits(int64_t rows, int size, const char* what) {
  TANDEM_CHECK(rows % size == 0, "[all_to_all] equal split of the {} needs dim 0 ({}) divisible by the group size {}",
               what, rows, size);
  return std::vector<int64_t>(size, rows / size);
}

std::string check_allreduce(const Tensor& tensor, ReduceOp reduce, bool fingerprint) {
  check_tensor(tensor, "allreduce", "tensor");
  check_reduce(reduce, tensor.dtype(), "allreduce");
  if (!fingerprint) return {};
  return fmt::format("allreduce({}) {} {}", reduce_op_name(reduce), tensor.dtype(), tensor.shape());
}

std::string check_allreduce_coalesced(const TensorList& tensors, ReduceOp reduce) {
  TANDEM_CHECK(!tensors.empty(), "[allreduce_coalesced] needs at least one tensor");
  std::string shapes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto what = fmt::format("tensor {}", i);
    check_tensor(tensors[i], "allreduce_coalesced", what.c_str());
    check_same_dtype(tensors[i], tensors[0], "allreduce_coalesced", what.c_str(), "tensor 0");
    shapes += (i ? ", " : "") + fmt::format("{}", tensors[i].shape());
  }
  check_reduce(reduce, tensors[0].dtype(), "allreduce_coalesced");
  return fmt::format("allreduce_coalesced({}) {} {} tensors {}", reduce_op_name(reduce), tensors[0].dtype(),
                     tensors.size(), shapes);
}

std::string check_broadcast(const ProcessGroup& g, const Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "tensor");
  TANDEM_CHECK(root >= 0 && root < g.size(), "[broadcast] root {} is not a rank of group {} (size {})", root, g.name(),
               g.size());
  return fmt::format("broadcast(root {}) {} {}", root, tensor.dtype(), tensor.shape());
}

std::string check_allgather(const ProcessGroup& g, const TensorList& outputs, const Tensor& input) {
  check_tensor(input, "allgather", "input");
  TANDEM_CHECK(static_cast<int>(outputs.size()) == g.size(), "[allgather] needs one output per rank ({}), got {}",
               g.size(), outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto what = fmt::format("output {}", i);
    check_tensor(outputs[i], "allgather", what.c_str());
    check_same_dtype(outputs[i], input, "allgather", what.c_str(), "input");
    TANDEM_CHECK(outputs[i].shape() == input.shape(), "[allgather] {} has shape {} but input has shape {}", what,
                 outputs[i].shape(), input.shape());
  }
  return fmt::format("allgather {} {}", input.dtype(), input.shape());
}

std::string check_allgather_into(const ProcessGroup& g, const Tensor& output, const Tensor& input) {
  check_tensor(input, "allgather_into", "input");
  check_tensor(output, "allgather_into", "output");
  check_same_dtype(output, input, "allgather_into", "output", "input");
  const int size = g.size();
  TANDEM_CHECK(output.numel() == input.numel() * size,
               "[allgather_into] output has {} elements (shape {}), expected {} x input {} = {}", output.numel(),
               output.shape(), size, input.shape(), input.numel() * size);
  return fmt::format("allgather_into {} {}", input.dtype(), input.shape());
}

std::string check_reduce_scatter(const ProcessGroup& g, const Tensor& output, const TensorList& inputs,
                                 ReduceOp reduce) {
  check_tensor(output, "reduce_scatter", "output");
  check_reduce(reduce, output.dtype(), "reduce_scatter");
  TANDEM_CHECK(static_cast<int>(inputs.size()) == g.size(), "[reduce_scatter] needs one input per rank ({}), got {}",
               g.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto what = fmt::format("input {}", i);
    check_tensor(inputs[i], "reduce_scatter", what.c_str());
    check_same_dtype(inputs[i], output, "reduce_scatter", what.c_str(), "output");
    TANDEM_CHECK(inputs[i].shape() == output.shape(), "[reduce_scatter] {} has shape {} but output has shape {}", what,
                 inputs[i].shape(), output.shape());
  }
  return fmt::format("reduce_scatter({}) {} {}", reduce_op_name(reduce), output.dtype(), output.shape());
}

std::string check_reduce_scatter_tensor(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                                        ReduceOp reduce) {
  check_tensor(output, "reduce_scatter_tensor", "output");
  check_tensor(input, "reduce_scatter_tensor", "input");
  check_same_dtype(output, input, "reduce_scatter_tensor", "output", "input");
  check_reduce(reduce, output.dtype(), "reduce_scatter_tensor");
  const int size = g.size();
  TANDEM_CHECK(input.numel() == output.numel() * size,
               "[reduce_scatter_tensor] input has {} elements (shape {}), expected {} x output {} = {}", input.numel(),
               input.shape(), size, output.shape(), output.numel() * size);
  return fmt::format("reduce_scatter_tensor({}) {} {}", reduce_op_name(reduce), output.dtype(), output.shape());
}

std::string check_all_to_all(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                             const AllToAllSplits& splits, std::vector<int64_t>& in_splits,
                             std::vector<int64_t>& out_splits) {
  check_tensor(output, "all_to_all", "output");
  check_tensor(input, "all_to_all", "input");
  check_same_dtype(output, input, "all_to_all", "output", "input");
  TANDEM_CHECK(input.dim() >= 1 && output.dim() >= 1, "[all_to_all] input {} and output {} need at least one dim",
               input.shape(), output.shape());
  TANDEM_CHECK(row_shape(input) == row_shape(output),
               "[all_to_all] input {} and output {} must agree beyond dim 0", input.shape(), output.shape());
  const int size = g.size();
  auto check_splits = [&](const std::vector<int64_t>& s, const Tensor& t, const char* what) {
    if (s.empty()) return equal_splits(t.size(0), size, what);
    TANDEM_CHECK(static_cast<int>(s.size()) == size, "[all_to_all] {} splits need one entry per rank ({}), got {}",
                 what, size, s.size());
    int64_t total = 0;
    for (int64_t v : s) {
      TANDEM_CHECK(v >= 0, "[all_to_all] {} splits must be non-negative, got [{}]", what, fmt::join(s, ", "));
      TANDEM_CHECK(!__builtin_add_overflow(total, v, &total),
                   "[all_to_all] {} splits [{}] sum past int64 but the {} has {} rows (shape {})", what,
                   fmt::join(s, ", "), what, t.size(0), t.shape());
    }
    TANDEM_CHECK(total == t.size(0), "[all_to_all] {} splits [{}] sum to {} but the {} has {} rows (shape {})", what,
                 fmt::join(s, ", "), total, what, t.size(0), t.shape());
    return s;
  };
  in_splits = check_splits(splits.input, input, "input");
  out_splits = check_splits(splits.output, output, "output");
  return fmt::format("all_to_all {} rows of {}", input.dtype(), row_shape(input));
}

void check_p2p(const ProcessGroup& g, const char* what, const char* peer_name, const Tensor& tensor, int peer,
               int tag) {
  check_tensor(tensor, what, "tensor");
  TANDEM_CHECK(peer >= 0 && peer < g.size() && peer != g.rank(),
               "[{}] {} {} must be another rank of group {} (size {}, this is rank {})", what, peer_name, peer,
               g.name(), g.size(), g.rank());
  TANDEM_CHECK(tag >= 0 && tag < (1 << 15), "[{}] tag {} must be in [0, 32768)", what, tag);
}


std::string new_group_fingerprint(const std::vector<int>& ranks) {
  return fmt::format("new_group [{}]", join_ranks(ranks));
}

std::string check_new_group(const ProcessGroup& g, const std::vector<int>& ranks) {
  TANDEM_CHECK(!ranks.empty(), "[new_group] needs at least one rank");
  std::set<int> seen;
  for (int r : ranks) {
    TANDEM_CHECK(r >= 0 && r < g.size(), "[new_group] rank {} is not in group {} (size {})", r, g.name(), g.size());
    TANDEM_CHECK(seen.insert(r).second, "[new_group] rank {} is listed twice in [{}]", r, join_ranks(ranks));
  }
  return new_group_fingerprint(ranks);
}

}  // namespace tandem::dist
