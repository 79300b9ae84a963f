#include "dist/detail/host_staging.h"

#include "core/backend.h"

namespace tandem::dist {

void sync_device_tensors(const Op& op) {
  for (const TensorList* list : {&op.inputs, &op.outputs}) {
    for (const Tensor& t : *list)
      if (!t.is_cpu()) backend_for(t.device(), "dist").synchronize(t.device());
  }
}

HostStaging::HostStaging(Op& op) {
  for (TensorList* list : {&op.inputs, &op.outputs}) {
    for (Tensor& t : *list) {
      if (t.is_cpu()) continue;
      Backend& backend = backend_for(t.device(), "dist");
      Tensor host = backend.host_staging(t);
      backend.copy_bytes(host.data_ptr(), kCPU, t.data_ptr(), t.device(), t.nbytes());
      staged_.emplace_back(&t, t);
      t = host;
    }
  }
}

void HostStaging::finish() {
  for (auto& [slot, dev] : staged_) {
    const Tensor& host = *slot;
    backend_for(dev.device(), "dist").copy_bytes(dev.data_ptr(), dev.device(), host.data_ptr(), kCPU, host.nbytes());
    *slot = dev;
  }
  staged_.clear();
}

}  // namespace tandem::dist
