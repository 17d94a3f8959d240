#!/usr/bin/env bash
# Runs one libFuzzer target of the fuzz build for SECONDS (docs/robustness.md).
#
# usage: tests/fuzz/run.sh TARGET SECONDS [libFuzzer options ...]
#   TARGET: safetensors, cost_table, plan_file, recipe, recipe_file,
#           config_toml, config_set, shard, data_meta, data_folder,
#           checkpoint, hf_config, cpuinfo, nvidia_smi, metrics, run_record
#           (tests/fuzz/targets.cmake)
# env:    SNIP_FUZZ_BUILD (default build/fuzz: scripts/setup.sh makes it)
#
# Starts from the committed seeds (tests/fuzz/corpus/TARGET, never written)
# and the inputs earlier runs found (BUILD/corpus/TARGET, grown by this
# run). Exit status 0 when the run ends with no crash, no sanitizer report,
# no leak, no timeout and no `snip: internal error`; otherwise 1, with the
# input that did it in BUILD/artifacts/ (replay: BUILD/tests/fuzz/fuzz_TARGET FILE).
# A long campaign, one target at a time: tests/fuzz/run.sh cost_table 3600 -runs=1000000
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 TARGET SECONDS [libFuzzer options ...]" >&2; exit 2; }
target="$1" seconds="$2"; shift 2
build="${SNIP_FUZZ_BUILD:-$root/build/fuzz}"
bin="$build/tests/fuzz/fuzz_$target"
seeds="$here/corpus/$target"
[ -d "$seeds" ] || { echo "fuzz: no target '$target' (no $seeds)" >&2; exit 2; }
[ -x "$bin" ] || { echo "fuzz: $bin is missing: build it with scripts/setup.sh (clang fuzz build in $build)" >&2; exit 1; }
work="$build/corpus/$target" artifacts="$build/artifacts"
dict=()
case "$target" in
  safetensors | cost_table | plan_file | recipe | data_meta | data_folder | checkpoint | hf_config | metrics | \
    run_record)
    dict=(-dict="$here/json.dict") ;;
  config_toml | config_set | recipe_file) dict=(-dict="$here/toml.dict") ;;
esac
mkdir -p "$work" "$artifacts"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# -timeout: one input taking 30 s is a finding (a hang; less flags a busy shared machine); -rss_limit_mb /
# -malloc_limit_mb: an allocation of 2 GiB driven by a small input is one too.
set +e
start=$SECONDS
"$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
  -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/$target-" "${dict[@]}" "$@" "$work" "$seeds" >"$log" 2>&1
rc=$?
elapsed=$((SECONDS - start))
set -e
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
if [ $rc -ne 0 ] || grep -q -e '^snip: internal error' -e 'runtime error:' -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' "$log"; then
  tail -n 60 "$log" >&2
  echo "fuzz $target: FAILED after ${runs:-?} executions in ${elapsed} s (input in $artifacts/)" >&2
  exit 1
fi
echo "fuzz $target: ${runs:-?} executions in ${elapsed} s, corpus $(ls "$work" | wc -l) + $(ls "$seeds" | wc -l) seeds, no findings"
