# Checks the sm_75 (Turing) PTX of flash_attention.cu that CudaBuildsForTuring.flash_attention
# writes: the f16 kernels keep their tensor-core bodies there (WMMA on f16 operands), and the
# bf16 ones have none (Turing has no bf16 WMMA). Run as cmake -DPTX=<file> -P this file.
if(NOT EXISTS "${PTX}")
  message(FATAL_ERROR "no PTX at '${PTX}': CudaBuildsForTuring.flash_attention writes it")
endif()
file(STRINGS "${PTX}" f16_mma REGEX "wmma\\.mma\\.sync")
file(STRINGS "${PTX}" f16_loads REGEX "wmma\\.load\\.a\\.sync.*\\.f16")
file(STRINGS "${PTX}" bf16_lines REGEX "bf16")
list(LENGTH f16_mma n_mma)
list(LENGTH f16_loads n_f16)
list(LENGTH bf16_lines n_bf16)
message(STATUS "sm_75 flash PTX: ${n_mma} wmma.mma, ${n_f16} f16 operand loads, ${n_bf16} lines naming bf16")
if(n_mma EQUAL 0 OR n_f16 EQUAL 0)
  message(FATAL_ERROR "the f16 flash kernels have no tensor-core code for sm_75")
endif()
if(NOT n_bf16 EQUAL 0)
  message(FATAL_ERROR "the sm_75 PTX has bf16 code, which Turing cannot run")
endif()
