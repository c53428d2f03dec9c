# Third-party dependencies, all from Debian packages (see docs/dependencies.md).
# Everything private to the library goes through the interface target paratrain_deps.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(ZLIB REQUIRED)

# oneDNN: GEMM and batched GEMM (faster than OpenBLAS on this CPU class; docs/dependencies.md).
find_library(DNNL_LIBRARY NAMES dnnl REQUIRED)
find_path(DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.h REQUIRED)

# sentencepiece: tokenizer training and encoding for `paratrain data prepare`.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)

add_library(paratrain_deps INTERFACE)
target_include_directories(paratrain_deps INTERFACE ${DNNL_INCLUDE_DIR})
target_link_libraries(paratrain_deps INTERFACE
  ${DNNL_LIBRARY} PkgConfig::SENTENCEPIECE nlohmann_json::nlohmann_json CLI11::CLI11
  ZLIB::ZLIB Threads::Threads OpenMP::OpenMP_CXX rt)

set(PARATRAIN_HAVE_MPI OFF)
if(PARATRAIN_WITH_MPI)
  find_package(MPI COMPONENTS C)
  if(MPI_C_FOUND)
    set(PARATRAIN_HAVE_MPI ON)
    target_link_libraries(paratrain_deps INTERFACE MPI::MPI_C)
    target_compile_definitions(paratrain_deps INTERFACE PARATRAIN_HAVE_MPI=1)
  endif()
endif()
