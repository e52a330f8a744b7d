# Finds what the build needs. Everything here is installed by scripts/setup.sh (Debian packages
# and pinned PyPI wheels); nothing is downloaded at configure time.
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)

# OpenBLAS: only the benchmark's sgemm comparison uses it.
find_library(OPENBLAS_LIB NAMES openblas)
find_path(OPENBLAS_INCLUDE NAMES cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread)
if(OPENBLAS_LIB AND OPENBLAS_INCLUDE)
  add_library(moe_openblas INTERFACE)
  target_link_libraries(moe_openblas INTERFACE ${OPENBLAS_LIB})
  target_include_directories(moe_openblas INTERFACE ${OPENBLAS_INCLUDE})
  message(STATUS "moe_ep: OpenBLAS ${OPENBLAS_LIB}")
endif()

# ---------------------------------------------------------------------------------------------
# CUDA (optional): nvcc builds every kernel even where no GPU is present.
set(MOE_EP_WITH_CUDA OFF)
if(NOT MOE_EP_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_nvcc nvcc PATHS /usr/local/cuda/bin)
    if(_nvcc)
      set(CMAKE_CUDA_COMPILER ${_nvcc})
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MOE_EP_WITH_CUDA ON)
  elseif(MOE_EP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOE_EP_CUDA=ON but nvcc was not found")
  endif()
endif()

if(MOE_EP_WITH_CUDA)
  # Hopper machine code (sm_90a: wgmma, TMA) and its PTX.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -gencode arch=compute_90a,code=[sm_90a,compute_90a]")
  enable_language(CUDA)
  # Older CMake (3.25 here) knows no CUDA20 dialect flag for nvcc 13: name it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)

  # NCCL >= 2.28 (device API): the toolkit, NCCL_ROOT, or the Python nvidia/nccl package.
  set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  execute_process(
    COMMAND python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])"
    OUTPUT_VARIABLE _py_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_py_nccl)
    list(APPEND _nccl_hints ${_py_nccl})
  endif()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
  # The library beside those headers first. The device API (ncclDevComm, LSA barriers) is
  # compiled into our kernels from the headers, so the library must be the same NCCL: a search
  # by name alone found a system libnccl.so (2.28.3, /usr/lib) on the H200 machines while the
  # headers came from the Python wheel (2.28.9), and the first LSA barrier faulted unless
  # LD_LIBRARY_PATH named the wheel's folder (docs/protocol.md §1).
  get_filename_component(_nccl_root "${NCCL_INCLUDE_DIR}" DIRECTORY)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_root}
               PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_nccl_hints}
               PATH_SUFFIXES lib lib64)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    message(FATAL_ERROR "moe_ep: NCCL not found (set NCCL_ROOT)")
  endif()
  add_library(moe_nccl INTERFACE)
  target_include_directories(moe_nccl INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(moe_nccl INTERFACE ${NCCL_LIBRARY})
  # And that library at run time without LD_LIBRARY_PATH: the wheel ships only libnccl.so.2, so
  # name its folder in the run path of everything linked against it.
  get_filename_component(_nccl_libdir "${NCCL_LIBRARY}" DIRECTORY)
  target_link_options(moe_nccl INTERFACE "LINKER:-rpath,${_nccl_libdir}")
  message(STATUS "moe_ep: NCCL ${NCCL_LIBRARY} (headers ${NCCL_INCLUDE_DIR})")

  # CUTLASS / CuTe headers from the pinned nvidia-cutlass wheel (copied to .deps/cutlass by
  # scripts/setup.sh so they can travel to the GPU machine): the wgmma kernels issue CuTe's SM90
  # GMMA atoms.
  find_path(CUTLASS_INCLUDE_DIR cute/arch/mma_sm90_gmma.hpp
            HINTS ${CUTLASS_DIR} $ENV{CUTLASS_DIR} ${CMAKE_SOURCE_DIR}/.deps/cutlass/include)
  if(NOT CUTLASS_INCLUDE_DIR)
    message(FATAL_ERROR "moe_ep: CUTLASS / CuTe headers not found (run scripts/setup.sh, or set "
                        "CUTLASS_DIR to the folder holding cute/)")
  endif()
  add_library(moe_cutlass INTERFACE)
  target_include_directories(moe_cutlass SYSTEM INTERFACE ${CUTLASS_INCLUDE_DIR})
  message(STATUS "moe_ep: CUTLASS ${CUTLASS_INCLUDE_DIR}")
endif()
message(STATUS "moe_ep: CUDA backend ${MOE_EP_WITH_CUDA}")
