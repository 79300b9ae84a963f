// DDP's native mixed precision: every managed parameter keeps its f32 master; before each forward
// in grad mode a low-precision shadow is filled from it and the parameter handle is pointed at
// the shadow (the layers keep their Tensor members and compute in param_dtype); at the end of
// the backward the handle points at the master again and the gradient lands, in the master's
// dtype, in the master's .grad. Outside a forward-backward pair parameters read as masters.
//
// The swap changes the storage, strides and dtype inside the parameter's TensorImpl, which every
// handle to it shares; autograd metadata (hooks, .grad) stays with the impl. The master's
// gradient is set aside during the pair (the low-precision backward accumulates into a .grad of
// the shadow's dtype) and comes back with this backward's contribution added: reduced across
// ranks after a synchronised backward, accumulated locally after a no_sync one.
#pragma once

#include <optional>

#include "core/dtype.h"
#include "core/tensor.h"

namespace tandem::dist {

struct MixedPrecision {
  std::optional<Dtype> param_dtype;   // f16 or bf16: forward and backward compute in it
  std::optional<Dtype> reduce_dtype;  // buckets are reduced in it; unset: param_dtype
  std::optional<Dtype> buffer_dtype;  // buffers are cast to it once, at construction; unset: left alone
};

// Points t's impl (shared by every handle to it) at a copy of its data in `dtype`: how buffers
// come to live in buffer_dtype.
void cast_in_place(const Tensor& t, Dtype dtype);

}  // namespace tandem::dist
