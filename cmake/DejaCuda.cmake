# The CUDA toolchain of the CUDA backend, included from DejaDependencies.cmake (top-level scope,
# so every target that links CUDA objects sees the language) when DEJA_HAVE_CUDA is on.
# Architectures: sm_80 (A100) and sm_90 (H100), SASS plus PTX for each; override with
# -DCMAKE_CUDA_ARCHITECTURES=... for a faster single-architecture build.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# One CUDA runtime in the process: the shared one CUDA::cudart names, also for nvcc's objects.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
message(STATUS "CUDA ${CUDAToolkit_VERSION}: architectures ${CMAKE_CUDA_ARCHITECTURES}")
