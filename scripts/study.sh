#!/usr/bin/env bash
# The evidence study of docs/results.md section 5: every arm of the comparison
# with several seeds, and the correlation study with repeats, in the regime of
# configs/study.toml (a 4-bit option with one FP32 scale per tensor, which
# measurably hurts). Two jobs at a time (each run uses one thread); about 2
# hours on 2 cores. BF16 and the comparison at budget 0.75 (SNIP and the four
# heuristics) get 5 seeds, every other arm 3.
#
# usage: scripts/study.sh [OUT]   (default runs/study; needs build/snip)
#        SNIP=path/to/snip to use another binary
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/study}"
snip="${SNIP:-build/snip}"
[ -d data/kjv2k ] || "$snip" data prepare --corpus kjv --out data/kjv2k --vocab-size 2048
mkdir -p "$out"
exp() { "$snip" experiment --config configs/study.toml --out "$out/experiment" --progress-interval 120 "$@"; }
export -f exp; export snip out
# One job per line; two at a time. The first job trains the BF16 reference
# with 5 seeds, then runs the correlation study from its seed-1234 checkpoint.
jobs=(
  "exp --arms none --seeds 5 > /dev/null && \"$snip\" correlate --run $out/experiment/none/seed-1234 --step 300 --steps 20 --repeats 3 --option fp4tensor --out $out/correlation"
  "exp --arms uniform-fp4tensor --seeds 3"
  "exp --arms snip-0.75 --seeds 5"
  "exp --arms uniform-fp8 --seeds 3"
  "exp --arms first-last-fp8-0.75 --seeds 5"
  "exp --arms layer-type-0.75 --seeds 5"
  "exp --arms min-rel-err-0.75 --seeds 5"
  "exp --arms random-0.75 --seeds 5"
  "exp --arms snip-0.5 --seeds 3"
  "exp --arms snip-0.9 --seeds 3"
  "exp --arms snip-gemm-0.75 --seeds 3"
)
printf '%s\0' "${jobs[@]}" | xargs -0 -P 2 -I{} bash -c '{} > /dev/null 2>>"$out/study.err" || { echo "failed: {}" >&2; exit 255; }'
arms=none,uniform-fp8,uniform-fp4tensor,snip-0.5,snip-0.75,snip-0.9,snip-gemm-0.75,min-rel-err-0.75,layer-type-0.75,first-last-fp8-0.75,random-0.75
"$snip" experiment --out "$out/experiment" --no-train --arms "$arms"
# The correlation table with bootstrap intervals (correlation.txt) and one scatter plot per predictor.
"$snip" correlate --replot "$out/correlation/correlation.json" --predictor q > "$out/correlation/correlation.txt"
for p in 'ld[drop]' wd rel_err_fprop; do
  "$snip" correlate --replot "$out/correlation/correlation.json" --predictor "$p" > /dev/null
done
echo "study done: $out/experiment/results.md, $out/correlation/correlation.json"
