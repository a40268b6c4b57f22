# The ROCm build of src/cuda (HETRA_WITH_ROCM): codec_kernels.cu and staging.cc compiled as HIP by
# clang, the compiler hipcc wraps, which the build must use as its C++ compiler
# (-DCMAKE_CXX_COMPILER=clang++-15 on Debian 12, whose hipcc 5.2 runs that clang).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "HETRA_WITH_ROCM=ON compiles HIP with clang: configure with "
                      "-DCMAKE_CXX_COMPILER=<the clang++ that hipcc uses> (hipconfig --hipclangpath), "
                      "not ${CMAKE_CXX_COMPILER_ID}")
endif()
find_package(hip REQUIRED CONFIG)  # hip::host: the runtime's headers and libamdhip64
# The device libraries (ocml, ockl) that clang links into the kernels, and the ROCm root clang
# takes the HIP headers from; both where hipcc finds them (Debian: /usr), or under /opt/rocm.
find_path(HETRA_HIP_DEVICE_LIBS ocml.bc
          PATHS ${HIP_ROOT_DIR}/amdgcn/bitcode /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode
                /usr/lib/amdgcn/bitcode /opt/rocm/amdgcn/bitcode
          NO_DEFAULT_PATH)
if(NOT HETRA_HIP_DEVICE_LIBS)
  message(FATAL_ERROR "HETRA_WITH_ROCM=ON: the ROCm device libraries (ocml.bc) were not found; "
                      "install rocm-device-libs")
endif()
get_filename_component(HETRA_ROCM_PATH "${hip_INCLUDE_DIR}/.." ABSOLUTE)
# GPU generations: MI100 (gfx908), MI200 (gfx90a), RDNA2 workstations (gfx1030). MI300 (gfx942)
# and RDNA3 (gfx1100) need newer device libraries than Debian 12's ROCm 5.2; add them to
# HETRA_HIP_ARCHITECTURES where the installed ROCm has them.
set(HETRA_HIP_ARCHITECTURES "gfx908;gfx90a;gfx1030" CACHE STRING "AMD GPU architectures")
set(hetra_hip_options -xhip --rocm-path=${HETRA_ROCM_PATH} --hip-device-lib-path=${HETRA_HIP_DEVICE_LIBS}
    # Bit identity with the CPU codecs, as the CUDA flags: no contraction, subnormals kept.
    -ffp-contract=off -fno-gpu-flush-denormals-to-zero -fno-gpu-rdc)
foreach(arch ${HETRA_HIP_ARCHITECTURES})
  list(APPEND hetra_hip_options --offload-arch=${arch})
endforeach()
message(STATUS "HIP: ${hip_VERSION}, device libraries ${HETRA_HIP_DEVICE_LIBS}, architectures "
               "${HETRA_HIP_ARCHITECTURES}")

add_library(hetra_rocm codec_kernels.cu staging.cc)
set_source_files_properties(codec_kernels.cu staging.cc PROPERTIES LANGUAGE CXX
                            COMPILE_OPTIONS "${hetra_hip_options}")
target_compile_definitions(hetra_rocm PUBLIC HETRA_HIP)
target_link_libraries(hetra_rocm PUBLIC hetra_comm hetra_store hetra_common hip::host
                      PRIVATE hetra_warnings)

# RCCL (NCCL's API for AMD GPUs) is not packaged for Debian 12: no RCCL transport is built, and
# the NCCL transport's code has not been compiled against RCCL's headers.
find_path(HETRA_RCCL_INCLUDE_DIR rccl/rccl.h PATHS /opt/rocm/include)
if(HETRA_RCCL_INCLUDE_DIR)
  message(STATUS "RCCL headers found at ${HETRA_RCCL_INCLUDE_DIR}: hetra has no RCCL transport "
                 "yet (nccl_transport.cc is CUDA-only)")
else()
  message(STATUS "RCCL: not found; no RCCL transport")
endif()
