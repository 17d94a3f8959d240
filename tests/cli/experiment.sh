#!/usr/bin/env bash
# The shortened comparison experiment: every default arm of `snip experiment`
# (none, uniform-fp8, uniform-fp4, snip at 0.5 and 0.75, the four heuristics
# at 0.75) trains a micro model for 16 steps on the Brown Corpus; the table,
# JSON, CSV and chart must be complete, and a second call must reuse the
# trained arms instead of training them again.
#
# usage: experiment.sh SNIP_BINARY PREPARED_DATA_DIR
set -eu
snip="$1"; data="$2"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/micro.toml" <<TOML
[model]
hidden_size = 64
intermediate_size = 172
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 64
[data]
dir = "$data"
[train]
batch_size = 8
seq_len = 64
max_steps = 16
lr = 1e-2
warmup_steps = 4
eval_interval = 4
eval_batches = 4
log_interval = 1000
checkpoint_interval = 0
threads = 1
[precision]
warmup_steps = 2
initial_interval = 6
final_interval = 6
TOML
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp" >"$tmp/out" 2>"$tmp/err" || {
  cat "$tmp/err" >&2; exit 1; }
/usr/bin/python3 - "$tmp/exp" <<'PY'
import json, math, re, sys
d = sys.argv[1]
rows = json.load(open(d + "/results.json"))
want = ["none", "uniform-fp8", "uniform-fp4", "snip-0.5", "snip-0.75", "min-rel-err-0.75",
        "layer-type-0.75", "first-last-fp8-0.75", "random-0.75"]
assert [r["arm"] for r in rows] == want, [r["arm"] for r in rows]
for r in rows:
    assert r["trained"] and r["steps"] == 16, r
    for k in ("final_val_loss", "gap_pct", "fp4_share", "seconds", "tokens_per_s"):
        assert isinstance(r[k], float) and math.isfinite(r[k]), (r["arm"], k, r[k])
    # the arm's own summary and metrics back the table
    s = json.load(open(f"{d}/{r['arm']}/summary.json"))
    assert s["final_val_loss"] == r["final_val_loss"], r["arm"]
    m = [json.loads(l) for l in open(f"{d}/{r['arm']}/metrics.jsonl")]
    share = sum(x["fp4_share"] for x in m) / len(m)
    assert abs(share - r["fp4_share"]) < 1e-12, (r["arm"], share, r["fp4_share"])
    assert s["policy"] == r["policy"], (s["policy"], r["policy"])
    assert s["gemm_dtype"] == r["gemm_dtype"] == "bf16", (s["gemm_dtype"], r["gemm_dtype"])
# The unquantized baseline is named for what it is: policy none, with its GEMM dtype.
md = open(d + "/results.md").read()
assert "| gap to none (bf16 GEMMs) |" in md and "| none | none (bf16 GEMMs) | - |" in md, md
ref = rows[0]["final_val_loss"]
for r in rows:
    assert abs(r["gap_pct"] - 100 * (r["final_val_loss"] - ref) / ref) < 1e-9, r
by = {r["arm"]: r for r in rows}
assert by["none"]["fp4_share"] == 0 and by["uniform-fp8"]["fp4_share"] == 0
# uniform FP4 runs FP4 between warmup (2 steps) and the final 10% (2 steps): 12 of 16 steps
assert abs(by["uniform-fp4"]["fp4_share"] - 12 / 16) < 1e-12, by["uniform-fp4"]["fp4_share"]
for a in want[3:]:
    budget = 0.5 if a == "snip-0.5" else 0.75
    assert by[a]["fp4_share"] >= budget * 12 / 16 - 1e-9, (a, by[a]["fp4_share"])
md = open(d + "/results.md").read()
assert len([l for l in md.splitlines() if l.startswith("| ") and not l.startswith("| arm")]) == 9, md
svg = open(d + "/val_loss.svg").read()
paths = re.findall(r'<path class="series" data-series="([^"]+)" d="(M[^"]+)"', svg)
assert [p[0] for p in paths] == want, [p[0] for p in paths]
assert all(p[1].count("L") >= 3 for p in paths), "a curve with fewer than 4 evaluations"
print("experiment ok:", len(rows), "arms")
PY
grep -q "| snip-0.75 | snip | 0.75 |" "$tmp/out"
# A second call reuses every arm.
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp" >"$tmp/out2" 2>"$tmp/err2"
test "$(grep -c 'already trained' "$tmp/err2")" -eq 9
# A bad arm fails before anything is trained, in one line.
set +e
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp2" --arms bf16,snip-1.5 >/dev/null 2>"$tmp/err3"
rc=$?
set -e
test "$rc" -eq 2 && test "$(wc -l <"$tmp/err3")" -eq 1 && grep -q "snip-1.5" "$tmp/err3" && test ! -e "$tmp/exp2"
# A changed configuration does not silently reuse the arms trained before.
set +e
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp" --set train.lr=0.02 >/dev/null 2>"$tmp/err4"
rc=$?
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp" --set precision.policy=snip >/dev/null 2>"$tmp/err5"
rc5=$?
set -e
test "$rc" -eq 2 && grep -q "was trained with train.lr = 0.01, the configuration now says 0.02" "$tmp/err4"
test "$rc5" -eq 2 && grep -q "precision.policy is set by each arm" "$tmp/err5"
# The rivals' rules as arms: no budget; each reaches its rule's FP4 share.
# By hand for this model (hidden 64, intermediate 172, KV 32; FLOPs per block
# 2*64*64 + 2*64*32 + 3*64*172 = 45312): bf16-tail keeps round(0.15 * 14) = 2
# layers high, block 1's up_proj and down_proj (2*64*172 = 22016 of 90624);
# first-last-n (n = 1 of 2 blocks) keeps every layer high.
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/rivals" --arms bf16-tail,first-last-n,autoswitch,snip-0.75+fprop \
  >"$tmp/out6" 2>"$tmp/err6" || { cat "$tmp/err6" >&2; exit 1; }
/usr/bin/python3 - "$tmp/rivals" <<'PY'
import json, sys
d = sys.argv[1]
rows = {r["arm"]: r for r in json.load(open(d + "/results.json"))}
plan = lambda arm: json.load(open(f"{d}/{arm}/plans/step-2.json"))
p = plan("bf16-tail")
assert p["phase"] == "plan" and abs(p["fp4_share"] - (90624 - 22016) / 90624) < 1e-12, p["fp4_share"]
assert sorted(k for k, v in p["assignments"].items() if v != "fp4") == [
    "model.layers.1.mlp.down_proj", "model.layers.1.mlp.up_proj"], p["assignments"]
assert plan("first-last-n")["fp4_share"] == 0.0 and rows["first-last-n"]["fp4_share"] == 0.0
a = plan("autoswitch")
assert len(a["assignments"]) == 14 * 3 and all(":" in k for k in a["assignments"]), a["assignments"]
assert "q_table" in a and 0.0 <= a["fp4_share"] <= 1.0
# +fprop: the final phase (from step 16 - round(0.1 * 16) = 14) raises fprop only.
f = json.load(open(f"{d}/snip-0.75+fprop/plans/step-14.json"))
assert f["phase"] == "final" and f["final_phase_gemms"] == "fprop", f.get("final_phase_gemms")
assert all(v == "fp8" for k, v in f["assignments"].items() if k.endswith(":fprop")) and len(f["assignments"]) == 42
assert "final_phase_gemms = 'fprop'" in open(f"{d}/snip-0.75+fprop/config.toml").read()
assert rows["snip-0.75+fprop"]["sets"] == {"precision.final_phase_gemms": "fprop"}, rows["snip-0.75+fprop"]
for r in rows.values():
    assert r["trained"] and r["steps"] == 16, r
print("rival arms ok:", {k: round(r["fp4_share"], 4) for k, r in rows.items()})
PY
# An arm with a +modifier is compared with the same arm without it (the
# late forward-only raise against the all-GEMM final phase), per seed, not
# only with the reference (none).
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/twins" --arms none,snip-0.75,snip-0.75+fprop,snip-0.75+nofinal --seeds 2 \
  >"$tmp/out9" 2>"$tmp/err9" || { cat "$tmp/err9" >&2; exit 1; }
/usr/bin/python3 - "$tmp/twins" <<'PY'
import json, sys
j = json.load(open(sys.argv[1] + "/results.json"))
loss = {a["arm"]: {r["seed"]: r["final_val_loss"] for r in a["runs"]} for a in j["arms"]}
p = [c for c in j["paired"] if c["a"] == "snip-0.75+fprop" and c["b"] == "snip-0.75"]
assert len(p) == 1, [(c["a"], c["b"]) for c in j["paired"]]
want = [loss["snip-0.75+fprop"][s] - loss["snip-0.75"][s] for s in p[0]["seeds"]]
assert p[0]["seeds"] == [1234, 1235] and p[0]["differences"] == want, (p[0], want)
assert not [c for c in j["paired"] if c["a"] == "snip-0.75" and c["b"] == "snip-0.75+fprop"]
# +nofinal: no final phase (16 steps, fraction 0.1 would start it at step 14),
# so no plan says "final"; paired with snip-0.75 and with +fprop (the late raise
# against no raise), in --arms order.
import glob
phases = {json.load(open(f))["phase"] for f in glob.glob(sys.argv[1] + "/snip-0.75+nofinal/seed-*/plans/step-*.json")}
assert phases and "final" not in phases, phases
for s in (1234, 1235):
    assert "final_high_precision_fraction = 0" in open(f"{sys.argv[1]}/snip-0.75+nofinal/seed-{s}/config.toml").read()
pairs = {(c["a"], c["b"]) for c in j["paired"]}
assert ("snip-0.75+nofinal", "snip-0.75") in pairs and ("snip-0.75+fprop", "snip-0.75+nofinal") in pairs, pairs
assert ("snip-0.75+nofinal", "snip-0.75+fprop") not in pairs, pairs
r = [c for c in j["paired"] if (c["a"], c["b"]) == ("snip-0.75+fprop", "snip-0.75+nofinal")][0]
assert r["differences"] == [loss["snip-0.75+fprop"][s] - loss["snip-0.75+nofinal"][s] for s in r["seeds"]], r
print("modifier twins ok:", want)
PY
# The same tables again from the trained folders (--no-train reads each
# arm's config.toml back, +nofinal's number included).
"$snip" experiment --out "$tmp/twins" --no-train --arms none,snip-0.75,snip-0.75+fprop,snip-0.75+nofinal \
  >"$tmp/out11" 2>"$tmp/err11" || { cat "$tmp/err11" >&2; exit 1; }
grep -q "| snip-0.75+fprop | snip-0.75+nofinal | 2 |" "$tmp/twins/results.md"
set +e
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp5" --arms bf16-tail-0.5 >/dev/null 2>"$tmp/err7"
rc=$?
set -e
test "$rc" -eq 2 && grep -q "policy bf16-tail takes no budget" "$tmp/err7" && test ! -e "$tmp/exp5"
set +e
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp5" --arms snip-0.75+late >/dev/null 2>"$tmp/err8"
rc=$?
set -e
test "$rc" -eq 2 && grep -q "unknown modifier '+late'" "$tmp/err8" && test ! -e "$tmp/exp5"
for bad in "bf16-tail+time:+time does not apply" "snip-0.75+fprop+fprop:given twice" \
           "snip-0.75+fprop+nofinal:+nofinal removes the phase" "snip-0+time:expected a budget in (0, 1e6\]" \
           "autoswitch-gemm:always plans per GEMM"; do
  set +e
  "$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp5" --arms "${bad%%:*}" >/dev/null 2>"$tmp/err9"
  rc=$?
  set -e
  test "$rc" -eq 2 && grep -q "${bad#*:}" "$tmp/err9" && test ! -e "$tmp/exp5"
done
# Under +time the budget is a ratio to the BF16 GEMM time, above 1 allowed
# (emulated FP4/FP8 are slower than BF16 on CPUs): 1000x admits any plan.
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/timearm" --arms snip-1000+time >"$tmp/out10" 2>"$tmp/err10" \
  || { cat "$tmp/err10" >&2; exit 1; }
grep -q "budget_unit = 'time'" "$tmp/timearm/snip-1000+time/config.toml"
grep -q "budget = 1000" "$tmp/timearm/snip-1000+time/config.toml"
test -s "$tmp/timearm/snip-1000+time/gemm_times.json"
# A +time arm planning with a given table sits in one experiment with FLOPs
# arms (where the table comes from may differ between arms).
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/twins" --arms snip-1000+time --seeds 2 \
  --set "precision.gemm_times=$tmp/timearm/snip-1000+time/gemm_times.json" >"$tmp/out12" 2>"$tmp/err12" \
  || { cat "$tmp/err12" >&2; exit 1; }
"$snip" experiment --out "$tmp/twins" --no-train --arms none,snip-0.75,snip-1000+time >"$tmp/out13" 2>"$tmp/err13" \
  || { cat "$tmp/err13" >&2; exit 1; }
grep -q "| snip-1000+time | none | 2 |" "$tmp/twins/results.md"
grep -q "| snip-1000+time | snip-0.75 | 2 |" "$tmp/twins/results.md"
# With a FLOPs arm as the reference (its precision options are compared).
"$snip" experiment --out "$tmp/twins" --no-train --arms snip-0.75,snip-1000+time >"$tmp/out14" 2>"$tmp/err14" \
  || { cat "$tmp/err14" >&2; exit 1; }
test "$(grep -c "| snip-1000+time | snip-0.75 | 2 |" "$tmp/twins/results.md")" -eq 1
# Killing the experiment stops its training child too.
"$snip" experiment --config "$tmp/micro.toml" --out "$tmp/exp3" --arms bf16 --set train.max_steps=100000 \
  >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do pgrep -f "run-dir $tmp/exp3/bf16" >/dev/null && break; sleep 0.1; done
pgrep -f "run-dir $tmp/exp3/bf16" >/dev/null
kill -TERM "$pid"
wait "$pid" || true
for _ in $(seq 50); do pgrep -f "run-dir $tmp/exp3/bf16" >/dev/null || break; sleep 0.1; done
! pgrep -f "run-dir $tmp/exp3/bf16" >/dev/null
echo "experiment.sh: ok"
