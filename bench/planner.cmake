# bench_planner: ILP solve times on TinyLlama-1.1B and Llama-2-70B shapes
# (included from bench/CMakeLists.txt; results in docs/planner.md).
add_executable(bench_planner ${CMAKE_CURRENT_LIST_DIR}/bench_planner.cpp)
target_link_libraries(bench_planner PRIVATE snip_plan benchmark::benchmark)
