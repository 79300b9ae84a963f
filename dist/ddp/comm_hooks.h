// Communication hooks: how DDP reduces one bucket of gradients. A hook receives the bucket (its
// flat buffer, the parameters in it and their offsets) and returns a Work whose first result is
// the reduced buffer; the reducer copies that result into the bucket (nothing to copy when the
// hook reduced the bucket's own buffer in place). The built-ins follow torch.distributed's
// default_hooks: allreduce (the default), fp16/bf16 compression, and a compressing wrapper.
#pragma once

#include <functional>
#include <vector>

#include "dist/process_group.h"

namespace tandem::dist {

struct GradBucket {
  int index = 0;                  // position in launch order (0 is reduced first)
  bool is_last = false;           // the last bucket of the iteration
  Tensor buffer;                  // flat, one dtype and device; the parameters' gradients, concatenated
  std::vector<Tensor> parameters; // the parameters whose gradients are in buffer
  std::vector<int64_t> offsets;   // element offset of each parameter's gradient in buffer
  std::vector<int64_t> lengths;   // its element count
  ProcessGroup* group = nullptr;  // the group DDP reduces over

  // Parameter i's gradient as a view of the buffer, shaped like the parameter.
  Tensor gradient(size_t i) const;
};

using CommHook = std::function<WorkPtr(GradBucket& bucket)>;

namespace hooks {

// Divides the buffer by the group size, then sums it in place across ranks (divide first, so
// low-precision buffers do not overflow). What DDP does without a hook.
WorkPtr allreduce(GradBucket& bucket);
// Casts the buffer to f16 / bf16, divides, sums, and casts the result back into the buffer.
WorkPtr fp16_compress(GradBucket& bucket);
WorkPtr bf16_compress(GradBucket& bucket);
// Runs `inner` on a copy of the bucket compressed to `dtype` (f16 or bf16), then decompresses
// its result into the original buffer.
CommHook compress_wrapper(Dtype dtype, CommHook inner);

}  // namespace hooks

}  // namespace tandem::dist
