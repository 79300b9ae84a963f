// Portability macros shared by the CPU and CUDA compilers.
#pragma once

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

#define TANDEM_INLINE inline __attribute__((always_inline))
