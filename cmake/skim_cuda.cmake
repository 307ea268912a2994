# skim::cuda — the CUDA parts of skim (include <skim/cuda.cuh>): skim::skim plus the CUDA
# runtime. Included from the top-level CMakeLists.txt only when SKIM_ENABLE_CUDA is on.
#
# No CUDA architectures and no flags beyond the language standard are set here: the engine
# that links skim::cuda chooses CMAKE_CUDA_ARCHITECTURES (skim's own compile check sets
# them on its test target only).
include_guard(GLOBAL)

if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# nvcc's host compiler must understand C++20: use the C++ compiler skim is built with.
if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
endif()
# Without CMAKE_CUDA_ARCHITECTURES, CMake uses nvcc's default architecture; targets that
# must build for specific GPUs set CUDA_ARCHITECTURES themselves.
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

add_library(skim_cuda INTERFACE)
add_library(skim::cuda ALIAS skim_cuda)
set_target_properties(skim_cuda PROPERTIES EXPORT_NAME cuda)
target_link_libraries(skim_cuda INTERFACE skim::skim CUDA::cudart)
# C++20 in device code. CMake < 3.26 does not know cuda_std_20 for nvcc 12+, so say it directly.
if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
  target_compile_features(skim_cuda INTERFACE cuda_std_20)
else()
  target_compile_options(skim_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
endif()
