# The modules that need LibTorch, one static library per folder sharing one
# precompiled header for <torch/torch.h> (a TU including it costs ~20 s
# without, ~2 s with):
#   src/model   Llama, the quantized linear layer, recipes bound to layers
#               (quantizers.cpp; the LibTorch-free recipe registry is
#               snip_recipes, src/recipes/CMakeLists.txt), Hugging Face I/O
#   src/dist    several ranks: the world, c10d Gloo (process_group.cpp only),
#               the bucketed gradient all-reduce, weight checksums
#   src/method  the stats step, the precision controller
#   src/train   the training step, the loop, checkpoints, optimizer
#   src/app     what the commands do: the correlation study, the experiment,
#               planning, the doctor, eval/export/sample, formats/quantize
# Layering (an include only points down; tests/layering/check_layers.py
# checks it, and docs/architecture.md draws it): app -> train -> method ->
# dist -> model.
# One static library per folder, each linking only the one below it (and
# the LibTorch-free libraries), so an upward call does not link: snip_model
# <- snip_dist <- snip_method <- snip_train <- snip_app. snip_model owns the
# precompiled header; the others reuse it. snip_torch is all of them, for
# the programs and tests.
find_library(SNIP_OPENBLAS_LIBRARY openblas REQUIRED)  # the FP32 GEMMs of src/model/blas.cpp
function(snip_torch_library name folder)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${folder}/*.cpp)
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${ARGN})
  # Position-independent: the Python package's shared library (src/python) links them.
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(name STREQUAL "snip_model")
    target_precompile_headers(${name} PRIVATE <torch/torch.h> <nlohmann/json.hpp>)
  else()
    target_precompile_headers(${name} REUSE_FROM snip_model)
  endif()
endfunction()
# Not snip_data: SentencePiece must stay out of LibTorch processes (src/data/CMakeLists.txt).
set(SNIP_TORCH_BELOW)
foreach(dep snip_formats snip_recipes snip_io snip_tokens snip_plan snip_report snip_config snip_hw snip_run snip_monitor)
  if(TARGET ${dep})
    list(APPEND SNIP_TORCH_BELOW ${dep})
  endif()
endforeach()
# A program (or the Python operators' library) made of LibTorch TUs reuses
# snip_model's precompiled header; GCC uses a header only under the -fPIC it
# was made with (the libraries are position-independent, above), so the
# program's TUs get -fPIC too (a PIE links -fPIC objects as well).
function(snip_reuse_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM snip_model)
  target_compile_options(${target} PRIVATE -fPIC)
endfunction()
snip_torch_library(snip_model model ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json spdlog::spdlog
                   OpenMP::OpenMP_CXX ZLIB::ZLIB ${SNIP_OPENBLAS_LIBRARY} ${SNIP_TORCH_BELOW} snip_formats_cuda)
snip_torch_library(snip_dist dist snip_model)
snip_torch_library(snip_method method snip_dist)
snip_torch_library(snip_train train snip_method)
snip_torch_library(snip_app app snip_train)
add_library(snip_torch INTERFACE)
target_link_libraries(snip_torch INTERFACE snip_app)
# ProcessGroupNCCL.hpp (src/dist/process_group.cpp) lays out its classes by
# <nccl.h>'s version (Options holds a versioned ncclConfig_t, NCCL_HAS_*
# adds members): the header must be the NCCL libtorch_cuda was built with,
# which is the nvidia-nccl wheel torch depends on (site-packages/nvidia/nccl,
# beside torch), not whichever nccl.h the system include paths hold first
# (the CUDA toolkit's). -I goes before every -isystem (Torch's and CUDA's
# include folders); only that file needs it. connect() checks the versions
# at run time as well (nccl_version_mismatch in dist/world.h).
get_filename_component(SNIP_NCCL_INCLUDE "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" REALPATH)
if(EXISTS "${SNIP_NCCL_INCLUDE}/nccl.h")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/dist/process_group.cpp PROPERTIES
                              COMPILE_OPTIONS "-I${SNIP_NCCL_INCLUDE}")
  message(STATUS "snip: nccl.h for ProcessGroupNCCL from ${SNIP_NCCL_INCLUDE}")
endif()
