#include "dist/ddp/comm_hooks.h"

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::dist {

Tensor GradBucket::gradient(size_t i) const {
  TANDEM_CHECK(i < parameters.size(), "[GradBucket] parameter {} out of range ({} in bucket {})", i, parameters.size(),
               index);
  return buffer.narrow(0, offsets[i], lengths[i]).view(parameters[i].shape());
}

namespace hooks {

namespace {

void require_group(const GradBucket& bucket, const char* hook) {
  TANDEM_CHECK(bucket.group != nullptr, "[{}] bucket {} has no process group", hook, bucket.index);
  TANDEM_CHECK(bucket.buffer.defined(), "[{}] bucket {} has no buffer", hook, bucket.index);
}

// The compressed copy is reduced on the comm thread; its result is cast back into the bucket's
// own buffer by a continuation, so the reducer's "copy the result in" is a no-op. On a device the
// cast runs on the group's step stream (the continuation runs on the watchdog thread, whose
// current stream is nobody's), which DDP joins at the end of backward.
WorkPtr compress(GradBucket& bucket, Dtype dtype, const CommHook* inner, const char* name) {
  require_group(bucket, name);
  TANDEM_CHECK(dtype == f16 || dtype == bf16, "[{}] can compress to f16 or bf16, not {}", name, dtype);
  TANDEM_CHECK(is_floating(bucket.buffer.dtype()), "[{}] bucket {} holds {} gradients, not floating point", name,
               bucket.index, bucket.buffer.dtype());
  NoGradGuard no_grad;
  Tensor original = bucket.buffer;
  GradBucket compressed = bucket;
  compressed.buffer = original.to(dtype);
  WorkPtr work = inner ? (*inner)(compressed) : allreduce(compressed);
  ProcessGroup* group = bucket.group;  // outlives the Work: DDP waits for its buckets
  return work->then([original, group](Work& w) {
    const Tensor reduced = w.result().at(0);
    group->run_on_step_stream([&] {
      NoGradGuard guard;
      original.copy_(reduced);
      return TensorList{original, reduced};
    });
    return TensorList{original};
  });
}

}  // namespace

WorkPtr allreduce(GradBucket& bucket) {
  require_group(bucket, "allreduce_hook");
  NoGradGuard no_grad;
  if (bucket.group->size() > 1) bucket.buffer.div_(bucket.group->size());
  return bucket.group->allreduce(bucket.buffer, ReduceOp::sum);
}

WorkPtr fp16_compress(GradBucket& bucket) { return compress(bucket, f16, nullptr, "fp16_compress_hook"); }
WorkPtr bf16_compress(GradBucket& bucket) { return compress(bucket, bf16, nullptr, "bf16_compress_hook"); }

CommHook compress_wrapper(Dtype dtype, CommHook inner) {
  TANDEM_CHECK(static_cast<bool>(inner), "[compress_wrapper] the wrapped hook is empty");
  TANDEM_CHECK(dtype == f16 || dtype == bf16, "[compress_wrapper] can compress to f16 or bf16, not {}", dtype);
  return [dtype, inner = std::move(inner)](GradBucket& bucket) {
    return compress(bucket, dtype, &inner, "compress_wrapper");
  };
}

}  // namespace hooks

}  // namespace tandem::dist
