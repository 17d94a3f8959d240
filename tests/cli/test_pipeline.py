#!/usr/bin/env python3
"""Pipeline stages (docs/distributed.md "Pipeline stages") through the real
binary: `snip train` processes over c10d Gloo on 127.0.0.1, one thread per
rank, the micro model with 4 decoder blocks (untied lm_head unless said):

  exact     2 stages (1F1B and GPipe, M = 2) == 1 process with grad_accum 2,
            bit for bit: loss, grad_norm, val_loss of every step; the final
            model.safetensors byte for byte; rank 1 wrote no file; the bytes
            at the boundaries = 2 directions x M x B·T·C x 4 (hand-computed)
  four      4 stages (M = 4) == 1 process with grad_accum 4, bit for bit;
            2 stages x 2 replicas == 2 data-parallel ranks with grad_accum
            2, bit for bit (the replicas group micro-batches as data
            parallelism does); a parameter perturbed on world rank 3 is named
            as rank 3 by the stage's weight check
  tied      tied lm_head over 2 stages (the two halves of the embedding
            gradient summed across stages): M = 1 bit for bit, M = 2 within
            1e-6 relative (the halves are summed in another order); over 4
            stages (middle stages add zeros) M = 1 bit for bit
  fp8       dist.boundary_comm = fp8: bytes = 2 x M x (B·T·C + 4) per step,
            losses within 1e-3 relative of fp32 boundaries, not equal
  snip      policy snip on 2 stages: the first stats step measures what one
            process measures (its "measured" numbers equal); every plan
            equals `snip plan --stats FILE --stages 2` on the saved
            statistics; each stage's first and last layer at fp8 and each
            stage's FP4 share >= the budget; `snip plan show` has a stage
            column; the report names the stages
  delayed   precision.recipe = fp8_tensor (delayed scaling: per-layer amax
            histories that only the layer's stage updates) on 2 stages ==
            1 process bit for bit, validation included (every rank gets the
            other stages' histories before it evaluates); stopped at step 3
            and resumed == uninterrupted (the checkpoint holds every stage's
            histories)
  rebalance 8 blocks on 2 stages, policy snip with dist.stage_cost making
            quantized GEMMs nearly free: the first plan (step 2) makes the
            shape-balanced split 5 / 3 slower than 7 / 1 (lm_head stays
            BF16), so the blocks move at the checkpoint of step 3; the run
            equals, bit for bit, the same run stopped at step 3 and resumed
            with dist.stage_split = "7,1" (weights, AdamW state and plans
            moved exactly); its last checkpoint records bounds [0, 7, 8]
  cost      dist.stage_cost = measured: rank 0 times each option's layer,
            the log names the factors (bf16 = 1), the run trains
  resume    2 stages stopped at step 3 and resumed == uninterrupted, bit for
            bit; that checkpoint resumed on 4 stages and on 1 process gives
            the same losses as each other (re-split by parameter name)
  killed    stage 1's process SIGKILLed: stage 0 stops within 60 s with one
            line naming rank 1
  errors    3 ranks for 2 stages, ZeRO, quantized gradient communication,
            more stages than blocks, a bad dist.stage_split, dist.stage_cost
            or dist.stage_boundary: one `snip: error:` line, exit 2, on every
            rank, nothing written; rank 1 started with another
            dist.micro_batches, dist.pipeline_stages, dist.stage_split or
            dist.pipeline_schedule: both stop at once naming the setting

usage: test_pipeline.py SNIP_BINARY PREPARED_DATA_DIR [CASE...]
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, free_port, micro_toml  # noqa: E402

snip, data = sys.argv[1], sys.argv[2]
cases = sys.argv[3:] or ["exact", "four", "tied", "fp8", "snip", "delayed", "rebalance", "cost", "resume",
                         "killed", "errors"]
tmp = tempfile.mkdtemp(prefix="snip-pipeline-")
T = Checks(snip)
check = T.check
procs = []

B, SEQ, C = 2, 16, 32  # the micro model (clitest.micro_toml)
cfg = os.path.join(tmp, "m.toml")
micro_toml(cfg, data, "max_steps = 6\neval_interval = 3\neval_batches = 2\ncheckpoint_interval = 3\n"
           "sample_tokens = 0\nlog_interval = 1")
BASE = ["model.num_hidden_layers=4", "model.tie_word_embeddings=false"]
KEYS = ["step", "loss", "grad_norm", "val_loss"]



def train(world, run, sets, resume=False, timeout=180, kill=None, rank_sets=None):
    """`snip train` on `world` ranks (1 = a plain process); [(rc, stdout +
    stderr)] per rank. kill = (rank, seconds): SIGKILL that rank after that long."""
    args = [snip, "train", "--config", cfg, "--run-dir", run] + (["--resume"] if resume else [])
    for s in sets:
        args += ["--set", s]
    port = free_port()
    ps = []
    for r in range(world):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("SLURM_") or k.startswith("TORCHELASTIC_"):
                del env[k]
        if world > 1:
            env.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "GLOO_SOCKET_IFNAME": "lo"})
        extra = []
        for s in (rank_sets or {}).get(r, []):
            extra += ["--set", s]
        p = subprocess.Popen(args + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        procs.append(p)
        ps.append(p)
    if kill:
        time.sleep(kill[1])
        os.killpg(ps[kill[0]].pid, signal.SIGKILL)
    out = []  # (rc, stdout + stderr): the log lines, then the errors
    for p in ps:
        try:
            so, err = p.communicate(timeout=timeout)
            out.append((p.returncode, so + err))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, err = p.communicate()
            out.append(("timeout", so + err))
    return out


def ok(name, res):
    good = all(rc == 0 for rc, _ in res)
    check(good, name, [e[-600:] for rc, e in res if rc != 0])
    return good


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def same_metrics(a, b):
    return [{k: r.get(k) for k in KEYS} for r in metrics(a)] == [{k: r.get(k) for k in KEYS} for r in metrics(b)]


def max_rel(a, b, key="loss"):
    return max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(metrics(a), metrics(b)))


def read(p):
    with open(p, "rb") as f:
        return f.read()


def d(name):
    p = os.path.join(tmp, name)
    shutil.rmtree(p, ignore_errors=True)
    return p


try:
    if "exact" in cases or "resume" in cases:
        one = d("one-m2")
        ok("exact: 1 process, grad_accum 2", train(1, one, BASE + ["train.grad_accum=2"]))
    if "exact" in cases:
        for sched in ("1f1b", "gpipe"):
            two = d("two-" + sched)
            if not ok(f"exact: 2 stages {sched}", train(2, two, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2",
                                                                       "dist.pipeline_schedule=" + sched])):
                continue
            check(same_metrics(one, two) and len(metrics(two)) == 6, f"exact: {sched} metrics bit for bit",
                  f"{metrics(one)[:1]} vs {metrics(two)[:1]}")
            check(read(os.path.join(one, "checkpoints/step-6/model.safetensors")) ==
                  read(os.path.join(two, "checkpoints/step-6/model.safetensors")),
                  f"exact: {sched} model.safetensors byte for byte")
            m = metrics(two)
            check(all(r.get("boundary_bytes") == 2 * 2 * B * SEQ * C * 4 for r in m),
                  f"exact: {sched} boundary bytes = 2 x M x B*T*C x 4", str([r.get("boundary_bytes") for r in m]))
            check(all(0 <= r.get("pipe_bubble", -1) <= 1 for r in m), f"exact: {sched} bubble in [0, 1]")
            with open(os.path.join(two, "summary.json")) as f:
                pp = json.load(f)["pipeline"]
            check(pp["stages"] == 2 and pp["micro_batches"] == 2 and abs(pp["ideal_bubble"] - 1 / 3) < 1e-12
                  and pp["schedule"] == sched, f"exact: {sched} summary.json pipeline", str(pp))
            st = json.load(open(os.path.join(two, "checkpoints/step-6/trainer_state.json")))
            check(st["pipeline"]["bounds"] == pp["bounds"] and st["data_parallel"] == 1,
                  f"exact: {sched} trainer_state.json records the layout", str(st.get("pipeline")))

    if "four" in cases:
        one4 = d("one-m4")
        ok("four: 1 process, grad_accum 4", train(1, one4, BASE + ["train.grad_accum=4"]))
        four = d("four-stages")
        if ok("four: 4 stages", train(4, four, BASE + ["train.grad_accum=4", "dist.pipeline_stages=4"])):
            check(same_metrics(one4, four), "four: 4 stages == 1 process bit for bit",
                  f"{metrics(one4)[:1]} vs {metrics(four)[:1]}")
            check(read(os.path.join(one4, "checkpoints/step-6/model.safetensors")) ==
                  read(os.path.join(four, "checkpoints/step-6/model.safetensors")),
                  "four: 4 stages model.safetensors byte for byte")
        two2, dp2 = d("two-by-two"), d("dp-two")
        if ok("four: 2 stages x 2 replicas", train(4, two2, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2",
                                                                       "dist.check_interval=1"])) and \
           ok("four: 2 data-parallel ranks", train(2, dp2, BASE + ["train.grad_accum=2"])):
            check(same_metrics(dp2, two2) and read(os.path.join(dp2, "checkpoints/step-6/model.safetensors")) ==
                  read(os.path.join(two2, "checkpoints/step-6/model.safetensors")),
                  "four: 2x2 == 2 data-parallel ranks with grad_accum 2, bit for bit",
                  f"{metrics(dp2)[:1]} vs {metrics(two2)[:1]}")
            check(json.load(open(os.path.join(two2, "summary.json")))["pipeline"]["replicas"] == 2,
                  "four: 2x2 summary says 2 replicas")
        os.environ.update(SNIP_TEST_PERTURB_RANK="3", SNIP_TEST_PERTURB_STEP="2")
        try:
            res = train(4, d("perturbed"), BASE + ["train.grad_accum=2", "dist.pipeline_stages=2",
                                                   "dist.check_interval=1"])
        finally:
            del os.environ["SNIP_TEST_PERTURB_RANK"], os.environ["SNIP_TEST_PERTURB_STEP"]
        last = [e.strip().splitlines()[-1] for rc, e in res if rc == 2 and e.strip()]
        check(any("weights differ" in l and "on rank 3 differs from rank 2" in l for l in last),
              "four: the stage's weight check names world ranks 3 and 2", str(last))

    if "tied" in cases:
        tied = ["model.num_hidden_layers=4", "model.tie_word_embeddings=true"]
        for m, tol, stages in ((1, 0.0, 2), (2, 1e-6, 2), (1, 0.0, 4)):
            a, b = d(f"tied-one-{m}"), d(f"tied-{stages}-{m}")
            if ok(f"tied: 1 process M={m}", train(1, a, tied + [f"train.grad_accum={m}"])) and \
               ok(f"tied: {stages} stages M={m}", train(stages, b, tied + [f"train.grad_accum={m}",
                                                                          f"dist.pipeline_stages={stages}"])):
                check(max_rel(a, b) <= tol and max_rel(a, b, "grad_norm") <= max(tol, 1e-6) * 10,
                      f"tied: {stages} stages M={m} losses and norms within {tol} relative",
                      f"{max_rel(a, b)} {max_rel(a, b, 'grad_norm')}")

    if "fp8" in cases:
        a, b = d("fp32-boundary"), d("fp8-boundary")
        if ok("fp8: fp32 boundaries", train(2, a, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2"])) and \
           ok("fp8: fp8 boundaries", train(2, b, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2",
                                                         "dist.boundary_comm=fp8"])):
            check(all(r["boundary_bytes"] == 2 * 2 * (B * SEQ * C + 4) for r in metrics(b)),
                  "fp8: bytes = 2 x M x (B*T*C + 4)", str([r["boundary_bytes"] for r in metrics(b)]))
            rel = max_rel(a, b)
            check(0 < rel < 1e-3, "fp8: losses close to fp32 boundaries, not equal", str(rel))

    if "snip" in cases:
        snip_sets = ["train.grad_accum=2", "precision.policy=snip", "precision.warmup_steps=2",
                     "precision.initial_interval=2", "precision.final_interval=2",
                     "precision.final_high_precision_fraction=0", "precision.budget=0.5"]
        a, b = d("snip-one"), d("snip-two")
        if ok("snip: 1 process", train(1, a, BASE + snip_sets)) and \
           ok("snip: 2 stages", train(2, b, BASE + snip_sets + ["dist.pipeline_stages=2"])):
            sa = json.load(open(os.path.join(a, "stats/step-2.json")))
            sb = json.load(open(os.path.join(b, "stats/step-2.json")))
            check(sa["measured"]["details"] == sb["measured"]["details"],
                  "snip: the first stats step measures what one process measures")
            check(all("stage" in l for l in sb["layers"]), "snip: the stats file carries each layer's stage")
            for step in (2, 4):
                plan = json.load(open(os.path.join(b, f"plans/step-{step}.json")))
                rc, out, err = T.run(["plan", "--stats", os.path.join(b, f"stats/step-{step}.json"), "--stages", "2",
                                      "--budget", "0.5", "--options", "fp4,fp8", "--json"])
                check(rc == 0, f"snip: snip plan --stages 2 at step {step}", err[-300:])
                if rc == 0:
                    mine = {i["name"]: i["option"] for i in plan["items"]}
                    check({i["name"]: i["option"] for i in json.loads(out)["items"]} == mine,
                          f"snip: plan at step {step} == snip plan --stages 2 on its statistics")
                items = plan["items"]
                for s in (0, 1):
                    st = [i for i in items if i["stage"] == s]
                    check(st and st[0]["option"] == "fp8" and st[-1]["option"] == "fp8",
                          f"snip: step {step} stage {s}: first and last layer at fp8",
                          str([(i["name"], i["option"]) for i in st]))
                    check(plan["stage_fp4_share"][s] >= 0.5 - 1e-9, f"snip: step {step} stage {s} meets the budget",
                          str(plan["stage_fp4_share"]))
            rc, out, err = T.run(["plan", "show", b])
            check(rc == 0 and " stage" in out.splitlines()[2] and "stages:" in out, "snip: plan show has stages",
                  out[:400] + err[-300:])
            rc, out, err = T.run(["report", b])
            html = read(os.path.join(b, "report.html")).decode() if os.path.exists(os.path.join(b, "report.html")) else ""
            check(rc == 0 and "<th>stage</th>" in html and "bubble" in html, "snip: the report shows stages and bubble",
                  err[-300:])

    if "delayed" in cases:
        sets = BASE + ["train.grad_accum=2", "precision.recipe=fp8_tensor"]
        a, b, c = d("delayed-one"), d("delayed-two"), d("delayed-part")
        if ok("delayed: 1 process", train(1, a, sets)) and \
           ok("delayed: 2 stages", train(2, b, sets + ["dist.pipeline_stages=2"])):
            check(same_metrics(a, b), "delayed: 2 stages == 1 process bit for bit (validation included)",
                  f"{[r.get('val_loss') for r in metrics(a)]} vs {[r.get('val_loss') for r in metrics(b)]}")
            st = json.load(open(os.path.join(b, "checkpoints/step-3/trainer_state.json")))
            layers = {e["layer"] for e in st["precision"]["quantizers"]["fp8_tensor"]["delayed"]}
            check(layers == set(range(28)), "delayed: the checkpoint holds the histories of both stages' layers",
                  str(sorted(layers)))
            if ok("delayed: first 3 steps", train(2, c, sets + ["dist.pipeline_stages=2", "train.max_steps=3"])) and \
               ok("delayed: resumed", train(2, c, sets + ["dist.pipeline_stages=2"], resume=True)):
                check(same_metrics(b, c), "delayed: resume bit for bit")

    if "rebalance" in cases:
        sets = ["model.num_hidden_layers=8", "model.tie_word_embeddings=false", "train.grad_accum=2",
                "precision.policy=snip", "precision.warmup_steps=2", "precision.initial_interval=2",
                "precision.final_interval=2", "precision.final_high_precision_fraction=0", "precision.budget=0.5",
                "dist.stage_cost=fp4=0.01,fp8=0.01", "dist.pipeline_stages=2"]
        a, b = d("rebalance"), d("rebalance-resumed")
        if ok("rebalance: run", train(2, a, sets)):
            m = metrics(a)
            check([r.get("rebalanced_to") for r in m] == [None, None, None, [0, 7, 8], None, None],
                  "rebalance: blocks moved to 7 / 1 after the checkpoint of step 3",
                  str([r.get("rebalanced_to") for r in m]))
            st = json.load(open(os.path.join(a, "checkpoints/step-3/trainer_state.json")))
            st6 = json.load(open(os.path.join(a, "checkpoints/step-6/trainer_state.json")))
            check(st["pipeline"]["bounds"] == [0, 5, 8] and st6["pipeline"]["bounds"] == [0, 7, 8],
                  "rebalance: the checkpoints record the split in force",
                  f'{st["pipeline"]["bounds"]} {st6["pipeline"]["bounds"]}')
            if ok("rebalance: first 3 steps", train(2, b, sets + ["train.max_steps=3"])) and \
               ok("rebalance: resumed as 7,1", train(2, b, sets + ["dist.stage_split=7,1"], resume=True)):
                check(same_metrics(a, b) and read(os.path.join(a, "checkpoints/step-6/model.safetensors")) ==
                      read(os.path.join(b, "checkpoints/step-6/model.safetensors")),
                      "rebalance: in-run move == stop and resume with the new split, bit for bit")

    if "cost" in cases:
        res = train(2, d("cost"), BASE + ["train.grad_accum=2", "dist.pipeline_stages=2", "dist.stage_cost=measured",
                                          "precision.options=fp4,fp8,bf16", "train.max_steps=2"])
        if ok("cost: measured", res):
            line = [l for l in res[0][1].splitlines() if "measured on rank 0" in l]
            check(line and "bf16=1," in line[0] and "fp4=" in line[0] and "fp8=" in line[0],
                  "cost: the measured factors are logged", str(line))

    if "resume" in cases:
        full, part = d("resume-full"), d("resume-part")
        sets = BASE + ["train.grad_accum=2", "dist.pipeline_stages=2"]
        ok("resume: uninterrupted", train(2, full, sets))
        if ok("resume: first 3 steps", train(2, part, sets + ["train.max_steps=3"])):
            other = d("resume-other")
            shutil.copytree(part, other)
            single = d("resume-single")
            shutil.copytree(part, single)
            if ok("resume: resumed", train(2, part, sets, resume=True)):
                check(same_metrics(full, part), "resume: bit for bit")
                check(read(os.path.join(full, "checkpoints/step-6/model.safetensors")) ==
                      read(os.path.join(part, "checkpoints/step-6/model.safetensors")),
                      "resume: model.safetensors byte for byte")
            r4 = train(4, other, BASE + ["train.grad_accum=2", "dist.pipeline_stages=4"], resume=True)
            r1 = train(1, single, BASE + ["train.grad_accum=2"], resume=True)
            if ok("resume: on 4 stages", r4) and ok("resume: on 1 process", r1):
                check(same_metrics(other, single) and same_metrics(other, one),
                      "resume: 4 stages == 1 process == the 1-process run (re-split by name)")

    if "killed" in cases:
        k = d("killed")
        t0 = time.time()
        res = train(2, k, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2", "train.max_steps=100000",
                                  "train.eval_interval=100000", "train.checkpoint_interval=0"], kill=(1, 5), timeout=90)
        last = res[0][1].strip().splitlines()[-1] if res[0][1].strip() else ""
        check(res[0][0] == 2 and last.startswith("snip: error: dist:") and "rank 1" in last and time.time() - t0 < 65,
              "killed: stage 0 stops naming rank 1", f"rc={res[0][0]} {last!r} after {time.time() - t0:.0f} s")

    if "errors" in cases:
        for world, sets, needle in [
                (3, ["dist.pipeline_stages=2"], "not a multiple"),
                (2, ["dist.pipeline_stages=2", "train.zero_stage=1"], "train.zero_stage"),
                (2, ["dist.pipeline_stages=2", "dist.grad_comm=fp8"], "dist.grad_comm"),
                (2, ["dist.pipeline_stages=2", "model.num_hidden_layers=1"], "dist.pipeline_stages"),
                (2, ["dist.pipeline_stages=2", "dist.stage_split=3,2"], "dist.stage_split"),
                (2, ["dist.pipeline_stages=2", "dist.stage_cost=fp4:1"], "dist.stage_cost"),
                (2, ["dist.pipeline_stages=2", "dist.stage_cost=fp4=1,fp4=2"], "dist.stage_cost"),
                (2, ["dist.pipeline_stages=2", "dist.stage_cost=fq4=1"], "dist.stage_cost"),
                (2, ["dist.pipeline_stages=2", "dist.stage_split=3,1,"], "dist.stage_split"),
                (2, ["dist.pipeline_stages=2", "dist.stage_boundary="], "dist.stage_boundary")]:
            e = d("errors")
            res = train(world, e, BASE + sets, timeout=60)
            good = all(rc == 2 and err.strip().splitlines()[-1].startswith("snip: error: ") and
                       needle in err.strip().splitlines()[-1] for rc, err in res)
            check(good, f"errors: {sets}", [(rc, err[-300:]) for rc, err in res])
            check(not os.path.exists(os.path.join(e, "checkpoints")), f"errors: {sets}: nothing written")
        # Ranks started with different pipeline settings stop at once, each naming the setting.
        for key, other in (("dist.micro_batches", "3"), ("dist.pipeline_stages", "1"), ("dist.stage_split", "2,2"),
                           ("dist.pipeline_schedule", "gpipe")):
            e = d("mismatch")
            t0 = time.time()
            res = train(2, e, BASE + ["train.grad_accum=2", "dist.pipeline_stages=2", "dist.stage_split=3,1"],
                        timeout=60, rank_sets={1: [f"{key}={other}"]})
            good = all(rc == 2 and f"another {key} than rank 0" in err.strip().splitlines()[-1] for rc, err in res)
            check(good and time.time() - t0 < 30, f"errors: rank 1 with another {key}",
                  [(rc, err[-300:]) for rc, err in res])
finally:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(tmp, ignore_errors=True)
T.finish()
