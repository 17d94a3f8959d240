#!/usr/bin/env bash
# The main job: set up, prepare the King James Bible (Debian's bible-kjv-text),
# train the tiny Llama on it in runs/tiny. Idempotent: setup and data preparation skip what is done; a
# finished runs/tiny is reported, not retrained; an interrupted one resumes.
#
# usage: scripts/run.sh [extra `snip train` arguments, e.g. --set train.max_steps=100]
#        (with extra arguments a fresh run goes to runs/tiny-<date>-<time>)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh snip   # only what the main job runs (snip and snip-data); scripts/test.sh builds the rest
build="${SNIP_BUILD_DIR:-build}"
"$build/snip" data prepare --corpus kjv --out data/kjv
run=runs/tiny
if [ $# -gt 0 ]; then
  exec "$build/snip" train --config configs/tiny.toml --run-dir "runs/tiny-$(date +%Y%m%d-%H%M%S)" "$@"
fi
if [ -f "$run/summary.json" ]; then
  echo "$run is already trained (delete it to train again; the whole record: $run/summary.json, $run/report.html):"
  "$PWD/.venv/bin/python" - "$run/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"  {s['steps']} steps, {s['tokens']} tokens in {s['seconds']:.1f} s ({s['tokens_per_s']:.0f} tokens/s)")
print(f"  train loss {s['final_train_loss']:.4f} | val loss {s['final_val_loss']:.4f} "
      f"(perplexity {s['final_val_ppl']:.1f}) | best val {s['best_val_loss']:.4f} | policy {s['policy']}")
PY
  exit 0
fi
if [ -f "$run/config.toml" ]; then   # interrupted (before or after its first checkpoint)
  exec "$build/snip" train --run-dir "$run" --resume
fi
exec "$build/snip" train --config configs/tiny.toml --run-dir "$run"
