# Tandem_NCCL::nccl: NCCL as an imported target, found the same way when Tandem is built and when
# an installed (static) Tandem is used, so the exported package names the target, not a path.
# NCCL ships with the CUDA toolkit here (/usr/local/cuda/lib), outside CUDAToolkit's own dirs.
if(NOT TARGET Tandem_NCCL::nccl)
  find_library(TANDEM_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib /usr/local/cuda/lib64)
  find_path(TANDEM_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(TANDEM_NCCL_LIBRARY AND TANDEM_NCCL_INCLUDE_DIR)
    add_library(Tandem_NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(Tandem_NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${TANDEM_NCCL_LIBRARY}" INTERFACE_INCLUDE_DIRECTORIES "${TANDEM_NCCL_INCLUDE_DIR}")
  endif()
endif()
