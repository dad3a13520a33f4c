# The CUDA backend (src/kernels/cuda/, docs/GPU.md). HYPERION_CUDA:
#   AUTO  on where a CUDA toolkit is found (nvcc on PATH, CUDACXX or /usr/local/cuda)
#   ON    required: configuring fails without a toolkit
#   OFF   never (the sanitizer and fuzz presets: nvcc is not their compiler)
# Sets HYPERION_CUDA_ENABLED. Kernels are compiled for sm_80 (A100) and sm_90 (H100/H200)
# unless CMAKE_CUDA_ARCHITECTURES says otherwise. The backend links the CUDA runtime
# statically and opens cuBLASLt at run time (dlopen), so a binary built with CUDA starts
# on a machine with no GPU and no driver, and reports why the backend is unavailable.
set(HYPERION_CUDA AUTO CACHE STRING "CUDA backend: AUTO (where the toolkit is found), ON or OFF")
set_property(CACHE HYPERION_CUDA PROPERTY STRINGS AUTO ON OFF)
set(HYPERION_CUDA_ENABLED OFF)
if(NOT HYPERION_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(HYPERION_CUDA_ENABLED ON)
    # Read by scripts/check-deps.sh: files under the toolkit come from NVIDIA, not apt.
    get_filename_component(root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    set(HYPERION_CUDA_TOOLKIT_ROOT "${root}" CACHE INTERNAL "the CUDA toolkit's root")
    if(HYPERION_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${HYPERION_LAUNCHER})
    endif()
    message(STATUS "CUDA backend: on (CUDA ${CUDAToolkit_VERSION}, sm ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(HYPERION_CUDA STREQUAL "ON")
    message(FATAL_ERROR "HYPERION_CUDA=ON but no CUDA toolkit was found (set CUDACXX to nvcc, "
                        "or configure with -DHYPERION_CUDA=AUTO or OFF)")
  else()
    unset(HYPERION_CUDA_TOOLKIT_ROOT CACHE)
    message(STATUS "CUDA backend: off (no CUDA toolkit found)")
  endif()
endif()

# Adds the backend's sources to the kernels layer (or the stub that says it is not built).
function(hyperion_add_cuda_backend target)
  set(dir ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/cuda)
  if(NOT HYPERION_CUDA_ENABLED)
    target_sources(${target} PRIVATE ${dir}/cuda_not_built.cc)
    return()
  endif()
  file(GLOB cuda_sources CONFIGURE_DEPENDS ${dir}/*.cu ${dir}/*.cc)
  list(FILTER cuda_sources EXCLUDE REGEX "cuda_not_built\\.cc$")
  target_sources(${target} PRIVATE ${cuda_sources})
  target_link_libraries(${target} PUBLIC CUDA::cudart_static ${CMAKE_DL_LIBS})
  # cuBLASLt's header only: the library is opened at run time (cublaslt_loader.cc).
  target_include_directories(${target} SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  # What the status line reports and where cuBLASLt is looked for: on the two files that
  # use them only, so the rest of the layer's compiler cache does not depend on them.
  string(REPLACE ";" "," archs "${CMAKE_CUDA_ARCHITECTURES}")
  set_source_files_properties(${dir}/cuda_backend.cc ${dir}/cublaslt_gemm.cc PROPERTIES
      COMPILE_DEFINITIONS "HYPERION_CUDA_VERSION=\"${CUDAToolkit_VERSION}\";HYPERION_CUDA_ARCHS=\"${archs}\";HYPERION_CUDA_LIBDIR=\"${CUDAToolkit_LIBRARY_DIR}\"")
  set_property(TARGET ${target} PROPERTY CUDA_STANDARD 17)
  # nvcc: the project's warnings are for the host compiler; device code gets its own.
  target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall -Werror=all-warnings>)
endfunction()
