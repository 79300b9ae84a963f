// The CUDA backend library's entry point (see core/backend.h): core calls it once, when a CUDA
// device is first asked for. It lives with the nccl group because the library holds two backends
// and only this layer sees both: core's CUDA backend (cuda/) and dist's "nccl" process group.
#include "core/backend.h"
#include "cuda/runtime.h"
#include "dist/nccl/nccl.h"

extern "C" void tandem_cuda_backend_install();  // exported: core looks it up by name

extern "C" void tandem_cuda_backend_install() {
  tandem::cuda::install();
#ifdef TANDEM_WITH_NCCL
  tandem::dist::register_backend("nccl", tandem::dist::make_nccl_world, tandem::dist::nccl_available);
#endif
}
