// The one entry point core calls (lazily, at the first CUDA tensor): registers the CUDA Backend
// and every op family's kernel table. Each family's .cu file defines its install_* function; the
// explicit calls here also make the linker keep those objects out of the static library.
namespace tandem::cuda {

void install_backend();              // cuda/backend.cpp
void install_elementwise_kernels();  // cuda/elementwise.cu

void install() {
  install_backend();
  install_elementwise_kernels();
}

}  // namespace tandem::cuda
