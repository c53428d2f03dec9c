# The CUDA architectures to build for when the user names none (cmake/cuda.cmake).
#
# paratrain_cuda_archs_from_caps(CAPS OUT DROPPED): CAPS is what
#   `nvidia-smi --query-gpu=compute_cap --format=csv,noheader` prints, one "major.minor" per GPU
#   ("9.0\n8.0\n9.0"); OUT gets the architectures of those GPUs as CMAKE_CUDA_ARCHITECTURES
#   takes them, sorted, each once ("80;90"), leaving out those below sm_75 (the oldest that nvcc
#   13 compiles for and that paratrain's kernels take), which DROPPED gets. Lines that are not
#   "major.minor" (an error text) are ignored.
# paratrain_default_cuda_archs(OUT WHY): the architectures of this machine's GPUs (nvidia-smi),
#   else 90 (H100/H200); WHY says which, for the configure message.
set(PARATRAIN_CUDA_OLDEST_ARCH 75)

function(paratrain_cuda_archs_from_caps caps out dropped)
  string(REPLACE "\n" ";" lines "${caps}")
  set(archs "")
  set(old "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line MATCHES "^([0-9]+)\\.([0-9])$")
      math(EXPR arch "${CMAKE_MATCH_1} * 10 + ${CMAKE_MATCH_2}")
      if(arch LESS PARATRAIN_CUDA_OLDEST_ARCH)
        list(APPEND old ${arch})
      else()
        list(APPEND archs ${arch})
      endif()
    endif()
  endforeach()
  foreach(v archs old)
    if(NOT "${${v}}" STREQUAL "")
      list(REMOVE_DUPLICATES ${v})
      list(SORT ${v} COMPARE NATURAL)
    endif()
  endforeach()
  set(${out} "${archs}" PARENT_SCOPE)
  set(${dropped} "${old}" PARENT_SCOPE)
endfunction()

function(paratrain_default_cuda_archs out why)
  set(archs "")
  find_program(PARATRAIN_NVIDIA_SMI nvidia-smi)
  if(PARATRAIN_NVIDIA_SMI)
    execute_process(COMMAND ${PARATRAIN_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
      OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0)
      paratrain_cuda_archs_from_caps("${caps}" archs dropped)
      if(dropped)
        message(WARNING "paratrain: this machine's GPUs of CUDA architectures ${dropped} are older than "
          "sm_${PARATRAIN_CUDA_OLDEST_ARCH}, which paratrain needs; they are left out")
      endif()
    endif()
  endif()
  if(archs)
    set(${out} "${archs}" PARENT_SCOPE)
    set(${why} "this machine's GPUs (nvidia-smi)" PARENT_SCOPE)
  else()
    set(${out} 90 PARENT_SCOPE)
    set(${why} "no GPU seen here, so H100/H200's" PARENT_SCOPE)
  endif()
endfunction()
