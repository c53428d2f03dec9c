# CUDA support: -DPARATRAIN_CUDA=auto|on|off (default auto).
#   auto: build the CUDA parts when a CUDA compiler, the CUDA runtime, cuBLAS(Lt) and NCCL
#         are found (the toolkit's default place is /usr/local/cuda); otherwise build without.
#   on:   the same, but a missing piece is a configure error.
#   off:  never.
# The CUDA parts are the files under src/<layer>/**/cuda/ (and src/comm/backends/nccl/):
# *.cu files compiled by nvcc, *.cpp files that use the CUDA runtime API, compiled by the
# C++ compiler. They compile and link wherever the toolkit is, with or without a GPU; a
# program finds the GPUs at run time (paratrain::cuda::device_count()).
# CMAKE_CUDA_ARCHITECTURES (or CMake's CUDAARCHS environment variable) picks the GPUs to build
# for, e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90"; by default those of this machine's GPUs
# (nvidia-smi), else 90 (H100/H200). sm_75 (Turing) is the oldest paratrain builds for.
set(PARATRAIN_CUDA auto CACHE STRING "Build the CUDA parts: auto|on|off")
set_property(CACHE PARATRAIN_CUDA PROPERTY STRINGS auto on off)
string(TOLOWER "${PARATRAIN_CUDA}" PARATRAIN_CUDA_MODE)
if(NOT PARATRAIN_CUDA_MODE MATCHES "^(auto|on|off)$")
  message(FATAL_ERROR "PARATRAIN_CUDA=${PARATRAIN_CUDA}: use auto, on or off")
endif()

set(PARATRAIN_HAVE_CUDA OFF)
if(NOT PARATRAIN_CUDA_MODE STREQUAL "off")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(paratrain_cuda_missing "")
  if(CMAKE_CUDA_COMPILER)
    # The user's (-DCMAKE_CUDA_ARCHITECTURES, or CMake's CUDAARCHS environment variable), else
    # this machine's GPUs', else 90 (cmake/cuda_archs.cmake).
    if(DEFINED CMAKE_CUDA_ARCHITECTURES OR DEFINED ENV{CUDAARCHS})
      set(paratrain_archs_why "as asked")
    else()
      include(${CMAKE_CURRENT_LIST_DIR}/cuda_archs.cmake)
      paratrain_default_cuda_archs(CMAKE_CUDA_ARCHITECTURES paratrain_archs_why)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublasLt OR NOT TARGET CUDA::cublas)
      list(APPEND paratrain_cuda_missing "the CUDA runtime and cuBLAS(Lt)")
    endif()
    # NCCL: beside the toolkit, in the system's folders, or under NCCL_ROOT (a cache variable
    # or the environment's; PyTorch's wheel nvidia-nccl ships include/ and lib/libnccl.so.2).
    set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "where NCCL is (include/nccl.h, lib/libnccl.so*)")
    find_path(NCCL_INCLUDE_DIR NAMES nccl.h HINTS ${NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS}
      ${CUDAToolkit_LIBRARY_ROOT}/include)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR}
      ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      list(APPEND paratrain_cuda_missing "NCCL (nccl.h, libnccl)")
    endif()
  else()
    list(APPEND paratrain_cuda_missing "a CUDA compiler (nvcc)")
  endif()
  if(paratrain_cuda_missing)
    string(JOIN ", " paratrain_cuda_missing_text ${paratrain_cuda_missing})
    if(PARATRAIN_CUDA_MODE STREQUAL "on")
      message(FATAL_ERROR "PARATRAIN_CUDA=on but not found: ${paratrain_cuda_missing_text}")
    endif()
    message(STATUS "paratrain: building without CUDA (not found: ${paratrain_cuda_missing_text})")
  else()
    set(PARATRAIN_HAVE_CUDA ON)
    # C++20 in device code. CMake 3.25 knows nvcc's dialect flags only up to C++17; nvcc 12+
    # takes -std=c++20.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    add_library(paratrain_cuda_deps INTERFACE)
    target_include_directories(paratrain_cuda_deps INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(paratrain_cuda_deps INTERFACE CUDA::cudart CUDA::cublasLt CUDA::cublas ${NCCL_LIBRARY})
    target_compile_definitions(paratrain_cuda_deps INTERFACE PARATRAIN_HAVE_CUDA=1)
    target_link_libraries(paratrain_deps INTERFACE paratrain_cuda_deps)
    message(STATUS "paratrain: building the CUDA parts (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
      "architectures ${CMAKE_CUDA_ARCHITECTURES}: ${paratrain_archs_why}; NCCL ${NCCL_LIBRARY})")
    # The architectures as text, for the message of a GPU this build has no code for
    # (src/tensor/cuda/kernel_image.cu).
    string(REPLACE ";" "," paratrain_archs_text "${CMAKE_CUDA_ARCHITECTURES}")
    set_source_files_properties(${PROJECT_SOURCE_DIR}/src/tensor/cuda/kernel_image.cu PROPERTIES
      COMPILE_DEFINITIONS "PARATRAIN_CUDA_ARCHITECTURES=\"${paratrain_archs_text}\"")
  endif()
endif()
