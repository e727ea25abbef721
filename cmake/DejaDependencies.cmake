# Every dependency comes from a Debian package (scripts/install_deps.sh installs them).
find_package(Threads REQUIRED)
find_package(glog REQUIRED)
find_package(gflags REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(hwy REQUIRED)
# TLS on the public API: certificate and key checks at start-up (gRPC itself links it too).
find_package(OpenSSL REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)

# OpenBLAS is linked explicitly: Debian's generic libblas.so.3 may resolve to the slow reference
# BLAS through alternatives.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas
          PATHS /usr/include/x86_64-linux-gnu /usr/include)
find_library(OPENBLAS_LIBRARY NAMES openblas PATH_SUFFIXES openblas-pthread
             PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/install_deps.sh")
endif()
add_library(deja_openblas INTERFACE)
target_include_directories(deja_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(deja_openblas INTERFACE ${OPENBLAS_LIBRARY})
message(STATUS "OpenBLAS: ${OPENBLAS_LIBRARY}")

if(DEJA_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(DEJA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

set(DEJA_HAVE_CUDA OFF)
if(DEJA_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(DEJA_HAVE_CUDA ON)
  endif()
endif()
message(STATUS "deja CUDA backend: ${DEJA_HAVE_CUDA}")
if(DEJA_HAVE_CUDA)
  include(DejaCuda)
endif()
