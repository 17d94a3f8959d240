#!/usr/bin/env bash
# What `snip train` tells a person, through the real binary: the warning for a
# warmup longer than the run, the recipe alias notice (printed once), the
# progress line showing the validation loss only on evaluation steps, a
# sample at each evaluation, the end-of-run summary naming what the run folder
# holds, `snip sample`, the notice of a resume that starts from step 0, and the
# lock a second trainer runs into.
#
# usage: train_messages.sh SNIP_BINARY PREPARED_DATA_DIR
set -u
snip="$1"; data="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/micro_toml.sh"
pass=0; fail=0
check() {  # check NAME FILE PATTERN [COUNT]: PATTERN (grep -E) occurs in FILE (COUNT times if given)
  local n; n=$(grep -cE -- "$3" "$2")
  if { [ $# -ge 4 ] && [ "$n" -eq "$4" ]; } || { [ $# -lt 4 ] && [ "$n" -gt 0 ]; }; then pass=$((pass + 1))
  else fail=$((fail + 1)); echo "FAIL $1: '$3' found $n times in $2:" >&2; cat "$2" >&2; fi
}

micro_toml "$tmp/m.toml" "$data" "max_steps = 6
warmup_steps = 9
eval_interval = 3
eval_batches = 2
log_interval = 1
[precision]
recipe = \"fp4\""

"$snip" train --config "$tmp/m.toml" --run-dir "$tmp/run" >"$tmp/out" 2>"$tmp/err" || { fail=$((fail + 1)); cat "$tmp/err" >&2; }
cat "$tmp/out" "$tmp/err" >"$tmp/all"   # spdlog's lines go to stdout
check "warmup warning" "$tmp/all" "warning: train.warmup_steps = 9 is larger than train.max_steps = 6"
check "alias notice once" "$tmp/all" "precision.recipe = 'fp4' is read as precision.policy = 'uniform-fp4'" 1
check "an unchanged plan is one line" "$tmp/err" "^precision plan at step" 1
check "progress lines" "$tmp/err" "^step +[0-9]+/6 \\|" 6
check "val on eval steps, with its windows" "$tmp/err" "^step +(3|6)/6 .*\\| val [0-9.]+ \\([0-9]+-token windows\\)$" 2
check "no val elsewhere" "$tmp/err" "^step +(1|2|4|5)/6 .*\\| val" 0
check "a sample at each evaluation" "$tmp/err" "^sample: The" 2
check "summary lists the run" "$tmp/out" "run directory .*: report.html, metrics.jsonl, summary.json, config.toml, checkpoints/ \\(1\\), plans/ \\([0-9]+\\)"
grep -qE "^policy = ['\"]uniform-fp4['\"]" "$tmp/run/config.toml" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: config.toml lacks the resolved policy" >&2; }

# snip sample: the same seed gives the same text, another seed (almost surely) another.
"$snip" sample --run-dir "$tmp/run" --prompt "The jury" --max-new-tokens 12 --seed 3 >"$tmp/s1" 2>"$tmp/serr" || { fail=$((fail + 1)); cat "$tmp/serr" >&2; }
"$snip" sample --run-dir "$tmp/run" --prompt "The jury" --max-new-tokens 12 --seed 3 >"$tmp/s2" 2>&1
"$snip" sample --run-dir "$tmp/run" --prompt "The jury" --max-new-tokens 12 --seed 4 >"$tmp/s3" 2>&1
check "sample continues the prompt" "$tmp/s1" "^The jury" 1
cmp -s "$tmp/s1" "$tmp/s2" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: same seed, other text" >&2; }
cmp -s "$tmp/s1" "$tmp/s3" && { fail=$((fail + 1)); echo "FAIL: seeds 3 and 4 gave the same text" >&2; } || pass=$((pass + 1))

# snip eval says how much of the validation split it read.
"$snip" eval --run-dir "$tmp/run" --batches 1 --batch-size 2 >"$tmp/e1" 2>&1 || { fail=$((fail + 1)); cat "$tmp/e1" >&2; }
check "eval says a part" "$tmp/e1" "over 1 of [0-9]+ micro-batches \(2 of [0-9]+ windows of 16 tokens: the run's train.seq_len; --batches 0 evaluates all\)" 1
"$snip" eval --run-dir "$tmp/run" --batch-size 64 >"$tmp/e2" 2>&1 || { fail=$((fail + 1)); cat "$tmp/e2" >&2; }
check "eval says all" "$tmp/e2" "over all [0-9]+ micro-batches \([0-9]+ windows of 16 tokens: the run's train.seq_len\)" 1
# Dtype names: export takes bf16 as well as bfloat16.
"$snip" export --run-dir "$tmp/run" --out "$tmp/hf16" --dtype bf16 >"$tmp/x1" 2>&1 || { fail=$((fail + 1)); cat "$tmp/x1" >&2; }
check "export --dtype bf16" "$tmp/hf16/config.json" '"torch_dtype": "bfloat16"' 1

# snip quantize --help defines its columns.
"$snip" quantize --help >"$tmp/qh" 2>&1
check "quantize help defines underflow" "$tmp/qh" "underflow  nonzero inputs that came out exactly 0" 1
check "quantize help defines saturated" "$tmp/qh" "saturated  finite inputs whose scaled magnitude" 1

# Stopped before its first checkpoint: --resume starts it again from step 0.
sed -i 's/^max_steps = 6/max_steps = 4/; s/^warmup_steps = 9/warmup_steps = 1/' "$tmp/m.toml"
mkdir -p "$tmp/early" && cp "$tmp/run/config.toml" "$tmp/early/config.toml"
"$snip" train --run-dir "$tmp/early" --resume --set train.max_steps=2 >"$tmp/out2" 2>"$tmp/err2" || { fail=$((fail + 1)); cat "$tmp/err2" >&2; }
cat "$tmp/out2" >>"$tmp/err2"
check "resume from zero" "$tmp/err2" "has no checkpoint yet: starting it from step 0 with its saved configuration" 1

# Resuming with another GEMM dtype works but says the steps will differ.
"$snip" train --config "$tmp/m.toml" --set train.max_steps=2 --set train.checkpoint_interval=1 --run-dir "$tmp/gd" >/dev/null 2>&1 || fail=$((fail + 1))
"$snip" train --run-dir "$tmp/gd" --resume --set train.max_steps=3 --set train.gemm_dtype=fp32 >"$tmp/out5" 2>"$tmp/err5" || { fail=$((fail + 1)); cat "$tmp/err5" >&2; }
cat "$tmp/out5" >>"$tmp/err5"
check "resume with another gemm dtype warns" "$tmp/err5" "--resume: train.gemm_dtype is fp32 but $tmp/gd was trained with bf16: the resumed steps will not be bit-identical" 1
# The resolved config.toml lists every option: a resume warns only of what
# differs from the defaults, as the first start did (there: none).
check "resume: no warning of pipeline options never set" "$tmp/err5" "has no effect" 0
"$snip" train --config "$tmp/m.toml" --set train.max_steps=1 --set dist.stage_split=1 --run-dir "$tmp/split" >"$tmp/out6" 2>"$tmp/err6" || fail=$((fail + 1))
"$snip" train --run-dir "$tmp/split" --resume --set train.max_steps=2 >>"$tmp/out6" 2>>"$tmp/err6" || fail=$((fail + 1))
cat "$tmp/out6" >>"$tmp/err6"
check "a pipeline option set without stages warns at start and at resume" "$tmp/err6" "dist.stage_split has no effect without pipeline stages" 2
check "and no other pipeline option" "$tmp/err6" "has no effect" 2

# Settings the policy never reads are said once: under the default policy
# none, a budget and a pin; under uniform-fp8, the budget; under snip, nothing.
"$snip" train --config "$tmp/m.toml" --set train.max_steps=1 --set precision.recipe=none --set precision.budget=0.3 --set "precision.pins=*.down_proj=fp8" --run-dir "$tmp/unread" >"$tmp/out7" 2>"$tmp/err7" || { fail=$((fail + 1)); cat "$tmp/err7" >&2; }
cat "$tmp/out7" >>"$tmp/err7"
check "unread settings under none" "$tmp/err7" "warning: precision.budget = 0.3, precision.pins = '\*.down_proj=fp8' have no effect under precision.policy = none" 1
"$snip" train --config "$tmp/m.toml" --set train.max_steps=1 --set precision.recipe=none --set precision.policy=uniform-fp8 --set precision.budget=0.3 --run-dir "$tmp/unread2" >"$tmp/out8" 2>"$tmp/err8" || { fail=$((fail + 1)); cat "$tmp/err8" >&2; }
cat "$tmp/out8" >>"$tmp/err8"
check "unread budget under uniform" "$tmp/err8" "warning: precision.budget = 0.3 has no effect under precision.policy = uniform-fp8$" 1
"$snip" train --config "$tmp/m.toml" --set train.max_steps=1 --set precision.recipe=none --set precision.policy=snip --set precision.budget=0.3 --set "precision.pins=*.down_proj=fp8" --run-dir "$tmp/read" >"$tmp/out9" 2>"$tmp/err9" || { fail=$((fail + 1)); cat "$tmp/err9" >&2; }
cat "$tmp/out9" >>"$tmp/err9"
check "nothing unread under snip" "$tmp/err9" "no effect under precision.policy" 0

# A second trainer on a folder in use gets one line naming the first.
"$snip" train --config "$tmp/m.toml" --set train.max_steps=1000000 --set train.log_interval=1000000 --set train.eval_interval=1000000 --run-dir "$tmp/busy" >/dev/null 2>&1 &
first=$!
for _ in $(seq 1 100); do [ -s "$tmp/busy/.lock" ] && break; sleep 0.1; done
"$snip" train --config "$tmp/m.toml" --run-dir "$tmp/busy" --resume >"$tmp/out3" 2>"$tmp/err3"; rc=$?
kill "$first" 2>/dev/null; wait "$first" 2>/dev/null
[ "$rc" -eq 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL lock: rc=$rc" >&2; }
check "lock names the first" "$tmp/err3" "^snip: error: run directory $tmp/busy is in use by process $first " 1

# A file-size limit (ulimit -f, KiB) ends the run with one error line, exit 2,
# never with SIGXFSZ (exit 153) in the middle of a file.
(ulimit -f 12; "$snip" train --config "$tmp/m.toml" --set train.max_steps=2 --run-dir "$tmp/fsize" >"$tmp/out4" 2>"$tmp/err4"); rc=$?
[ "$rc" -eq 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL file-size limit: rc=$rc (want 2)" >&2; }
check "file-size limit is one error line" "$tmp/err4" "^snip: error: .*File too large" 1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
