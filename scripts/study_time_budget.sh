#!/usr/bin/env bash
# The budget in GEMM time against the FLOPs budget at equal predicted step
# time (issue 34; docs/results.md section 7), in the study regime
# (configs/study.toml), after scripts/study_rivals.sh trained snip-0.75:
#   1. `snip doctor --calibrate` times every GEMM of the study model in
#      training steps (OUT/gemm-times/gemm_times.json; keep the machine idle);
#   2. the budget B = the mean predicted GEMM time of snip-0.75's plan-phase
#      plans under that table (each plan weighted by the steps it was in
#      force, over its seeds), as a ratio to all-BF16;
#   3. snip-B+time: SNIP planning under at most B x the BF16 GEMM time with
#      that same table (so it runs at snip-0.75's predicted step time), the
#      same seeds; `snip experiment` pairs it with snip-0.75.
# On a CPU, FP4 and FP8 are emulated at about the same cost (2.5x BF16), so
# a time budget there buys precision the FLOPs budget spends on FP4 that is
# no faster; on a GPU with native FP4 the trade differs (not measured here).
# One run at a time: 10 runs of about 5 minutes. Resumable.
#
# usage: scripts/study_time_budget.sh [OUT] [SEEDS]  (default runs/rivals, 10)
#        SNIP=path/to/snip to use another binary
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/rivals}"
seeds="${2:-10}"
snip="${SNIP:-build/snip}"
[ -d "$out/experiment/snip-0.75" ] || { echo "study_time_budget: train snip-0.75 first (scripts/study_rivals.sh $out)" >&2; exit 2; }
table="$out/gemm-times/gemm_times.json"
[ -f "$table" ] || "$snip" doctor --calibrate --config configs/study.toml --run "$out/gemm-times"
budget=$(python3 - "$table" "$out/experiment/snip-0.75" configs/study.toml <<'PY'
import glob, json, os, sys, tomllib
sys.path.insert(0, "bench")
from time_budget import gemm_seconds  # noqa: E402  the bench's GEMM shapes and table lookup
table, arm, cfg = json.load(open(sys.argv[1])), sys.argv[2], tomllib.load(open(sys.argv[3], "rb"))
secs = gemm_seconds(cfg, table, sorted({e["option"] for e in table["entries"]}))
def layer_s(name, opt):  # fprop + dgrad + wgrad of one layer
    return sum(secs[f"{name}:{g}"][opt] for g in ("fprop", "dgrad", "wgrad"))
ratios = []
for seed in sorted(glob.glob(os.path.join(arm, "seed-*"))):
    plans = sorted((json.load(open(f)) for f in glob.glob(os.path.join(seed, "plans", "step-*.json"))),
                   key=lambda p: p["step"])
    for p, nxt in zip(plans, plans[1:]):
        if p["phase"] != "plan":
            continue
        a = p["assignments"]
        ratios.append((nxt["step"] - p["step"], sum(layer_s(n, o) for n, o in a.items()) /
                       sum(layer_s(n, "bf16") for n in a)))
print(f"{sum(w * r for w, r in ratios) / sum(w for w, _ in ratios):.4f}")
PY
)
echo "study_time_budget: snip-0.75's plans predict $budget x the BF16 GEMM time under $table: arm snip-$budget+time" >&2
"$snip" experiment --config configs/study.toml --out "$out/experiment" --progress-interval 300 \
  --arms "snip-$budget+time" --seeds "$seeds" --set "precision.gemm_times=$table"
"$snip" experiment --out "$out/experiment" --no-train --arms "none,snip-0.75,snip-$budget+time"
echo "study done: $out/experiment/results.md"
