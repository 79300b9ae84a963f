// CUDA tests: tagged [cuda]; without a usable device they skip at run time and say so.
#pragma once

#include <catch2/catch.hpp>

#include "cuda/runtime.h"

// First line of every CUDA test case.
#define TANDEM_REQUIRE_CUDA_OR_SKIP()                                                               \
  do {                                                                                              \
    if (!::tandem::cuda::is_available()) {                                                          \
      WARN("SKIP: no usable CUDA device (" << ::tandem::cuda::unavailable_reason() << ")");         \
      return;                                                                                       \
    }                                                                                               \
  } while (0)
