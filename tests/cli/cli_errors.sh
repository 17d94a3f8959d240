#!/usr/bin/env bash
# Bad input through the real `snip` binary: each case must exit with status 2,
# print exactly one line `snip: error: ...` naming what is wrong, and leave no
# partial files behind.
#
# usage: cli_errors.sh SNIP_BINARY PREPARED_DATA_DIR
set -u
snip="$1"; data="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/micro_toml.sh"
pass=0; fail=0

# expect NAME NEEDLE -- command...: exit 2, one stderr line with NEEDLE.
expect() {
  local name="$1" needle="$2"; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q "^snip: error: .*$needle" "$tmp/err"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $name: rc=$rc lines=$lines (want 2, 1, '$needle'):" >&2; cat "$tmp/err" >&2
  fi
}
# absent PATH: the failed command left nothing at PATH
absent() {
  if [ -e "$1" ]; then fail=$((fail + 1)); echo "FAIL: $1 was left behind" >&2; else pass=$((pass + 1)); fi
}

micro_toml "$tmp/ok.toml" "$data" "max_steps = 2"

expect "missing config" "cannot be read" -- "$snip" train --config "$tmp/nope.toml" --run-dir "$tmp/r0"
absent "$tmp/r0"
printf '[train]\nbatch_sise = 4\n' >"$tmp/typo.toml"
expect "unknown key" "unknown option 'train.batch_sise' (did you mean 'train.batch_size'?" -- \
  "$snip" train --config "$tmp/typo.toml" --run-dir "$tmp/r1"
absent "$tmp/r1"
expect "wrong type" "train.lr: expected a number, got 'fast'" -- \
  "$snip" train --config "$tmp/ok.toml" --set train.lr=fast --run-dir "$tmp/r2"
absent "$tmp/r2"
expect "vocab mismatch" "smaller than the tokenizer's vocabulary" -- \
  "$snip" train --config "$tmp/ok.toml" --set model.vocab_size=10 --run-dir "$tmp/r3"
absent "$tmp/r3"
expect "missing data" "does not exist" -- \
  "$snip" train --config "$tmp/ok.toml" --set data.dir="$tmp/nodata" --run-dir "$tmp/r4"
absent "$tmp/r4"
touch "$tmp/afile"
expect "unwritable run dir" "not writable" -- "$snip" train --config "$tmp/ok.toml" --run-dir "$tmp/afile/run"
expect "config is a directory" "is a directory" -- "$snip" train --config "$tmp" --run-dir "$tmp/r6"
absent "$tmp/r6"
expect "negative eps" "train.eps: expected a finite number in (0, 1000\\]" -- \
  "$snip" train --config "$tmp/ok.toml" --set train.eps=-1 --run-dir "$tmp/r7"
absent "$tmp/r7"

# Measured crashes and internal errors on malformed input.
expect "lr beyond FP32 (was an internal error)" "train.lr: expected a finite number in (0, 1000\\], got 1e+308" -- \
  "$snip" train --config "$tmp/ok.toml" --set train.lr=1e308 --run-dir "$tmp/r8"
expect "grad_clip beyond FP32 (was an internal error)" "train.grad_clip: expected a finite number in \\[0, 1e+30\\]" -- \
  "$snip" train --config "$tmp/ok.toml" --set train.grad_clip=1e308 --run-dir "$tmp/r8"
cp "$tmp/ok.toml" "$tmp/lr.toml"; printf 'lr = 1e309\n' >>"$tmp/lr.toml"
expect "lr literal beyond a double" "lr.toml:[0-9]*: train.lr: expected a finite number in (0, 1000\\], got 1e309" -- \
  "$snip" train --config "$tmp/lr.toml" --run-dir "$tmp/r8"
python3 -c "print('[' + '.'.join(['a'] * 31287) + ']')" >"$tmp/deep.toml"
expect "31,287-part table header (was SIGSEGV)" "deep.toml:1: expected tables, dotted keys, arrays and inline tables nested at most 64" -- \
  "$snip" train --config "$tmp/deep.toml" --run-dir "$tmp/r8"
# (--log-level error: the warning that policy none ignores pins is on stderr too)
expect "pin matching no layer under bf16 (was accepted)" "config: precision.pins: pin 'x.=fp8' matches no item" -- \
  "$snip" train --log-level error --config "$tmp/ok.toml" --set 'precision.pins=x[=fp8' --run-dir "$tmp/r8"
absent "$tmp/r8"
printf '{"layers": [{"name": "a", "flops": 1, "q": {"fp4": 1, "fp8": 0}}]}' >"$tmp/costs.json"
python3 -c "n = 65968; print('{\"layers\": ' + '[' * n + ']' * n + '}')" >"$tmp/deep.json"
expect "65,968 nested arrays in a cost table (was SIGSEGV)" "deep.json: layers\\[0\\]\\[0\\].*expected at most 128 nested arrays/objects" -- \
  "$snip" plan --costs "$tmp/deep.json" --budget 0.5
printf '{"layers": [{"name": "a", "flops": 1e309, "q": {"fp4": 1}}]}' >"$tmp/big.json"
expect "1e309 in a cost table (was an internal error)" "big.json: layers\\[0\\].flops: expected a number a double can hold" -- \
  "$snip" plan --costs "$tmp/big.json" --budget 0.5
mkdir -p "$tmp/hf"; printf '{"hidden_size": 1e309}' >"$tmp/hf/config.json"
expect "1e309 in a Hugging Face config.json (was an internal error)" "config.json: hidden_size: expected a number a double can hold" -- \
  "$snip" train --config "$tmp/ok.toml" --init-from "$tmp/hf" --run-dir "$tmp/r9"
absent "$tmp/r9"
expect "empty --budget (was 0)" "--budget: expected a number, got ''" -- "$snip" plan --costs "$tmp/costs.json" --budget ''
expect "--options no layer offers (was dropped)" "--options: expected options the cost table .* gives a Q for (fp4, fp8), got 'zz'" -- \
  "$snip" plan --costs "$tmp/costs.json" --budget 0.5 --options fp4,zz
expect "unknown flag" "" -- "$snip" train --bogus
expect "unknown command" "" -- "$snip" bogus
expect "missing corpus" "" -- "$snip" data prepare --input "$tmp/no-corpus" --out "$tmp/d1"
absent "$tmp/d1"
mkdir -p "$tmp/empty"; printf '   \n\n' >"$tmp/empty/a.txt"
expect "empty corpus" "" -- "$snip" data prepare --input "$tmp/empty" --out "$tmp/d2"
absent "$tmp/d2"

# A trained run whose checkpoint is then truncated: resume refuses it.
"$snip" train --config "$tmp/ok.toml" --run-dir "$tmp/run" >/dev/null 2>&1 || { echo "FAIL: tiny run" >&2; fail=$((fail + 1)); }
expect "fresh run into an existing run" "already holds a run" -- \
  "$snip" train --config "$tmp/ok.toml" --run-dir "$tmp/run"
expect "resume with nothing to do" "nothing to do" -- \
  "$snip" train --config "$tmp/ok.toml" --run-dir "$tmp/run" --resume
# a number option given a word: the option and what it expected (was CLI11's "Could not convert: --budget = abc")
expect "budget abc" "--budget: expected a number, got 'abc' (see --help)$" -- "$snip" plan --costs x.json --budget abc
expect "sample temperature -1" "--temperature: expected a finite number >= 0" -- \
  "$snip" sample --run-dir "$tmp/run" --prompt x --temperature -1
# eval's numbers name the option, not the loader inside
expect "eval batch size 0" "--batch-size: expected an integer >= 1, got 0$" -- \
  "$snip" eval --run-dir "$tmp/run" --batch-size 0
expect "eval batches -1" "--batches: expected an integer >= 0" -- "$snip" eval --run-dir "$tmp/run" --batches -1
expect "eval seq len -5" "--seq-len: expected an integer >= 1" -- "$snip" eval --run-dir "$tmp/run" --seq-len -5
cp -r "$tmp/run" "$tmp/run2"
sed -i 's/"step": 2/"step": 1/' "$tmp/run2/checkpoints/step-2/trainer_state.json"
# manifest.json covers trainer_state.json (its fields: tests/cli/corrupt_inputs.py)
expect "edited trainer state" "trainer_state.json: checksum mismatch with manifest.json" -- \
  "$snip" train --config "$tmp/ok.toml" --set train.max_steps=4 --run-dir "$tmp/run2" --resume
w="$tmp/run/checkpoints/step-2/model.safetensors"
if [ -f "$w" ]; then
  head -c 100 "$w" >"$tmp/t" && mv "$tmp/t" "$w"
  expect "truncated checkpoint" "checksum mismatch" -- \
    "$snip" train --config "$tmp/ok.toml" --set train.max_steps=4 --run-dir "$tmp/run" --resume
  expect "eval of truncated checkpoint" "checksum mismatch" -- "$snip" eval --run-dir "$tmp/run"
fi
expect "resume without checkpoint" "no complete checkpoint" -- \
  "$snip" train --config "$tmp/ok.toml" --run-dir "$tmp/r5" --resume
absent "$tmp/r5"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
