# bench_formats: fake-quantization throughput of snip_formats vs memcpy.
# Included from bench/CMakeLists.txt: include(${CMAKE_CURRENT_LIST_DIR}/formats.cmake)
add_executable(bench_formats ${CMAKE_CURRENT_LIST_DIR}/bench_formats.cpp)
target_link_libraries(bench_formats PRIVATE snip_formats snip_recipes benchmark::benchmark)
