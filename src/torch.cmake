# snip_torch: the modules that need LibTorch, as one static library with one
# precompiled header for <torch/torch.h> (a TU including it costs ~20 s
# without, ~2 s with):
#   src/model   Llama, the quantized linear layer, recipes bound to layers
#               (quantizers.cpp; the LibTorch-free recipe registry is
#               snip_recipes, src/quant/CMakeLists.txt), Hugging Face I/O
#   src/dist    several ranks: the world, c10d Gloo (process_group.cpp only),
#               the bucketed gradient all-reduce, weight checksums
#   src/method  the stats step, the precision controller
#   src/train   the training step, the loop, checkpoints, optimizer
#   src/app     drivers over whole runs: the correlation study
# Layering (an include only points down; tests/layering.py checks it, and
# docs/architecture.md draws it): app -> train -> method -> dist -> model.
file(GLOB SNIP_TORCH_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/model/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dist/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/method/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/app/*.cpp)
add_library(snip_torch STATIC ${SNIP_TORCH_SOURCES})
target_include_directories(snip_torch PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_link_libraries(snip_torch PUBLIC ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json
  spdlog::spdlog OpenMP::OpenMP_CXX ZLIB::ZLIB)
# Not snip_data: SentencePiece must stay out of LibTorch processes (src/data/CMakeLists.txt).
foreach(dep snip_formats snip_recipes snip_io snip_tokens snip_policy snip_report snip_config snip_hw snip_run snip_monitor)
  if(TARGET ${dep})
    target_link_libraries(snip_torch PUBLIC ${dep})
  endif()
endforeach()
# OpenBLAS (Debian's libopenblas-dev): the FP32 GEMMs of src/model/blas.cpp.
find_library(SNIP_OPENBLAS_LIBRARY openblas REQUIRED)
target_link_libraries(snip_torch PUBLIC ${SNIP_OPENBLAS_LIBRARY})
target_precompile_headers(snip_torch PRIVATE <torch/torch.h> <nlohmann/json.hpp>)
