# The fuzz targets (tests/fuzz/fuzz_<name>.cpp), one list for the fuzz build
# (tests/fuzz/CMakeLists.txt) and for the CTest smoke runs (tests/CMakeLists.txt).
set(SNIP_FUZZ_TARGETS safetensors cost_table plan_file recipe config_toml config_set shard data_meta
    data_folder checkpoint hf_config recipe_file cpuinfo nvidia_smi metrics run_record)
