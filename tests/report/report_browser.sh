#!/usr/bin/env bash
# The run report in a real browser: writes a synthetic run (and a bf16
# reference run) with known shapes, renders it with `snip report`, loads the
# page in headless Chromium and checks the rendered DOM: every chart present,
# every series path non-empty, the expected number of series per chart, and
# rows x cols cells in both heat maps. Saves a screenshot to
# ARTIFACT_DIR/report.png (look at it) and checks it is not trivial.
#
# usage: report_browser.sh SNIP_BINARY ARTIFACT_DIR
# needs: chromium (Debian package `chromium`; scripts/setup.sh installs it),
#        /usr/bin/python3 (standard library only).
set -euo pipefail
snip="$1"; artifacts="$2"
if ! command -v chromium >/dev/null 2>&1; then
  echo "FAIL: chromium is not installed; run scripts/setup.sh (it installs the apt package chromium)" >&2
  exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$artifacts"

# ---- the synthetic run: L=2 decoder layers x 7 projections = 14 layers, 40
# steps, decisions at s = 0 (warmup, bf16), 4 and 20 (plans with stats), 36
# (final, fp8); evaluations every 10 steps.
layers=()
for l in 0 1; do
  for p in self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj mlp.gate_proj mlp.up_proj mlp.down_proj; do
    layers+=("model.layers.$l.$p")
  done
done
n_layers=${#layers[@]}
decisions=(0 4 20 36)
n_decisions=${#decisions[@]}

# option of layer index i at decision s
option() {
  local i=$1 s=$2
  case $s in
    0) echo bf16 ;;
    36) echo fp8 ;;
    *) if (( (i + s) % 3 == 0 )); then echo fp8; else echo fp4; fi ;;
  esac
}
# {"layer": "option", ...} at decision s
precision_json() {
  local s=$1 out="" i
  for i in "${!layers[@]}"; do out+="${out:+,}\"${layers[$i]}\":\"$(option "$i" "$s")\""; done
  echo "{$out}"
}
# {"layer": rel, ...}: fprop relative error at the chosen option
rel_json() {
  local s=$1 out="" i
  for i in "${!layers[@]}"; do
    if [ "$(option "$i" "$s")" = fp4 ]; then r="0.1$i"; else r="0.02$i"; fi
    out+="${out:+,}\"${layers[$i]}\":$r"
  done
  echo "{$out}"
}
write_run() {  # DIR POLICY
  local dir=$1 policy=$2 step extra share loss
  mkdir -p "$dir/plans" "$dir/stats"
  : >"$dir/metrics.jsonl"
  for step in $(seq 1 40); do
    extra=""
    share=0.0
    if [ "$policy" = snip ]; then
      (( step > 4 && step <= 36 )) && share=0.62
      case $((step - 1)) in
        0 | 36) extra=",\"plan_step\":$((step - 1)),\"phase\":\"$([ $step = 1 ] && echo warmup || echo final)\",\"precision\":$(precision_json $((step - 1)))" ;;
        4 | 20) extra=",\"plan_step\":$((step - 1)),\"phase\":\"plan\",\"precision\":$(precision_json $((step - 1))),\"rel_err_fprop\":$(rel_json $((step - 1)))" ;;
      esac
    fi
    (( step % 10 == 0 )) && extra+=",\"val_loss\":$(awk "BEGIN{print 8 - $step/20}"),\"val_ppl\":100"
    loss=$(awk "BEGIN{print 9 - 2*log($step)/log(40) + 0.1*sin($step)}")
    printf '{"step":%d,"loss":%s,"lr":0.001,"grad_norm":0.5,"tokens_per_s":1000,"elapsed_s":%d,"fp4_share":%s%s}\n' \
      "$step" "$loss" "$step" "$share" "$extra" >>"$dir/metrics.jsonl"
  done
  printf '{"final_train_loss":7.1,"final_val_loss":6.0,"final_val_ppl":403.4,"parameters":123456,"policy":"%s","seconds":40.0,"steps":40,"tokens":81920,"tokens_per_s":2048.0}\n' \
    "$policy" >"$dir/summary.json"
  printf '[model]\nhidden_size = 64\nnum_hidden_layers = 2\n[precision]\npolicy = "%s"\n' "$policy" >"$dir/config.toml"
  [ "$policy" = snip ] || return 0
  local s i items rel qt stats_layers phase
  for s in "${decisions[@]}"; do
    items=""; rel=""; qt=""; stats_layers=""
    for i in "${!layers[@]}"; do
      items+="${items:+,}{\"name\":\"${layers[$i]}\",\"flops\":$((100 + 50 * (i % 7))),\"option\":\"$(option "$i" "$s")\",\"q\":{\"fp4\":0.$((i + 10)),\"fp8\":0.0$((i + 10)),\"bf16\":0}}"
      rel+="${rel:+,}\"${layers[$i]}\":{\"fp4\":0.1$i,\"fp8\":0.02$i,\"bf16\":0}"
      qt+="${qt:+,}\"${layers[$i]}\":{\"fp4\":0.$((i + 10)),\"fp8\":0.0$((i + 10)),\"bf16\":0}"
      stats_layers+="${stats_layers:+,}{\"name\":\"${layers[$i]}\",\"flops\":$((100 + 50 * (i % 7))),\"q\":{\"fp4\":0.$((i + 10)),\"fp8\":0.0$((i + 10)),\"bf16\":0},\"rel_err\":{\"fp4\":0.1$i,\"fp8\":0.02$i}}"
    done
    case $s in 0) phase=warmup ;; 36) phase=final ;; *) phase=plan ;; esac
    if [ "$phase" = plan ]; then
      printf '{"step":%d,"policy":"snip","phase":"plan","method":"ilp","status":"optimal","proven_optimal":true,"solve_seconds":0.01,"stats_seconds":0.5,"budget":0.6,"fp4_share":0.62,"objective":1.5,"low_option":"fp4","option_costs":{"fp4":1,"fp8":2,"bf16":4},"items":[%s],"q_table":{%s},"rel_err_fprop":{%s}}\n' \
        "$s" "$items" "$qt" "$rel" >"$dir/plans/step-$s.json"
      printf '{"step":%d,"smoothing":0.1,"layers":[%s],"details":{"low_option":"fp4","layers":[]}}\n' \
        "$s" "$stats_layers" >"$dir/stats/step-$s.json"
    else
      printf '{"step":%d,"policy":"snip","phase":"%s","method":"uniform-%s","status":"optimal","fp4_share":0,"objective":0,"low_option":"fp4","budget":null,"items":[%s]}\n' \
        "$s" "$phase" "$(option 0 "$s")" "$items" >"$dir/plans/step-$s.json"
    fi
  done
}
write_run "$tmp/run" snip
write_run "$tmp/ref" bf16

# ---- render with `snip report`
out=$("$snip" report "$tmp/run" --reference "$tmp/ref" --out "$tmp/report.html")
[ "$out" = "$tmp/report.html" ] || { echo "FAIL: snip report printed '$out', expected $tmp/report.html" >&2; exit 1; }
"$snip" report "$tmp/ref" >/dev/null
cp "$tmp/report.html" "$artifacts/report.html"

chrome() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --disable-dev-shm-usage \
    --hide-scrollbars --user-data-dir="$(mktemp -d -p "$tmp")" "$@" 2>>"$tmp/chromium.log"
}
chrome --dump-dom "file://$tmp/report.html" >"$tmp/dom.html" || { cat "$tmp/chromium.log" >&2; echo "FAIL: chromium --dump-dom" >&2; exit 1; }
chrome --dump-dom "file://$tmp/ref/report.html" >"$tmp/dom-ref.html" || { echo "FAIL: chromium --dump-dom (reference)" >&2; exit 1; }

# ---- check the rendered DOM
/usr/bin/python3 - "$tmp/dom.html" "$tmp/dom-ref.html" "$n_layers" "$n_decisions" <<'PY'
import sys
from html.parser import HTMLParser

class Charts(HTMLParser):
    """Per <svg class="chart ..."> element: its attributes and counts of series paths, cells, points."""
    def __init__(self):
        super().__init__()
        self.charts, self.cur, self.text = {}, None, []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "svg" and "chart" in cls:
            self.cur = {"attrs": a, "series": [], "cells": 0, "points": 0}
            self.charts[a.get("data-chart")] = self.cur
        elif self.cur is not None:
            if tag == "path" and "series" in cls:
                self.cur["series"].append((a.get("data-series"), a.get("d") or ""))
            elif tag == "rect" and "cell" in cls:
                self.cur["cells"] += 1
            elif tag == "circle" and "point" in cls:
                self.cur["points"] += 1
    def handle_endtag(self, tag):
        if tag == "svg":
            self.cur = None
    def handle_data(self, data):
        self.text.append(data)

def parse(path):
    p = Charts()
    p.feed(open(path, encoding="utf-8").read())
    return p

dom_path, ref_path, L, D = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
run, ref = parse(dom_path), parse(ref_path)
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

# 40 steps are too few for an EMA (span 40/60 < 2): each run's raw loss only.
expected_series = {"loss": 2, "val-loss": 2, "fp4-share": 1}   # run + reference raw loss; run + reference; run
for cid, n in expected_series.items():
    c = run.charts.get(cid)
    check(c is not None, f"chart {cid} missing")
    if c is None:
        continue
    check(len(c["series"]) == n, f"chart {cid}: {len(c['series'])} series paths, expected {n}")
    check(c["attrs"].get("data-series-count") == str(n), f"chart {cid}: data-series-count {c['attrs'].get('data-series-count')}, expected {n}")
    for name, d in c["series"]:
        check(d.startswith("M") and len(d) > 10, f"chart {cid}: series {name!r} has an empty path d={d!r}")
for cid in ("precision-map", "error-map"):
    c = run.charts.get(cid)
    check(c is not None, f"heat map {cid} missing")
    if c is None:
        continue
    check(c["cells"] == L * D, f"heat map {cid}: {c['cells']} cells, expected {L} layers x {D} decisions = {L * D}")
    check(c["attrs"].get("data-rows") == str(L) and c["attrs"].get("data-cols") == str(D),
          f"heat map {cid}: data-rows/cols {c['attrs'].get('data-rows')}x{c['attrs'].get('data-cols')}, expected {L}x{D}")
c = run.charts.get("stats-scatter")
check(c is not None and c["points"] == L, f"stats-scatter: expected {L} points, got {c and c['points']}")
text = " ".join(run.text)
check("Latest plan" in text and "CBC optimal" in text, "latest plan section missing")
# The bf16 reference alone: loss charts, no precision charts, the explanation.
check("no precision decisions (policy none" in " ".join(ref.text), "bf16 report: 'no precision decisions (policy none ...)' missing")
check("precision-map" not in ref.charts and "error-map" not in ref.charts, "bf16 report has a precision chart")
check(len(ref.charts.get("loss", {}).get("series", [])) == 1, "bf16 report: loss chart should have 1 series (raw loss, no EMA at 40 steps)")
if errors:
    print("FAIL:\n  " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"report DOM ok: {len(run.charts)} charts, heat maps {L}x{D}")
PY

# ---- screenshot
rm -f "$artifacts/report.png"
chrome --screenshot="$artifacts/report.png" --window-size=1400,4000 "file://$tmp/report.html" >/dev/null || {
  cat "$tmp/chromium.log" >&2; echo "FAIL: chromium --screenshot" >&2; exit 1; }
size=$(stat -c %s "$artifacts/report.png" 2>/dev/null || echo 0)
if [ "$size" -le 10240 ]; then
  echo "FAIL: screenshot $artifacts/report.png is $size bytes (expected > 10 kB)" >&2
  exit 1
fi
echo "report_browser: ok; screenshot $artifacts/report.png ($size bytes), page $artifacts/report.html"
