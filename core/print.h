// PyTorch-style tensor printing, with a seam for the layers above core to append suffixes
// (autograd adds requires_grad=True / grad_fn=<...>) without core depending on them.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

// "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=f64)": data nested by shape,
// summarised with "..." beyond 1000 elements (3 items kept at each edge), then the device (when
// not the CPU), the dtype (when not f32, i64 or bool) and `extra_suffixes`.
std::string format_tensor(const Tensor& t, const std::vector<std::string>& extra_suffixes = {});

// Tensor::str() appends what this provider returns (e.g. "requires_grad=True"); set once at
// start-up by the autograd layer. nullptr clears it.
using StrSuffixProvider = std::vector<std::string> (*)(const Tensor&);
void set_str_suffix_provider(StrSuffixProvider provider);

}  // namespace tandem
