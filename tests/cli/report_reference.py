#!/usr/bin/env python3
"""Reports that compare like with like, through the real binary:

- `snip report RUN --reference OTHER` with OTHER trained on data of another
  tokenizer and vocabulary: refused with one line naming both runs and what
  differs, exit 2, no report written; --force writes it with a warning that
  names the differences.
- A reference on the same data with another model and step count: each
  difference one `snip: note:` line and a row of the report's header; a
  run evaluated once is a marker in the validation chart, not an invisible
  zero-length line.
- A resumed run: the console summary, summary.json and the report's
  throughput card cover every session (steps, tokens, seconds), and say
  where it was resumed.

usage: report_reference.py SNIP_BINARY PREPARED_DATA_DIR
"""
import json
import os
import random
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, micro_toml  # noqa: E402

snip, data = sys.argv[1], os.path.abspath(sys.argv[2])
tmp = tempfile.mkdtemp(prefix="snip-report-ref-")
T = Checks(snip)
check = T.check


def run(*args):
    return T.run(args, timeout=300)


def read(path):
    with open(path) as f:
        return f.read()


def train(name, data_dir, extra, *more):
    cfg = os.path.join(tmp, name + ".toml")
    micro_toml(cfg, data_dir, extra)
    d = os.path.join(tmp, name)
    rc, out, err = run("train", "--config", cfg, "--run-dir", d, *more)
    check(rc == 0, "train " + name, err[-500:])
    return d, out, err


# Another corpus, another tokenizer: 200 generated ASCII documents, BPE of 320 pieces.
rng = random.Random(7)
words = "the a of and to in model loss token step data run layer train weight value quick brown fox".split()
corpus = os.path.join(tmp, "corpus")
os.makedirs(corpus)
for d in range(200):
    with open(os.path.join(corpus, f"doc{d:03d}.txt"), "w") as f:
        for _ in range(20):
            f.write(" ".join(rng.choice(words) for _ in range(12)).capitalize() + ".\n")
other_data = os.path.join(tmp, "other-data")
rc, out, err = run("data", "prepare", "--input", corpus, "--vocab-size", "320", "--out", other_data)
check(rc == 0, "prepare the other data", err[-400:])

quiet = "eval_batches = 1\nsample_tokens = 0\n"
# a: 4 steps, evaluated once (step 4). b: another tokenizer. c: same data, another model, 6 steps.
a, _, _ = train("a", data, "max_steps = 4\neval_interval = 100\n" + quiet)
b, _, _ = train("b", other_data, "max_steps = 4\neval_interval = 100\n" + quiet)
c, _, _ = train("c", data, "max_steps = 6\neval_interval = 3\n" + quiet, "--set", "model.hidden_size=48")

# ---- incomparable losses: refused, nothing written
out_html = os.path.join(tmp, "ab.html")
T.expect_error("reference on another tokenizer", ["report", a, "--reference", b, "--out", out_html],
               f"snip report: {a} and the reference {b} have incomparable losses", untouched=a, absent=out_html)
rc, out, err = run("report", a, "--reference", b, "--out", out_html)
line = err.strip()
for needle in ["tokenizer: SHA-256", "vocabulary: 512 (a) vs 320 (b)", "validation data: SHA-256", "--force"]:
    check(needle in line, "the refusal names " + needle, line)

# ---- --force: written, with the warning naming the differences
rc, out, err = run("report", a, "--reference", b, "--out", out_html, "--force")
check(rc == 0 and out.strip() == out_html and os.path.exists(out_html), "--force writes the report", err[-400:])
notes = err.splitlines()
check(any(l.startswith("snip: warning: --force: tokenizer:") for l in notes), "--force warns of the tokenizer", err)
check(any(l == "snip: warning: --force: vocabulary: 512 (a) vs 320 (b)" for l in notes), "--force warns of the vocabulary", err)
check(any(l.startswith("snip: note: data folder: ") for l in notes), "the data folders are a note", err)
html = read(out_html)
check('<div class="warning" id="incomparable"><b>The losses are not comparable</b>: tokenizer, vocabulary, '
      'validation data differ between a and the reference b' in html, "the report carries the warning", html[:200])

# ---- a comparable reference: differences stated, not refused
out_ac = os.path.join(tmp, "ac.html")
rc, out, err = run("report", a, "--reference", c, "--out", out_ac)
check(rc == 0, "comparable reference", err[-400:])
notes = err.splitlines()
check("snip: note: model: C=32, 1 layer, 2/1 heads, SwiGLU 64, tied (a) vs C=48, 1 layer, 2/1 heads, SwiGLU 64, tied (c)"
      in notes,
      "the model is a note", err)
check("snip: note: steps: 4 (a) vs 6 (c)" in notes, "the steps are a note", err)
check(not any("tokenizer" in l or "validation" in l or "vocabulary" in l for l in notes),
      "same tokenizer and validation set: nothing said", err)
check(len(notes) == 2, "two notes (model, steps)", err)
html = read(out_ac)
check('<table class="compare" id="comparison" data-rows="2">' in html and 'class="warning"' not in html,
      "the header lists the two differences", "")
# The validation chart: a's one evaluation (step 4) and c's two (steps 3, 6) are markers.
val = html[html.index('data-chart="val-loss"'):]
val = val[:val.index("</svg>")]
check(len(re.findall(r'class="marker" data-series="val loss" data-x="4"', val)) == 1,
      "a run evaluated once shows a marker", val[-600:])
check(len(re.findall(r'class="marker" data-series="c val loss"', val)) == 2, "the reference's evaluations are markers",
      val[-600:])
# c as the run, a (evaluated once) as the reference: a's single point is a hollow marker.
rc, out, err = run("report", c, "--reference", a, "--out", os.path.join(tmp, "ca.html"))
val = read(os.path.join(tmp, "ca.html"))
val = val[val.index('data-chart="val-loss"'):]
m = re.search(r'<circle class="marker" data-series="a val loss" data-x="4"[^>]*>', val)
check(rc == 0 and m is not None and 'fill="#FFFFFF"' in m.group(0), "a reference evaluated once is a hollow marker",
      val[-600:])

# ---- a resumed run: the summary covers every session
r, out1, err1 = train("r", data, "max_steps = 10\ncheckpoint_interval = 5\neval_interval = 5\n" + quiet)
first = json.load(open(os.path.join(r, "summary.json")))
elapsed10 = json.load(open(os.path.join(r, "checkpoints", "step-10", "trainer_state.json")))["elapsed_s"]
rc, out2, err2 = run("train", "--run-dir", r, "--resume", "--set", "train.max_steps=20")
check(rc == 0, "resume to 20 steps", err2[-400:])
s = json.load(open(os.path.join(r, "summary.json")))
tokens_per_step = 2 * 16 * 1  # micro_toml: B x T x grad_accum
check(first["steps"] == 10 and first["resumed_at"] == [], "first session's summary", str(first))
check(s["steps"] == 20 and s["tokens"] == 20 * tokens_per_step and s["tokens_total"] == 20 * tokens_per_step,
      "summary.json counts every step and token", str(s))
check(s["resumed_at"] == [10] and s["invocation"]["start_step"] == 10 and s["invocation"]["steps"] == 10
      and s["invocation"]["tokens"] == 10 * tokens_per_step, "summary.json says where it was resumed", str(s))
check(abs(s["seconds"] - (elapsed10 + s["invocation"]["seconds"])) < 1e-9 and s["seconds"] > s["invocation"]["seconds"]
      and s["seconds"] >= elapsed10 > 0, "seconds: the first session up to its checkpoint plus the second", str(s))
check(abs(s["tokens_per_s"] - s["tokens"] / s["seconds"]) < 1e-6 * s["tokens_per_s"], "tokens/s over the whole run",
      str(s))
m = re.search(r"summary: (\d+) steps \((\d+) in this session, resumed at step (\d+)\), (\d+) tokens in ([0-9.]+) s "
              r"\((\d+) tokens/s\)", out2)
check(m is not None and m.groups()[:4] == ("20", "10", "10", str(20 * tokens_per_step))
      and abs(float(m.group(5)) - s["seconds"]) <= 0.051, "the console summary covers the whole run", out2)
check("in this session" not in out1 and re.search(r"summary: 10 steps, 320 tokens in", out1) is not None,
      "an uninterrupted run's summary says nothing of sessions", out1)
html = read(os.path.join(r, "report.html"))
card = re.search(r'<div class="k">throughput</div><div class="v">(\d+) tok/s</div><div class="d">([^<]*)</div>', html)
check(card is not None and int(card.group(1)) == round(s["tokens_total"] / s["elapsed_s"])
      and card.group(2) == "over every session", "the throughput card covers the whole run", str(card and card.groups()))
check("2 sessions: resumed at step 10" in html, "the report says where it was resumed", "")
st = json.load(open(os.path.join(r, "checkpoints", "step-20", "trainer_state.json")))
check(st["resumed_at"] == [10] and len(st["data"]["val_sha256"]) == 64, "the checkpoint records resumes and val.bin",
      json.dumps(st["data"]))

shutil.rmtree(tmp, ignore_errors=True)
T.finish()
