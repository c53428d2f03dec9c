# cmake -P tests/cmake/cuda_archs_test.cmake: paratrain_cuda_archs_from_caps (cmake/cuda_archs.cmake)
# turns nvidia-smi's compute capabilities into CMAKE_CUDA_ARCHITECTURES. Fails with a message
# naming the case that went wrong.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/cuda_archs.cmake)

function(expect caps want_archs want_dropped)
  paratrain_cuda_archs_from_caps("${caps}" archs dropped)
  if(NOT "${archs}" STREQUAL "${want_archs}" OR NOT "${dropped}" STREQUAL "${want_dropped}")
    message(FATAL_ERROR "caps '${caps}': got archs '${archs}' dropped '${dropped}', "
      "want '${want_archs}' and '${want_dropped}'")
  endif()
endfunction()

expect("9.0\n" "90" "")
expect("9.0\n9.0\n9.0\n9.0\n" "90" "")                  # eight of one GPU: once
expect("9.0\n8.0\n8.6\n" "80;86;90" "")                 # mixed: sorted
expect(" 8.9 \n12.0\n7.5\n" "75;89;120" "")             # spaces; Blackwell's 12.0 after 8.9
expect("7.0\n6.1\n8.0\n" "80" "61;70")                  # older than sm_75: left out, named
expect("No devices were found\n" "" "")                 # nvidia-smi's text without GPUs
expect("" "" "")
