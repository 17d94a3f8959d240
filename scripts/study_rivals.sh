#!/usr/bin/env bash
# The method against its rivals (issue 34; docs/results.md section 7), in the
# regime of configs/study.toml (uniform 4-bit costs about +1.1 nats there):
# 10 seeds (1234-1243) of BF16, uniform 4-bit, SNIP at 0.75, SNIP at 0.75
# with the late forward-only raise (+fprop) and without a final phase
# (+nofinal, the raise's control), and the rivals' rules
# (autoswitch, bf16-tail, first-last-n), then SNIP re-planned at each rival's
# own FP4 share. One experiment folder, so every paired comparison uses the
# seeds both arms trained. Two runs at a time (one thread each): about 100
# runs of 3-6 minutes, so 3.5-4 hours on 2 cores. Every call resumes: a run
# already trained is reused, so the script can be stopped and started again.
#
# usage: scripts/study_rivals.sh [OUT] [SEEDS]  (default runs/rivals, 10; needs build/snip)
#        SNIP=path/to/snip to use another binary (a copy keeps rebuilds out of a long study)
# The budget in GEMM time (+time arms) is left out on CPUs: the emulated
# FP4/FP8 GEMMs are slower than BF16 there, so a time budget below 1 only
# buys BF16 (docs/method.md, "Budget in measured time"); run it on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/rivals}"
seeds="${2:-10}"
snip="${SNIP:-build/snip}"
[ -d data/kjv2k ] || "$snip" data prepare --corpus kjv --out data/kjv2k --vocab-size 2048
mkdir -p "$out"
exp() { "$snip" experiment --config configs/study.toml --out "$out/experiment" --progress-interval 300 "$@"; }
export -f exp; export snip out
run_jobs() {
  printf '%s\0' "$@" | xargs -0 -P 2 -I{} bash -c '{} > /dev/null 2>>"$out/study.err" || { echo "failed: {}" >&2; exit 255; }'
}
# Each rival's own FP4 share: the mean plan-phase share of its plans over its
# seeds (a rule on names gives one share; autoswitch's varies by step and seed).
share() {
  python3 - "$out/experiment/$1" <<'PY'
import glob, json, sys
s = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/seed-*/plans/step-*.json")]
v = [p["fp4_share"] for p in s if p.get("phase") == "plan"]
print(f"{round(sum(v) / len(v), 4):g}")
PY
}
fixed=(none uniform-fp4tensor snip-0.75 bf16-tail first-last-n autoswitch snip-0.75+fprop snip-0.75+nofinal)
rivals=(bf16-tail first-last-n autoswitch)
extra=""
# Half the seeds of every arm first, then the rest, so a stop half-way leaves
# every comparison paired on the same seeds. In each round the rivals go
# first where they have no run yet (their FP4 share decides SNIP's arm),
# then every arm, each rival beside SNIP at its share, so the pairs that
# settle the question fill up first. Reused runs are not trained again.
for n in $(( (seeds + 1) / 2 )) "$seeds"; do
  jobs=()
  for rival in "${rivals[@]}"; do
    [ -d "$out/experiment/$rival" ] || jobs+=("exp --arms $rival --seeds $n")
  done
  [ ${#jobs[@]} -eq 0 ] || run_jobs "${jobs[@]}"
  jobs=()
  matched=()
  for rival in "${rivals[@]}"; do
    b=$(share "$rival")
    echo "study_rivals: $rival reaches an FP4 share of $b in its plans: snip-$b" >&2
    jobs+=("exp --arms $rival --seeds $n")
    # A share of 0 (autoswitch raising every GEMM) is the all-high plan SNIP
    # makes at budget 0 too: the same run, so no arm.
    if [ "$b" != 0 ] && ! printf '%s\n' "${fixed[@]}" "${matched[@]}" | grep -qxF "snip-$b"; then
      matched+=("snip-$b")
      jobs+=("exp --arms snip-$b --seeds $n")
    fi
  done
  # Then SNIP at 0.75 (beside autoswitch), the late raise, the references.
  for arm in snip-0.75 snip-0.75+fprop snip-0.75+nofinal none uniform-fp4tensor; do jobs+=("exp --arms $arm --seeds $n"); done
  run_jobs "${jobs[@]}"
  extra="${matched[*]}"
done
arms=$(IFS=,; echo "${fixed[*]}")
for arm in $extra; do arms="$arms,$arm"; done
"$snip" experiment --out "$out/experiment" --no-train --arms "$arms"
echo "study done: $out/experiment/results.md (arms $arms)"
