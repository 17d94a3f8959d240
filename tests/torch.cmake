# Tests of the LibTorch modules (tests/model, tests/method, tests/train): one
# executable, reusing snip_torch's precompiled header.
file(GLOB SNIP_TORCH_TESTS CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_LIST_DIR}/model/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/method/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/*.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dist/*.cpp)
add_executable(test_torch ${SNIP_TORCH_TESTS})
target_link_libraries(test_torch PRIVATE snip_torch GTest::gtest_main)
target_include_directories(test_torch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/common ${PROJECT_SOURCE_DIR}/src)  # src: headers beside their .cpp
snip_reuse_torch_pch(test_torch)
target_compile_definitions(test_torch PRIVATE SNIP_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                              SNIP_BINARY_DIR="${CMAKE_BINARY_DIR}")

# Real text for the trainer tests: the King James Bible (Debian's
# bible-kjv-text, the main job's corpus) with a 512-piece BPE.
add_test(NAME prepare_kjv512
         COMMAND $<TARGET_FILE:snip-data> data prepare --corpus kjv --vocab-size 512
                 --out ${CMAKE_BINARY_DIR}/test-data/kjv512)
set_tests_properties(prepare_kjv512 PROPERTIES FIXTURES_SETUP kjv512 TIMEOUT 600)

# Reference.* reads the float64 fixture that gen_ref_fixture writes;
# Trainer.* the prepared KJV data.
gtest_discover_tests(test_torch DISCOVERY_TIMEOUT 120
                     PROPERTIES FIXTURES_REQUIRED "llama_ref;kjv512" TIMEOUT 600)

# The emulated BF16 GEMM path (FP32 GEMMs on BF16-rounded operands) on every
# machine: CPUs with native BF16 GEMMs (AVX512-BF16/AMX) take LibTorch's
# kernel in the tests above, so the numerics and training tests run again here
# with SNIP_BF16_GEMM=emulated (label bf16-emulated; the whole suite that way:
# `SNIP_BF16_GEMM=emulated ctest --test-dir build`).
add_test(NAME bf16_emulated
         COMMAND test_torch --gtest_filter=Bf16Gemm.*:QuantLinear.*:Llama*:Reference.*:Trainer.LossDecreasesOnRealText:Trainer.ResumeIsExact:QuantTraining.*)
set_tests_properties(bf16_emulated PROPERTIES ENVIRONMENT SNIP_BF16_GEMM=emulated LABELS bf16-emulated
                     FIXTURES_REQUIRED "llama_ref;kjv512" TIMEOUT 900)

# GEMM-time calibration against FLOPs and against the trainer's own module
# (label timing): meaningful on an idle machine only, so not in the default
# run (scripts/test.sh passes -LE timing), where GemmCalibrate.* checks the
# table's structure and skips these; `ctest --test-dir build -L timing`.
add_test(NAME gemm_timing COMMAND test_torch --gtest_filter=GemmCalibrate.*)
set_tests_properties(gemm_timing PROPERTIES ENVIRONMENT SNIP_TIMING_TESTS=1 LABELS timing TIMEOUT 300)

# The trainer's GPU path (label cuda, run by scripts/gpu_check.sh on a lent
# device): the recipe quantizers on CUDA tensors against the CPU. The same
# cases are discovered above too and skip there without a GPU.
add_test(NAME cuda_quantizers COMMAND test_torch --gtest_filter=CudaQuantizers.*)
set_tests_properties(cuda_quantizers PROPERTIES LABELS cuda TIMEOUT 600)
