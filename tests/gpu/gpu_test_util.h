// For tests/gpu: PT_REQUIRE_GPU() skips the test with "no CUDA GPU: <why>" where this process
// sees no GPU (ctest reports it skipped); elsewhere the test runs on cuda:0.
#pragma once

#include <gtest/gtest.h>

#include "paratrain/tensor/cuda.h"

#define PT_REQUIRE_GPU()                                                              \
  do {                                                                                \
    if (::paratrain::cuda::device_count() == 0)                                       \
      GTEST_SKIP() << "no CUDA GPU: " << ::paratrain::cuda::unavailable_reason();     \
    ::paratrain::cuda::set_device(0);                                                 \
  } while (0)
