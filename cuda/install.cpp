// Registers the CUDA Backend and every op family's kernel table (see cuda/runtime.h). Each
// family's .cu file defines its install_* function; the explicit calls here also make the linker
// keep those objects when the library is static.
#include "cuda/runtime.h"

namespace tandem::cuda {

void install_backend();              // cuda/backend.cpp
void install_elementwise_kernels();  // cuda/elementwise.cu
void install_matmul_kernels();       // cuda/matmul.cu
void install_optim_kernels();        // cuda/optim.cu
void install_reduce_kernels();       // cuda/reduce.cu
void install_nn_kernels();           // cuda/nn_ops.cu
void install_index_kernels();        // cuda/index.cu
void install_random_kernels();       // cuda/random.cu
void install_creation_kernels();     // cuda/creation.cu
void install_conv_kernels();         // cuda/conv.cu
void install_pool_kernels();         // cuda/pool.cu
void install_topk_kernels();         // cuda/topk.cu
void install_triangle_kernels();     // cuda/triangle.cu
void install_attention_kernels();    // cuda/attention.cu

void install() {
  install_backend();
  install_elementwise_kernels();
  install_matmul_kernels();
  install_optim_kernels();
  install_reduce_kernels();
  install_nn_kernels();
  install_index_kernels();
  install_random_kernels();
  install_creation_kernels();
  install_conv_kernels();
  install_pool_kernels();
  install_topk_kernels();
  install_triangle_kernels();
  install_attention_kernels();
}

}  // namespace tandem::cuda
