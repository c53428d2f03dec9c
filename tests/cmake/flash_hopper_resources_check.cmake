# The flash attention kernels' registers and local memory on Hopper (sm_90), from ptxas: what
# decides how many blocks an SM runs, and whether a kernel spills registers to local memory. A
# change in a shared header can cost a kernel registers without changing a result (an int where
# an unsigned was made the bf16 dQ kernel for head size 64 spill 20 bytes), so no test of values
# notices; this one does. Run as
#   cmake -DNVCC=<nvcc> -DINCLUDES="<dir>|<dir>" -DSOURCES="<.cu>|<.cu>" -DOUT=<dir> -P this file
# (lists joined with |, which passes through add_test unchanged where ; would not)
# It compiles each source's device code alone (-cubin, a few seconds a file), prints every
# kernel's figures, and fails where
#   - a tensor-core flash kernel on bf16 (the default precision's), any head size, spills or has
#     a stack frame (an array that is not unrolled into registers lives in local memory);
#   - an f32-arithmetic flash kernel on bf16 buffers (`tiles` for bf16), any head size, does;
#   - the tensor-core bf16 forward for head size 64 (gpt2-124m's) uses more than 128 registers:
#     4 blocks of 128 threads an SM, which docs/cuda.md's figures assume.
foreach(var NVCC INCLUDES SOURCES OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "flash_hopper_resources_check.cmake needs -D${var}=...")
  endif()
endforeach()

string(REPLACE "|" ";" INCLUDES "${INCLUDES}")
string(REPLACE "|" ";" SOURCES "${SOURCES}")
set(include_flags "")
foreach(dir ${INCLUDES})
  list(APPEND include_flags "-I${dir}")
endforeach()

set(failures "")
foreach(src ${SOURCES})
  get_filename_component(name ${src} NAME_WE)
  execute_process(
    COMMAND ${NVCC} -std=c++20 --expt-relaxed-constexpr --extended-lambda -DPARATRAIN_HAVE_CUDA=1 -O3 -DNDEBUG
      ${include_flags} --generate-code=arch=compute_90,code=sm_90 -cubin -Xptxas -v ${src}
      -o ${OUT}/${name}.sm_90.cubin
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nvcc could not compile ${src} for sm_90:\n${out}${log}")
  endif()
  # ptxas: "Compiling entry function '<mangled>' for 'sm_90'", then the function's
  # "N bytes stack frame, S bytes spill stores, L bytes spill loads", then "Used R registers".
  string(REPLACE "\n" ";" lines "${log}")
  set(kernel "")
  set(spill 0)
  set(stack 0)
  set(count 0)
  set(bf16_count 0)
  foreach(line ${lines})
    if(line MATCHES "Compiling entry function '([^']+)'")
      set(kernel "${CMAKE_MATCH_1}")
    elseif(line MATCHES "([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads"
           AND kernel)
      set(stack ${CMAKE_MATCH_1})
      math(EXPR spill "${CMAKE_MATCH_2} + ${CMAKE_MATCH_3}")
    elseif(line MATCHES "Used ([0-9]+) registers" AND kernel)
      set(regs ${CMAKE_MATCH_1})
      # A readable name: the kernel, its head size and its element type.
      set(label "${kernel}")
      if(kernel MATCHES "([a-z_]+_kernel)ILi([0-9]+)E(6__half|13__nv_bfloat16|NS1_6detail4ElemILNS_5DTypeE([0-9])E)")
        set(dtype "${CMAKE_MATCH_3}")
        if(dtype STREQUAL "6__half" OR CMAKE_MATCH_4 STREQUAL "2")
          set(dtype f16)
        elseif(dtype STREQUAL "13__nv_bfloat16" OR CMAKE_MATCH_4 STREQUAL "1")
          set(dtype bf16)
        else()
          set(dtype f32)
        endif()
        set(label "${name} ${CMAKE_MATCH_1}<${CMAKE_MATCH_2}, ${dtype}>")
        set(head_size ${CMAKE_MATCH_2})
        set(kernel_name ${CMAKE_MATCH_1})
      else()
        set(dtype "")
        set(kernel_name "")
      endif()
      message(STATUS "${label}: ${regs} registers, ${spill} bytes spilled (stores + loads), ${stack} bytes of stack")
      math(EXPR count "${count} + 1")
      if(dtype STREQUAL "bf16" AND NOT kernel_name STREQUAL "rowdot_kernel")
        math(EXPR bf16_count "${bf16_count} + 1")
      endif()
      if(dtype STREQUAL "bf16" AND (spill GREATER 0 OR stack GREATER 0))
        list(APPEND failures
          "${label} spills ${spill} bytes (stores + loads) and has ${stack} bytes of stack at ${regs} registers")
      endif()
      if(name STREQUAL "flash_attention" AND dtype STREQUAL "bf16" AND kernel_name STREQUAL "flash_forward_kernel"
         AND head_size EQUAL 64 AND regs GREATER 128)
        list(APPEND failures "${label} uses ${regs} registers: more than 128, fewer than 4 blocks an SM")
      endif()
      set(kernel "")
      set(spill 0)
      set(stack 0)
    endif()
  endforeach()
  # Three kernels (forward, backward keys, backward queries) for each of three head sizes: a
  # rename that the pattern above misses must not leave the checks with nothing to check.
  if(bf16_count LESS 9)
    message(FATAL_ERROR "ptxas reported ${bf16_count} bf16 flash kernels of ${src} (of ${count} kernels), "
      "expected 9: does the name pattern of this check still match them?\n${log}")
  endif()
endforeach()

if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "flash kernels on sm_90:\n  ${text}")
endif()
