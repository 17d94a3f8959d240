#!/usr/bin/env python3
"""The shipped dashboard and alert rules use only metrics snip exports.

usage: check_deploy.py METRIC_NAMES_BINARY REPO_ROOT

Parses deploy/grafana/snip-dashboard.json (every panel, rows included) and
deploy/prometheus/snip-rules.yml, pulls the metric names out of each PromQL
expression and checks each against the exporter's own list (the
metric_names binary prints monitor::metric_table()). Prometheus's own series
(`up`) are allowed in the rules only. Also checks the dashboard's structure:
unique panel ids, a Prometheus datasource variable, the panels it must show,
and that the provisioning files name the dashboard's folder and a Prometheus
datasource."""
import json
import os
import re
import subprocess
import sys

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "Inf", "NaN", "inf", "nan"}


def metric_names(expr):
    """Identifiers of `expr` that are metric names: not in strings, label
    matchers or ranges, not functions (followed by '('), not keywords, not
    label names in by/without/on/ignoring (...) lists."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    e = re.sub(r"\{[^}]*\}", "", e)                        # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                       # ranges [5m]
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tok = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or tok in PROMQL_WORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", tok):
            continue
        names.add(tok)
    return names


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def main():
    binary, root = sys.argv[1], sys.argv[2]
    exported = set(subprocess.run([binary], check=True, capture_output=True, text=True).stdout.split())
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check(len(exported) >= 20 and all(n.startswith("snip_") for n in exported),
          f"the exporter lists {len(exported)} snip_ metrics")
    # a self-test of the extractor on known expressions
    check(metric_names('(snip_loss - avg_over_time(snip_loss[5m])) / avg_over_time(snip_loss[5m]) > 0.5')
          == {"snip_loss"}, "extractor: functions and ranges are not metric names")
    check(metric_names('max by (layer) (snip_quant_rel_error{gemm="fprop"}) or up{job="x"} == +Inf')
          == {"snip_quant_rel_error", "up"}, "extractor: by-lists, matchers and Inf are not metric names")

    with open(os.path.join(root, "deploy/grafana/snip-dashboard.json")) as f:
        dash = json.load(f)
    all_panels = list(panels(dash["panels"]))
    ids = [p["id"] for p in all_panels]
    check(len(ids) == len(set(ids)), f"{len(ids)} panels with unique ids")
    dsvars = [v for v in dash.get("templating", {}).get("list", []) if v.get("type") == "datasource"]
    check(len(dsvars) == 1 and dsvars[0]["query"] == "prometheus", "one Prometheus datasource variable")
    used = set()
    for p in all_panels:
        for t in p.get("targets", []):
            names = metric_names(t["expr"])
            check(bool(names), f"panel {p['id']} '{p['title']}': {t['expr']} names a metric")
            unknown = names - exported
            check(not unknown, f"panel {p['id']} '{p['title']}': {t['expr']}" +
                  (f": not exported: {sorted(unknown)}" if unknown else ""))
            used |= names
            ds = t.get("datasource", p.get("datasource", {}))
            check(ds.get("uid") == "${datasource}", f"panel {p['id']} target {t['refId']} uses the datasource variable")
    for need in ["snip_loss", "snip_val_loss", "snip_tokens_per_second", "snip_fp4_flops_share",
                 "snip_quant_rel_error", "snip_layer_precision_bits", "snip_quant_operand_rel_error",
                 "snip_quant_operand_rel_error_streak"]:
        check(need in used, f"the dashboard shows {need}")
    check(any(p["type"] == "alertlist" for p in all_panels), "the dashboard has an alert list")
    check(any(p["type"] in ("heatmap", "status-history") and "snip_quant_rel_error" in
              "".join(t["expr"] for t in p.get("targets", [])) for p in all_panels),
          "the per-layer quantization error is a heat map (status history: one row per layer)")
    check(any(p["type"] == "status-history" and "snip_quant_operand_rel_error" in
              "".join(t["expr"] for t in p.get("targets", [])) and
              all("{{operand}}" in t.get("legendFormat", "") and "{{format}}" in t.get("legendFormat", "")
                  for t in p.get("targets", [])) for p in all_panels),
          "the per-step operand error is a heat map whose rows name layer, operand and format")

    # The alert rules (YAML without a YAML library: the expr lines).
    with open(os.path.join(root, "deploy/prometheus/snip-rules.yml")) as f:
        exprs = [m.group(1).strip() for m in re.finditer(r"^\s*expr:\s*(.+)$", f.read(), re.M)]
    check(len(exprs) >= 5, f"{len(exprs)} alert expressions")
    for e in exprs:
        unknown = metric_names(e) - exported - {"up"}
        check(not unknown, f"rule {e}" + (f": not exported: {sorted(unknown)}" if unknown else ""))

    with open(os.path.join(root, "deploy/grafana/provisioning/datasources/snip.yml")) as f:
        check("type: prometheus" in f.read(), "provisioning: a Prometheus datasource")
    with open(os.path.join(root, "deploy/grafana/provisioning/dashboards/snip.yml")) as f:
        check("type: file" in f.read(), "provisioning: a file dashboard provider")

    print(f"{len(failures)} failed" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
